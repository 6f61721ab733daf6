"""The common consumer Fetch answered in one pass over the frame: a fast path beside the generic one.

Why: at ``latency-1k`` (1,000 acks=all produces/s and a consumer whose long-poll Fetch each append
wakes) a consumer Fetch is every other request the broker handles, and the CPU-time profile of
the broker there (bench/results/fetch-fast-s17.md) charged the generic path about 85 Python calls
per Fetch between the frame and its answer: the header parser's objects, the body parser's
nested functions, slotted dataclasses and timedelta (``fetch_request_reader``), the handler's
per-partition loop and ``FetchPartitionResult``, the response writer's per-field appends and the
dispatcher's framing; and a parked Fetch held the connection's task in an ``await`` that each
append woke through a future and a task step. This path reads the request in place with a few
``unpack_from`` calls, answers from a per-(topic, partition, version) struct and the log's
record bytes (or a file slice, sent with sendfile), and parks as a ``delayed_fetch.ParkedFetch``
whose answer the connection writes from the wake-up call (``deferred_response.PendingAnswer``):
no task step per wake-up.

Contract: ``FastFetch.answer`` either takes the request completely (the same bytes the generic
path writes, the same metrics) or returns None having changed nothing (a read is not a change),
and the dispatcher then runs the generic path, which re-reads the frame from the start. It takes
only a consumer's (replica id -1) session-less Fetch v4-v12 of one topic and one partition,
without forgotten topics or request tagged fields, read_uncommitted or read_committed, on a
single broker without an authorizer, from a connection that takes deferred answers, of a
partition that exists (not an internal topic) at an offset inside the log. Anything else --
errors, sessions, several partitions, replica fetches, a cluster (epochs, leadership, follower
bookkeeping), an authorizer -- goes the generic way. A parked fetch whose partition is gone or
whose offset left the log when it wakes (a topic deleted, DeleteRecords) is answered by the
generic handler's own read of the same request (``handlers.fetch._read_all``), which answers
those errors. Equivalence: tests/server/test_fetch_fast.py.
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
from exactly.server.deferred_response import Deferred, ExclusiveAnswer
from exactly.server.delayed_fetch import ParkedFetch
from exactly.server.handlers.fetch import READ_COMMITTED, SLICE_FROM, _read_all
from exactly.storage.log_read import OffsetOutOfRangeError
from exactly.topics import INTERNAL_TOPICS
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.storage.partition_log import PartitionLog

log = logging.getLogger(__name__)

_FETCH = int(ApiKey.FETCH)
# api key, api version, correlation id, client id length (request header v1/v2 up to the client id)
_HEADER = struct.Struct(">hhih")
# replica id, max wait ms, min bytes, max bytes, isolation level (+ session id and epoch, v7+)
_TOP_V4 = struct.Struct(">iiiib")
_TOP_V7 = struct.Struct(">iiiibii")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ABORTED = struct.Struct(">qq")
# one partition of the request, as fetch_request_reader reads it per version
_PARTITION = {
    v: struct.Struct(">iiqiqi" if v >= 12 else ">iiqqi" if v >= 9 else ">iqqi" if v >= 5 else ">iqi")
    for v in range(4, 13)
}
_NULL_ARRAY = b"\xff\xff\xff\xff"
_EMPTY_ARRAY = b"\x00\x00\x00\x00"
_SINGLE = [bytes((i,)) for i in range(0x80)]  # one-byte unsigned varints
_TWO = struct.Struct(">BB")  # a two-byte one: low seven bits with the continuation bit, the rest
_NO_PREFERRED = _I32.pack(-1)  # preferred_read_replica (v11+)
# a v12 answer ends with the partition's, the topic's and the response's empty tag sections
_TAIL_V12 = b"\x00\x00\x00"


class _Entry:
    """A partition's log and the answer layout of one Fetch version for it: ``head`` packs the
    frame size, the response header and the body up to the partition's log start offset (the
    topic's name in ``prefix``, from the topic count to the partition count)."""

    __slots__ = ("head", "name", "plog", "prefix", "version")

    def __init__(self, plog: PartitionLog, name: str, version: int) -> None:
        self.name = name
        raw = name.encode("utf-8")
        if version >= 12:
            self.prefix = b"\x02" + write_uvarint(len(raw) + 1) + raw + b"\x02"
            fmt = f">iiBihi{len(self.prefix)}sihqqq"
        else:
            self.prefix = _I32.pack(1) + _I16.pack(len(raw)) + raw + _I32.pack(1)
            top = "ihi" if version >= 7 else "i"  # throttle (+ error, session id from v7)
            part = "ihqqq" if version >= 5 else "ihqq"  # log start offset from v5
            fmt = f">ii{top}{len(self.prefix)}s{part}"
        self.head = struct.Struct(fmt)
        self.plog = plog
        self.version = version


