"""A cluster leader's answer to a steady-state follower Fetch in one pass over the frame: a fast
path beside the generic one (``handlers.fetch``).

Why: at RF 3 acks=all every produce costs the leader two follower Fetches, and the CPU profile
of the leader (bench/results/cluster-tail-s17.md) charged about half of its ~645 µs per message
to the generic Fetch machinery serving them: the request parsed into objects, the handler's
coroutine, a ``_read_all`` on arrival (which in steady state finds nothing: the follower asks at
the leader's log end) and another on the append's wake-up, dispatch's framing. This path reads
the request in place with ``unpack_from`` (the shape ``protocol.fetch_request`` writes), skips
the arrival read when every partition is asked at the log end (it cannot find a byte there),
parks a ``delayed_fetch.ParkedFetch`` without a task, and frames the answer itself.

What it keeps of the generic path, by calling the same functions in the same order: per
partition ``ReplicaManager.check_follower_read``, the log present, the offset inside the log,
``check_diverging_epoch`` (skipped only when the follower asks in the leader's latest epoch, where
it cannot find a divergence), then ``PartitionLog.read`` (up to the log end) and
``LeaderReplicas.on_follower_fetch`` (follower LEO, HW, ISR expansion, delayed produces
completed). The answer is written in place (``_frame``) with the bytes ``encode_fetch_response``
writes for the same partitions (tests compare the two). The follower's offsets are recorded on
arrival only, as there.

Contract: ``FollowerFetch.answer`` either takes the request completely or returns None having
changed nothing (every partition is checked before the first ``on_follower_fetch``), and the
dispatcher's generic path answers it. It takes only a replica's (replica id >= 0) Fetch v11/v12
without a session, forgotten topics or tagged fields, read_uncommitted, of one or more
partitions, on a cluster broker without an authorizer, from a caller that takes deferred
answers, when every partition passes the replica checks (right epoch, this broker leads, the
fetcher is a replica), has no diverging epoch and is asked inside its log. Anything else
(errors, NOT_LEADER / FENCED epochs, truncation, unknown partitions, an authorizer) is the
generic path's. A parked fetch whose checks fail when it wakes (a role change, a deleted topic)
is answered by the generic handler's own read of the same request (``handlers.fetch._read_all``).
A wake-up repeats the replica checks (``check_follower_read``) only when
``ReplicaManager.role_changes`` moved since the request passed them, and an arrival only when it
moved since the same replica's last Fetch of the same partitions in the same epochs passed them:
every change to what they read (assignments, roles and epochs, leaderships) counts there first,
before it wakes anything, so an append's wake-up (the steady state) only re-checks the logs
(present, open, offset inside, divergence): two of the four ``check_follower_read`` passes per acks=all message at RF 3
(bench/results/rf3p99-s19.md); the arrival skip (``FollowerFetch._passed``) removes the other two
(bench/results/rf3cpu-s20.md).
Equivalence: tests/server/test_follower_fetch_fast.py.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Sized
from functools import partial
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey
from exactly.protocol.fast import encode_fetch_response
from exactly.protocol.fetch_request_reader import parse_fetch_request
from exactly.protocol.primitives import write_uvarint
from exactly.replication.fetch_checks import NO_EPOCH, check_diverging_epoch
from exactly.server.deferred_response import Deferred, PendingAnswer
from exactly.server.fetch_fast import frame_answer
from exactly.server.follower_fetch_shape import FetchShapes
from exactly.server.handlers.fetch import SLICE_FROM, _read_all
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.replica_manager import ReplicaManager
    from exactly.storage.partition_log import PartitionLog

log = logging.getLogger(__name__)

_FETCH = int(ApiKey.FETCH)
_NONE = ErrorCode.none
_HEADER = struct.Struct(">hhih")  # api key, version, correlation id, client id length
_TOP = struct.Struct(">iiiibii")  # replica, max wait, min bytes, max bytes, isolation, session id, epoch
_PART_V12 = struct.Struct(">iiqiqi")  # partition, current epoch, offset, last fetched epoch, log start, max
_PART_V11 = struct.Struct(">iiqqi")  # partition, current epoch, offset, log start, max bytes
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
# the answer's head: size, correlation id, (v12: header tags), throttle, error, session id, topics
_HEAD_V11 = struct.Struct(">iiihii")
_HEAD_V12 = struct.Struct(">iiBihiB")
_PART_HEAD = struct.Struct(">ihqqq")  # index, error, high watermark, last stable offset, log start
_NULL_ABORTED_V12 = b"\x00\xff\xff\xff\xff"  # aborted transactions null, preferred replica -1
_NULL_ABORTED_V11 = b"\xff\xff\xff\xff\xff\xff\xff\xff"

# (partition, current leader epoch, fetch offset, last fetched epoch, log start, partition max bytes, tp)
_Part = tuple[int, int, int, int, int, int, TopicPartition]


class FollowerFetch:
    """One cluster broker's fast path for its followers' Fetches (see the module docstring)."""

    __slots__ = ("_broker", "_passed", "_shapes")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        # each replica's last Fetch layout: its next one is read by comparison (rf3hop-s21)
        self._shapes = FetchShapes()
        # Per replica id: ``replicas.role_changes`` when that replica's last Fetch passed
        # ``check_follower_read`` for every partition, and its (topic, partition, current
        # leader epoch) list. A follower asks for the same partitions in the same epochs Fetch
        # after Fetch; while nothing those checks read has changed (every change bumps
        # ``role_changes`` first, the same invariant the wake-up relies on) they would answer
        # the same again, so an arrival with the same list skips them (two of the leader's
        # four passes per acks=all message at RF 3; the log checks always run). At most one
        # entry per broker of the cluster.
        self._passed: dict[int, tuple[int, list[tuple[str, int, int]]]] = {}

    def answer(self, payload: bytearray, file_slices: bool) -> list[Any] | Deferred[list[Any] | None] | None:
        """The framed answer (or a Deferred one, parked); None: not taken, nothing changed."""
        broker = self._broker
        replicas = broker.replicas
        if replicas is None or broker.authorizer is not None:
            return None
        request = self._shapes.parse(payload)
        positions: list[int] | None = None
        if request is None:
            positions = []
            try:
                request = _parse(payload, positions)
            except (IndexError, struct.error, UnicodeDecodeError):  # past the end of the frame
                return None
            if request is None:
                return None
        version, correlation_id, replica_id, max_wait_ms, min_bytes, max_bytes, topics = request
        deadline = time.monotonic() + max(max_wait_ms, 0) / 1000.0
        checked_at = replicas.role_changes
        asked = [(name, p[0], p[1]) for name, parts in topics for p in parts]
        passed = self._passed.get(replica_id)
        same = passed is not None and passed[0] == checked_at and passed[1] == asked
        logs = _checked(broker, replicas, replica_id, topics, replica_checks=not same)
        if logs is None:
            return None
        if positions is not None:
            # the shape keeps each log's own tp (equal to the parsed one): the dict lookups of
            # the next Fetches then find their key by identity, without an equality test
            self._shapes.remember(payload, request, positions, [plog.tp for _p, plog in logs])
        if not same:
            self._passed[replica_id] = (checked_at, asked)
        # from here on the request is taken
        broker.metrics.requests[_FETCH] += 1
        slice_from = SLICE_FROM if file_slices else None
        on_follower_fetch = replicas.on_follower_fetch
        if min_bytes > 0 and max_wait_ms > 0 and all(p[2] == plog.log_end_offset for p, plog in logs):
            # every partition asked at the log end: the generic read finds nothing, so only the
            # follower's offsets are recorded before parking (same calls, same order)
            for p, plog in logs:
                on_follower_fetch(plog, replica_id, p[2], p[4])
        else:
            responses, total = _read(topics, logs, max_bytes, slice_from, replica_id, on_follower_fetch)
            if total >= min_bytes or deadline - time.monotonic() <= 0:
                return _frame(broker, version, correlation_id, responses)
        parked = _Parked(broker, payload, version, correlation_id, replica_id, min_bytes, max_bytes, topics)
        parked.checked_at = checked_at
        parked.park(deadline, slice_from)
        return Deferred(parked.answer)


def _parse(
    payload: bytearray, positions: list[int] | None = None
) -> tuple[int, int, int, int, int, int, list[tuple[str, list[_Part]]]] | None:
    """The replica fetcher's Fetch shape (protocol.fetch_request), or None for anything else;
    ``positions`` (given) gets the start of each partition's entry, in order."""
    end = len(payload)
    api_key, version, correlation_id, client_len = _HEADER.unpack_from(payload, 0)
    if api_key != _FETCH or version not in (11, 12):
        return None
    flexible = version == 12
    pos = 10 + max(client_len, 0)
    if flexible:
        if payload[pos]:  # header tags
            return None
        pos += 1
    replica_id, max_wait_ms, min_bytes, max_bytes, isolation, session_id, session_epoch = _TOP.unpack_from(
        payload, pos
    )
    if replica_id < 0 or isolation != 0 or session_id != 0 or session_epoch != -1:
        return None
    count, pos = _count(payload, pos + 25, flexible, _I32)
    if not 0 < count < 0x7F:
        return None
    topics: list[tuple[str, list[_Part]]] = []
    for _ in range(count):
        n, pos = _count(payload, pos, flexible, _I16)
        if n < 1 or (flexible and n >= 0x7F):
            return None
        name = payload[pos : pos + n].decode("utf-8")
        nparts, pos = _count(payload, pos + n, flexible, _I32)
        if not 0 < nparts < 0x7F:
            return None
        parts: list[_Part] = []
        for _ in range(nparts):
            if positions is not None:
                positions.append(pos)
            if flexible:
                index, epoch, offset, last_epoch, log_start, pmax = _PART_V12.unpack_from(payload, pos)
                pos += 32
                if payload[pos]:  # partition tags
                    return None
                pos += 1
            else:
                index, epoch, offset, log_start, pmax = _PART_V11.unpack_from(payload, pos)
                last_epoch = NO_EPOCH
                pos += 28
            parts.append((index, epoch, offset, last_epoch, log_start, pmax, TopicPartition(name, index)))
        if flexible:
            if payload[pos]:  # topic tags
                return None
            pos += 1
        topics.append((name, parts))
    if flexible:  # no forgotten topics, rack id "", no request tags
        if payload[pos] != 1 or payload[pos + 1] != 1 or payload[pos + 2] != 0:
            return None
        pos += 3
    else:
        if _I32.unpack_from(payload, pos)[0] != 0:
            return None
        rack = _I16.unpack_from(payload, pos + 4)[0]
        if rack < 0:
            return None
        pos += 6 + rack
    if pos != end:
        return None
    return version, correlation_id, replica_id, max_wait_ms, min_bytes, max_bytes, topics


