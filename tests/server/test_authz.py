"""The handlers' authorization helper: the peer's IP as ACLs see it, and the default with no
authorizer (everything allowed, the ACL APIs answer SECURITY_DISABLED, as Kafka does)."""

from __future__ import annotations

import asyncio
import datetime

from tests.server.authz_broker import AuthzBroker, error_codes

from exactly.protocol.apis import ApiKey
from exactly.server.authz import peer_host


def test_peer_host() -> None:
    assert peer_host("10.1.2.3:5555") == "10.1.2.3"
    assert peer_host("::1:5555") == "::1"
    assert peer_host("[fe80::1]:9092") == "fe80::1"
    assert peer_host("fuzz") == "fuzz"


def test_without_an_authorizer_everything_is_allowed_and_acl_apis_are_disabled() -> None:
    async def scenario() -> None:
        ab = await AuthzBroker(**{"authorizer.class.name": ""}).open({"t": 1})
        try:
            assert ab.broker is not None and ab.broker.authorizer is None and ab.broker.acls is None
            init = await ab.call(
                "User:nobody",
                ApiKey.INIT_PRODUCER_ID,
                3,
                transactional_id="tx",
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1,
                producer_epoch=-1,
            )
            assert init.error_code == 0
            described = await ab.describe_acls("User:nobody")
            assert error_codes(described) == [54]  # SECURITY_DISABLED
        finally:
            await ab.close()

    asyncio.run(scenario())