class FastFetch:
    """One broker's fast-path state: answer layouts by (topic, partition, version), so a request
    costs no ``TopicPartition`` and no parsed request objects. A cached log is used only while it
    is open; a deleted topic's log is closed, so a topic created again is looked up afresh."""

    __slots__ = ("_broker", "_entries")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._entries: dict[tuple[str, int, int], _Entry] = {}

    def _lookup(self, name: str, index: int, version: int) -> _Entry | None:
        if name in INTERNAL_TOPICS:
            return None
        plog = self._broker.logs.get_partition(TopicPartition(name, index))
        if plog is None or plog.closed:
            return None
        if len(self._entries) > 4096:  # topics come and go: keep the cache bounded
            self._entries.clear()
        entry = _Entry(plog, name, version)
        self._entries[(name, index, version)] = entry
        return entry

    def answer(self, payload: bytearray, file_slices: bool) -> list[Any] | Deferred[list[Any] | None] | None:
        """The framed answer of a common consumer Fetch (or a Deferred one, parked); None: not
        one (nothing changed, the generic path answers)."""
        broker = self._broker
        if broker.replicas is not None or broker.authorizer is not None:
            return None
        try:  # the whole reading in one function with its ``try`` (was ``_answer``: a call per Fetch)
            end = len(payload)
            api_key, version, correlation_id, client_len = _HEADER.unpack_from(payload, 0)
            if api_key != _FETCH or not 4 <= version <= 12:
                return None
            pos = 10 + client_len if client_len > 0 else 10
            flexible = version >= 12
            if flexible:
                if payload[pos]:  # request header tags
                    return None
                pos += 1
            if version >= 7:
                replica_id, max_wait_ms, min_bytes, max_bytes, isolation, session_id, session_epoch = (
                    _TOP_V7.unpack_from(payload, pos)
                )
                # the generic path's full fetch without a session (it never creates one)
                if session_id or session_epoch > 0:
                    return None
                pos += 25
            else:
                replica_id, max_wait_ms, min_bytes, max_bytes, isolation = _TOP_V4.unpack_from(payload, pos)
                pos += 17
            if replica_id != -1 or (isolation != 0 and isolation != READ_COMMITTED):
                return None
            # one topic of one partition; its name
            if flexible:
                n = payload[pos + 1] - 1
                if payload[pos] != 2 or n < 1 or n >= 0x7F:
                    return None
                pos += 2
            else:
                if _I32.unpack_from(payload, pos)[0] != 1:
                    return None
                n = _I16.unpack_from(payload, pos + 4)[0]
                if n < 1:
                    return None
                pos += 6
            name_at = pos
            pos += n
            if flexible:
                if payload[pos] != 2:
                    return None
                pos += 1
            else:
                if _I32.unpack_from(payload, pos)[0] != 1:
                    return None
                pos += 4
            layout = _PARTITION[version]
            fields = layout.unpack_from(payload, pos)
            pos += layout.size
            index = fields[0]
            if flexible:
                fetch_offset, partition_max_bytes = fields[2], fields[5]
                # partition tags, topic tags, no forgotten topics, then the rack id (compact string)
                if payload[pos] or payload[pos + 1] or payload[pos + 2] != 1:
                    return None
                rack = payload[pos + 3] - 1
                if rack < 0 or rack >= 0x7F:
                    return None
                pos += 4 + rack
                if payload[pos]:  # request tags (cluster id ...)
                    return None
                pos += 1
            else:
                fetch_offset, partition_max_bytes = fields[-3] if version >= 5 else fields[1], fields[-1]
                if version >= 7:
                    if _I32.unpack_from(payload, pos)[0] != 0:  # forgotten topics
                        return None
                    pos += 4
                if version >= 11:
                    rack = _I16.unpack_from(payload, pos)[0]
                    if rack < 0:
                        return None
                    pos += 2 + rack
            if pos != end:
                return None
            name = payload[name_at : name_at + n].decode("utf-8")
            entry = self._entries.get((name, index, version))
            if entry is None or entry.plog.closed:
                entry = self._lookup(name, index, version)
                if entry is None:
                    return None
            plog = entry.plog
            # the high watermark is at most the log end: at or below it, no ``log_end_offset``
            # (a property) is asked (a consumer at the high watermark: every latency-1k Fetch)
            if fetch_offset < plog.log_start_offset or (
                fetch_offset > plog.high_watermark and fetch_offset > plog.log_end_offset
            ):
                return None  # OFFSET_OUT_OF_RANGE: the generic path answers it
            read_committed = isolation == READ_COMMITTED
            limit = max(min(partition_max_bytes, max_bytes), 0)
            slice_from = SLICE_FROM if file_slices else None
            # A consumer at the read's bound (the high watermark, read_committed: the last stable
            # offset) that waits for a byte parks without the read: it would find nothing
            # (``read_batches`` returns no data from ``bound`` on), and the wake-up reads anyway.
            # At latency-1k every parked Fetch is one of these: a log read (~8 calls) per record.
            if (
                max_wait_ms <= 0
                or min_bytes <= 0
                or fetch_offset < (plog.last_stable_offset if read_committed else plog.high_watermark)
            ):
                result = plog.read(
                    fetch_offset,
                    limit,
                    read_committed=read_committed,
                    min_one_batch=True,
                    slice_from=slice_from,
                )
                broker.metrics.requests[_FETCH] += 1
                if len(result.records) >= min_bytes or max_wait_ms <= 0:
                    return _encode(
                        broker, entry, correlation_id, index, result.records, result.high_watermark,
                        result.last_stable_offset, result.log_start_offset,
                        (result.aborted_transactions or ()) if read_committed else None,
                    )  # fmt: skip
            else:
                broker.metrics.requests[_FETCH] += 1
            # parked for max_wait from now (the read above took microseconds; a wait that ends
            # meanwhile ends on the timer's first turn, with the same re-read)
            wait_s = max_wait_ms / 1000.0
            fetch = _Parked(
                self, broker, payload, correlation_id, entry, index, fetch_offset, limit,
                read_committed, min_bytes, slice_from, time.monotonic() + wait_s,
            )  # fmt: skip
            # ``fetch.park(entry, wait_s)`` unfolded (a call per parked Fetch)
            parked = fetch.parked = broker.waiters.park(
                [entry.plog.tp], wait_s, fetch.fire, up_to_log_end=False
            )
            fetch.answer.on_cancel(parked.cancel)
            return Deferred(fetch.answer)
        except (IndexError, struct.error, UnicodeDecodeError):  # past the end of the frame
            return None