def _count(payload: bytearray, pos: int, flexible: bool, wide: struct.Struct) -> tuple[int, int]:
    """An array's count or a string's length at ``pos``, and the position after it: flexible
    versions write one compact unsigned varint (N + 1), read here as one byte only - a longer
    varint (first byte >= 0x80) gives >= 0x7F, which every caller declines; the others ``wide``
    (int32 counts, int16 string lengths)."""
    if flexible:
        return payload[pos] - 1, pos + 1
    return wide.unpack_from(payload, pos)[0], pos + wide.size


def _checked(
    broker: Broker,
    replicas: ReplicaManager,
    replica_id: int,
    topics: list[tuple[str, list[_Part]]],
    replica_checks: bool = True,
) -> list[tuple[_Part, PartitionLog]] | None:
    """Every partition with its log when each passes the generic path's checks for a follower
    read (in its order) and asks inside its log; None when one does not (nothing changed).
    ``replica_checks=False``: the request passed ``check_follower_read`` for every partition
    with ``replicas.role_changes`` as it is now, so that check would give the same answer again;
    the log checks (present, open, offset inside, divergence) always run."""
    get = broker.logs.get_partition
    out: list[tuple[_Part, PartitionLog]] = []
    for _name, parts in topics:
        for p in parts:
            tp = p[6]
            if replica_checks and replicas.check_follower_read(tp, replica_id, p[1]) != _NONE:
                return None
            plog = get(tp)
            if plog is None or plog.closed:
                return None
            offset = p[2]
            log_start, log_end = plog.log_start_offset, plog.log_end_offset
            if offset < log_start or offset > log_end:
                return None  # OFFSET_OUT_OF_RANGE: the generic path answers it
            entries = plog.leader_epochs.entries
            # Asked in the leader's latest epoch (the steady state), the follower cannot have
            # diverged: that epoch ends at the log end (``end_offset_for``), not before this
            # in-log offset, so ``check_diverging_epoch`` would find nothing; it runs otherwise.
            if not (entries and p[3] == entries[-1].epoch):
                check = check_diverging_epoch(
                    entries,
                    last_fetched_epoch=p[3],
                    fetch_offset=offset,
                    log_start_offset=log_start,
                    log_end_offset=log_end,
                )
                if check.error != _NONE or check.diverging is not None:
                    return None
            out.append((p, plog))
    return out


