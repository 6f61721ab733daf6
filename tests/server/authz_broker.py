"""An in-process broker with the ACL authorizer on, driven through ``dispatch`` as any principal.

Why in process: the principal a request runs as comes from the connection's authentication, and
no byte of a request can choose it. Tests of the authorization matrix need several principals
before SASL exists, so they call ``dispatch(..., principal=...)`` directly, the way the fuzz
harness calls it; nothing here is reachable over the wire.

``AuthzBroker.call(principal, api_key, version, **fields)`` builds the request with
``exactly.protocol.apis.build`` (nested entries from ``request_module``), encodes it as a client
would, dispatches it and decodes the answer. ``grant``/``revoke`` change ACLs through
CreateAcls/DeleteAcls sent as the super user ``User:admin``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from exactly.client.wire import decode_response, encode_request
from exactly.protocol.apis import ApiKey, build, schema
from exactly.security.acl import CLUSTER_NAME, AclOperation, AclPermissionType, PatternType, ResourceType
from exactly.server.broker import Broker, Endpoint
from exactly.server.clock import now_ms
from exactly.server.config import BrokerConfig
from exactly.server.dispatch import dispatch

ADMIN = "User:admin"
PEER = "10.1.2.3:40000"
AUTH_ERRORS = frozenset({29, 30, 31, 53})


def error_codes(entity: Any) -> list[int]:
    """Every ``*error_code`` field anywhere in a response entity, in order."""
    found: list[int] = []
    if dataclasses.is_dataclass(entity) and not isinstance(entity, type):
        for f in dataclasses.fields(entity):
            value = getattr(entity, f.name)
            if f.name.endswith("error_code"):
                found.append(int(value))
            else:
                found.extend(error_codes(value))
    elif isinstance(entity, tuple):
        for item in entity:
            found.extend(error_codes(item))
    return found


class AuthzBroker:
    def __init__(self, **overrides: str) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="exactly-authz-")
        self.data_dir = Path(self._tmp.name)
        conf = {
            "log.dirs": str(self.data_dir),
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": ADMIN,
            **overrides,
        }
        self.config = BrokerConfig.load(None, conf)
        self.broker: Broker | None = None
        self._corr = 0
        self._tasks: list[Any] = []

    async def open(self, topics: dict[str, int]) -> AuthzBroker:
        b = Broker.open(self.config, self.data_dir)
        b.advertised = Endpoint("127.0.0.1", 9092)  # what start() would set
        b.groups.load()
        b.txn.load()
        self._tasks = [*b.groups.start_tasks(), *b.txn.start_tasks()]
        for name, parts in topics.items():
            b.logs.create_topic(name, parts, {}, now_ms=now_ms())
        self.broker = b
        return self

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.broker is not None:
            self.broker.logs.close()
        self._tmp.cleanup()

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        return build(schema(api_key, version).request_type, **fields)

    def module(self, api_key: int, version: int) -> Any:
        return schema(api_key, version).request_module

    async def send(self, principal: str, request: Any, peer: str = PEER) -> Any:
        assert self.broker is not None
        self._corr += 1
        framed = encode_request(request, self._corr, "authz-test")
        chunks = await dispatch(self.broker, bytearray(framed[4:]), peer, principal=principal)
        assert chunks is not None
        data = b"".join(bytes(c) for c in chunks)
        corr, response = decode_response(int(request.__api_key__), int(request.__version__), data[4:])
        assert corr == self._corr
        return response

    async def call(self, principal: str, api_key: int, version: int, **fields: Any) -> Any:
        return await self.send(principal, self.request(api_key, version, **fields))

    async def describe_acls(self, principal: str, **filters: Any) -> Any:
        """DescribeAcls v3 with a match-anything filter (resource type ANY, pattern ANY, operation
        and permission ANY), narrowed by ``filters`` (the request's field names)."""
        fields: dict[str, Any] = {
            "resource_type_filter": 1,
            "resource_name_filter": None,
            "pattern_type_filter": 1,
            "principal_filter": None,
            "host_filter": None,
            "operation": 1,
            "permission_type": 1,
        }
        return await self.call(principal, ApiKey.DESCRIBE_ACLS, 3, **{**fields, **filters})

    async def _acl(
        self,
        api: ApiKey,
        rtype: ResourceType,
        name: str,
        op: AclOperation,
        principal: str,
        *,
        pattern: PatternType = PatternType.LITERAL,
        allow: bool = True,
        host: str = "*",
    ) -> Any:
        perm = AclPermissionType.ALLOW if allow else AclPermissionType.DENY
        mod = self.module(api, 3)
        if api == ApiKey.CREATE_ACLS:
            entry = build(
                mod.AclCreation,
                resource_type=rtype,
                resource_name=name,
                resource_pattern_type=pattern,
                principal=principal,
                host=host,
                operation=op,
                permission_type=perm,
            )
            response = await self.call(ADMIN, api, 3, creations=(entry,))
        else:
            flt = build(
                mod.DeleteAclsFilter,
                resource_type_filter=rtype,
                resource_name_filter=name,
                pattern_type_filter=pattern,
                principal_filter=principal,
                host_filter=host,
                operation=op,
                permission_type=perm,
            )
            response = await self.call(ADMIN, api, 3, filters=(flt,))
        assert set(error_codes(response)) == {0}, response
        return response

    async def grant(
        self, rtype: ResourceType, name: str, op: AclOperation, principal: str, **kw: Any
    ) -> None:
        if rtype == ResourceType.CLUSTER:
            name = CLUSTER_NAME
        await self._acl(ApiKey.CREATE_ACLS, rtype, name, op, principal, **kw)

    async def revoke_all(self) -> None:
        """DeleteAcls with a match-everything filter."""
        mod = self.module(ApiKey.DELETE_ACLS, 3)
        flt = build(
            mod.DeleteAclsFilter,
            resource_type_filter=ResourceType.ANY,
            resource_name_filter=None,
            pattern_type_filter=PatternType.ANY,
            principal_filter=None,
            host_filter=None,
            operation=AclOperation.ANY,
            permission_type=AclPermissionType.ANY,
        )
        response = await self.call(ADMIN, ApiKey.DELETE_ACLS, 3, filters=(flt,))
        assert set(error_codes(response)) <= {0}
