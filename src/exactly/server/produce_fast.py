"""The common Produce answered in one pass over the frame: a fast path beside the generic one.

Why: a bulk producer's Produce (librdkafka: flexible v9+, no transactional id, acks=all or 1,
one topic, one partition, one idempotent batch) is what a single broker spends most of its
requests on, and the profile of the 100 B-record workload (``bench/dispatch_micro.py --records
3000 --profile produce --calls``; bench/results/produce-fast-s16.md) showed ~135 Python calls per
such request between the frame and its answer: the header and request parsers' objects
(``RequestHeader``, ``RequestContext``, ``ProduceRequestData`` and its tuples), the handler's
per-partition outcome tuples and results, ``BatchHeader`` properties, the staged producer-state
change and the response encoder. In the broker every call runs with cold caches (each request
drags ~0.5 MB of socket, CRC and page-cache traffic through them), so the Python per request
costs about twice the in-process figure. This path reads the request header, the body and the
batch header in place with three ``unpack_from`` calls and answers from a per-topic struct.

Contract: ``produce_fast`` either answers the request completely (the same bytes the generic
path writes, same metrics, same log) or returns None having changed nothing, and the dispatcher
then runs the generic path, which re-reads the frame from the start. It answers only a
successful append of that shape on a single broker without an authorizer; every other case --
other versions, a transactional id, acks 0 or invalid, several topics or partitions, tagged
fields, an unknown or internal topic, any invalid batch (size, magic, CRC, counts), a
transactional or control batch, a LogAppendTime topic, a batch over max.message.bytes, a
duplicate or any producer-state error -- returns None before anything is written, so its answer
and log line come from the generic path. Equivalence: tests/server/test_produce_fast.py.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import crc32c

from exactly.protocol.apis import VERSION_RANGES, ApiKey
from exactly.protocol.primitives import write_uvarint
from exactly.topics import INTERNAL_TOPICS
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.metrics import Metrics
    from exactly.storage.partition_log import PartitionLog

# api key, api version, correlation id, client id length (request header v2 up to the client id)
_HEADER = struct.Struct(">hhih")
_ACKS_TIMEOUT = struct.Struct(">hi")
_I32 = struct.Struct(">i")
# the v2 batch header, as records.batch.BatchHeader.parse reads it
_BATCH = struct.Struct(">qiibIhiqqqhii")
_PRODUCE = int(ApiKey.PRODUCE)
_LOWEST_FLEXIBLE = 9
_HIGHEST = VERSION_RANGES[ApiKey.PRODUCE][1]
_TXN_OR_CONTROL = 0x10 | 0x20  # batch attributes: transactional, control
_ONE = 2  # a compact array of one element (count + 1)
# after the partition: record_errors (empty), error_message (null), partition tags, topic tags,
# throttle_time_ms 0, response tags (the same bytes at v9, v10 and v11 for an answer without error)
_TAIL = b"\x01\x00\x00\x00" + _I32.pack(0) + b"\x00"


def _response_struct(name: str) -> tuple[struct.Struct, bytes]:
    """The whole framed answer for one topic as one struct: size, correlation id, header tags,
    [one topic: name, [one partition: index, error, base offset, log append time, log start]]
    and the tail; and the constant bytes from the topic count to the partition count."""
    raw = name.encode("utf-8")
    prefix = bytes([_ONE]) + write_uvarint(len(raw) + 1) + raw + bytes([_ONE])
    return struct.Struct(f">iiB{len(prefix)}sihqqq{len(_TAIL)}s"), prefix


CommonProduce = tuple[int, int, int, str, int, int, int, tuple[int, ...]]
"""What ``read_common_produce`` reads: correlation id, acks, timeout ms, topic, partition, the
batch's start and stop in the frame, and its header fields as ``_BATCH`` unpacks them."""


def read_common_produce(payload: bytearray) -> CommonProduce | None:
    """The common Produce's fields read in place (v9+, no transactional id, acks 1 or -1, one
    topic, one partition, one v2 batch that is neither transactional nor control, whose sizes,
    counts and CRC check out), or None: not that shape, or not valid (the generic path answers).
    Reads only: shared by the single-broker path (``FastProduce``) and the cluster leader's
    (``server.produce_fast_cluster``), so both take exactly the same requests."""
    try:
        return _read_common_produce(payload)
    except (IndexError, struct.error):  # a length or byte past the end of the frame
        return None


