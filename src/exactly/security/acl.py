"""Kafka's ACL model: resource patterns, access control entries, bindings and binding filters.

An ACL binding is a resource pattern (resource type, name, pattern type) plus an entry
(principal ``User:x`` or ``User:*``, host IP or ``*``, operation, permission). The enum values are
Kafka's int8 wire codes, so a binding travels through CreateAcls/DescribeAcls/DeleteAcls and the
on-disk store as the same numbers Kafka's clients use.

Filters (DescribeAcls, DeleteAcls) follow ``ResourcePatternFilter``/``AccessControlEntryFilter``:
a null field or ANY matches everything; the pattern type MATCH matches every stored pattern that
*applies* to the filter's name (the literal name, the literal wildcard ``*``, and prefixes), and
ANY matches the same name under any pattern type.

Invariant: a ``AclBinding`` built through ``binding_error`` being None is storable: concrete
enum values (no UNKNOWN/ANY/MATCH), a ``kafka-cluster`` name for the Cluster resource, a
``Type:name`` principal and a non-empty host.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15  # KIP-939 (Kafka 4.1): on a TransactionalId, InitProducerId enable_2pc


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# An ALLOW of the key implies an ALLOW of these (Kafka's AclEntry.implies); never for DENY.
IMPLIED_BY_ALLOW: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.ALTER_CONFIGS}),
}

# The resource types this broker authorizes (Kafka's also has DELEGATION_TOKEN and USER).
SUPPORTED_RESOURCE_TYPES = frozenset(
    {ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID}
)


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    def applies_to(self, name: str) -> bool:
        """Does this stored pattern cover resource ``name``?"""
        if self.pattern_type == PatternType.LITERAL:
            return self.name == name or self.name == WILDCARD
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.name)
        return False


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    def to_json(self) -> dict[str, object]:
        return {
            "resourceType": int(self.pattern.resource_type),
            "name": self.pattern.name,
            "patternType": int(self.pattern.pattern_type),
            "principal": self.entry.principal,
            "host": self.entry.host,
            "operation": int(self.entry.operation),
            "permissionType": int(self.entry.permission),
        }

    @classmethod
    def from_json(cls, obj: dict[str, object]) -> AclBinding:
        return binding(
            int(str(obj["resourceType"])),
            str(obj["name"]),
            int(str(obj["patternType"])),
            str(obj["principal"]),
            str(obj["host"]),
            int(str(obj["operation"])),
            int(str(obj["permissionType"])),
        )


def binding(
    resource_type: int,
    name: str,
    pattern_type: int,
    principal: str,
    host: str,
    operation: int,
    permission: int,
) -> AclBinding:
    """An AclBinding from wire codes; raises ValueError for a code outside the enums."""
    return AclBinding(
        ResourcePattern(ResourceType(resource_type), name, PatternType(pattern_type)),
        AccessControlEntry(principal, host, AclOperation(operation), AclPermissionType(permission)),
    )


def binding_error(b: AclBinding) -> str | None:
    """Why CreateAcls refuses ``b`` (Kafka answers INVALID_REQUEST), or None if it is storable."""
    if b.pattern.resource_type not in SUPPORTED_RESOURCE_TYPES:
        return f"resource type {b.pattern.resource_type.name} is not supported"
    if b.pattern.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"pattern type {b.pattern.pattern_type.name} is not a concrete pattern type"
    if not b.pattern.name:
        return "the resource name must not be empty"
    if b.pattern.resource_type == ResourceType.CLUSTER and b.pattern.name != CLUSTER_NAME:
        return f"the cluster resource must be named {CLUSTER_NAME}"
    if b.entry.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"operation {b.entry.operation.name} is not a concrete operation"
    if b.entry.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        return f"permission {b.entry.permission.name} is not ALLOW or DENY"
    kind, sep, who = b.entry.principal.partition(":")
    if not sep or not kind or not who:
        return f"principal {b.entry.principal!r} is not of the form Type:name"
    if not b.entry.host:
        return "the host must not be empty"
    return None


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """A DescribeAcls/DeleteAcls filter: None for a string field, ANY for an enum, matches all."""

    resource_type: ResourceType
    name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: AclOperation
    permission: AclPermissionType

    def matches(self, b: AclBinding) -> bool:
        p = b.pattern
        if self.resource_type != ResourceType.ANY and self.resource_type != p.resource_type:
            return False
        if not self._pattern_matches(p):
            return False
        e = b.entry
        if self.principal is not None and self.principal != e.principal:
            return False
        if self.host is not None and self.host != e.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != e.operation:
            return False
        return self.permission == AclPermissionType.ANY or self.permission == e.permission

    def _pattern_matches(self, p: ResourcePattern) -> bool:
        if self.pattern_type == PatternType.MATCH:
            return self.name is None or p.applies_to(self.name)
        if self.pattern_type != PatternType.ANY and self.pattern_type != p.pattern_type:
            return False
        return self.name is None or self.name == p.name

    def error(self) -> str | None:
        """Why the filter is unusable (UNKNOWN codes), or None."""
        for value in (self.resource_type, self.pattern_type, self.operation, self.permission):
            if value == 0:
                return f"the filter has an UNKNOWN {type(value).__name__}"
        return None


def filter_from_wire(
    resource_type: int,
    name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission: int,
) -> AclBindingFilter:
    """A filter from wire codes; raises ValueError for a code outside the enums."""
    return AclBindingFilter(
        ResourceType(resource_type),
        name,
        PatternType(pattern_type),
        principal,
        host,
        AclOperation(operation),
        AclPermissionType(permission),
    )
