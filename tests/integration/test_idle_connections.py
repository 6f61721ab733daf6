"""connections.max.idle.ms: the broker closes connections idle that long (Kafka's selector does,
default 10 minutes); active ones and ones with a parked request stay open."""

from __future__ import annotations

import time

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from tests.conftest import BrokerFactory
from tests.support.wire import WireClient, create_topic, encode_request, fetch_request

pytestmark = pytest.mark.timeout(60)


def _ask(c: WireClient) -> None:
    assert c.send(ApiVersionsRequest(client_software_name="t", client_software_version="1")).error_code == 0


def test_idle_connection_is_closed_and_busy_ones_are_not(fresh_broker: BrokerFactory) -> None:
    b = fresh_broker(**{"connections.max.idle.ms": "600"})
    with WireClient(b.bootstrap) as idle, WireClient(b.bootstrap) as busy, WireClient(b.bootstrap) as parked:
        for c in (idle, busy, parked):
            _ask(c)
        assert create_topic(busy, "idle-t").error_code == 0
        # a Fetch parked for 1.5 s (past the idle limit) on an empty partition
        parked.send_frame(
            encode_request(
                fetch_request("idle-t", 0, 0, max_wait_ms=1500, min_bytes=1), parked.next_correlation_id()
            )
        )
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            _ask(busy)  # a request every 100 ms keeps this one active
            time.sleep(0.1)  # the traffic pattern under test, not a synchronisation
        assert idle.is_closed(wait=2.0)
        _ask(busy)
        assert parked.recv_frame()  # the parked Fetch was answered, not cut off
    # disabled with -1
    b2 = fresh_broker(**{"connections.max.idle.ms": "-1"})
    with WireClient(b2.bootstrap) as c:
        _ask(c)
        time.sleep(1.0)  # longer than a 600 ms limit would allow: nothing to await, the close must not come
        _ask(c)
