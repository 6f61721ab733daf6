"""Follower replication: one fetcher task per leader broker (Kafka's ReplicaFetcherThread, as an
asyncio task on the broker's loop).

Each task keeps one connection to its leader and sends Fetch v12 with ``replica_id`` = this
broker's id, the leader epoch it follows as ``current_leader_epoch`` (the leader refuses a stale
or future epoch), each partition's log end offset as the fetch offset (which *is* how the
leader learns the follower's LEO) and its latest local epoch as ``last_fetched_epoch``. Returned
batches are CRC-checked, all of a partition's before any is appended (Kafka's
``analyzeAndValidateRecords`` runs for replicated appends too; a mismatch is logged and fetched
again after a back-off, as Kafka's fetcher does), then appended unchanged (``PartitionLog.append_as_follower``: offsets, leader epochs and
LogAppendTime timestamps as the leader wrote them; producer state with the REPLICATION origin,
which never raises on sequences), then the follower's high watermark becomes min(leader HW, own LEO).

The hot path copies no record byte in user space (every replicated byte passes through here):
the connection (``replica_channel``) receives a large response straight into a reusable buffer,
``exactly.protocol.fetch_response`` finds each partition's records region in that frame, and
``PartitionLog.append_batches_as_follower`` writes the batches from it to the segment; the
request is written by hand (``exactly.protocol.fetch_request``). Only the rare
OffsetsForLeaderEpoch goes through kio's generic codec.

Errors are per partition: NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH
mean the roles are moving; the partition waits for the next observed state (the replica manager
moves it to another fetcher or makes it leader). The connection uses the inter-broker listener's
security protocol (``inter_broker``: TLS, SASL as the broker's configured principal); a refused
authentication or TLS handshake is logged as a warning and retried after a back-off that grows
with each consecutive failure. A lost connection is retried after a back-off; so is a response
that does not come within ``replica.socket.timeout.ms`` (Kafka's fetcher
request timeout): a request or response lost on the way would otherwise stall every partition
of this leader for good, and the follower would never return to the ISR.

Steady state without the task (``_on_frame``): while every partition of a response is a plain
one (no error, no DivergingEpoch, followed in the epoch it was asked in, not truncating or
stopped), the response is handled inside the channel's receive callback and the next Fetch is
written from there: no task wake-up, future or timer per round trip, and no event-loop turn
between the leader's answer and the follower's next Fetch, which is what moves the leader's HW
for an acks=all produce. Anything else is declined *before* any partition is touched and takes
the task's path below; the appends, HW updates and the next request are the same functions
either way (``tests/server/test_replica_fetcher_fast.py`` compares the two). The answer itself is
read in place against the request in flight (``follower_response_fast``: no per-field reader, no
lookups by a new ``TopicPartition``), and the next Fetch is that request's template refilled while
no partition was followed or unfollowed since; any other answer takes the generic reader here.

Truncation (KIP-101/279), as Kafka does since IBP 2.7 (``replication.truncation``): a partition
whose log has epochs starts every new leader epoch FETCHING, and the leader's answer carries a
``DivergingEpoch`` (no records) when the follower's last fetched epoch ends earlier there; the
fetcher cuts its log where ``truncation_offset`` says (``PartitionLog.truncate_to``: log, epoch
cache, producer state) and fetches on (truncation on fetch). When that cut is incomplete (the
follower lacks the leader's epoch, KIP-279) or the log has no epoch at all, the partition is
TRUNCATING: OffsetsForLeaderEpoch for its latest epoch, asked again until the answer is complete
(a follower without any epoch truncates to its HW); only then does it fetch records. The cuts
and the OffsetsForLeaderEpoch questions and answers are ``replica_truncation``'s.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.client.wire import decode_response, encode_request
from exactly.protocol.fetch_request import FetchPosition, ReplicaFetchTemplate
from exactly.protocol.fetch_response import FetchedPartition, parse_fetch_response
from exactly.records.batch import InvalidRecordError, first_corrupt, iter_batches
from exactly.replication.truncation import FollowerPartition, epoch_to_ask
from exactly.server.clock import now_ms
from exactly.server.follower_response_fast import (
    PlannedAnswer,
    PlannedPartition,
    ResponsePlan,
    read_planned,
    still_planned,
)
from exactly.server.inter_broker import is_refusal, refused_backoff_s
from exactly.server.replica_channel import ReplicaChannel
from exactly.server.replica_truncation import (
    FollowedPartition,
    apply_epoch_answers,
    epoch_questions,
    truncate_on_fetch,
)
from exactly.storage.leader_epoch import latest_epoch
from exactly.storage.partition_log import PartitionLog
from exactly.storage.producer_state import ProducerStateError
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.replica_manager import ReplicaManager

log = logging.getLogger("exactly.replica_fetcher")

FETCH_VERSION = 12  # last_fetched_epoch / DivergingEpoch (truncation on fetch)
FETCH_API_KEY = 1
EPOCH_API_KEY = 23
EPOCH_VERSION = 3
MAX_WAIT_MS = 500  # replica.fetch.wait.max.ms
PARTITION_MAX_BYTES = 1_048_576  # replica.fetch.max.bytes
MAX_BYTES = 10_485_760  # replica.fetch.response.max.bytes
BACKOFF_S = 0.2  # replica.fetch.backoff.ms-ish: after a connection failure or a partition error


class CorruptBatchError(Exception):
    """A replicated batch whose CRC32C does not match (Kafka's CorruptRecordException)."""


class _Step(enum.Enum):
    """What the fetcher does instead of sending a Fetch (``LeaderFetcher._next_step``)."""

    IDLE = "no partition active: the task returns and waits for one"
    TRUNCATE = "a partition truncates first: OffsetsForLeaderEpoch"
    NO_LOG = "no active partition has a log: back off"


class LeaderFetcher:
    """Fetches every partition this broker follows from one leader."""

    def __init__(self, manager: ReplicaManager, leader: int) -> None:
        self.manager = manager
        self.leader = leader
        self.partitions: dict[TopicPartition, FollowedPartition] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._correlation = 0
        # The leader epoch each partition of the fetch in flight was asked in (stale answers).
        self._sent_epochs: dict[TopicPartition, int] = {}
        self._client_id = f"replica-{manager.broker_id}"
        self._connect_failures = 0  # consecutive refused authentications/handshakes (back-off)
        self._backoff_after_frame = False  # ``_on_frame`` took a response that asks for a back-off
        self._template: ReplicaFetchTemplate | None = None  # the Fetch for ``_template_key``
        self._template_key: tuple[tuple[TopicPartition, int], ...] = ()
        # the template's partitions, for reading a plain answer in place (follower_response_fast)
        self._plan: ResponsePlan | None = None
        # ``_take_planned``'s next request: the plan's logs in the template's order, when they
        # were every active partition's, and the ``partitions`` membership (``_version``) then
        self._plan_logs: tuple[PartitionLog, ...] | None = None
        self._plan_version = -1
        self._version = 0  # bumped by every follow / unfollow

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{self.leader}"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def follow(self, tp: TopicPartition, leader_epoch: int) -> None:
        """Start (or restart, on a newer epoch) following: always truncating first, even when
        the leader is the same broker (KAFKA-7164) - on fetch when the log has epochs."""
        plog = self.manager.broker.logs.get_partition(tp)
        on_fetch = plog is not None and epoch_to_ask(plog.leader_epochs.entries) is not None
        current = self.partitions.get(tp)
        if current is not None and current.state.on_leader_epoch(
            self.leader, leader_epoch, truncate_on_fetch=on_fetch
        ):
            current.failed = False
        elif current is None or leader_epoch > current.leader_epoch:
            state = FollowerPartition(self.leader, leader_epoch, truncate_on_fetch=on_fetch)
            self.partitions[tp] = FollowedPartition(tp, state)
        self._version += 1
        self._changed.set()

    def unfollow(self, tp: TopicPartition) -> None:
        self.partitions.pop(tp, None)
        self._version += 1

    async def _run(self) -> None:
        while True:
            active = [p for p in self.partitions.values() if not p.failed]
            if not active:
                self._changed.clear()
                await self._changed.wait()
                continue
            endpoint = self.manager.cache.brokers.get(self.leader)
            if endpoint is None:
                await asyncio.sleep(BACKOFF_S)
                continue
            try:
                channel = await self._open(endpoint.host, endpoint.port)
            except (OSError, ValueError) as exc:  # ValueError: a garbled answer during SASL
                if not is_refusal(exc):  # refused, unreachable: the leader is (re)starting
                    log.info("fetcher for leader %d: cannot connect: %s", self.leader, exc)
                    await asyncio.sleep(BACKOFF_S)
                    continue
                await self._back_off(exc)  # refused credentials or certificate
                continue
            try:
                await self._fetch_loop(channel)
            except (OSError, ValueError) as exc:  # ConnectionError, WireFormatError among them
                log.info("fetcher for leader %d: connection lost: %r", self.leader, exc)
                await asyncio.sleep(BACKOFF_S)
            finally:
                channel.close()

    async def _open(self, host: str, port: int) -> ReplicaChannel:
        """A connection to the leader over the inter-broker listener's protocol: TLS when it
        says so, then the SASL exchange (requests through ``_call``, like OffsetsForLeaderEpoch)."""
        client = self.manager.broker.inter_broker
        timeout_s = self.manager.fetch_timeout_s
        channel = await ReplicaChannel.open(host, port, **client.connect_options(host, timeout_s))
        try:
            await client.authenticate(
                lambda request: self._call(
                    channel, request, int(request.__api_key__), int(request.__version__)
                ),
                f"broker {self.leader} at {host}:{port}",
            )
        except BaseException:
            channel.close()
            raise
        return channel

    async def _back_off(self, exc: Exception) -> None:
        """After a refused authentication or TLS handshake (a misconfiguration, not a restart):
        wait longer after each consecutive failure (Kafka's reconnect back-off growing to its
        maximum), so a broker with wrong credentials or trust store keeps retrying without
        flooding the log or its peer."""
        self._connect_failures += 1
        delay = refused_backoff_s(self._connect_failures)
        log.warning(
            "fetcher for leader %d: cannot connect: %s (attempt %d, next in %.1f s)",
            self.leader,
            exc,
            self._connect_failures,
            delay,
        )
        await asyncio.sleep(delay)

    async def _fetch_loop(self, channel: ReplicaChannel) -> None:
        while True:
            request = self._next_step()
            if request is _Step.IDLE:
                return
            if request is _Step.TRUNCATE:
                await self._truncate(
                    channel, [p for p in self.partitions.values() if p.truncating and not p.failed]
                )
                continue
            if request is _Step.NO_LOG:
                await asyncio.sleep(BACKOFF_S)
                continue
            frame = await channel.call(request, self.manager.fetch_timeout_s, self._on_frame)
            self._connect_failures = 0
            if frame is None:  # ``_on_frame`` handled the responses and gave control back
                if self._backoff_after_frame:
                    self._backoff_after_frame = False
                    await asyncio.sleep(BACKOFF_S)
                continue
            response = parse_fetch_response(frame, FETCH_VERSION)
            self._check_correlation(response.correlation_id)
            if response.error_code != 0:
                log.info("fetcher for leader %d: fetch error %d", self.leader, response.error_code)
                await asyncio.sleep(BACKOFF_S)
                continue
            backoff = False
            for part in response.partitions:
                if not self._handle_partition(frame, part):
                    backoff = True
            del response
            channel.release(frame)  # nothing refers to it any more: the next response reuses it
            del frame
            if backoff:
                await asyncio.sleep(BACKOFF_S)

    def _on_frame(self, frame: bytearray) -> bytearray | bool:
        """A Fetch response, in the channel's receive callback (module docstring): False (the
        task handles it; nothing was changed) unless every partition is plain, then handled as
        the task would and, when the task would go straight on fetching, the next request."""
        plan = self._plan
        if plan is not None:  # the steady state: the plain answer to the request in flight
            answers = read_planned(frame, plan, self._correlation)
            if answers is not None:
                if still_planned(
                    answers, self.partitions, self._sent_epochs, self.manager.broker.logs.get_partition
                ):
                    return self._take_planned(frame, answers)
                self._template = None  # a partition moved on: the next request builds a new plan
        response = parse_fetch_response(frame, FETCH_VERSION)
        if response.correlation_id != self._correlation or response.error_code != 0:
            return False
        partitions = self.partitions
        sent = self._sent_epochs
        get_partition = self.manager.broker.logs.get_partition
        for part in response.partitions:
            if part.error_code != 0 or part.diverging_epoch is not None:
                return False
            tp = TopicPartition(part.topic, part.partition)
            followed = partitions.get(tp)
            if (
                followed is None
                or followed.failed
                or followed.truncating
                or sent.get(tp) != followed.leader_epoch
                or get_partition(tp) is None
            ):
                return False
        self._connect_failures = 0
        backoff = False
        for part in response.partitions:
            if not self._handle_partition(frame, part):
                backoff = True  # a batch the log refused: that partition stopped
        del response
        return self._after_frame(backoff)

    def _take_planned(self, frame: bytearray, answers: list[PlannedAnswer]) -> bytearray | bool:
        """A checked planned answer: each partition taken as ``_handle_partition`` takes a plain one."""
        self._connect_failures = 0
        backoff = False
        for planned, hw, start, end in answers:
            if not self._take_records(planned.followed, planned.plog, frame, start, end, hw):
                backoff = True
        logs = self._plan_logs
        if backoff or logs is None or self._plan_version != self._version:
            return self._after_frame(backoff)
        # No follow / unfollow since the plan, which held every active partition, each checked
        # plain just now (not stopped, not truncating, same epoch and log): ``_next_step`` would
        # build this same template and fill it from these same logs.
        self._correlation += 1
        return self._template_fill(logs)

    def _template_fill(self, logs: tuple[PartitionLog, ...] | list[PartitionLog]) -> bytearray:
        """The current template, with each log's positions (in the template's partition order)."""
        template = self._template
        assert template is not None
        return template.fill(
            self._correlation,
            [
                (plog.log_end_offset, latest_epoch(plog.leader_epochs.entries), plog.log_start_offset)
                for plog in logs
            ],
        )

    def _after_frame(self, backoff: bool) -> bytearray | bool:
        """``_on_frame``'s outcome after its partitions were handled: a back-off for the task, or
        the next request (True: the task decides what comes instead)."""
        if backoff:
            self._backoff_after_frame = True
            return True
        request = self._next_step()
        return True if isinstance(request, _Step) else request

    def _next_step(self) -> bytearray | _Step:
        """What comes after a handled response, for the task and ``_on_frame`` alike: the next
        Fetch (go on fetching), or what the task must do instead - return (no partition active),
        truncate first (OffsetsForLeaderEpoch), back off (no active partition has a log)."""
        active = [p for p in self.partitions.values() if not p.failed]
        if not active:
            return _Step.IDLE
        if any(p.truncating for p in active):
            return _Step.TRUNCATE
        request = self._build(active)
        return _Step.NO_LOG if request is None else request

    def _check_correlation(self, corr: int) -> None:
        if corr != self._correlation:
            raise ValueError(f"correlation id {corr}, expected {self._correlation}")

    async def _call(self, channel: ReplicaChannel, request: Any, api_key: int, version: int) -> Any:
        """A request answered through kio's generic reader (the rare, small ones)."""
        self._correlation += 1
        frame = await channel.call(
            encode_request(request, self._correlation, self._client_id), self.manager.fetch_timeout_s
        )
        assert frame is not None  # no frame handler: the call returns the frame
        corr, response = decode_response(api_key, version, bytes(frame))
        self._check_correlation(corr)
        return response

    async def _truncate(self, channel: ReplicaChannel, truncating: list[FollowedPartition]) -> None:
        """One OffsetsForLeaderEpoch round for every truncating partition; each answer cuts the
        log and either completes the truncation or asks again next round (KIP-279)."""
        logs = self.manager.broker.logs
        request, asked_for = epoch_questions(self.manager.broker_id, truncating, logs)
        if request is None:
            return
        response = await self._call(channel, request, EPOCH_API_KEY, EPOCH_VERSION)
        if apply_epoch_answers(response, asked_for, self.partitions, logs):
            await asyncio.sleep(BACKOFF_S)

    def _build(self, active: list[FollowedPartition]) -> bytearray | None:
        """The Fetch request frame for every active partition, or None when none has a log:
        written from a template kept while the partitions and their leader epochs stay the same
        (``exactly.protocol.fetch_request``), with each log's current positions."""
        get_partition = self.manager.broker.logs.get_partition
        logs: list[PartitionLog] = []
        fetched: list[FollowedPartition] = []
        version = self._version
        key: list[tuple[TopicPartition, int]] = []
        for followed in active:
            plog = get_partition(followed.tp)
            if plog is None:
                continue
            logs.append(plog)
            fetched.append(followed)
            key.append((followed.tp, followed.leader_epoch))
        if not logs:
            return None
        sent = tuple(key)
        template = self._template
        if template is None or sent != self._template_key:
            self._template = self._new_template(sent)
            self._template_key = sent
            self._sent_epochs = dict(sent)  # unchanged while the template is
            self._plan = None
        if self._plan is None or self._plan_version != version:
            self._plan = ResponsePlan.of(
                [PlannedPartition(f.tp, f, plog) for f, plog in zip(fetched, logs, strict=True)]
            )
            self._plan_logs = tuple(logs) if len(logs) == len(active) else None
            self._plan_version = version
        self._correlation += 1
        return self._template_fill(logs)

    def _new_template(self, sent: tuple[tuple[TopicPartition, int], ...]) -> ReplicaFetchTemplate:
        """The request's fixed part for these partitions; the template's partition order is that
        of ``sent`` (topics grouped in first-seen order, as the encoder writes them)."""
        by_topic: dict[str, list[tuple[int, FetchPosition]]] = {}
        for i, (tp, epoch) in enumerate(sent):
            by_topic.setdefault(tp.topic, []).append(
                (i, FetchPosition(tp.partition, epoch, 0, 0, PARTITION_MAX_BYTES))
            )
        written = [i for parts in by_topic.values() for i, _ in parts]
        template = ReplicaFetchTemplate.build(
            FETCH_VERSION,
            self._client_id,
            replica_id=self.manager.broker_id,
            max_wait_ms=MAX_WAIT_MS,
            min_bytes=1,
            max_bytes=MAX_BYTES,
            topics=[(topic, [p for _, p in parts]) for topic, parts in by_topic.items()],
        )
        starts = [0] * len(sent)
        for start, i in zip(template.starts, written, strict=True):
            starts[i] = start
        return ReplicaFetchTemplate(template.frame, tuple(starts), template.version)

    def _handle_partition(self, frame: bytearray, part: FetchedPartition) -> bool:
        """Append what came back (``frame[part.records_start:part.records_end]``, read in place);
        False when the partition needs a back-off."""
        tp = TopicPartition(part.topic, part.partition)
        followed = self.partitions.get(tp)
        plog = self.manager.broker.logs.get_partition(tp)
        if followed is None or plog is None:
            return True  # unfollowed while the fetch was in flight
        code = part.error_code
        if code != ErrorCode.none:
            if code == ErrorCode.offset_out_of_range:
                followed.failed = True
                log.error(
                    "%s: leader %d answered OFFSET_OUT_OF_RANGE at %d; truncation is not built, "
                    "replication of this partition stopped",
                    tp,
                    self.leader,
                    plog.log_end_offset,
                )
            return False
        diverging = part.diverging_epoch
        if diverging is not None:  # the tagged field is present
            if followed.truncating or self._sent_epochs.get(tp) != followed.leader_epoch:
                return True  # asked in an older epoch: the new epoch's own check decides
            truncate_on_fetch(followed, plog, diverging)
            return True
        return self._take_records(
            followed, plog, frame, part.records_start, part.records_end, part.high_watermark
        )

    def _take_records(
        self, followed: FollowedPartition, plog: PartitionLog, frame: bytearray, start: int, end: int, hw: int
    ) -> bool:
        """A plain partition answer (no error, no DivergingEpoch): its batches appended, then the
        follower's HW; False when the partition stopped (needs a back-off)."""
        if end > start:
            try:
                self._append(plog, frame, start, end)
            except CorruptBatchError as exc:
                # Kafka's fetcher on a CorruptRecordException: log, back off, fetch it again
                # (a torn read on the leader heals; this log, its HW and the partition stay as they were)
                log.error(
                    "%s: found invalid messages during fetch (leader %d): %s", followed.tp, self.leader, exc
                )
                return False
            except (InvalidRecordError, ProducerStateError) as exc:
                # A batch this log cannot take (an unreadable marker, data inside an open
                # transaction): stop this partition, not the fetcher of every other one.
                followed.failed = True
                log.error(
                    "%s: replicated batch refused, replication of this partition stopped: %s",
                    followed.tp,
                    exc,
                )
                return False
        plog.update_high_watermark(min(hw, plog.log_end_offset))
        self.manager.broker.waiters.notify(followed.tp)
        return True

    def _append(self, plog: PartitionLog, frame: bytearray, start: int, end: int) -> None:
        """Append the whole batches in ``frame[start:end]`` (a partial last batch, cut by the
        leader's size limit, is left for the next fetch) straight from the response frame:
        each header's ``position`` is absolute in ``frame``, so no batch is copied out."""
        headers = [h for h in iter_batches(frame, start, end) if h.last_offset >= plog.log_end_offset]
        if headers:  # a batch below the log end is one we already have (it began before our offset)
            corrupt = first_corrupt(frame, headers)  # every batch checked before any is appended
            if corrupt is not None:
                raise CorruptBatchError(f"batch at offset {corrupt.base_offset}: CRC32C mismatch")
            plog.append_batches_as_follower(frame, headers, now_ms=now_ms())
