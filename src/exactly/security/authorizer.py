"""The ACL authorizer: Kafka's decision procedure over a set of ACL bindings (sans-IO).

Decision for (principal, host, operation, resource type, name), as in Kafka's AclAuthorizer and
StandardAuthorizer:

1. a principal listed in ``super.users`` is allowed;
2. the applicable bindings are the LITERAL ones with the exact name, the LITERAL wildcard ``*``
   and the PREFIXED ones whose name starts the resource's name, whose principal is the caller or
   ``User:*`` and whose host is ``*`` or the caller's IP;
3. any applicable DENY of the operation (or of ALL) denies, whatever the specificity;
4. else any applicable ALLOW of the operation, of ALL, or of an operation implying it (READ,
   WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows;
5. else a resource with no binding at all (for anyone) is allowed only when
   ``allow.everyone.if.no.acl.found`` is true; otherwise denied.

``authorize_by_resource_type`` is KIP-679's question "may the caller do ``op`` on *some*
resource of this type" (an idempotent InitProducerId without IDEMPOTENT_WRITE on the cluster
asks it for WRITE on topics).

The bindings live in memory, indexed by (resource type, pattern type, name); the broker's store
(exactly.security.acl_store) persists them and replaces the authorizer's set on every change,
so a CreateAcls takes effect for the very next request, without a restart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exactly.security.acl import (
    IMPLIED_BY_ALLOW,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

# Values of authorizer.class.name that turn authorization on: Kafka's two ACL authorizers (so a
# Kafka server.properties carries over) and this broker's own name.
AUTHORIZER_CLASS_NAMES = frozenset(
    {
        "kafka.security.authorizer.AclAuthorizer",
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "exactly.security.authorizer.AclAuthorizer",
    }
)

_Key = tuple[ResourceType, PatternType, str]


@dataclass(frozen=True, slots=True)
class AuthorizerConfig:
    super_users: frozenset[str]
    allow_everyone_if_no_acl_found: bool

    @classmethod
    def parse(cls, super_users: str, allow_everyone: bool) -> AuthorizerConfig:
        """``super.users`` is ``;``-separated principals (``User:admin;User:ANONYMOUS``)."""
        names = frozenset(p.strip() for p in super_users.split(";") if p.strip())
        return cls(names, allow_everyone)


class Authorizer:
    """Kafka's ACL decision procedure over an in-memory binding set.

    Invariant: ``_index`` is (by key, prefixed): the first holds exactly the bindings of
    ``bindings()``, each under its pattern's (resource type, pattern type, name); the second lists
    per resource type the PREFIXED names that have at least one binding. It is replaced whole,
    never mutated."""

    def __init__(self, config: AuthorizerConfig, bindings: Iterable[AclBinding] = ()) -> None:
        self.config = config
        self._index: tuple[dict[_Key, set[AclBinding]], dict[ResourceType, set[str]]] = ({}, {})
        self.replace(bindings)

    # ---- the binding set ----------------------------------------------------------------------
    def replace(self, bindings: Iterable[AclBinding]) -> None:
        """Swap in a new binding set. The index is built aside and assigned in one step, so a
        decision running concurrently (the ZooKeeper watch reloads on kazoo's thread) sees the old
        or the new set, never a half-built one."""
        by_key: dict[_Key, set[AclBinding]] = defaultdict(set)
        prefixed: dict[ResourceType, set[str]] = defaultdict(set)
        for b in bindings:
            p = b.pattern
            by_key[(p.resource_type, p.pattern_type, p.name)].add(b)
            if p.pattern_type == PatternType.PREFIXED:
                prefixed[p.resource_type].add(p.name)
        self._index = (by_key, prefixed)

    @property
    def _by_key(self) -> dict[_Key, set[AclBinding]]:
        return self._index[0]

    @property
    def _prefixed(self) -> dict[ResourceType, set[str]]:
        return self._index[1]

    def bindings(self) -> list[AclBinding]:
        return [b for group in self._by_key.values() for b in group]

    def matching(self, flt: AclBindingFilter) -> list[AclBinding]:
        return [b for b in self.bindings() if flt.matches(b)]

    # ---- decisions ----------------------------------------------------------------------------
    def is_super_user(self, principal: str) -> bool:
        return principal in self.config.super_users

    def _applicable(self, rtype: ResourceType, name: str) -> list[AclBinding]:
        by_key, prefixed = self._index  # one consistent snapshot
        found: list[AclBinding] = []
        for key in ((rtype, PatternType.LITERAL, name), (rtype, PatternType.LITERAL, WILDCARD)):
            group = by_key.get(key)
            if group:
                found.extend(group)
        for prefix in prefixed.get(rtype, ()):
            if name.startswith(prefix):
                found.extend(by_key.get((rtype, PatternType.PREFIXED, prefix), ()))
        return found

    def authorize(self, principal: str, host: str, op: AclOperation, rtype: ResourceType, name: str) -> bool:
        if self.is_super_user(principal):
            return True
        applicable = self._applicable(rtype, name)
        if not applicable:
            return self.config.allow_everyone_if_no_acl_found
        allowed = False
        for b in applicable:
            e = b.entry
            if e.principal != principal and e.principal != WILDCARD_PRINCIPAL:
                continue
            if e.host != WILDCARD and e.host != host:
                continue
            if e.permission == AclPermissionType.DENY:
                if e.operation == op or e.operation == AclOperation.ALL:
                    return False
            elif not allowed:
                allowed = (
                    e.operation == op
                    or e.operation == AclOperation.ALL
                    or e.operation in IMPLIED_BY_ALLOW.get(op, ())
                )
        return allowed

    def authorize_by_resource_type(
        self, principal: str, host: str, op: AclOperation, rtype: ResourceType
    ) -> bool:
        """May ``principal`` do ``op`` on some resource of ``rtype``? (KIP-679.)

        A probe on a name no ACL can name first, so super users and allow-if-no-ACL apply; then
        some ALLOW for ``op`` or ALL not cancelled by a DENY: a wildcard DENY cancels all, a
        literal DENY cancels the same-name literal ALLOW, a PREFIXED DENY cancels the ALLOWs
        whose names start with it. No DESCRIBE implication here, as in Kafka."""
        if self.authorize(principal, host, op, rtype, "\x00exactly-probe\x00"):
            return True
        denied: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        allowed: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        for (kind, pattern_type, name), group in self._by_key.items():
            if kind != rtype:
                continue
            for b in group:
                e = b.entry
                if e.principal != principal and e.principal != WILDCARD_PRINCIPAL:
                    continue
                if e.host != WILDCARD and e.host != host:
                    continue
                if e.operation != op and e.operation != AclOperation.ALL:
                    continue
                target = denied if e.permission == AclPermissionType.DENY else allowed
                target[pattern_type].add(name)
        if WILDCARD in denied[PatternType.LITERAL]:
            return False
        if WILDCARD in allowed[PatternType.LITERAL]:
            return True

        def cancelled(name: str) -> bool:
            return any(name.startswith(p) for p in denied[PatternType.PREFIXED])

        for name in allowed[PatternType.PREFIXED]:
            if not cancelled(name):
                return True
        return any(
            name not in denied[PatternType.LITERAL] and not cancelled(name)
            for name in allowed[PatternType.LITERAL]
        )


def authorizer_from_config(
    values: Mapping[str, str], bindings: Iterable[AclBinding] = ()
) -> Authorizer | None:
    """The authorizer ``authorizer.class.name`` asks for, or None (authorization off).

    Raises ValueError for a class name this broker does not implement, so a typo does not
    silently leave the broker open."""
    name = values.get("authorizer.class.name", "").strip()
    if not name:
        return None
    if name not in AUTHORIZER_CLASS_NAMES:
        raise ValueError(
            f"authorizer.class.name={name!r} is not supported; use one of {sorted(AUTHORIZER_CLASS_NAMES)}"
        )
    allow = values.get("allow.everyone.if.no.acl.found", "false").strip().lower() == "true"
    return Authorizer(AuthorizerConfig.parse(values.get("super.users", ""), allow), bindings)
