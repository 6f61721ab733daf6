"""How a broker tells ``exactly topics describe`` the dirty ratio of its compacted partitions.

Kafka has no admin API field for a partition's dirty ratio (its cleaner publishes
``max-dirty-percent`` over JMX only). Rather than make the describe tool scrape the Prometheus
endpoint (a second port, off by default), the broker answers a DescribeConfigs request for a
topic resource that *names* the read-only key :data:`DIRTY_RATIOS_CONFIG`, with one value listing
the ratio of each partition of that topic whose log this broker holds and has looked at:
``"0=0.4213,2=0.0000"``. A request that lists every config (configuration_keys null, what
``kafka-configs --describe`` sends) never gets it, so standard tools see no extra entry; an alter of
the key is rejected like any unknown config.

Invariants: ratios are in [0, 1], printed with 4 decimals; partitions in ascending order; an empty
value means the broker holds no checked partition of the topic (the cleaner is off, or has not
looked yet). The ratio is the one at the cleaner's last check (as Kafka's gauge), not recomputed
on the request: computing it reads segment metadata the cleaner thread may be rewriting.
"""

from __future__ import annotations

from collections.abc import Mapping

DIRTY_RATIOS_CONFIG = "exactly.partition.dirty.ratios"


def format_dirty_ratios(ratios: Mapping[int, float]) -> str:
    """``{partition: ratio}`` -> the config value (partitions ascending)."""
    return ",".join(f"{p}={ratios[p]:.4f}" for p in sorted(ratios))


def parse_dirty_ratios(text: str | None) -> dict[int, float]:
    """The config value -> ``{partition: ratio}``; malformed items are skipped (a newer or older
    broker may add to the format), never raised."""
    out: dict[int, float] = {}
    for item in (text or "").split(","):
        partition, sep, ratio = item.strip().partition("=")
        if not sep:
            continue
        try:
            out[int(partition)] = float(ratio)
        except ValueError:
            continue
    return out
