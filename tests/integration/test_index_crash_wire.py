"""kill -9 of a broker after acknowledged writes whose index entries were still in memory
(``storage.index`` writes them at flush, roll and close): after the restart every offset is
found through the offset index (Fetch) and every batch's timestamp through the time index
(ListOffsets), and a clean stop leaves the indexes a broker that was never killed would have."""

from __future__ import annotations

from typing import Any

import pytest

from exactly.records.batch import BatchHeader
from exactly.storage.index import OFFSET_ENTRY
from tests.support.broker import Broker
from tests.support.wire import (
    WireClient,
    create_topic,
    fetch_request,
    list_offset,
    log_end_offset,
    partition_response,
    produce_request,
    simple_batch,
)

pytestmark = pytest.mark.timeout(120)

FIRST_TS = 1_700_000_000_000
BATCHES = 240


def _timestamp(i: int) -> int:
    """Rising, with a dip every 5th batch: the time index records only new maxima."""
    return FIRST_TS + 10 * i - (7 if i % 5 == 4 else 0)


def _first_batch_at(c: WireClient, topic: str, offset: int) -> BatchHeader:
    (t,) = c.send(fetch_request(topic, 0, offset, partition_max_bytes=1)).responses
    (p,) = t.partitions
    assert p.error_code == 0, f"Fetch error {p.error_code!r} at {offset}"
    return BatchHeader.parse(bytes(p.records), 0)


def _index_sizes(b: Broker, topic: str) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(b.partition_dir(topic).glob("*.index"))}


def test_every_offset_and_timestamp_is_found_after_kill_9(fresh_broker: Any, topic: str) -> None:
    b: Broker = fresh_broker(**{"log.index.interval.bytes": "256", "log.segment.bytes": "65536"})
    bases: list[int] = []
    with WireClient(b.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        for i in range(BATCHES):
            data = simple_batch(
                [f"v{i}-{j}".encode().ljust(60, b".") for j in range(4)], base_timestamp=_timestamp(i)
            )
            part = partition_response(c.send(produce_request(topic, 0, data)))
            assert part.error_code == 0
            bases.append(int(part.base_offset))
    assert bases == [4 * i for i in range(BATCHES)]
    before_kill = _index_sizes(b, topic)
    assert len(before_kill) >= 2, f"expected several segments, found {before_kill}"
    b.kill()
    b.start()
    with WireClient(b.bootstrap) as c:
        assert log_end_offset(c, topic) == 4 * BATCHES
        for i, base in enumerate(bases):
            for offset in (base, base + 3):
                header = _first_batch_at(c, topic, offset)
                assert header.base_offset == base, (offset, header.base_offset)
                assert header.max_timestamp == _timestamp(i)
        for i in range(BATCHES):
            expected = next(base for j, base in enumerate(bases) if _timestamp(j) >= _timestamp(i))
            assert list_offset(c, topic, 0, _timestamp(i)) == (0, expected), i
        assert list_offset(c, topic, 0, _timestamp(BATCHES) + 1000) == (0, -1)
    assert b.stop() == 0
    after = _index_sizes(b, topic)
    assert after.keys() == before_kill.keys()
    # The kill lost entries that were still in memory; recovery put them back.
    assert any(before_kill[name] < after[name] for name in after), (before_kill, after)
    assert all(size % OFFSET_ENTRY.size == 0 and size > 0 for size in after.values())
