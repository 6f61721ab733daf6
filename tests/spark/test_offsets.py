"""Offsets, rationing and option parsing (pure functions, no Spark, no broker)."""

from __future__ import annotations

import pytest

from exactly.spark.offsets import from_json_offsets, rate_limit, to_json_offsets
from exactly.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    parse_sink_options,
    parse_source_options,
)
from exactly.spark.source import OffsetRange, plan_ranges

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_json_offsets_round_trip_and_sorting() -> None:
    offsets = {("b", 1): 5, ("a", 10): 7, ("a", 2): 3}
    data = to_json_offsets(offsets)
    assert data == {"a": {"2": 3, "10": 7}, "b": {"1": 5}}
    assert from_json_offsets(data) == offsets
    assert from_json_offsets(None) == {}


def test_rate_limit_shares_in_proportion_and_never_exceeds_end() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    end = {("t", 0): 300, ("t", 1): 200, ("t", 2): 50}
    capped = rate_limit(start, end, 100)
    assert capped[("t", 2)] == 50
    assert capped[("t", 0)] - 0 == 75 and capped[("t", 1)] - 100 == 25
    assert rate_limit(start, end, 10_000) == end
    # a tiny limit still moves every partition with a backlog (no starvation)
    tiny = rate_limit(start, end, 1)
    assert tiny[("t", 0)] == 1 and tiny[("t", 1)] == 101


def test_plan_ranges_new_partitions_start_at_earliest() -> None:
    ranges = plan_ranges({("t", 0): 5}, {("t", 0): 9, ("t", 1): 4, ("u", 0): 0})
    assert ranges == [OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 0, 4, from_earliest=True)]
    assert plan_ranges({("t", 0): 9}, {("t", 0): 9}) == []


def test_source_options_mirror_spark_kafka() -> None:
    opts = parse_source_options(
        {
            **BASE,
            "subscribe": "a, b",
            "startingOffsets": '{"a": {"0": 23, "1": -2}}',
            "maxOffsetsPerTrigger": "500",
            "kafka.fetch.max.bytes": "1000",
            "kafka.group.id": "ignored",
        },
        streaming=True,
    )
    assert opts.subscription.topics == ("a", "b")
    assert opts.starting.for_partition("a", 0, LATEST) == 23
    assert opts.starting.for_partition("a", 1, LATEST) == EARLIEST
    assert opts.starting.for_partition("a", 7, LATEST) == LATEST
    assert opts.max_offsets_per_trigger == 500
    assert opts.read_committed and opts.fail_on_data_loss and not opts.include_headers
    assert opts.client == {"bootstrap.servers": "127.0.0.1:9092", "fetch.max.bytes": "1000"}
    assert parse_source_options({**BASE, "subscribe": "a"}, streaming=True).starting.kind == "latest"
    assert parse_source_options({**BASE, "subscribe": "a"}, streaming=False).starting.kind == "earliest"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "a"}, "kafka.bootstrap.servers is required"),
        ({**BASE}, "exactly one of"),
        ({**BASE, "subscribe": "a", "subscribePattern": "a.*"}, "exactly one of"),
        ({**BASE, "assign": "[1]"}, "assign must be JSON"),
        ({**BASE, "subscribe": "a", "startingOffsets": "soon"}, "startingOffsets must be"),
        ({**BASE, "subscribe": "a", "kafka.isolation.level": "dirty"}, "isolation.level"),
        ({**BASE, "subscribe": "a", "maxOffsetsPerTrigger": "0"}, "at least 1"),
        ({**BASE, "subscribe": "a", "failOnDataLoss": "maybe"}, "true or false"),
    ],
)
def test_source_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_source_options(options, streaming=True)


def test_batch_reads_refuse_latest_start() -> None:
    with pytest.raises(OptionError, match="startingOffsets=latest"):
        parse_source_options({**BASE, "subscribe": "a", "startingOffsets": "latest"}, streaming=False)


def test_sink_options() -> None:
    opts = parse_sink_options({**BASE, "topic": "out", "kafka.transaction.timeout.ms": "30000"})
    assert opts.exactly_once and opts.topic == "out" and opts.transaction_timeout_ms == 30000
    assert "transaction.timeout.ms" not in opts.client
    assert not parse_sink_options({**BASE, "deliveryGuarantee": "at-least-once"}).exactly_once
    with pytest.raises(OptionError, match="deliveryGuarantee"):
        parse_sink_options({**BASE, "deliveryGuarantee": "maybe"})
    faults = parse_sink_options({**BASE, "testing.hookDir": "/x", "testing.hangBatch": "3"}).faults
    assert faults.active and faults.hang_batch == 3