def _read_common_produce(payload: bytearray) -> CommonProduce | None:
    end = len(payload)
    if end < 32:
        return None
    api_key, version, correlation_id, client_len = _HEADER.unpack_from(payload, 0)
    if api_key != _PRODUCE or not _LOWEST_FLEXIBLE <= version <= _HIGHEST:
        return None
    pos = 10 + client_len if client_len > 0 else 10
    # header tags, then the transactional id: both empty (one zero byte each)
    if pos + 9 > end or payload[pos] or payload[pos + 1]:
        return None
    acks, timeout = _ACKS_TIMEOUT.unpack_from(payload, pos + 2)
    if acks != 1 and acks != -1:  # acks=0 has no answer; others are refused: generic path
        return None
    pos += 8
    n = payload[pos + 1]
    if payload[pos] != _ONE or n < 2 or n >= 0x80:  # one topic, a name of 1-126 bytes
        return None
    name_at = pos + 2
    pos = name_at + n - 1
    if pos + 6 > end or payload[pos] != _ONE:  # one partition
        return None
    index = _I32.unpack_from(payload, pos + 1)[0]
    pos += 5
    # the records' compact length: an unsigned varint of size + 1 (3 bytes for 16 KB-2 MB)
    size = shift = 0
    while True:
        byte = payload[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift > 28:
            return None
    size -= 1
    start = pos
    stop = start + size
    # then the partition's, the topic's and the request's empty tag sections, and the end
    if size < 61 or stop + 3 != end or payload[stop] or payload[stop + 1] or payload[stop + 2]:
        return None
    fields = _BATCH.unpack_from(payload, start)
    # validate_produce_records' checks, in its order; any failure: the generic path answers
    if fields[3] != 2 or fields[1] + 12 != size or fields[5] & _TXN_OR_CONTROL:
        return None
    count = fields[12]
    if count <= 0 or fields[6] != count - 1:
        return None
    with memoryview(payload) as view:
        crc_ok = crc32c.crc32c(view[start + 21 : stop]) == fields[4]
        name = str(view[name_at : name_at + n - 1], "utf-8")
    if not crc_ok:
        return None
    return correlation_id, acks, timeout, name, index, start, stop, fields


def response_layout(name: str) -> tuple[struct.Struct, bytes]:
    """The framed answer's struct for one topic (see ``_response_struct``) and its constant
    prefix, as ``pack_answer`` takes them."""
    return _response_struct(name)


def pack_answer(
    metrics: Metrics,
    answer: struct.Struct,
    prefix: bytes,
    correlation_id: int,
    index: int,
    code: int,
    base_offset: int,
    log_start: int,
) -> bytes:
    """The framed one-partition answer, counted in bytes_out (as the generic path counts what
    it writes). An error's offsets are -1 (as ``ProducePartitionResult(index, code, -1, -1,
    -1)``); log append time is always -1, since a LogAppendTime topic takes the generic path.
    Shared by ``FastProduce`` and ``server.produce_fast_cluster`` so both write the same bytes."""
    metrics.bytes_out += answer.size
    return answer.pack(
        answer.size - 4, correlation_id, 0, prefix, index, code, base_offset, -1, log_start, _TAIL
    )


class FastProduce:
    """One broker's fast-path state: the partition logs and response structs by (topic,
    partition), so a request costs no ``TopicPartition`` and no dictionary of dataclass keys.
    A cached log is used only while it is open; a deleted topic's log is closed, so a topic
    deleted and created again is looked up afresh."""

    __slots__ = ("_broker", "_logs")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._logs: dict[tuple[str, int], tuple[PartitionLog, struct.Struct, bytes]] = {}

    def _lookup(self, name: str, index: int) -> tuple[PartitionLog, struct.Struct, bytes] | None:
        if name in INTERNAL_TOPICS:
            return None
        plog = self._broker.logs.get_partition(TopicPartition(name, index))
        if plog is None or plog.closed:
            return None
        if len(self._logs) > 4096:  # topics come and go: keep the cache bounded
            self._logs.clear()
        entry = (plog, *_response_struct(name))
        self._logs[(name, index)] = entry
        return entry

    def answer(self, payload: bytearray, now_ms: int) -> list[bytes] | None:
        """The framed answer of a common Produce, appended; None: not one (nothing changed)."""
        broker = self._broker
        if broker.replicas is not None or broker.authorizer is not None:
            return None
        # one function with its ``try`` (was ``_answer`` inside it, and ``read_common_produce``'s
        # own ``try`` around ``_read_common_produce``): two calls fewer per Produce
        try:
            common = _read_common_produce(payload)
            if common is None:
                return None
            correlation_id, _acks, _timeout, name, index, start, stop, fields = common
            count = fields[12]
            cached = self._logs.get((name, index))
            if cached is None or cached[0].closed:
                cached = self._lookup(name, index)
                if cached is None:
                    return None
            plog, answer, prefix = cached
            with memoryview(payload) as view:
                records = view[start:stop]
                try:
                    base_offset = plog.append_plain(records, fields, now_ms)
                except OSError:
                    return None  # not written (write_whole cut the file back): the generic path reports it
                finally:
                    records.release()
            if base_offset is None:
                return None
            metrics = broker.metrics
            metrics.requests[_PRODUCE] += 1
            metrics.messages_in += count
            # the batch as written (the frame's bytes, offsets patched): a consumer Fetch this append
            # wakes answers from it when it is all that Fetch would read (``fetch_fast._Parked.fire``)
            broker.waiters.notify(
                plog.tp, (plog, base_offset, base_offset + fields[6] + 1, payload, start, stop)
            )
            return [
                pack_answer(
                    metrics, answer, prefix, correlation_id, index, 0, base_offset, plog.log_start_offset
                )
            ]
        except (IndexError, struct.error):  # a length or byte past the end of the frame
            return None


__all__ = ["CommonProduce", "FastProduce", "pack_answer", "read_common_produce", "response_layout"]
