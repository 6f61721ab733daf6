"""The long fuzzing run: ``python -m tests.fuzz.run_fuzz --inputs 1000000 [--socket-inputs 20000]``.

Phase 1 (in-process, fast): mutated requests of every API/version, real-client-shaped produce
requests with re-checksummed batch mutations and random bytes go through the broker's own
framer and dispatcher (tests/fuzz/harness.py), with a health check (valid ApiVersions/Metadata/Produce)
every 5000 inputs.

Phase 2 (socket): the same kind of inputs over TCP to a live broker subprocess, several
connections at once; every input must get a response or a closed connection within 3 s, and a
separate control connection must keep working. If the broker process dies, the input is saved,
the broker restarted, and the run goes on.

Inputs with overlong array lengths (which made kio's native reader abort the process before the
dispatcher refused them, src/exactly/protocol/guard.py) are sent like any other; ``--guard`` counts
and skips them, for brokers without that fix. Exit status 1 on any crash.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import socket
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.fuzz.harness import (
    PARKING_APIS,
    TOPICS,
    Mutator,
    Stats,
    health_requests,
    produce_seeds,
    run_inprocess,
    schema_seeds,
)
from tests.fuzz.kio_guard import would_abort
from tests.support.broker import Broker
from tests.support.wire import WireClient, create_topic

_SIZE = struct.Struct(">i")
_SENTINEL_CORR = 0x7EADBEEF
_SENTINEL = struct.pack(">hhih", 18, 0, _SENTINEL_CORR, 4) + b"fuzz"  # ApiVersions v0
_SENTINEL_FRAME = _SIZE.pack(len(_SENTINEL)) + _SENTINEL


def save(out: Path, name: str, items: list[tuple[bytes, str]]) -> None:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    for i, (payload, why) in enumerate(items):
        (d / f"{i:04d}.bin").write_bytes(payload)
        (d / f"{i:04d}.txt").write_text(why)


# ------------------------------------------------------------------ in-process phase
def _worker(inputs: int, seed: int, mm_path: str, progress_path: str, out: str, report_every: int) -> None:
    import mmap

    with open(mm_path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), LAST_SIZE)

    def progress(st: Stats) -> None:
        Path(progress_path).write_text(
            json.dumps({"total": st.total, "outcomes": dict(st.outcomes), "crashes": len(st.crashes)})
        )

    st = asyncio.run(run_inprocess(inputs, seed, report_every=report_every, last=mm, progress=progress))
    save(Path(out), f"inprocess-crashes-{seed}", st.crashes)
    save(Path(out), f"inprocess-native-aborts-{seed}", st.native_aborts[:20])
    save(Path(out), f"inprocess-handler-errors-{seed}", st.handler_errors[:50])
    kinds = Counter(tb.strip().splitlines()[-1][:160] for _, tb in st.handler_errors)
    Path(progress_path).write_text(
        json.dumps(
            {
                "total": st.total,
                "outcomes": dict(st.outcomes),
                "crashes": len(st.crashes),
                "handler_error_kinds": kinds,
                "done": True,
            }
        )
    )


LAST_SIZE = 1 << 20


def inprocess_phase(inputs: int, seed: int, out: Path, report_every: int) -> dict[str, Any]:
    """Run workers (fresh processes) until ``inputs`` are fed; a worker that dies (a native abort
    in the broker code) is a crash: its last input is saved and a new worker goes on."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    mm_path = out / "last-input.mm"
    mm_path.write_bytes(b"\0" * LAST_SIZE)
    outcomes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    crashes = 0
    done = 0
    worker = 0
    dead: list[tuple[bytes, str]] = []
    while done < inputs:
        worker += 1
        wseed = seed * 1000 + worker
        prog = out / f"progress-{wseed}.json"
        p = ctx.Process(
            target=_worker, args=(inputs - done, wseed, str(mm_path), str(prog), str(out), report_every)
        )
        p.start()
        p.join()
        info: dict[str, Any] = (
            json.loads(prog.read_text()) if prog.exists() else {"total": 0, "outcomes": {}, "crashes": 0}
        )
        outcomes.update(info["outcomes"])
        kinds.update(info.get("handler_error_kinds", {}))
        crashes += info["crashes"]
        done += max(info["total"], 1)
        if p.exitcode != 0 or not info.get("done"):
            raw = mm_path.read_bytes()
            (n,) = _SIZE.unpack_from(raw, 0)
            dead.append((raw[4 : 4 + n], f"worker died with exit code {p.exitcode} on this input"))
            outcomes["process-died"] += 1
            crashes += 1
            done += 1
            print(f"  worker {wseed} died (exit {p.exitcode}); input saved; going on", flush=True)
    save(out, "inprocess-process-deaths", dead)
    return {
        "inputs": done,
        "outcomes": dict(outcomes),
        "crashes": crashes,
        "workers": worker,
        "handler_error_kinds": dict(kinds),
    }


