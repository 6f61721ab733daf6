"""The dirty-ratio value carried to ``exactly topics describe`` over DescribeConfigs."""

from __future__ import annotations

from exactly.storage.cleaner.describe import format_dirty_ratios, parse_dirty_ratios


def test_format_orders_partitions_and_rounds_to_four_decimals() -> None:
    assert format_dirty_ratios({2: 0.5, 0: 1 / 3}) == "0=0.3333,2=0.5000"
    assert format_dirty_ratios({}) == ""


def test_parse_round_trips_and_skips_malformed_items() -> None:
    assert parse_dirty_ratios(format_dirty_ratios({0: 0.25, 7: 1.0})) == {0: 0.25, 7: 1.0}
    assert parse_dirty_ratios("0=0.1,x=2,3,4=nan?,5=0.5") == {0: 0.1, 5: 0.5}
    assert parse_dirty_ratios(None) == {}
    assert parse_dirty_ratios("") == {}
