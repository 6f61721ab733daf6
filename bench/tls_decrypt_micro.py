"""What a TLS byte stream costs the broker's receive path, against the floor of decrypting it.

    PYTHONPATH=src .venv/bin/python bench/tls_decrypt_micro.py            # all mixes, 3 rounds
    PYTHONPATH=src .venv/bin/python bench/tls_decrypt_micro.py --mb 64 --rounds 1 --mix kcat

A client makes one TLS 1.3 connection (OpenSSL's defaults, as librdkafka: AES-256-GCM) and the
whole stream is encrypted *before* the clock starts, one TLS record per plaintext piece of the
chosen mix, so the client only ``sendall``s ciphertext and the receiver's CPU is all that is
measured (``time.process_time`` of the receiving process, which runs nothing else). Mixes, per
MB of plaintext:

- ``full``: 16 KB records (61 per MB), what a client writing whole requests sends;
- ``kcat``: librdkafka 2.16's produce layout with the bench's settings (bench/results/tls-s14.md):
  201 pairs of a 1 KB value and its 10-byte record header, each its own record, plus 48 full
  records (about 450 records per MB);
- ``pairs``: only 1 KB + 10 B pairs (about 1,960 records per MB, librdkafka with small batches).

Receivers (each CPU-s per GB of plaintext, and per TLS record after the ``full`` per-byte part):

- ``floor``: a Python loop over ``ssl.MemoryBIO`` + ``SSLObject`` in one process: each 256 KB of
  ciphertext written to the BIO (the copy every MemoryBIO transport makes), then the C object's
  ``read(n, buffer)`` per record straight into one preallocated buffer until
  ``SSLWantReadError``. No socket, no event loop: the cost of the decryption itself.
- ``uvloop``: a uvloop server with the ssl context and a ``BufferedProtocol`` that hands out a
  preallocated buffer (as the broker's framer does): socket reads, the MemoryBIO copy, uvloop's
  per-record loop and the event loop.
- ``uvloop-plain``: the same server and protocol on a plaintext socket, sent the plaintext: what
  the receive path costs without TLS (the broker's plaintext part).
- ``broker`` (``--broker``): the real broker (PLAINTEXT and SSL listeners of one process) sent
  Produce v7 requests (acks=1, one ~1 MB batch of 1 KB records each, bench/benchlib/batch_producer)
  pre-encrypted in the mix's record layout (a request's bytes cut into the mix's piece sizes), and
  the same requests in plaintext (``broker-plain``): the broker's whole produce path, its CPU
  from /proc, with no client competing for the CPU. The difference between ``broker`` and
  ``broker-plain`` is the broker's TLS cost for that record layout."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import socket
import ssl
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import kafka, procstat
from benchlib.batch_producer import check_response, produce_request
from benchlib.drivers import payload_pool
from exactly.records.builder import Record, build_batch
from exactly.testing.broker import Broker
from tls_ab import make_server_cert

MB = 1_000_000
MIXES = ("full", "kcat", "pairs")


def pieces_per_mb(mix: str) -> list[int]:
    """Plaintext record sizes making up about 1 MB in ``mix``."""
    if mix == "full":
        return [16384] * 61
    if mix == "pairs":
        return [10, 1024] * 490
    if mix == "kcat":
        out = [16384] * 24 + [10, 1024] * 201 + [16384] * 24
        return out
    raise ValueError(mix)


def _pump(obj: ssl.SSLObject, inc: ssl.MemoryBIO, out: ssl.MemoryBIO, peer_inc: ssl.MemoryBIO) -> None:
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    peer_inc.write(out.read())


def handshake_in_memory(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    """(server object, its incoming BIO, client object, client's outgoing BIO, server outgoing)."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    for _ in range(10):
        _pump(client, c_in, c_out, s_in)
        _pump(server, s_in, s_out, c_in)
    client.do_handshake()
    server.do_handshake()
    return server, s_in, client, c_out, s_out


def encrypt_records(client: ssl.SSLObject, out: ssl.MemoryBIO, mix: str, mb: int) -> list[bytes]:
    """``mb`` MB of ``mix`` as ciphertext, one TLS record per piece, a bytes object per record."""
    sizes = pieces_per_mb(mix)
    data = os.urandom(16384)
    parts: list[bytes] = []
    for _ in range(mb):
        for size in sizes:
            client.write(data[:size])
            parts.append(out.read())
    return parts


def encrypt(client: ssl.SSLObject, out: ssl.MemoryBIO, mix: str, mb: int) -> bytes:
    """``mb`` MB of ``mix`` as ciphertext, one TLS record per piece."""
    return b"".join(encrypt_records(client, out, mix, mb))


def plain_stream(mix: str, mb: int) -> bytes:
    return os.urandom(sum(pieces_per_mb(mix))) * mb


def floor(
    server: ssl.SSLObject, incoming: ssl.MemoryBIO, stream: bytes, chunk: int
) -> tuple[float, int, int]:
    """(CPU s, plaintext bytes, records) decrypting ``stream`` with the C object's read."""
    read = server._sslobj.read  # type: ignore[attr-defined]
    buf = bytearray(4 * 1024 * 1024)
    view = memoryview(buf)
    src = memoryview(stream)
    total = records = 0
    t0 = time.process_time()
    for off in range(0, len(stream), chunk):
        incoming.write(src[off : off + chunk])
        pos = 0
        while True:
            try:
                n = read(len(buf) - pos, view[pos:])
            except ssl.SSLWantReadError:
                break
            pos += n
            records += 1
            if pos > 2 * 1024 * 1024:
                total += pos
                pos = 0
        total += pos
    return time.process_time() - t0, total, records


class Sink(asyncio.BufferedProtocol):
    """Receives into one preallocated buffer, counting bytes and calls (the framer's role)."""

    def __init__(self, expect: int, done: asyncio.Future[None]) -> None:
        self.buf = bytearray(4 * 1024 * 1024)
        self.view = memoryview(self.buf)
        self.pos = 0
        self.total = 0
        self.calls = 0
        self.expect = expect
        self.done = done

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.pos :]

    def buffer_updated(self, nbytes: int) -> None:
        self.total += nbytes
        self.calls += 1
        self.pos += nbytes
        if self.pos > 2 * 1024 * 1024:
            self.pos = 0
        if self.total >= self.expect and not self.done.done():
            self.done.set_result(None)