# (partition index, high watermark, last stable offset, log start offset, records) of a checked
# partition's answer: no error, no aborted transactions (read_uncommitted), no DivergingEpoch
_Answer = tuple[int, int, int, int, Sized]


def _read(
    topics: list[tuple[str, list[_Part]]],
    logs: list[tuple[_Part, PartitionLog]],
    max_bytes: int,
    slice_from: int | None,
    replica_id: int,
    on_follower_fetch: Callable[[PartitionLog, int, int, int], None] | None,
) -> tuple[list[tuple[str, list[_Answer]]], int]:
    """``handlers.fetch._read_all`` for checked partitions: each read up to the log end, then
    (``on_follower_fetch``: on arrival) the follower's offsets recorded, then its answer."""
    remaining = max_bytes
    min_one = True
    total = 0
    out: list[tuple[str, list[_Answer]]] = []
    i = 0
    for name, parts in topics:
        results: list[_Answer] = []
        for _ in parts:
            p, plog = logs[i]
            i += 1
            result = plog.read(
                p[2],
                max(min(p[5], remaining), 0),
                read_committed=False,
                min_one_batch=min_one,
                up_to_log_end=True,
                slice_from=slice_from,
            )
            if on_follower_fetch is not None:
                on_follower_fetch(plog, replica_id, p[2], p[4])
            size = len(result.records)
            if size:
                min_one = False
                remaining -= size
                total += size
            results.append(
                (
                    p[0],
                    plog.high_watermark,
                    result.last_stable_offset,
                    result.log_start_offset,
                    result.records,
                )
            )
        out.append((name, results))
    return out, total


