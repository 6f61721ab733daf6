#!/usr/bin/env python3
"""The bare receive path: the floor a Python broker's bulk Produce cannot go below on this box.

    PYTHONPATH=src .venv/bin/python bench/floor_server.py --data DIR [--pages fresh|recycle]

Why: issue #15 asks 100 B records for <= 1.2 broker CPU-s/GB; the broker's figure mixes its own
Python per request with what the kernel and this VM charge per byte (socket receive copy, CRC32C,
the page-cache copy of ``pwrite`` and, on this VM, faulting freed pages back in: rf3-ratio-s16.md).
This server does only the per-byte part a broker cannot skip, with the least Python per request:
a uvloop ``BufferedProtocol`` receives into one large ring buffer (one kernel -> user copy, no
user-space copy of a frame but the occasional move of a partial frame to the buffer's start),
a Produce frame of the bulk shape (flexible v9+, one topic, one partition, plain batches) is
located with a few ``unpack_from``, every batch's CRC32C is checked over the received bytes in
place, the records are ``pwrite``n from that memory to one file per partition (blocks reserved
ahead as the broker's segments do, ``storage.file_write.BlockReserve``), and a fixed answer is
packed. No offsets are assigned, no producer state, no index, no log object: not a broker.

Every other frame (ApiVersions, Metadata, InitProducerId, CreateTopics, a Produce of another
shape...) goes to ``exactly.server.dispatch.dispatch`` of a broker opened in this process on a
scratch directory, so clients connect and set up as they do against the broker; those requests
are few and not per byte. Responses keep request order per connection.

``--pages fresh`` (default): each new partition gets a new file and the previous partitions'
files are deleted, as the bench's produce runs create a topic per run and delete it after (the
pages then come from free memory). ``--pages recycle``: every partition writes one shared file
from offset 0 again, so a run overwrites page-cache pages the previous run already faulted in.
The difference of the two is what page-cache first touch costs per byte on this machine.

Prints ``listening on HOST:PORT`` once serving; SIGTERM stops it. Stats (frames answered on the
floor path, frames handed to dispatch, bytes written, socket reads, records per partition) go to
``DIR/floor-stats.json`` at every new partition and at exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import struct
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import crc32c

from exactly.server.broker import Broker, Endpoint
from exactly.server.config import BrokerConfig
from exactly.server.dispatch import dispatch
from exactly.storage.file_write import BlockReserve

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhih")
_I32 = struct.Struct(">i")
_BATCH_HEAD = struct.Struct(">qiibI")  # base offset, length, leader epoch, magic, crc
_TAIL = b"\x01\x00\x00\x00" + _I32.pack(0) + b"\x00"
RING = 16 << 20


class Floor:
    """Per-process state: the partition files and counters."""

    def __init__(self, data: Path, pages: str) -> None:
        self.data, self.pages = data, pages
        self.files: dict[tuple[str, int], list[Any]] = {}  # key -> [fd, position, reserve, records]
        self.answers: dict[tuple[str, int], tuple[struct.Struct, bytes]] = {}
        self.floor_frames = self.dispatched = self.bytes = self.reads = 0
        self.records: dict[str, int] = {}
        self.shared_fd = -1

    def open(self, key: tuple[str, int]) -> list[Any]:
        for old in list(self.files):  # a new run's partition: the previous ones are done
            fd = self.files.pop(old)[0]
            if self.pages == "fresh":
                os.close(fd)
                os.unlink(self.data / f"{old[0]}-{old[1]}.log")
        if self.pages == "fresh":
            fd = os.open(self.data / f"{key[0]}-{key[1]}.log", os.O_RDWR | os.O_CREAT, 0o644)
        else:
            if self.shared_fd < 0:
                self.shared_fd = os.open(self.data / "shared.log", os.O_RDWR | os.O_CREAT, 0o644)
            fd = self.shared_fd
        entry = [fd, 0, BlockReserve(), 0]
        self.files[key] = entry
        self.dump()
        return entry

    def dump(self) -> None:
        stats = {
            "pages": self.pages,
            "floor_frames": self.floor_frames,
            "dispatched": self.dispatched,
            "bytes": self.bytes,
            "reads": self.reads,
            "records": self.records,
        }
        (self.data / "floor-stats.json").write_text(json.dumps(stats))

    def answer(self, name: str) -> tuple[struct.Struct, bytes]:
        """The framed answer as one struct (as produce_fast's) and its constant topic bytes."""
        raw = name.encode()
        prefix = b"\x02" + bytes([len(raw) + 1]) + raw + b"\x02"
        return struct.Struct(f">iiB{len(prefix)}sihqqq{len(_TAIL)}s"), prefix

    def produce(self, view: memoryview, start: int, end: int) -> bytes | None:
        """The answer of a bulk-shaped Produce in ``view[start:end]``, written; None: not one."""
        api_key, version, correlation_id, client_len = _HEADER.unpack_from(view, start)
        if api_key != 0 or version < 9:
            return None
        pos = start + 10 + max(client_len, 0)
        if view[pos] or view[pos + 1]:  # header tags, transactional id
            return None
        pos += 8  # acks, timeout
        n = view[pos + 1]
        if view[pos] != 2 or not 2 <= n < 0x80:
            return None
        name = str(view[pos + 2 : pos + 1 + n], "utf-8")
        pos += 1 + n
        if view[pos] != 2:
            return None
        index = _I32.unpack_from(view, pos + 1)[0]
        pos += 5
        size = shift = 0
        while True:
            byte = view[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        size -= 1
        stop = pos + size
        if stop + 3 != end:
            return None
        records = 0
        at = pos
        while at < stop:  # every batch's CRC, in place
            _base, length, _epoch, magic, crc = _BATCH_HEAD.unpack_from(view, at)
            if magic != 2 or crc32c.crc32c(view[at + 21 : at + 12 + length]) != crc:
                return None
            records += _I32.unpack_from(view, at + 57)[0]
            at += 12 + length
        key = (name, index)
        entry = self.files.get(key)
        if entry is None:
            entry = self.open(key)
        fd, position, reserve, _ = entry
        reserve.before_write(fd, position, size)
        os.pwrite(fd, view[pos:stop], position)
        entry[1] = position + size
        entry[3] += records
        self.records[name] = self.records.get(name, 0) + records
        self.bytes += size
        self.floor_frames += 1
        cached = self.answers.get(key)
        if cached is None:
            cached = self.answers[key] = self.answer(name)
        answer, prefix = cached
        return answer.pack(answer.size - 4, correlation_id, 0, prefix, index, 0, 0, -1, 0, _TAIL)


class FloorProtocol(asyncio.BufferedProtocol):
    def __init__(self, floor: Floor, broker: Broker) -> None:
        self.floor, self.broker = floor, broker
        self.buf = bytearray(RING)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.queue: deque[Any] = deque()  # responses waiting behind a dispatched request
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.end == RING or (self.start and RING - self.end < 65536):
            # move the partial frame to the start: the only user-space copy of received bytes
            n = self.end - self.start
            self.buf[:n] = self.view[self.start : self.end]
            self.start, self.end = 0, n
        return self.view[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        self.floor.reads += 1
        view = self.view
        while self.end - self.start >= 4:
            size = _SIZE.unpack_from(view, self.start)[0]
            body = self.start + 4
            if self.end - body < size:
                if size + 4 > RING:
                    raise SystemExit(f"frame of {size} bytes does not fit the ring")
                break
            answer = None
            if not self.queue and not self.busy:
                answer = self.floor.produce(view, body, body + size)
            if answer is not None:
                assert self.transport is not None
                self.transport.write(answer)
            else:
                self.floor.dispatched += 1
                self.queue.append(bytearray(view[body : body + size]))
                if not self.busy:
                    self.busy = True
                    asyncio.get_running_loop().create_task(self.drain())
            self.start = body + size
        if self.start == self.end:
            self.start = self.end = 0

    async def drain(self) -> None:
        """Answer queued frames in order through the broker's dispatch (the floor path only
        answers when nothing is queued, so order holds)."""
        try:
            while self.queue:
                frame = self.queue.popleft()
                chunks = await dispatch(self.broker, frame, "floor")
                if chunks and self.transport is not None:
                    self.transport.writelines(chunks)  # type: ignore[arg-type]
        finally:
            self.busy = False


async def serve(args: argparse.Namespace) -> None:
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    meta = Path(tempfile.mkdtemp(prefix="meta-", dir=data))
    conf = {"log.dirs": str(meta), "group.initial.rebalance.delay.ms": "0"}
    broker = Broker.open(BrokerConfig.load(None, conf), meta)
    broker.groups.load()
    broker.txn.load()
    tasks = [*broker.groups.start_tasks(), *broker.txn.start_tasks()]
    floor = Floor(data, args.pages)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FloorProtocol(floor, broker), "127.0.0.1", args.port)
    port = server.sockets[0].getsockname()[1]
    broker.advertised = Endpoint("127.0.0.1", port)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    loop.add_signal_handler(signal.SIGINT, stop.set_result, None)
    await stop
    server.close()
    floor.dump()
    for t in tasks:
        t.cancel()
    os._exit(0)  # the scratch broker's shutdown is not what this measures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--pages", choices=("fresh", "recycle"), default="fresh")
    args = ap.parse_args()
    import uvloop

    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
