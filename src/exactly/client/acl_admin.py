"""CreateAcls / DescribeAcls / DeleteAcls over one broker connection (the ``exactly acls`` wire side).

Any broker answers the ACL APIs for the whole cluster (Kafka's admin client sends them to the
least loaded broker), so one bootstrap connection is enough. Errors come back as ``AclAdminError``
with Kafka's error name (CLUSTER_AUTHORIZATION_FAILED, SECURITY_DISABLED, INVALID_REQUEST, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

from exactly.client.wire import WireClient, WireError, error_name
from exactly.protocol.apis import ApiKey
from exactly.security.acl import AclBinding, AclBindingFilter, binding


class AclAdminError(WireError):
    """The broker refused an ACL request (the message names Kafka's error)."""


def create_acls(client: WireClient, bindings: Sequence[AclBinding]) -> None:
    version = client.version_for(ApiKey.CREATE_ACLS, 3)
    mod = client.module(ApiKey.CREATE_ACLS, version)
    creations = tuple(
        mod.AclCreation(
            resource_type=b.pattern.resource_type,
            resource_name=b.pattern.name,
            resource_pattern_type=b.pattern.pattern_type,
            principal=b.entry.principal,
            host=b.entry.host,
            operation=b.entry.operation,
            permission_type=b.entry.permission,
        )
        for b in bindings
    )
    response = client.call(ApiKey.CREATE_ACLS, version, creations=creations)
    for b, r in zip(bindings, response.results, strict=True):
        if int(r.error_code):
            raise AclAdminError(
                f"CreateAcls {b} failed: {error_name(r.error_code)} {r.error_message or ''}".strip()
            )


def _filter_fields(f: AclBindingFilter) -> dict[str, object]:
    return {
        "resource_type_filter": f.resource_type,
        "resource_name_filter": f.name,
        "pattern_type_filter": f.pattern_type,
        "principal_filter": f.principal,
        "host_filter": f.host,
        "operation": f.operation,
        "permission_type": f.permission,
    }


def describe_acls(client: WireClient, flt: AclBindingFilter) -> list[AclBinding]:
    version = client.version_for(ApiKey.DESCRIBE_ACLS, 3)
    response = client.call(ApiKey.DESCRIBE_ACLS, version, **_filter_fields(flt))
    if int(response.error_code):
        raise AclAdminError(
            f"DescribeAcls failed: {error_name(response.error_code)} {response.error_message or ''}".strip()
        )
    return [
        binding(
            r.resource_type,
            r.resource_name,
            r.pattern_type,
            a.principal,
            a.host,
            a.operation,
            a.permission_type,
        )
        for r in response.resources
        for a in r.acls
    ]


def delete_acls(client: WireClient, filters: Sequence[AclBindingFilter]) -> list[AclBinding]:
    version = client.version_for(ApiKey.DELETE_ACLS, 3)
    mod = client.module(ApiKey.DELETE_ACLS, version)
    response = client.call(
        ApiKey.DELETE_ACLS, version, filters=tuple(mod.DeleteAclsFilter(**_filter_fields(f)) for f in filters)
    )
    deleted: list[AclBinding] = []
    for r in response.filter_results:
        if int(r.error_code):
            raise AclAdminError(
                f"DeleteAcls failed: {error_name(r.error_code)} {r.error_message or ''}".strip()
            )
        deleted.extend(
            binding(
                m.resource_type,
                m.resource_name,
                m.pattern_type,
                m.principal,
                m.host,
                m.operation,
                m.permission_type,
            )
            for m in r.matching_acls
        )
    return deleted