class _Parked:
    """A fast-path Fetch waiting for data: parked on its partition (``delayed_fetch.park``), the
    same events and max_wait as the generic path's awaited wait, re-read on every wake-up with the
    same completion rule (min_bytes reached or max_wait over). Cancelling ``answer`` (the
    connection is gone) unparks it. ``parked``: its current ``ParkedFetch`` (the wake-up's batch,
    ``tail``, is read from it)."""

    __slots__ = (
        "answer", "broker", "correlation_id", "deadline", "entry", "fast", "fetch_offset", "index",
        "limit", "min_bytes", "parked", "payload", "read_committed", "slice_from",
    )  # fmt: skip

    def __init__(
        self, fast: FastFetch, broker: Broker, payload: bytearray, correlation_id: int, entry: _Entry,
        index: int, fetch_offset: int, limit: int, read_committed: bool,
        min_bytes: int, slice_from: int | None, deadline: float,
    ) -> None:  # fmt: skip
        self.answer: ExclusiveAnswer[list[Any] | None] = ExclusiveAnswer()
        self.fast = fast
        self.broker = broker
        self.payload = payload
        self.correlation_id = correlation_id
        self.entry = entry
        self.index = index
        self.fetch_offset = fetch_offset
        self.limit = limit
        self.read_committed = read_committed
        self.min_bytes = min_bytes
        self.slice_from = slice_from
        self.deadline = deadline
        self.parked: ParkedFetch | None = None

    def park(self, entry: _Entry, wait_s: float) -> None:
        """Park (again) for ``wait_s``: ``FastFetch._answer`` does the first park unfolded."""
        parked = self.parked = self.broker.waiters.park(
            [entry.plog.tp], wait_s, self.fire, up_to_log_end=False
        )
        self.answer.on_cancel(parked.cancel)

    def fire(self) -> Callable[[], None] | None:
        """Woken (an append, its max_wait): read again; returns what sends the answer (None:
        parked again). Runs from the event loop's callback, so nothing may escape it: the read
        is inside this call's ``try`` (not a method of its own: a call per woken fetch).

        Woken by a single broker's fast Produce, it may answer from the batch that append wrote
        (``ParkedFetch.tail``) instead of reading the log: at latency-1k every record wakes the
        consumer's Fetch, whose read (``PartitionLog.read``: the segment lookup, the recent-batch
        search, a ``pread`` of the bytes just written, read_committed's aborted-transaction
        search, the result object) was ~18 calls and a system call per record. Only when that
        batch is exactly what the read would return: the same log, still open, the fetch offset
        is the batch's base offset and not below the log start, the read's bound (the high
        watermark; read_committed: the LSO too) is the batch's next offset, so no byte was
        appended after it (the high watermark is the log end on a single broker), the batch is
        not below min_bytes and would not be sent as a file slice (``SLICE_FROM``). Then the
        read would return these bytes (whole batches from the one holding the fetch offset up to
        the bound, at least one batch), the same offsets, and no aborted transaction: the
        transaction index holds one entry per ABORT marker, its last offset the marker's, and
        every marker lies before this batch, below the fetch offset. Anything else reads the
        log as before. Equivalence: tests/server/test_fetch_fast.py."""
        try:
            entry = self.entry
            tail = self.parked.tail if self.parked is not None else None
            if tail is not None and tail[0] is entry.plog and tail[1] == self.fetch_offset:
                plog = entry.plog
                next_offset = tail[2]
                size = tail[5] - tail[4]
                lso = plog.last_stable_offset
                log_start = plog.log_start_offset
                slice_from = self.slice_from
                if (
                    not plog.closed
                    and plog.high_watermark == next_offset
                    and (lso == next_offset or not self.read_committed)
                    and log_start <= self.fetch_offset
                    and size >= self.min_bytes
                    and (slice_from is None or size < slice_from)
                ):
                    chunks = _encode(
                        self.broker, entry, self.correlation_id, self.index, tail[3][tail[4] : tail[5]],
                        next_offset, lso, log_start, () if self.read_committed else None,
                    )  # fmt: skip
                    return partial(self.answer.set_result, chunks)
            gone = False
            if entry.plog.closed:  # the topic was deleted (and maybe created again): look it up
                found = self.fast._lookup(entry.name, self.index, entry.version)
                if found is None:
                    gone = True
                else:
                    entry = self.entry = found
            if gone:  # the partition is gone: the generic read answers the error
                chunks = self._generic()
            else:
                try:
                    result = entry.plog.read(
                        self.fetch_offset,
                        self.limit,
                        read_committed=self.read_committed,
                        min_one_batch=True,
                        slice_from=self.slice_from,
                    )
                except OffsetOutOfRangeError:
                    chunks = self._generic()
                else:
                    if len(result.records) < self.min_bytes:
                        remaining = self.deadline - time.monotonic()
                        if remaining > 0:
                            self.park(entry, remaining)  # a wake-up that brought too few bytes
                            return None
                    chunks = _encode(
                        self.broker, entry, self.correlation_id, self.index, result.records,
                        result.high_watermark, result.last_stable_offset, result.log_start_offset,
                        (result.aborted_transactions or ()) if self.read_committed else None,
                    )  # fmt: skip
        except Exception:
            log.exception("answering a parked fetch failed")
            self.broker.metrics.error(ApiKey.FETCH, ErrorCode.unknown_server_error)
            version = self.entry.version
            body = encode_fetch_response(version, ErrorCode.unknown_server_error, 0, [])
            chunks = frame_answer(self.broker, version, self.correlation_id, body)
        return partial(self.answer.set_result, chunks)

    def _generic(self) -> list[Any]:
        """The generic handler's read of this request: answers the errors this path declines."""
        version = self.entry.version
        payload = self.payload
        pos = 10 + max(_I16.unpack_from(payload, 8)[0], 0) + (1 if version >= 12 else 0)
        request = parse_fetch_request(payload, pos, version)
        responses, _total, _errors = _read_all(self.broker, request, self.slice_from, frozenset(), False)
        body = encode_fetch_response(version, 0, 0, responses)
        return frame_answer(self.broker, version, self.correlation_id, body)


