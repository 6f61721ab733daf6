"""DescribeConfigs (32): topic configs (defaults + overrides) and this broker's configs.

A topic resource whose request names ``exactly.partition.dirty.ratios`` also gets that read-only
entry (the dirty ratios of the topic's partitions held here; ``storage.cleaner.describe``). It is
never part of a full listing, so Kafka's tools see only Kafka's configs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import DESCRIBE_CONFIGS, TOPIC, authorize, authorize_cluster
from exactly.storage.cleaner.describe import DIRTY_RATIOS_CONFIG, format_dirty_ratios

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.DESCRIBE_CONFIGS

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
CONFIG_TYPE_STRING = 2
CONFIG_TYPE_LONG = 5


def _entries(
    mod: Any, items: dict[str, str], overridden: set[str], keys: Any, override_source: int, synonyms: bool
) -> tuple[Any, ...]:
    out = []
    for name in sorted(items):
        if keys is not None and name not in keys:
            continue
        value = items[name]
        source = override_source if name in overridden else SOURCE_DEFAULT
        out.append(
            build(
                mod.DescribeConfigsResourceResult,
                name=name,
                value=value,
                read_only=False,
                config_source=source,
                is_sensitive=False,
                synonyms=(build(mod.DescribeConfigsSynonym, name=name, value=value, source=source),)
                if synonyms
                else (),
                config_type=CONFIG_TYPE_LONG if value.lstrip("-").isdigit() else CONFIG_TYPE_STRING,
                documentation=None,
            )
        )
    return tuple(out)


def _dirty_ratios_entry(mod: Any, broker: Broker, topic: str) -> Any:
    ratios = {
        tp.partition: ratio
        for tp, ratio in broker.logs.cleaner_manager.dirty_ratios().items()
        if tp.topic == topic
    }
    value = format_dirty_ratios(ratios)
    return build(
        mod.DescribeConfigsResourceResult,
        name=DIRTY_RATIOS_CONFIG,
        value=value,
        read_only=True,
        config_source=SOURCE_DEFAULT,
        is_sensitive=False,
        synonyms=(),
        config_type=CONFIG_TYPE_STRING,
        documentation=None,
    )


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    results = []
    for res in request.resources:
        keys = None if res.configuration_keys is None else set(res.configuration_keys)
        code = ErrorCode.none
        message = ""  # Kafka's ConfigHelper leaves the schema default "" on success (never null)
        configs: tuple[Any, ...] = ()
        if res.resource_type == RESOURCE_TOPIC and not authorize(
            broker, ctx, DESCRIBE_CONFIGS, TOPIC, res.resource_name
        ):
            code, message = ErrorCode.topic_authorization_failed, "Topic authorization failed."
        elif res.resource_type == RESOURCE_BROKER and not authorize_cluster(broker, ctx, DESCRIBE_CONFIGS):
            code, message = ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
        elif res.resource_type == RESOURCE_TOPIC:
            info = broker.logs.topic(res.resource_name)
            if info is None:
                code, message = (
                    ErrorCode.unknown_topic_or_partition,
                    f"Topic {res.resource_name} does not exist",
                )
            else:
                configs = _entries(
                    mod,
                    info.config.as_kafka_configs(),
                    set(info.overrides),
                    keys,
                    SOURCE_DYNAMIC_TOPIC,
                    request.include_synonyms,
                )
                if keys is not None and DIRTY_RATIOS_CONFIG in keys:
                    configs += (_dirty_ratios_entry(mod, broker, res.resource_name),)
        elif res.resource_type == RESOURCE_BROKER:
            if res.resource_name not in ("", str(broker.node_id)):
                code, message = ErrorCode.invalid_request, f"Unknown broker id {res.resource_name}"
            else:
                values = dict(broker.config.values)
                configs = _entries(
                    mod, values, set(values), keys, SOURCE_STATIC_BROKER, request.include_synonyms
                )
        else:
            code, message = ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
        broker.metrics.error(ApiKey.DESCRIBE_CONFIGS, code)
        results.append(
            build(
                mod.DescribeConfigsResult,
                error_code=code,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=configs,
            )
        )
    return build(ctx.api.response_type, results=tuple(results))
