"""Micro-benchmark of the follower's response handling, old path vs new, in one process.

    PYTHONPATH=src .venv/bin/python bench/follower_micro.py

CPU seconds (``time.process_time``) per 10^9 record bytes for taking a Fetch v11 response frame
to the log: *old* = kio's generic reader, ``bytearray(records)``, a slice per batch and
``append_as_follower`` (what the fetcher did before follower-perf), *new* = the in-place reader
and ``append_batches_as_follower`` straight from the frame. Socket receive is not included (the
old path also copied through the StreamReader there). The log lives on /dev/shm so the figure is
the user-space work plus one page-cache copy. Also times the Fetch request encoding (kio vs hand
written) and the reading of a small response. See bench/README.md for the measured figures.
"""

from __future__ import annotations

import datetime
import struct
import sys
import tempfile
import time
import timeit
from pathlib import Path

from kio.schema.fetch.v11 import request as fetch_v11
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from exactly.client.wire import decode_response, encode_request
from exactly.protocol.fast import FetchPartitionResult, encode_fetch_response
from exactly.protocol.fetch_request import FetchPosition, encode_replica_fetch
from exactly.protocol.fetch_response import parse_fetch_response
from exactly.records.batch import BatchHeader, iter_batches
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.storage.helpers import make_batch


def batches(count: int, value_size: int) -> bytes:
    out = bytearray()
    for i in range(count):
        batch = make_batch(1000, value_size=value_size)
        batch[0:8] = (i * 1000).to_bytes(8, "big")
        out += batch
    return bytes(out)


def response_frame(records: bytes) -> bytearray:
    body = encode_fetch_response(11, 0, 0, [("t", [FetchPartitionResult(0, 0, 1, 1, 0, None, records)])])
    return bytearray(struct.pack(">i", 1) + b"".join(bytes(c) for c in body))


def cpu_per_gb(mode: str, records: bytes, rounds: int) -> float:
    directory = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="exactly-micro-"))
    plog = PartitionLog.open(directory, TopicPartition("t", 0), LogConfig(), recovery_point=0, now_ms=0)
    start = time.process_time()
    for _ in range(rounds):
        plog.truncate_to(0)
        frame = response_frame(records)
        if mode == "old":
            _corr, response = decode_response(1, 11, bytes(frame))
            data = bytearray(response.responses[0].partitions[0].records)
            for header in iter_batches(data):
                batch = data[header.position : header.position + header.size]
                plog.append_as_follower(batch, BatchHeader.parse(batch, 0), now_ms=0)
        else:
            part = parse_fetch_response(frame, 11).partitions[0]
            headers = list(iter_batches(frame, part.records_start, part.records_end))
            plog.append_batches_as_follower(frame, headers, now_ms=0)
    elapsed = time.process_time() - start
    plog.delete()
    return elapsed / (rounds * len(records)) * 1e9


def kio_request() -> bytes:
    partition = fetch_v11.FetchPartition(
        partition=i32(0),
        current_leader_epoch=i32(1),
        fetch_offset=i64(5),
        log_start_offset=i64(0),
        partition_max_bytes=i32(1_048_576),
    )
    request = fetch_v11.FetchRequest(
        replica_id=BrokerId(1),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
        min_bytes=i32(1),
        max_bytes=i32(10_485_760),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(fetch_v11.FetchTopic(topic=TopicName("t"), partitions=(partition,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    return encode_request(request, 1, "replica-1")


def hand_request() -> bytes:
    return encode_replica_fetch(
        11,
        1,
        "replica-1",
        replica_id=1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=10_485_760,
        topics=[("t", [FetchPosition(0, 1, 5, 0, 1_048_576)])],
    )


def main() -> None:
    one = batches(1, 1000)  # one ~1 MB batch per response, as cluster-produce-p1
    for mode in ("old", "new", "old", "new"):
        print(f"{mode}: one 1 MB batch per response: {cpu_per_gb(mode, one, 300):.2f} CPU-s/GB")
    eight = batches(8, 100)
    for mode in ("old", "new"):
        print(f"{mode}: 8 batches per response: {cpu_per_gb(mode, eight, 300):.2f} CPU-s/GB")
    assert kio_request() == hand_request()
    n = 3000
    old, new = (timeit.timeit(f, number=n) / n * 1e6 for f in (kio_request, hand_request))
    print(f"Fetch request: kio {old:.1f} us, hand-written {new:.1f} us")
    small = response_frame(b"x" * 1100)
    old = timeit.timeit(lambda: decode_response(1, 11, bytes(small)), number=n) / n * 1e6
    new = timeit.timeit(lambda: parse_fetch_response(small, 11), number=n) / n * 1e6
    print(f"small response read: kio {old:.1f} us, in place {new:.1f} us")


if __name__ == "__main__":
    main()
