"""CreateTopics (19).

Per-topic errors as Kafka returns them: INVALID_TOPIC_EXCEPTION (illegal name),
TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS (< 1), INVALID_REPLICATION_FACTOR (anything but 1 on a
one-broker cluster; larger than the live brokers in cluster mode), INVALID_CONFIG (unknown name or bad value), INVALID_REQUEST (duplicate name
in one request, manual assignments to brokers that do not exist). validate_only checks without
creating.

Cluster mode (``zookeeper.connect``): Kafka's admin path. The replicas come from the live brokers
by Kafka's AdminUtils placement (or the request's assignments), ``/config/topics/<t>`` then
``/brokers/topics/<t>`` are written, and the answer waits (up to the request's timeout) until the
controller elected a leader for every partition; each broker creates its local replicas when it
observes its role.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import CREATE, TOPIC, authorize, authorize_cluster
from exactly.server.clock import now_ms
from exactly.storage.config import InvalidConfigError
from exactly.storage.log_manager import TopicExistsError, TopicInfo
from exactly.topics import topic_name_error

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.CREATE_TOPICS

DEFAULT_CONFIG_SOURCE = 5
DYNAMIC_TOPIC_CONFIG_SOURCE = 1


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    results = []
    seen: dict[str, int] = {}
    for topic in request.topics:
        seen[topic.name] = seen.get(topic.name, 0) + 1
    cluster_create = authorize_cluster(broker, ctx, CREATE, log_denied=False)
    for topic in request.topics:
        if seen[topic.name] == 1 and not (
            cluster_create or authorize(broker, ctx, CREATE, TOPIC, topic.name)
        ):
            code = ErrorCode.topic_authorization_failed
            broker.metrics.error(ApiKey.CREATE_TOPICS, code)
            results.append(
                build(
                    mod.CreatableTopicResult,
                    name=topic.name,
                    error_code=code,
                    error_message="Authorization failed.",
                    num_partitions=-1,
                    replication_factor=-1,
                )
            )
            continue
        if broker.replicas is not None:
            results.append(await _create_in_cluster(broker, ctx, request, topic, seen))
            continue
        code, message, info = _create_one(broker, topic, seen, request.validate_only)
        broker.metrics.error(ApiKey.CREATE_TOPICS, code)
        fields: dict[str, Any] = {"name": topic.name, "error_code": code, "error_message": message}
        if info is not None and hasattr(mod, "CreatableTopicConfigs"):
            fields.update(
                topic_id=info.topic_id,
                num_partitions=info.partitions,
                replication_factor=1,
                configs=tuple(
                    build(
                        mod.CreatableTopicConfigs,
                        name=k,
                        value=v,
                        read_only=False,
                        config_source=DYNAMIC_TOPIC_CONFIG_SOURCE
                        if k in info.overrides
                        else DEFAULT_CONFIG_SOURCE,
                        is_sensitive=False,
                    )
                    for k, v in sorted(info.config.as_kafka_configs().items())
                ),
            )
        elif info is not None:
            fields.update(topic_id=info.topic_id)
        else:
            fields.update(num_partitions=-1, replication_factor=-1)
        results.append(build(mod.CreatableTopicResult, **fields))
    return build(ctx.api.response_type, topics=tuple(results))


def _create_one(
    broker: Broker, topic: Any, seen: dict[str, int], validate_only: bool
) -> tuple[ErrorCode, str | None, Any]:
    name = topic.name
    if seen[name] > 1:
        return (
            ErrorCode.invalid_request,
            f"Create topics request from client contains multiple entries for {name}",
            None,
        )
    problem = topic_name_error(name)
    if problem is not None:
        return ErrorCode.invalid_topic_exception, problem, None
    if broker.logs.topic(name) is not None:
        return ErrorCode.topic_already_exists, f"Topic '{name}' already exists.", None
    if topic.assignments:
        partitions = len(topic.assignments)
        for a in topic.assignments:
            if any(b != broker.node_id for b in a.broker_ids):
                return ErrorCode.invalid_replica_assignment, "Replica assignment names unknown brokers", None
    else:
        partitions = broker.num_partitions if topic.num_partitions == -1 else topic.num_partitions
    if partitions < 1:
        return ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.", None
    if topic.replication_factor not in (-1, 1) and not topic.assignments:
        return (
            ErrorCode.invalid_replication_factor,
            f"Unable to replicate the partition {topic.replication_factor} time(s): "
            "The target replication factor is larger than the number of brokers (1).",
            None,
        )
    overrides = {c.name: c.value for c in topic.configs if c.value is not None}
    try:
        config = broker.default_log_config.with_overrides(overrides)
    except InvalidConfigError as exc:
        return ErrorCode.invalid_config, str(exc), None
    if validate_only:
        return ErrorCode.none, None, TopicInfo(name, uuid.UUID(int=0), partitions, overrides, config, False)
    try:
        info = broker.logs.create_topic(name, partitions, overrides, now_ms=now_ms())
    except TopicExistsError:
        return ErrorCode.topic_already_exists, f"Topic '{name}' already exists.", None
    except InvalidConfigError as exc:
        return ErrorCode.invalid_config, str(exc), None
    except OSError as exc:
        return ErrorCode.kafka_storage_error, str(exc), None
    return ErrorCode.none, None, info


async def _create_in_cluster(
    broker: Broker, ctx: RequestContext, request: Any, topic: Any, seen: dict[str, int]
) -> Any:
    replicas_manager = broker.replicas
    assert replicas_manager is not None
    mod = ctx.api.response_module
    name = topic.name
    code, message, replicas, overrides = _plan_in_cluster(broker, topic, seen)
    topic_id = uuid.UUID(int=0)
    if code == ErrorCode.none and not request.validate_only:
        timeout_s = max(request.timeout.total_seconds(), 0.0)
        code, message, created_id = await replicas_manager.topics.create_topic(
            name, replicas, overrides, timeout_s
        )
        topic_id = created_id or topic_id
    broker.metrics.error(ApiKey.CREATE_TOPICS, code)
    fields: dict[str, Any] = {"name": name, "error_code": code, "error_message": message}
    if code == ErrorCode.none:
        fields.update(topic_id=topic_id)
        if hasattr(mod, "CreatableTopicConfigs"):
            config = broker.default_log_config.with_overrides(overrides)
            fields.update(
                num_partitions=len(replicas),
                replication_factor=len(next(iter(replicas.values()))),
                configs=tuple(
                    build(
                        mod.CreatableTopicConfigs,
                        name=k,
                        value=v,
                        read_only=False,
                        config_source=DYNAMIC_TOPIC_CONFIG_SOURCE
                        if k in overrides
                        else DEFAULT_CONFIG_SOURCE,
                        is_sensitive=False,
                    )
                    for k, v in sorted(config.as_kafka_configs().items())
                ),
            )
    else:
        fields.update(num_partitions=-1, replication_factor=-1)
    return build(mod.CreatableTopicResult, **fields)


def _plan_in_cluster(
    broker: Broker, topic: Any, seen: dict[str, int]
) -> tuple[ErrorCode, str | None, dict[int, tuple[int, ...]], dict[str, str]]:
    """Validate and place one topic (Kafka's AdminManager.createTopics checks, in its order)."""
    replicas_manager = broker.replicas
    assert replicas_manager is not None
    name = topic.name
    if seen[name] > 1:
        return (
            ErrorCode.invalid_request,
            f"Create topics request from client contains multiple entries for {name}",
            {},
            {},
        )
    problem = topic_name_error(name)
    if problem is not None:
        return ErrorCode.invalid_topic_exception, problem, {}, {}
    if replicas_manager.cache.topic(name) is not None:
        return ErrorCode.topic_already_exists, f"Topic '{name}' already exists.", {}, {}
    overrides = {c.name: c.value for c in topic.configs if c.value is not None}
    try:
        broker.default_log_config.with_overrides(overrides)
    except InvalidConfigError as exc:
        return ErrorCode.invalid_config, str(exc), {}, {}
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            return (
                ErrorCode.invalid_request,
                "Both numPartitions or replicationFactor and replicasAssignments were set.",
                {},
                {},
            )
        live = replicas_manager.cache.brokers
        replicas: dict[int, tuple[int, ...]] = {}
        for a in topic.assignments:
            ids = tuple(int(b) for b in a.broker_ids)
            if not ids or len(set(ids)) != len(ids) or any(b not in live for b in ids):
                return (
                    ErrorCode.invalid_replica_assignment,
                    "Replica assignment names unknown brokers",
                    {},
                    {},
                )
            replicas[int(a.partition_index)] = ids
        if sorted(replicas) != list(range(len(replicas))):
            return (
                ErrorCode.invalid_replica_assignment,
                "Partitions must be numbered from 0 without gaps",
                {},
                {},
            )
        if len({len(r) for r in replicas.values()}) != 1:
            return (
                ErrorCode.invalid_replica_assignment,
                "All partitions must have the same replication factor",
                {},
                {},
            )
        return ErrorCode.none, None, replicas, overrides
    partitions = broker.num_partitions if topic.num_partitions == -1 else topic.num_partitions
    if partitions < 1:
        return ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.", {}, {}
    rf = (
        broker.config.get_int("default.replication.factor")
        if topic.replication_factor == -1
        else topic.replication_factor
    )
    code, message, replicas = replicas_manager.topics.plan_assignment(partitions, rf)
    return code, message, replicas, overrides