def _frame(
    broker: Broker, version: int, correlation_id: int, topics: list[tuple[str, list[_Answer]]]
) -> list[Any]:
    """The framed answer, written in place: the bytes of ``fetch_fast.frame_answer`` of
    ``encode_fetch_response(version, 0, 0, ...)`` for these partitions (each without error,
    aborted transactions null, preferred read replica -1, no tagged fields), without building a
    ``FetchPartitionResult`` per partition or the encoder's per-field writes. The parser took
    fewer than 127 topics and partitions per topic and topic names shorter than 127 bytes, so in
    v12 each of their compact lengths is one byte; the records' size is a full varint."""
    flexible = version >= 12
    out = bytearray(_HEAD_V12.size if flexible else _HEAD_V11.size)  # the frame head, packed last
    chunks: list[Any] = [out]
    size = 0
    for name, parts in topics:
        key = (name, len(parts), flexible)
        topic_head = _TOPIC_HEADS.get(key)
        if topic_head is None:
            topic_head = _topic_head(*key)
        out += topic_head
        for index, hw, lso, log_start, records in parts:
            out += _PART_HEAD.pack(index, 0, hw, lso, log_start)
            n = len(records)
            if flexible:
                out += _NULL_ABORTED_V12 + write_uvarint(n + 1)
            else:
                out += _NULL_ABORTED_V11 + _I32.pack(n)
            if n:
                size += len(out) + n
                chunks.append(records)
                out = bytearray()
                chunks.append(out)
            if flexible:
                out.append(0)  # partition tags
        if flexible:
            out.append(0)  # topic tags
    if flexible:
        out.append(0)  # response tags
    size += len(out)
    head = chunks[0]
    if flexible:
        _HEAD_V12.pack_into(head, 0, size - 4, correlation_id, 0, 0, 0, 0, len(topics) + 1)
    else:
        _HEAD_V11.pack_into(head, 0, size - 4, correlation_id, 0, 0, 0, len(topics))
    broker.metrics.bytes_out += size
    return chunks


# (topic name, partitions, flexible) -> the answer's bytes before its first partition: the same
# few topics are answered thousands of times a second (at most _TOPIC_HEADS_MAX kept)
_TOPIC_HEADS: dict[tuple[str, int, bool], bytes] = {}
_TOPIC_HEADS_MAX = 1024


