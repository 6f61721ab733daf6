"""The wire client of socket-level tests: the production client (``exactly.client.wire``) plus
what only tests need.

``WireClient(bootstrap)`` is the production :class:`exactly.client.wire.WireClient` on a fresh
connection *without* the ApiVersions exchange (tests decide what goes on the wire first).
``send(request)`` frames a kio request entity, awaits and parses its response exactly as the
command line tools do. On top of that, for malformed-input and fault tests:

* ``send_raw`` / ``send_frame`` / ``recv_frame`` - bytes, a size-prefixed frame, one response frame;
* ``send(request, acks_zero=True)`` - a request that gets no response (acks=0 produce);
* ``is_closed`` - whether the broker hangs up; a closed connection raises :class:`ConnectionClosed`;
* ``encode_request`` (no size prefix), ``raw_request`` (a hand-made header for odd keys and
  versions) and ``parse_response`` (a response frame read with ``recv_frame``).
"""

from __future__ import annotations

import datetime
import socket
import struct
import time
from typing import Any

from kio.schema.create_topics.v4 import request as ct
from kio.schema.list_offsets.v1 import request as lo
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.schema.types import BrokerId, ProducerId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import Records, i8, i16, i32, i32Timedelta, i64

from exactly.client import wire as production
from exactly.client.wire import WireError, parse_bootstrap
from exactly.protocol.apis import ApiKey, build, schema
from exactly.records.batch import BatchHeader
from exactly.records.builder import Record, build_batch, decode_batch

_SIZE = struct.Struct(">i")


class ConnectionClosed(WireError):
    """The broker closed the connection instead of answering."""


def encode_request(request: Any, correlation_id: int, client_id: str | None = "wire-test") -> bytes:
    """Request header + body (no size prefix): the production encoding, for ``send_frame``."""
    return production.encode_request(request, correlation_id, client_id)[_SIZE.size :]


def raw_request(
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: bytes = b"",
    client_id: str | None = "wire-test",
    flexible: bool = False,
) -> bytes:
    """A hand-made request (header v1, or v2 with an empty tag buffer) for odd keys/versions."""
    out = struct.pack(">hhi", api_key, api_version, correlation_id)
    if client_id is None:
        out += struct.pack(">h", -1)
    else:
        cid = client_id.encode()
        out += struct.pack(">h", len(cid)) + cid
    if flexible:
        out += b"\x00"
    return out + body


def parse_response(response_cls: Any, payload: bytes, *, header_v1: bool) -> tuple[int, Any]:
    """-> (correlation id, response entity) from a response frame's payload."""
    header_cls: Any = ResponseHeaderV1 if header_v1 else ResponseHeaderV0
    header, used = entity_reader(header_cls)(payload, 0)
    body, _ = entity_reader(response_cls)(payload, used)
    return int(header.correlation_id), body