_HEAD_V0 = struct.Struct(">ii")
_HEAD_V1 = struct.Struct(">iiB")


def frame_answer(broker: Broker, version: int, correlation_id: int, body: list[Any]) -> list[Any]:
    """Frame a Fetch answer body as dispatch does (size, correlation id, v12: header tags); the
    follower's fast path (``follower_fetch_fast``) frames its answers with it too."""
    size = sum(len(c) for c in body) + (5 if version >= 12 else 4)
    broker.metrics.bytes_out += size + 4
    head = _HEAD_V1.pack(size, correlation_id, 0) if version >= 12 else _HEAD_V0.pack(size, correlation_id)
    return [head, *body]


def _encode(
    broker: Broker,
    entry: _Entry,
    correlation_id: int,
    index: int,
    records: Sized,
    hw: int,
    lso: int,
    start: int,
    aborted: tuple[Any, ...] | None,
) -> list[Any]:
    """The framed answer: one partition without error, its offsets, the aborted transactions
    (``aborted``: read_committed's array, maybe empty; None: read_uncommitted's null) and the
    records."""
    version = entry.version
    flexible = version >= 12
    size = len(records)
    if aborted is None:  # read_uncommitted: a null array
        mid = b"\x00" if flexible else _NULL_ARRAY
    elif not aborted:  # read_committed without aborted transactions (the usual case): no loop
        mid = b"\x01" if flexible else _EMPTY_ARRAY
    elif flexible:
        mid = write_uvarint(len(aborted) + 1) + b"".join(
            _ABORTED.pack(a.producer_id, a.first_offset) + b"\x00" for a in aborted
        )
    else:
        mid = _I32.pack(len(aborted)) + b"".join(
            _ABORTED.pack(a.producer_id, a.first_offset) for a in aborted
        )
    if version >= 11:
        mid += _NO_PREFERRED
    if flexible:
        n = size + 1  # the compact length, its unsigned varint inlined below 16 KB (two calls)
        mid += (
            _SINGLE[n] if n < 0x80 else _TWO.pack(n & 0x7F | 0x80, n >> 7) if n < 0x4000 else write_uvarint(n)
        )
        tail = _TAIL_V12
    else:
        mid += _I32.pack(size)
        tail = b""
    head = entry.head
    total = head.size + len(mid) + size + len(tail)
    prefix = entry.prefix
    if flexible:
        first = head.pack(total - 4, correlation_id, 0, 0, 0, 0, prefix, index, 0, hw, lso, start)
    elif version >= 7:
        first = head.pack(total - 4, correlation_id, 0, 0, 0, prefix, index, 0, hw, lso, start)
    elif version >= 5:
        first = head.pack(total - 4, correlation_id, 0, prefix, index, 0, hw, lso, start)
    else:
        first = head.pack(total - 4, correlation_id, 0, prefix, index, 0, hw, lso)
    broker.metrics.bytes_out += total
    if size:
        return [first + mid, records, tail] if tail else [first + mid, records]
    return [first + mid + tail]


__all__ = ["FastFetch"]
