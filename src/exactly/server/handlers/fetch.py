"""Fetch (1), v4+: whole batches up to the high watermark (read_uncommitted) or the last stable
offset (read_committed, with the aborted transactions overlapping the returned range).

Limits follow Kafka (KIP-74): partitions are served in request order, each up to
min(partition_max_bytes, what is left of max_bytes); the first batch of the first non-empty
partition is returned even when it exceeds the limits, so a consumer can always make progress.

Long poll: when fewer than min_bytes are available, the request waits (up to max_wait) for an
event that can complete it on any of its partitions, then reads again: a follower's fetch for an
append (it reads up to the log end), a consumer's for a high-watermark move (see
``delayed_fetch``).

Records of SLICE_FROM bytes or more are answered, when the caller is a connection, as a slice of
the segment file that the connection sends with sendfile (``storage.file_slice``), not a copy.

Replica fetches (cluster mode) read up to the log end and move the leader's HW and ISR; from v12
they carry the follower's last fetched epoch, and a follower whose log diverged gets a
DivergingEpoch and no records (truncation on fetch, ``fetch_checks.check_diverging_epoch``).
A follower's fetch that has to wait is not awaited: the handler returns a ``Deferred`` answer and
parks a callback (``delayed_fetch.ParkedFetch``) that the leader's next append calls; it re-reads
and the answer goes out from inside that append (the connection writes a resolved answer at once,
``deferred_response``). Its effects (the follower's offset moving the HW and ISR) all happen on
arrival, so only the answer is deferred, as ``Deferred`` requires; the follower sends one fetch
at a time, so nothing queues behind it.
Consumers' last fetched epochs are not checked (Kafka checks them too).

Fetch sessions (KIP-227): the broker never creates one (answers session id 0), which clients
treat as "keep sending full fetches"; a request naming an unknown session gets
FETCH_SESSION_ID_NOT_FOUND as in Kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey
from exactly.protocol.fast import FetchPartitionResult, encode_fetch_response
from exactly.protocol.fetch_request_reader import parse_fetch_request
from exactly.replication.fetch_checks import NO_EPOCH, check_diverging_epoch
from exactly.server.authz import CLUSTER_ACTION, READ, TOPIC, authorize, authorize_cluster
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.storage.leader_epoch import EpochEndOffset
from exactly.storage.log_read import OffsetOutOfRangeError
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

log = logging.getLogger(__name__)

API_KEY = ApiKey.FETCH
parse_request = parse_fetch_request  # by hand: the request every append wakes

READ_COMMITTED = 1
# Kafka's FetchRequest.DEBUGGING_CONSUMER_ID: served by any replica (leader or follower) up to that
# replica's high watermark, without follower bookkeeping; the replica verification tool reads with it.
DEBUG_REPLICA_ID = -2
# Records of at least this many bytes go to the connection as a slice of the segment file, sent
# with sendfile (no copy in user space); below it one pread copy is cheaper than the descriptor
# duplicate and the extra system calls.
SLICE_FROM = 64 * 1024


async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    session_id = getattr(request, "session_id", 0)  # v7+ (KIP-227)
    session_epoch = getattr(request, "session_epoch", -1)
    if session_epoch > 0 or (session_id != 0 and session_epoch != -1):
        broker.metrics.error(ApiKey.FETCH, ErrorCode.fetch_session_id_not_found)
        return encode_fetch_response(ctx.version, ErrorCode.fetch_session_id_not_found, 0, [])
    max_wait_s = max(request.max_wait.total_seconds(), 0.0)
    deadline = time.monotonic() + max_wait_s
    tps: list[TopicPartition] | None = None  # built only when the fetch has to park
    # a follower's read is bound by the log end, a consumer's by the high watermark: each parks
    # for the event that can complete it
    from_follower = int(getattr(request, "replica_id", -1)) >= 0 and broker.replicas is not None
    slice_from = SLICE_FROM if ctx.file_slices else None
    denied = _denied_topics(broker, ctx, request)
    first = True
    while True:
        # a follower's fetch offset is recorded once, on arrival (as Kafka's fetchMessages; its
        # DelayedFetch re-reads without it): the re-reads after a wake-up move nothing
        responses, total, errors = _read_all(broker, request, slice_from, denied, first)
        first = False
        remaining = deadline - time.monotonic()
        if total >= request.min_bytes or errors or remaining <= 0:
            break
        if tps is None:
            tps = [TopicPartition(t.topic, p.partition) for t in request.topics for p in t.partitions]
        if not tps:
            break
        if from_follower and ctx.may_defer:
            return Deferred(
                _answer_when_appended(broker, ctx.version, request, tps, deadline, slice_from, denied)
            )
        await broker.waiters.wait(tps, remaining, up_to_log_end=from_follower)
        if time.monotonic() >= deadline:
            responses, total, errors = _read_all(broker, request, slice_from, denied, False)
            break
    return encode_fetch_response(ctx.version, 0, 0, responses)


def _answer_when_appended(
    broker: Broker,
    version: int,
    request: Any,
    tps: list[TopicPartition],
    deadline: float,
    slice_from: int | None,
    denied: frozenset[str],
) -> PendingAnswer[Any]:
    """A parked follower fetch's answer, resolved by the call that completes it (an append, a
    role change, its max_wait): the same re-read and the same completion rule as the awaited
    path in ``handle``. Cancelling it (the connection is gone) unparks it."""
    answer: PendingAnswer[Any] = PendingAnswer()

    def park(remaining: float) -> None:
        parked = broker.waiters.park(tps, remaining, fire, up_to_log_end=True)
        answer.on_cancel(parked.cancel)

    def fire() -> Callable[[], None] | None:
        # runs inside the leader's append: nothing may escape into it. Returns the send (the
        # waker writes every ready answer back to back, see ``delayed_fetch.ParkedFetch``).
        try:
            responses, total, errors = _read_all(broker, request, slice_from, denied, False)
            remaining = deadline - time.monotonic()
            if total < request.min_bytes and not errors and remaining > 0:
                park(remaining)  # a wake-up that brought too few bytes
                return None
            response = encode_fetch_response(version, 0, 0, responses)
        except Exception:
            log.exception("answering a parked follower fetch failed")
            broker.metrics.error(ApiKey.FETCH, ErrorCode.unknown_server_error)
            response = encode_fetch_response(version, ErrorCode.unknown_server_error, 0, [])
        return partial(answer.set_result, response)

    park(max(deadline - time.monotonic(), 0.0))
    return answer


def _denied_topics(broker: Broker, ctx: RequestContext, request: Any) -> frozenset[str]:
    """Topics this fetch may not read: a follower (replica id >= 0) needs CLUSTER_ACTION, else
    every topic is refused; a consumer needs READ on each topic. Asked once per request, before
    any existence check, so an unauthorized topic is never revealed to exist."""
    names = {t.topic for t in request.topics}
    if broker.authorizer is None or not names:
        return frozenset()
    if int(getattr(request, "replica_id", -1)) >= 0:
        return frozenset() if authorize_cluster(broker, ctx, CLUSTER_ACTION) else frozenset(names)
    return frozenset(n for n in names if not authorize(broker, ctx, READ, TOPIC, n))


def _read_all(
    broker: Broker,
    request: Any,
    slice_from: int | None,
    denied: frozenset[str] = frozenset(),
    record_follower: bool = True,
) -> tuple[list[tuple[str, list[FetchPartitionResult]]], int, bool]:
    """Every partition's answer, the record bytes in them and whether one carries an error.
    ``record_follower``: a follower's fetch offsets move the leader's HW and ISR (its first
    read only)."""
    read_committed = request.isolation_level == READ_COMMITTED
    replica_id = int(getattr(request, "replica_id", -1))
    from_follower = replica_id >= 0 and broker.replicas is not None
    debug_read = replica_id == DEBUG_REPLICA_ID
    remaining = request.max_bytes
    min_one = True
    total = 0
    errors = False
    out: list[tuple[str, list[FetchPartitionResult]]] = []
    for topic in request.topics:
        parts: list[FetchPartitionResult] = []
        if topic.topic in denied:
            errors = True
            for p in topic.partitions:
                broker.metrics.error(ApiKey.FETCH, ErrorCode.topic_authorization_failed)
                parts.append(_error_partition(p.partition, ErrorCode.topic_authorization_failed))
            out.append((topic.topic, parts))
            continue
        for p in topic.partitions:
            plog = broker.partition(topic.topic, p.partition)
            replicas = broker.replicas
            if replicas is not None:
                tp = TopicPartition(topic.topic, p.partition)
                epoch = getattr(p, "current_leader_epoch", -1)
                if not replicas.manages(tp):
                    code = ErrorCode.none
                elif from_follower:
                    code = replicas.check_follower_read(tp, replica_id, epoch)
                else:
                    code = replicas.check_read(tp, epoch, require_leader=not debug_read)
                if code != ErrorCode.none:
                    errors = True
                    broker.metrics.error(ApiKey.FETCH, code)
                    parts.append(_error_partition(p.partition, code))
                    continue
            if plog is None:
                errors = True
                broker.metrics.error(ApiKey.FETCH, ErrorCode.unknown_topic_or_partition)
                parts.append(_error_partition(p.partition, ErrorCode.unknown_topic_or_partition))
                continue
            if from_follower and broker.replicas is not None:
                # Fetch v12+ truncation on fetch: the follower's log diverged from ours; answer
                # where its last fetched epoch ends here and record nothing about this fetch.
                check = check_diverging_epoch(
                    plog.leader_epochs.entries,
                    last_fetched_epoch=int(getattr(p, "last_fetched_epoch", NO_EPOCH)),
                    fetch_offset=p.fetch_offset,
                    log_start_offset=plog.log_start_offset,
                    log_end_offset=plog.log_end_offset,
                )
                if check.error != ErrorCode.none:
                    errors = True
                    broker.metrics.error(ApiKey.FETCH, check.error)
                    parts.append(_error_partition(p.partition, check.error))
                    continue
                if check.diverging is not None:
                    errors = True  # answer at once: the follower truncates before fetching on
                    parts.append(_diverging_partition(p.partition, plog, check.diverging))
                    continue
            limit = max(min(p.partition_max_bytes, remaining), 0)
            try:
                result = plog.read(
                    p.fetch_offset,
                    limit,
                    read_committed=read_committed and not from_follower,
                    min_one_batch=min_one,
                    up_to_log_end=from_follower,
                    slice_from=slice_from,
                )
            except OffsetOutOfRangeError:
                errors = True
                broker.metrics.error(ApiKey.FETCH, ErrorCode.offset_out_of_range)
                parts.append(_error_partition(p.partition, ErrorCode.offset_out_of_range))
                continue
            high_watermark = result.high_watermark
            if from_follower and broker.replicas is not None:
                # The follower's fetch offset is its log end: the leader's HW and ISR follow it.
                if record_follower:
                    broker.replicas.on_follower_fetch(
                        plog, replica_id, p.fetch_offset, getattr(p, "log_start_offset", -1)
                    )
                high_watermark = plog.high_watermark
            size = len(result.records)
            if size:
                min_one = False
                remaining -= size
                total += size
            aborted = None
            if read_committed:
                aborted = [(a.producer_id, a.first_offset) for a in (result.aborted_transactions or ())]
            parts.append(
                FetchPartitionResult(
                    p.partition,
                    0,
                    high_watermark,
                    result.last_stable_offset,
                    result.log_start_offset,
                    aborted,
                    result.records,
                )
            )
        out.append((topic.topic, parts))
    return out, total, errors


def _diverging_partition(index: int, plog: PartitionLog, diverging: EpochEndOffset) -> FetchPartitionResult:
    """Kafka's answer to a diverged follower: no records, the offsets, and the DivergingEpoch."""
    return FetchPartitionResult(
        index,
        0,
        plog.high_watermark,
        plog.last_stable_offset,
        plog.log_start_offset,
        None,
        b"",
        diverging_epoch=(diverging.leader_epoch, diverging.end_offset),
    )


def _error_partition(index: int, error_code: int) -> FetchPartitionResult:
    """A partition that carries an error, as Kafka's ReplicaManager.createLogReadResult(e) fills it:
    high watermark, last stable offset and log start offset unknown (-1), no aborted transactions
    (null) and an empty record set - never a null one, which librdkafka cannot parse (it drops the
    whole response without seeing the error code and fetches again at once).

    (For a topic missing from its metadata cache Kafka's KafkaApis uses
    FetchResponse.partitionResponse, which leaves the records null; exactly writes the empty set
    there too, see notes/wire-conformance.md.)
    """
    return FetchPartitionResult(index, error_code, -1, -1, -1, None, b"")