class WireClient(production.WireClient):
    """One blocking TCP connection to a broker, not yet past ApiVersions."""

    def __init__(self, bootstrap: str, timeout: float = 10.0, client_id: str | None = "wire-test") -> None:
        ((host, port),) = parse_bootstrap(bootstrap)
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().__init__(sock, bootstrap, client_id)

    def next_correlation_id(self) -> int:
        self._correlation += 1
        return self._correlation

    # ------------------------------------------------------------ bytes
    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(_SIZE.pack(len(payload)) + payload)

    def recv_frame(self) -> bytes:
        return self._recv_frame()

    def _recv_exact(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            try:
                chunk = self.sock.recv(n - len(chunks))
            except ConnectionResetError as exc:
                raise ConnectionClosed("connection reset by broker") from exc
            if not chunk:
                raise ConnectionClosed(f"connection closed after {len(chunks)}/{n} bytes")
            chunks += chunk
        return bytes(chunks)

    def is_closed(self, wait: float = 5.0) -> bool:
        """True if the broker closes the connection within ``wait`` seconds (data is discarded)."""
        deadline = time.monotonic() + wait
        old = self.sock.gettimeout()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.sock.settimeout(left)
                try:
                    chunk = self.sock.recv(65536)
                except TimeoutError:
                    return False
                except (ConnectionResetError, BrokenPipeError):
                    return True
                if not chunk:
                    return True
        finally:
            self.sock.settimeout(old)

    # ------------------------------------------------------------ entities
    def send(self, request: Any, *, acks_zero: bool = False) -> Any:
        """Send a kio request entity and return the parsed response entity (None for
        ``acks_zero``: the broker sends nothing back)."""
        if not acks_zero:
            return super().send(request)
        self.send_frame(encode_request(request, self.next_correlation_id(), self.client_id))
        return None


# ---------------------------------------------------------------- helpers for common requests
def produce_request(
    topic: str,
    partition: int,
    records: bytes,
    *,
    version: int = 8,
    acks: int = -1,
    timeout_ms: int = 10_000,
    transactional_id: str | None = None,
) -> Any:
    """A ProduceRequest (v3-v8: non-flexible) for one partition."""
    mod: Any = schema(ApiKey.PRODUCE, version).request_module
    return mod.ProduceRequest(
        transactional_id=transactional_id,
        acks=i16(acks),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(
            mod.TopicProduceData(
                name=TopicName(topic),
                partition_data=(mod.PartitionProduceData(index=i32(partition), records=Records(records)),),
            ),
        ),
    )


def simple_batch(
    values: list[bytes],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_timestamp: int | None = None,
) -> bytes:
    ts = int(time.time() * 1000) if base_timestamp is None else base_timestamp
    return build_batch(
        [Record(value=v, key=None) for v in values],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_timestamp=ts,
    )


def partition_response(response: Any) -> Any:
    """The single partition result of a one-partition ProduceResponse."""
    (topic,) = response.responses
    (part,) = topic.partition_responses
    return part


def create_topic(
    client: WireClient, name: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> Any:
    """CreateTopics v4; returns the topic's result entry (error_code 0 on success)."""
    req = ct.CreateTopicsRequest(
        topics=(
            ct.CreatableTopic(
                name=TopicName(name),
                num_partitions=i32(partitions),
                replication_factor=i16(1),
                assignments=(),
                configs=tuple(ct.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()),
            ),
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
    )
    (result,) = client.send(req).topics
    return result


def init_producer_id(client: WireClient, version: int = 0) -> tuple[int, int]:
    """Non-transactional InitProducerId -> (producer id, epoch); asserts no error."""
    response = client.call(
        ApiKey.INIT_PRODUCER_ID,
        version,
        transactional_id=None,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=ProducerId(-1),
        producer_epoch=i16(-1),
    )
    assert response.error_code == 0, f"InitProducerId failed: {response.error_code!r}"
    return int(response.producer_id), int(response.producer_epoch)


def list_offset(client: WireClient, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
    """ListOffsets v1 -> (error code, offset); timestamp -1 = latest (log end), -2 = earliest."""
    req = lo.ListOffsetsRequest(
        replica_id=BrokerId(-1),
        topics=(
            lo.ListOffsetsTopic(
                name=TopicName(topic),
                partitions=(
                    lo.ListOffsetsPartition(partition_index=i32(partition), timestamp=i64(timestamp)),
                ),
            ),
        ),
    )
    (t,) = client.send(req).topics
    (p,) = t.partitions
    return int(p.error_code), int(p.offset)


def log_end_offset(client: WireClient, topic: str, partition: int = 0) -> int:
    error, offset = list_offset(client, topic, partition, -1)
    assert error == 0, f"ListOffsets error {error}"
    return offset


def fetch_request(
    topic: str,
    partition: int,
    offset: int,
    *,
    version: int = 11,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    isolation_level: int = 0,
    partition_max_bytes: int = 4 * 1024 * 1024,
) -> Any:
    """A one-partition FetchRequest (v4-v12: sessionless, by topic name)."""
    fr: Any = schema(ApiKey.FETCH, version).request_module
    part = build(
        fr.FetchPartition,
        partition=i32(partition),
        fetch_offset=i64(offset),
        partition_max_bytes=i32(partition_max_bytes),
    )
    return build(
        fr.FetchRequest,
        replica_id=BrokerId(-1),
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=i32(min_bytes),
        max_bytes=i32(8 * 1024 * 1024),
        isolation_level=i8(isolation_level),
        topics=(fr.FetchTopic(topic=TopicName(topic), partitions=(part,)),),
        forgotten_topics_data=(),
    )


def fetch_batches(
    client: WireClient,
    topic: str,
    partition: int = 0,
    offset: int = 0,
    *,
    max_wait_ms: int = 0,
    version: int = 11,
    decode: bool = True,
) -> list[tuple[Any, list[Record]]]:
    """Every batch from the one holding ``offset`` to the high watermark, as (BatchHeader, records).

    With ``decode=False`` the record lists are empty (for codecs the builder cannot decode).
    """
    out: list[tuple[Any, list[Record]]] = []
    position = offset
    while True:
        req = fetch_request(topic, partition, position, version=version, max_wait_ms=max_wait_ms)
        (t,) = client.send(req).responses
        (p,) = t.partitions
        assert p.error_code == 0, f"Fetch error {p.error_code!r}"
        data = bytes(p.records or b"")
        pos = 0
        progressed = False
        while pos + 61 <= len(data):
            header = BatchHeader.parse(data, pos)
            if pos + header.size > len(data):
                break  # partial batch at the end of the response
            records = decode_batch(data, pos)[1] if decode else []
            out.append((header, records))
            position = max(position, header.next_offset)
            progressed = True
            pos += header.size
        if not progressed or position >= int(p.high_watermark):
            return out


def fetch_records(
    client: WireClient,
    topic: str,
    partition: int = 0,
    offset: int = 0,
    max_wait_ms: int = 0,
    version: int = 11,
) -> list[Record]:
    """Every record from ``offset`` to the high watermark (read_uncommitted)."""
    return [
        record
        for _header, records in fetch_batches(
            client, topic, partition, offset, max_wait_ms=max_wait_ms, version=version
        )
        for record in records
        if record.offset >= offset
    ]
