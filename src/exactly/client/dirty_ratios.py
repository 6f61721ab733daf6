"""The dirty ratio of compacted partitions, read over the wire (``exactly topics describe``).

Kafka's admin APIs have no field for it; each broker answers a DescribeConfigs that names the
read-only key ``exactly.partition.dirty.ratios`` (see ``storage.cleaner.describe``) with the ratios
of the logs it holds, so the question goes to every partition's leader.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from exactly.client.broker_pool import BrokerPool
from exactly.client.wire import WireError
from exactly.protocol.apis import ApiKey, build
from exactly.storage.cleaner.describe import DIRTY_RATIOS_CONFIG, parse_dirty_ratios

TOPIC_RESOURCE = 2


def read_dirty_ratios(
    bootstrap: str,
    leaders: Mapping[int, Collection[str]],
    *,
    timeout_s: float,
    config: Mapping[str, Any] | None = None,
) -> tuple[set[str], dict[tuple[str, int], float]]:
    """(compacted topics, {(topic, partition): dirty ratio}) from each partition leader.

    Each leader is asked with one DescribeConfigs naming ``cleanup.policy`` and the read-only
    ``exactly.partition.dirty.ratios`` key (see ``storage.cleaner.describe``): a broker holds the
    ratios of its own logs only. A broker that cannot be reached, or does not know the key (another
    Kafka-compatible broker), leaves its partitions without a ratio; describe itself goes on.
    """
    compacted: set[str] = set()
    ratios: dict[tuple[str, int], float] = {}
    if not leaders:
        return compacted, ratios
    try:
        pool = BrokerPool.connect(bootstrap, timeout=timeout_s, config=config)
    except (OSError, WireError):
        return compacted, ratios
    with pool:
        for broker_id, topics in sorted(leaders.items()):
            try:
                client = pool.client(broker_id)
                version = client.version_for(ApiKey.DESCRIBE_CONFIGS)
                module: Any = client.module(ApiKey.DESCRIBE_CONFIGS, version)
                resources = tuple(
                    build(
                        module.DescribeConfigsResource,
                        resource_type=TOPIC_RESOURCE,
                        resource_name=topic,
                        configuration_keys=("cleanup.policy", DIRTY_RATIOS_CONFIG),
                    )
                    for topic in sorted(topics)
                )
                response = client.call(
                    ApiKey.DESCRIBE_CONFIGS, version, resources=resources, include_synonyms=False
                )
            except (OSError, WireError):
                pool.drop(broker_id)
                continue
            for result in response.results:
                if int(result.error_code):
                    continue
                topic = str(result.resource_name)
                for entry in result.configs:
                    if entry.name == "cleanup.policy" and "compact" in str(entry.value or ""):
                        compacted.add(topic)
                    elif entry.name == DIRTY_RATIOS_CONFIG:
                        for partition, ratio in parse_dirty_ratios(entry.value).items():
                            ratios[(topic, partition)] = ratio
    return compacted, ratios