# ------------------------------------------------------------------ socket phase
class SocketFuzzer:
    def __init__(self, broker: Broker, seed: int, guard: bool) -> None:
        self.broker = broker
        self.rng = random.Random(seed)
        self.guard = guard
        self.stats = Stats()
        rng = random.Random(seed)
        self.mut = Mutator(schema_seeds(4, rng) + produce_seeds(rng) + health_requests(), rng)
        self.conns: list[socket.socket | None] = [None] * 4

    def conn(self, i: int) -> socket.socket:
        s = self.conns[i]
        if s is None:
            s = socket.create_connection((self.broker.host, self.broker.port or 0), timeout=3)
            self.conns[i] = s
        return s

    def drop(self, i: int) -> None:
        s = self.conns[i]
        if s is not None:
            s.close()
        self.conns[i] = None

    def one(self, payload: bytes) -> str:
        key = struct.unpack_from(">h", payload, 0)[0] if len(payload) >= 2 else -1
        if self.guard and would_abort(payload) is not None:
            return "native-abort"
        i = self.rng.randrange(len(self.conns))
        try:
            s = self.conn(i)
            # a sentinel ApiVersions v0 after the input: answers come in order, so its answer
            # proves the input was dealt with even when it had none (acks=0 produce)
            s.sendall(_SIZE.pack(len(payload)) + payload + _SENTINEL_FRAME)
            frames = 0
            while True:
                head = _recv(s, 4)
                if head is None:
                    self.drop(i)
                    return "close"
                (size,) = _SIZE.unpack(head)
                body = _recv(s, size)
                if body is None:
                    self.drop(i)
                    return "close"
                frames += 1
                if len(body) >= 4 and _SIZE.unpack_from(body, 0)[0] == _SENTINEL_CORR:
                    return "response" if frames > 1 else "none"
                if frames > 2:
                    self.drop(i)
                    return "extra-response"
        except TimeoutError:
            self.drop(i)
            return "parked" if key in PARKING_APIS else "hang"
        except OSError:
            self.drop(i)
            return "close"

    def healthy(self) -> bool:
        try:
            with WireClient(self.broker.bootstrap, timeout=5) as c:
                for req in health_requests():
                    c.send_frame(req)
                    c.recv_frame()
            return True
        except (OSError, ValueError):
            return False

    def run(self, inputs: int, out: Path, report_every: int) -> Stats:
        started = time.monotonic()
        while self.stats.total < inputs:
            payload = self.mut.next()
            outcome = self.one(payload)
            self.stats.outcomes[outcome] += 1
            if outcome in ("hang", "extra-response"):
                self.stats.crashes.append(
                    (
                        payload,
                        f"{outcome}: no answer and no close within 3 s"
                        if outcome == "hang"
                        else "more than one response",
                    )
                )
            if not self.broker.running:
                self.stats.outcomes["broker-died"] += 1
                self.stats.crashes.append((payload, f"broker died (exit {self.broker.returncode})"))
                for i in range(len(self.conns)):
                    self.drop(i)
                self.broker.restart()
            if self.stats.total % 500 == 0 and not self.healthy():
                self.stats.crashes.append((payload, "control connection failed"))
                self.stats.outcomes["unhealthy"] += 1
            if report_every and self.stats.total % report_every == 0:
                rate = self.stats.total / (time.monotonic() - started)
                print(
                    f"  socket: {self.stats.total} inputs, {rate:.0f}/s, {dict(self.stats.outcomes)}",
                    flush=True,
                )
        for i in range(len(self.conns)):
            self.drop(i)
        return self.stats


def _recv(s: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def socket_phase(inputs: int, seed: int, guard: bool, out: Path, report_every: int) -> Stats:
    base = Path(tempfile.mkdtemp(prefix="exactly-fuzz-sock-"))
    b = Broker(
        base / "data",
        base / "broker.log",
        name="fuzz-broker",
        overrides={"auto.create.topics.enable": "false", "group.initial.rebalance.delay.ms": "0"},
    )
    b.start()
    try:
        with WireClient(b.bootstrap) as c:
            for name, parts in TOPICS.items():
                create_topic(c, name, parts)
        stats = SocketFuzzer(b, seed, guard).run(inputs, out, report_every)
        log = b.log_text()
        stats.outcomes["internal-error-closes"] = log.count("unexpected error on connection")
        (out / "socket-broker.log").write_text(log[-2_000_000:])
        return stats
    finally:
        b.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000, help="in-process inputs")
    ap.add_argument("--socket-inputs", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="where crashing inputs and the summary go")
    ap.add_argument(
        "--guard",
        action="store_true",
        help="skip inputs with overlong arrays (for brokers without the dispatcher guard)",
    )
    ap.add_argument("--report-every", type=int, default=50_000)
    ap.add_argument("--max-memory-gb", type=int, default=4, help="RLIMIT_AS of the fuzzing process")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="exactly-fuzz-out-"))
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"seed": args.seed}
    started = time.monotonic()
    crashes = 0
    # a request that makes the broker allocate gigabytes must fail here (MemoryError, counted as a
    # crash with its traceback), not eat a shared machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (args.max_memory_gb << 30, args.max_memory_gb << 30))
    if args.inputs:
        print(f"phase 1: {args.inputs} in-process inputs (seed {args.seed})", flush=True)
        info = inprocess_phase(args.inputs, args.seed, out, args.report_every)
        summary["inprocess"] = info
        crashes += info["crashes"]
        print(
            f"phase 1 done: {info['inputs']} inputs, {info['crashes']} crashes, {info['outcomes']}",
            flush=True,
        )
    if args.socket_inputs:
        print(f"phase 2: {args.socket_inputs} socket inputs", flush=True)
        st = socket_phase(args.socket_inputs, args.seed, args.guard, out, args.report_every // 10)
        save(out, "socket-crashes", st.crashes)
        summary["socket"] = {"inputs": st.total, "outcomes": dict(st.outcomes), "crashes": len(st.crashes)}
        crashes += len(st.crashes)
        print(f"phase 2 done: {st.total} inputs, {len(st.crashes)} crashes, {dict(st.outcomes)}", flush=True)
    summary["seconds"] = round(time.monotonic() - started)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"total crashes: {crashes}; details in {out}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