def _serve(ctx: ssl.SSLContext | None, expect: int, port_out: Any, result_out: Any) -> None:
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        sinks: list[Sink] = []

        def factory() -> Sink:
            sinks.append(Sink(expect, done))
            return sinks[-1]

        server = await loop.create_server(factory, "127.0.0.1", 0, ssl=ctx)
        port_out.send(server.sockets[0].getsockname()[1])
        # the clock starts at the first byte of the stream: wait for the connection (handshake done)
        while not sinks or (ctx is not None and sinks[0].calls == 0 and sinks[0].total == 0):
            await asyncio.sleep(0.001)
            if sinks and ctx is None:
                break
        t0 = time.process_time()
        await done
        cpu = time.process_time() - t0
        result_out.send((cpu, sinks[0].total, sinks[0].calls))
        server.close()

    uvloop.run(main())


def _send_paced(sock: socket.socket, stream: bytes, chunk: int) -> None:
    """``stream`` in ``chunk``-byte sends with a pause after each, so that the receiver (idle
    between them) wakes up once per chunk, as it does for a client slower than it."""
    view = memoryview(stream)
    for off in range(0, len(stream), chunk):
        sock.sendall(view[off : off + chunk])
        time.sleep(0.0003)


def serve_and_measure(
    ctx: ssl.SSLContext | None,
    client_ctx: ssl.SSLContext | None,
    mix: str,
    mb: int,
    per_record: bool = False,
    paced: int = 0,
) -> tuple[float, int, int]:
    """Run a receiver process, send it the stream (pre-encrypted over TLS), return its figures."""
    mp = multiprocessing.get_context("fork")
    port_r, port_w = mp.Pipe(False)
    res_r, res_w = mp.Pipe(False)
    expect = sum(pieces_per_mb(mix)) * mb
    proc = mp.Process(target=_serve, args=(ctx, expect, port_w, res_w))
    proc.start()
    port = port_r.recv()
    sock = socket.create_connection(("127.0.0.1", port))
    if client_ctx is None:
        stream = plain_stream(mix, mb)
        time.sleep(0.05)
        if paced:
            _send_paced(sock, stream, paced)
        else:
            sock.sendall(stream)
    else:
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = client_ctx.wrap_bio(inc, out, server_hostname="localhost")
        sock.setblocking(True)
        for _ in range(20):
            try:
                obj.do_handshake()
                sock.sendall(out.read())
                break
            except ssl.SSLWantReadError:
                sock.sendall(out.read())
                inc.write(sock.recv(65536))
        # a byte of application data first, so the receiver's clock starts after the handshake
        obj.write(b"x")
        sock.sendall(out.read())
        time.sleep(0.2)
        if per_record:  # one send() per TLS record, as librdkafka's SSL_write per segment
            records = encrypt_records(obj, out, mix, mb)
            send = sock.sendall
            for record in records:
                send(record)
        elif paced:
            _send_paced(sock, encrypt(obj, out, mix, mb), paced)
        else:
            sock.sendall(encrypt(obj, out, mix, mb))
    cpu, total, calls = res_r.recv()
    proc.join()
    sock.close()
    return cpu, total, calls


