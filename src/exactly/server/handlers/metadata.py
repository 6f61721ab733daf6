"""Metadata (3): brokers (just us), and topics with their partitions, all led by us.

The request is parsed by hand rather than by kio because librdkafka's "all topics" request at
v9+ carries stray bytes that look like an unknown tagged field (kio raises on those; Kafka
ignores unknown tags and trailing bytes). Parsing it by hand also keeps this frequent request
cheap.

Auto-creation: a named, unknown topic is created with num.partitions when the request allows it
(v4+: allow_auto_topic_creation; before v4 always) and auto.create.topics.enable is true. Kafka
answers such a topic with LEADER_NOT_AVAILABLE until its leader is elected; ours is ready at
once, so we answer with its partitions.

Cluster mode: everything comes from the metadata cache the replica manager fills from ZooKeeper
watches: every live broker, the controller, per partition the leader (-1 and
LEADER_NOT_AVAILABLE while there is none), leader epoch, replicas, ISR and offline replicas.
Auto-creation writes the topic to ZooKeeper in the background and answers LEADER_NOT_AVAILABLE,
as Kafka does.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.cluster.znodes import ZnodeFormatError, decode_topic_id
from exactly.protocol.apis import ApiKey, build
from exactly.protocol.primitives import read_uvarint, skip_tagged_fields
from exactly.server.authz import CREATE, DESCRIBE, TOPIC, authorize, authorize_cluster
from exactly.server.metadata_cache import CachedTopic
from exactly.topics import INTERNAL_TOPICS, topic_name_error

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.METADATA

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class MetadataRequestData:
    topics: tuple[tuple[str | None, uuid.UUID | None], ...] | None  # None: all topics
    allow_auto_topic_creation: bool


def parse_request(buf: bytes | bytearray, pos: int, version: int) -> MetadataRequestData:
    flexible = version >= 9
    topics: list[tuple[str | None, uuid.UUID | None]] | None
    if flexible:
        n, pos = read_uvarint(buf, pos)
        count = n - 1
    else:
        count = _I32.unpack_from(buf, pos)[0]
        pos += 4
    if count < 0 or (version == 0 and count == 0):
        topics = None
    else:
        if count > len(buf) - pos:  # every entry takes at least one byte
            raise ValueError(f"topic count {count} exceeds the {len(buf) - pos} bytes left")
        topics = []
        for _ in range(count):
            topic_id: uuid.UUID | None = None
            if version >= 10:
                raw = bytes(buf[pos : pos + 16])
                if len(raw) != 16:
                    raise ValueError("truncated topic id")
                pos += 16
                topic_id = uuid.UUID(bytes=raw)
                if topic_id.int == 0:
                    topic_id = None
            if flexible:
                n, pos = read_uvarint(buf, pos)
                if n == 0:
                    name = None
                else:
                    if pos + n - 1 > len(buf):
                        raise ValueError("truncated topic name")
                    name = bytes(buf[pos : pos + n - 1]).decode()
                    pos += n - 1
                pos = skip_tagged_fields(buf, pos)
            else:
                length = _I16.unpack_from(buf, pos)[0]
                pos += 2
                if length < 0 or pos + length > len(buf):  # a negative length moved pos backwards
                    raise ValueError(f"bad topic name length {length}")
                name = bytes(buf[pos : pos + length]).decode()
                pos += length
            if name is None and version < 12:  # Kafka: null topic names need v12+
                raise ValueError(f"null topic name in Metadata v{version}")
            topics.append((name, topic_id))
    allow_auto = True
    if version >= 4 and pos < len(buf):
        allow_auto = buf[pos] != 0
    # The remaining fields (authorized-operations flags, tagged fields, librdkafka's stray
    # bytes) do not change our answer; like Kafka we do not insist on them.
    return MetadataRequestData(None if topics is None else tuple(topics), allow_auto)


async def handle(broker: Broker, ctx: RequestContext, request: MetadataRequestData) -> Any:
    if broker.replicas is not None:
        return _handle_cluster(broker, ctx, request)
    mod = ctx.api.response_module
    # the endpoint of the listener the request came in on (the inter-broker one if that
    # listener is not advertised: a lone broker has no other node to point at)
    adv = broker.advertised_for(ctx.listener) or broker.advertised
    assert adv is not None
    logs = broker.logs
    topic_results = []
    names: list[tuple[str | None, uuid.UUID | None]]
    if request.topics is None:
        names = [(name, None) for name in sorted(logs.topics())]
    else:
        names = list(request.topics)
    for name, topic_id in names:
        info = None
        if name is None:  # v12+: by topic id (a zero id finds nothing)
            info = logs.topic_by_id(topic_id) if topic_id is not None else None
            if info is None:
                topic_results.append(_unknown_topic_id(broker, mod, topic_id))
                continue
            name = info.name
        if not _may_describe(broker, ctx, request, name):
            if request.topics is not None:
                topic_results.append(_unauthorized_topic(broker, mod, name, topic_id))
            continue
        if info is None:
            info = logs.topic(name)
        if info is None and request.topics is not None:
            if topic_name_error(name) is not None:
                topic_results.append(_error_topic(mod, name, ErrorCode.invalid_topic_exception))
                broker.metrics.error(ApiKey.METADATA, ErrorCode.invalid_topic_exception)
                continue
            if request.allow_auto_topic_creation:
                if broker.auto_create_topics and not _may_create(broker, ctx, name):
                    topic_results.append(_unauthorized_topic(broker, mod, name, None))
                    continue
                info = broker.auto_create(name)
        if info is None:
            topic_results.append(_error_topic(mod, name, ErrorCode.unknown_topic_or_partition))
            broker.metrics.error(ApiKey.METADATA, ErrorCode.unknown_topic_or_partition)
            continue
        partitions = tuple(
            build(
                mod.MetadataResponsePartition,
                error_code=ErrorCode.none,
                partition_index=i,
                leader_id=broker.node_id,
                leader_epoch=0,
                replica_nodes=(broker.node_id,),
                isr_nodes=(broker.node_id,),
                offline_replicas=(),
            )
            for i in range(info.partitions)
        )
        topic_results.append(
            build(
                mod.MetadataResponseTopic,
                error_code=ErrorCode.none,
                name=info.name,
                topic_id=info.topic_id,
                is_internal=info.name in INTERNAL_TOPICS,
                partitions=partitions,
                topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            )
        )
    return build(
        ctx.api.response_type,
        brokers=(
            build(
                mod.MetadataResponseBroker, node_id=broker.node_id, host=adv.host, port=adv.port, rack=None
            ),
        ),
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        topics=tuple(topic_results),
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


def _may_describe(broker: Broker, ctx: RequestContext, request: MetadataRequestData, name: str) -> bool:
    """DESCRIBE on the topic; a request for all topics omits the others silently (not audited)."""
    return authorize(broker, ctx, DESCRIBE, TOPIC, name, log_denied=request.topics is not None)


def _may_create(broker: Broker, ctx: RequestContext, name: str) -> bool:
    """Auto-creation needs CREATE on the cluster or on the topic."""
    return authorize_cluster(broker, ctx, CREATE, log_denied=False) or authorize(
        broker, ctx, CREATE, TOPIC, name
    )


def _unauthorized_topic(broker: Broker, mod: Any, name: str, topic_id: uuid.UUID | None) -> Any:
    """TOPIC_AUTHORIZATION_FAILED without a lookup: no partitions, a zero id (or the id asked
    for: ids are not secret), so the answer says nothing about whether the topic exists."""
    broker.metrics.error(ApiKey.METADATA, ErrorCode.topic_authorization_failed)
    return build(
        mod.MetadataResponseTopic,
        error_code=ErrorCode.topic_authorization_failed,
        name=name if topic_id is None else None,
        topic_id=topic_id or uuid.UUID(int=0),
        is_internal=False,
        partitions=(),
        topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


def _error_topic(mod: Any, name: str, code: ErrorCode) -> Any:
    return build(
        mod.MetadataResponseTopic,
        error_code=code,
        name=name,
        topic_id=uuid.UUID(int=0),
        is_internal=False,
        partitions=(),
        topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


def _handle_cluster(broker: Broker, ctx: RequestContext, request: MetadataRequestData) -> Any:
    replicas = broker.replicas
    assert replicas is not None
    cache = replicas.cache
    mod = ctx.api.response_module
    topic_results = []
    # live brokers with an endpoint on the request's listener: the others are left out, and
    # partitions they lead answer LISTENER_NOT_FOUND (v6+; LEADER_NOT_AVAILABLE before), as Kafka
    endpoints = {
        broker_id: ep
        for broker_id, b in sorted(cache.brokers.items())
        if (ep := b.endpoint_for(ctx.listener)) is not None
    }
    reachable = frozenset(endpoints)
    names: list[tuple[str | None, uuid.UUID | None]]
    if request.topics is None:
        names = [(name, None) for name in cache.topic_names()]
    else:
        names = list(request.topics)
    for name, topic_id in names:
        if name is None:  # by topic id: only topics with a known id
            found = next(
                (
                    t
                    for t in cache.topic_names()
                    if topic_id is not None and _topic_uuid(cache.topic(t)) == topic_id
                ),
                None,
            )
            if found is None:
                topic_results.append(_unknown_topic_id(broker, mod, topic_id))
                continue
            name = found
        if not _may_describe(broker, ctx, request, name):
            if request.topics is not None:
                topic_results.append(_unauthorized_topic(broker, mod, name, topic_id))
            continue
        cached = cache.topic(name)
        if cached is None:
            code = ErrorCode.unknown_topic_or_partition
            if topic_name_error(name) is not None:
                code = ErrorCode.invalid_topic_exception
            elif (
                request.allow_auto_topic_creation
                and broker.auto_create_topics
                and name not in INTERNAL_TOPICS
            ):
                if not _may_create(broker, ctx, name):
                    topic_results.append(_unauthorized_topic(broker, mod, name, None))
                    continue
                broker.auto_create(name)
                code = ErrorCode.leader_not_available
            topic_results.append(_error_topic(mod, name, code))
            broker.metrics.error(ApiKey.METADATA, code)
            continue
        partitions = tuple(
            build(
                mod.MetadataResponsePartition,
                error_code=_partition_error(p.leader, reachable, ctx.version),
                partition_index=p.partition,
                leader_id=p.leader,
                leader_epoch=p.leader_epoch,
                replica_nodes=p.replicas,
                isr_nodes=p.isr,
                offline_replicas=p.offline_replicas,
            )
            for p in cache.partitions(name)
        )
        topic_results.append(
            build(
                mod.MetadataResponseTopic,
                error_code=ErrorCode.none,
                name=name,
                topic_id=_topic_uuid(cached) or uuid.UUID(int=0),
                is_internal=name in INTERNAL_TOPICS,
                partitions=partitions,
                topic_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            )
        )
    return build(
        ctx.api.response_type,
        brokers=tuple(
            build(mod.MetadataResponseBroker, node_id=node, host=host, port=port, rack=None)
            for node, (host, port) in endpoints.items()
        ),
        cluster_id=broker.cluster_id,
        controller_id=cache.controller_id if cache.controller_id is not None else -1,
        topics=tuple(topic_results),
        cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


def _partition_error(leader: int, reachable: frozenset[int], version: int) -> ErrorCode:
    if leader < 0:
        return ErrorCode.leader_not_available
    if leader not in reachable:
        return ErrorCode.listener_not_found if version >= 6 else ErrorCode.leader_not_available
    return ErrorCode.none


def _topic_uuid(cached: CachedTopic | None) -> uuid.UUID | None:
    if cached is None or cached.assignment.topic_id is None:
        return None
    try:
        return decode_topic_id(cached.assignment.topic_id)
    except ZnodeFormatError:
        return None


def _unknown_topic_id(broker: Broker, mod: Any, topic_id: uuid.UUID | None) -> Any:
    """A v12+ lookup by an id no topic has (a zero id finds nothing): UNKNOWN_TOPIC_ID, name null."""
    broker.metrics.error(ApiKey.METADATA, ErrorCode.unknown_topic_id)
    return build(
        mod.MetadataResponseTopic,
        error_code=ErrorCode.unknown_topic_id,
        name=None,
        topic_id=topic_id or uuid.UUID(int=0),
    )