def _topic_head(name: str, parts: int, flexible: bool) -> bytes:
    """A topic's head in an answer: its name and partition count (v12 compact, one byte each:
    ``_parse`` took names < 127 bytes and < 127 partitions)."""
    raw = name.encode("utf-8")
    if flexible:
        head = bytes([len(raw) + 1]) + raw + bytes([parts + 1])
    else:
        head = _I16.pack(len(raw)) + raw + _I32.pack(parts)
    if len(_TOPIC_HEADS) >= _TOPIC_HEADS_MAX:
        _TOPIC_HEADS.clear()
    _TOPIC_HEADS[(name, parts, flexible)] = head
    return head


class _Parked:
    """A taken follower Fetch waiting for an append (``delayed_fetch.park``, log-end bound), with
    the generic path's completion rule (min_bytes reached or max_wait over) and re-read. It is
    answered from inside the append that wakes it; cancelling ``answer`` unparks it."""

    __slots__ = (
        "answer",
        "broker",
        "checked_at",
        "correlation_id",
        "deadline",
        "max_bytes",
        "min_bytes",
        "payload",
        "replica_id",
        "slice_from",
        "topics",
        "tps",
        "version",
    )  # fmt: skip

    def __init__(
        self, broker: Broker, payload: bytearray, version: int, correlation_id: int, replica_id: int,
        min_bytes: int, max_bytes: int, topics: list[tuple[str, list[_Part]]],
    ) -> None:  # fmt: skip
        self.answer: PendingAnswer[list[Any] | None] = PendingAnswer()
        self.broker = broker
        self.payload = payload
        self.version = version
        self.correlation_id = correlation_id
        self.replica_id = replica_id
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.topics = topics
        self.tps = [p[6] for _name, parts in topics for p in parts]
        self.deadline = 0.0
        self.slice_from: int | None = None
        # ``replicas.role_changes`` when this request last passed every check (-1: never)
        self.checked_at = -1

    def park(self, deadline: float, slice_from: int | None) -> None:
        self.deadline = deadline
        self.slice_from = slice_from
        self._park()

    def _park(self) -> None:
        remaining = max(self.deadline - time.monotonic(), 0.0)
        parked = self.broker.waiters.park(self.tps, remaining, self.fire, up_to_log_end=True)
        self.answer.on_cancel(parked.cancel)

    def fire(self) -> Callable[[], None] | None:
        """Woken (an append, a role change, its max_wait): read again; returns what sends the
        answer (None: parked again). Runs inside the waker: nothing may escape it."""
        broker = self.broker
        version = self.version
        try:
            replicas = broker.replicas
            logs = None
            if replicas is not None:
                # No role, epoch, assignment or leadership change since the request passed its
                # replica checks (the common wake-up: an append): only the log checks again.
                checked_at = replicas.role_changes
                same = checked_at == self.checked_at
                logs = _checked(broker, replicas, self.replica_id, self.topics, replica_checks=not same)
                self.checked_at = checked_at if logs is not None else -1
            if logs is not None:
                answers, total = _read(
                    self.topics, logs, self.max_bytes, self.slice_from, self.replica_id, None
                )
                if total < self.min_bytes and self.deadline - time.monotonic() > 0:
                    self._park()  # a wake-up that brought too few bytes
                    return None
                framed = _frame(broker, version, self.correlation_id, answers)
                return partial(self.answer.set_result, framed)
            # the generic re-read answers what changed (errors, divergence)
            responses, total, errors = _read_all(broker, self._request(), self.slice_from, frozenset(), False)
            if total < self.min_bytes and not errors and self.deadline - time.monotonic() > 0:
                self._park()
                return None
            body = encode_fetch_response(version, 0, 0, responses)
        except Exception:
            log.exception("answering a parked follower fetch failed")
            broker.metrics.error(ApiKey.FETCH, ErrorCode.unknown_server_error)
            body = encode_fetch_response(version, ErrorCode.unknown_server_error, 0, [])
        return partial(self.answer.set_result, frame_answer(broker, version, self.correlation_id, body))

    def _request(self) -> Any:
        payload = self.payload
        pos = 10 + max(_I16.unpack_from(payload, 8)[0], 0) + (1 if self.version >= 12 else 0)
        return parse_fetch_request(payload, pos, self.version)


__all__ = ["FollowerFetch"]