def frame_pieces(mix: str, size: int) -> list[int]:
    """A ``size``-byte request cut into ``mix``'s record sizes (its pattern repeated)."""
    out: list[int] = []
    left = size
    for piece in itertools.cycle(pieces_per_mb(mix)):
        if left <= 0:
            break
        out.append(min(piece, left))
        left -= out[-1]
    return out


def _tls_client(
    sock: socket.socket, ctx: ssl.SSLContext
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="localhost")
    for _ in range(20):
        try:
            obj.do_handshake()
            sock.sendall(out.read())
            break
        except ssl.SSLWantReadError:
            sock.sendall(out.read())
            inc.write(sock.recv(65536))
    return obj, inc, out


def broker_feed(broker: Broker, client_ctx: ssl.SSLContext | None, mix: str, mb: int) -> float:
    """Broker CPU-s per GB of record values for ``mb`` ~1 MB Produce requests in ``mix``'s layout."""
    pool = payload_pool()
    records = 960
    topic = f"micro-{mix}-{time.monotonic_ns()}"
    frame = produce_request(topic, build_batch([Record(v) for v in pool[:records]]), acks=1)
    host, port = broker.listener_address("SSL" if client_ctx else "PLAINTEXT").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    obj = inc = None
    kafka.create_topic(broker.listener_address("PLAINTEXT"), topic, 1)
    if client_ctx is not None:
        obj, inc, out = _tls_client(sock, client_ctx)
    chunks: list[bytes] = []
    sizes = frame_pieces(mix, len(frame))
    for n in range(mb + 1):
        struct.pack_into(">i", frame, 8, n + 1)
        if obj is None:
            chunks.append(bytes(frame))
            continue
        view = memoryview(frame)
        pos = 0
        for size in sizes:
            obj.write(view[pos : pos + size])
            pos += size
        chunks.append(out.read())

    correlation = 0

    def answers(count: int) -> None:
        """Read until ``count`` more Produce answers came back, in order; raise on an error."""
        nonlocal correlation
        got = b""
        for _ in range(count):
            for _ in range(1_000_000):
                if len(got) >= 4 and len(got) >= 4 + int.from_bytes(got[:4], "big"):
                    break
                data = sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("broker closed the connection")
                if obj is not None and inc is not None:
                    inc.write(data)
                    data = b""
                    for _ in range(1000):
                        try:
                            data += obj.read(1 << 16)
                        except ssl.SSLWantReadError:
                            break
                got += data
            size = int.from_bytes(got[:4], "big")
            correlation += 1
            error = check_response(got[4 : 4 + size], correlation)
            if error:
                raise RuntimeError(f"produce error {error}")
            got = got[4 + size :]

    sock.sendall(chunks[0])  # a warm-up request
    answers(1)
    stream = b"".join(chunks[1:])
    del chunks
    pid = broker.pid
    assert pid is not None
    c0 = procstat.cpu_seconds(pid)
    sock.sendall(stream)
    answers(mb)
    cpu = procstat.cpu_seconds(pid) - c0
    sock.close()
    return cpu / (mb * records * 1024 / 1e9)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=128, help="MB of plaintext per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mix", action="append", choices=MIXES)
    parser.add_argument("--broker", action="store_true", help="also feed the real broker (see above)")
    parser.add_argument(
        "--paced", type=int, default=0, metavar="BYTES", help="also uvloop runs sent in paced chunks of BYTES"
    )
    parser.add_argument("--only-broker", action="store_true", help="only the broker rows")
    parser.add_argument("--chunk", type=int, default=256 * 1024, help="floor: ciphertext bytes per BIO write")
    args = parser.parse_args()
    mixes = args.mix or list(MIXES)
    scratch = Path(tempfile.mkdtemp(prefix="exactly-tls-micro-"))
    keystore, ca = make_server_cert(scratch)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(keystore)
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    client_ctx = ssl.create_default_context(cafile=str(ca))
    print(f"load average {os.getloadavg()[0]:.2f}; {args.mb} MB per measurement, {args.rounds} round(s)")
    results: dict[tuple[str, str], list[float]] = {}
    broker = None
    if args.broker or args.only_broker:
        broker = Broker(
            scratch / "data",
            scratch / "broker.log",
            overrides={
                "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                "ssl.keystore.location": str(keystore),
            },
            name="tls-micro",
        ).start()
    reads: dict[str, list[float]] = {}
    records_per_mb = {mix: len(pieces_per_mb(mix)) * MB / sum(pieces_per_mb(mix)) for mix in mixes}
    for rnd in range(args.rounds):
        for mix in mixes:
            if broker is not None:
                results.setdefault(("broker", mix), []).append(broker_feed(broker, client_ctx, mix, args.mb))
                results.setdefault(("broker-plain", mix), []).append(broker_feed(broker, None, mix, args.mb))
            if args.only_broker:
                continue
            server, s_in, client, c_out, _ = handshake_in_memory(server_ctx, client_ctx)
            stream = encrypt(client, c_out, mix, args.mb)
            cpu, total, _recs = floor(server, s_in, stream, args.chunk)
            results.setdefault(("floor", mix), []).append(cpu / (total / 1e9))
            del stream
            cpu, total, calls = serve_and_measure(server_ctx, client_ctx, mix, args.mb)
            results.setdefault(("uvloop", mix), []).append(cpu / (total / 1e9))
            cpu, total, calls = serve_and_measure(server_ctx, client_ctx, mix, args.mb, per_record=True)
            results.setdefault(("uvloop-send-per-record", mix), []).append(cpu / (total / 1e9))
            reads.setdefault(f"uvloop-send-per-record {mix}", []).append(calls * 1e6 / total)
            cpu, total, calls = serve_and_measure(None, None, mix, args.mb)
            results.setdefault(("uvloop-plain", mix), []).append(cpu / (total / 1e9))
            if args.paced:
                cpu, total, calls = serve_and_measure(server_ctx, client_ctx, mix, args.mb, paced=args.paced)
                results.setdefault(("uvloop-paced", mix), []).append(cpu / (total / 1e9))
                reads.setdefault(f"uvloop-paced {mix}", []).append(calls * 1e6 / total)
                cpu, total, calls = serve_and_measure(None, None, mix, args.mb, paced=args.paced)
                results.setdefault(("uvloop-plain-paced", mix), []).append(cpu / (total / 1e9))
                reads.setdefault(f"uvloop-plain-paced {mix}", []).append(calls * 1e6 / total)
        print(f"round {rnd + 1} done, load {os.getloadavg()[0]:.2f}", flush=True)
    print("\n| receiver | mix | records/MB | CPU-s/GB median [min-max] | us per record over full |")
    print("| --- | --- | --- | --- | --- |")
    for (recv, mix), vals in sorted(results.items()):
        med = statistics.median(vals)
        per = ""
        if mix != "full" and (recv, "full") in results:
            extra = med - statistics.median(results[(recv, "full")])
            per = f"{extra * 1e6 / 1e3 / (records_per_mb[mix] - records_per_mb.get('full', 61)):.2f}"
        print(
            f"| {recv} | {mix} | {records_per_mb[mix]:.0f} | {med:.3f} [{min(vals):.3f}-{max(vals):.3f}] | {per} |"
        )
    if broker is not None:
        broker.stop()
    for mix, vals in reads.items():
        print(f"{mix}: buffer_updated calls per MB {statistics.median(vals):.1f}")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
