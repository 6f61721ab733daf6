"""Fuzzing harness: an in-process broker driven through the real dispatcher, seed inputs, and a
fast mutator.

``InProcessBroker`` opens a Broker on a temp data dir (coordinators loaded, timers running) and
feeds request payloads (frames without the size prefix) through the broker's framer
(exactly.protocol.framing, one per InProcessBroker, as one per connection) to
``dispatch.dispatch`` - the exact code a socket's bytes go through. Long-poll waits are disabled so a Fetch never parks. Outcomes:

* ``response``  a response whose size prefix is right and whose correlation id is the request's
* ``none``      no response (acks=0 produce)
* ``close``     ``CloseConnection`` (what Kafka does for unparseable frames)
* ``parked``    a JoinGroup/SyncGroup still waiting for its rebalance after the time limit (legal)
* ``handler-error`` an Exception from a handler: the connection loop logs it and closes the
                connection (the broker carries on) - a bug to list, though not a crash
* ``native-abort`` not fed: kio's native reader would abort the process (tests/fuzz/kio_guard.py)
* ``crash``     a BaseException that is not an Exception, a malformed response, a blocked loop, or
                any other request over the time limit

Seeds (``seed_requests``): requests of every API and version we advertise, built with kio from
hypothesis' ``from_type`` strategies (random but schema-valid), plus hand-made produce requests
with valid batches (idempotent and transactional). ``Mutator`` derives new inputs from them.
"""

from __future__ import annotations

import asyncio
import random
import signal
import struct
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exactly.protocol.apis import VERSION_RANGES, ApiKey, schema
from exactly.protocol.framing import Framer, frame
from exactly.records.batch import compute_crc
from exactly.records.builder import Record, build_batch
from exactly.server.broker import Broker, Endpoint
from exactly.server.config import BrokerConfig
from exactly.server.dispatch import CloseConnection, dispatch
from tests.fuzz.kio_guard import would_abort
from tests.support.framer import feed_chunks
from tests.support.wire import encode_request, produce_request

TOPICS = {"fuzz-a": 3, "fuzz-b": 1}
PARKING_APIS = {ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP}
_SIZE = struct.Struct(">i")


class _Hang(Exception):
    """Raised by SIGALRM inside a synchronous stretch of the broker that took too long."""


def _alarm(_sig: int, _frame: Any) -> None:
    raise _Hang


class _NoWait:
    """Stands in for AppendWaiters: a long-poll Fetch returns at once."""

    async def wait(self, tps: Any, timeout_s: float) -> None:
        return None

    def notify(self, tp: Any) -> None:
        return None


@dataclass
class Stats:
    outcomes: Counter[str] = field(default_factory=Counter)
    by_api: Counter[int] = field(default_factory=Counter)
    crashes: list[tuple[bytes, str]] = field(default_factory=list)
    native_aborts: list[tuple[bytes, str]] = field(default_factory=list)  # skipped: would kill the process
    handler_errors: list[tuple[bytes, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


class InProcessBroker:
    def __init__(self, data_dir: Path | None = None, **overrides: str) -> None:
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="exactly-fuzz-")
            data_dir = Path(self._tmp.name)
        conf = {
            "log.dirs": str(data_dir),
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            **overrides,
        }
        self.config = BrokerConfig.load(None, conf)
        self.data_dir = data_dir
        self.broker: Broker | None = None
        self.framer: Framer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.timeout = 2.0
        self.guard = False  # True: skip (and count) inputs with overlong arrays (pre-guard brokers)
        self.last: Any = None  # a writable buffer (shared memory) that gets each input first

    async def open(self) -> InProcessBroker:
        from exactly.server.clock import now_ms

        b = Broker.open(self.config, self.data_dir)
        b.waiters = _NoWait()  # type: ignore[assignment]
        b.advertised = Endpoint("127.0.0.1", 9092)  # what start() would set
        b.groups.load()
        b.txn.load()
        self._tasks = [*b.groups.start_tasks(), *b.txn.start_tasks()]
        for name, parts in TOPICS.items():
            if name not in b.logs.topics():
                b.logs.create_topic(name, parts, {}, now_ms=now_ms())
        self.broker = b
        self.framer = Framer(b.max_request_size)
        return self

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.broker is not None:
            self.broker.logs.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def feed(self, payload: bytes, stats: Stats | None = None) -> str:
        """Dispatch one request payload; returns the outcome (see the module docstring)."""
        b = self.broker
        assert b is not None
        key = struct.unpack_from(">h", payload, 0)[0] if len(payload) >= 2 else -1
        corr = _SIZE.unpack_from(payload, 4)[0] if len(payload) >= 8 else None
        if self.last is not None:  # for post-mortems of a process that dies natively
            n = min(len(payload), len(self.last) - 4)
            self.last[4 : 4 + n] = payload[:n]
            _SIZE.pack_into(self.last, 0, n)
        if self.guard:
            path = would_abort(payload)
            if path is not None:  # kio's native reader would abort this process (a known bug)
                if stats is not None:
                    stats.outcomes["native-abort"] += 1
                    stats.by_api[key] += 1
                    if len(stats.native_aborts) < 50:
                        stats.native_aborts.append((payload, path))
                return "native-abort"
        # a watchdog for synchronous stretches that wait_for cannot interrupt (main thread only)
        watchdog = threading.current_thread() is threading.main_thread()
        if watchdog:
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, self.timeout * 2)
        outcome = "?"
        chunks = None
        try:
            chunks = await asyncio.wait_for(dispatch(b, self._framed(payload), "fuzz"), self.timeout)
        except CloseConnection:
            outcome = "close"
        except _Hang:
            outcome = "crash"
            if stats is not None:
                stats.crashes.append(
                    (
                        payload,
                        f"hang: the broker's loop was blocked for {self.timeout * 2}s\n"
                        + traceback.format_exc(),
                    )
                )
        except TimeoutError:
            outcome = "parked" if key in PARKING_APIS else "crash"
            if outcome == "crash" and stats is not None:
                stats.crashes.append((payload, f"no answer within {self.timeout}s"))
        except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
            raise
        except MemoryError:  # under run_fuzz's RLIMIT_AS: one request asked for gigabytes
            outcome = "crash"
            if stats is not None:
                stats.crashes.append((payload, "memory blow-up\n" + traceback.format_exc()))
        except Exception:
            # a handler bug: the connection loop logs it and closes the connection ("internal
            # error"); the broker and other connections carry on. Counted and listed, not a crash.
            outcome = "handler-error"
            if stats is not None and len(stats.handler_errors) < 200:
                stats.handler_errors.append((payload, traceback.format_exc()))
        except BaseException:  # e.g. pyo3's PanicException: escapes the connection's except Exception
            outcome = "crash"
            if stats is not None:
                stats.crashes.append((payload, traceback.format_exc()))
        finally:
            if watchdog:
                signal.setitimer(signal.ITIMER_REAL, 0)
        if outcome == "?":
            if chunks is None:
                outcome = "none"
            else:
                outcome = "response"
                data = b"".join(bytes(c) for c in chunks)
                problem = None
                if len(data) < 8 or _SIZE.unpack_from(data, 0)[0] != len(data) - 4:
                    problem = "response size prefix does not match its length"
                elif _SIZE.unpack_from(data, 4)[0] != corr:
                    problem = "response correlation id differs from the request's"
                if problem is not None:
                    outcome = "crash"
                    if stats is not None:
                        stats.crashes.append((payload, problem))
        if stats is not None:
            stats.outcomes[outcome] += 1
            stats.by_api[key] += 1
        return outcome

    def _framed(self, payload: bytes) -> bytearray:
        """``payload`` as the broker's framer hands it to the dispatcher."""
        framer = self.framer
        assert framer is not None
        feed_chunks(framer, [frame(payload)])
        return framer.frames.popleft()

    async def healthy(self) -> bool:
        """Valid requests still work: ApiVersions, Metadata, an idempotent-less produce."""
        for req in health_requests():
            if await self.feed(req) != "response":
                return False
        return True


# ------------------------------------------------------------------ seeds
def encode(request: Any, corr: int = 7, client_id: str | None = "fuzz") -> bytes:
    return encode_request(request, corr, client_id)


def health_requests() -> list[bytes]:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.metadata.v12.request import MetadataRequest

    av = ApiVersionsRequest(client_software_name="fuzz", client_software_version="1")
    md = MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    batch = build_batch([Record(value=b"health")], base_timestamp=int(time.time() * 1000))
    return [encode(av, 1), encode(md, 2), encode(produce_request("fuzz-a", 0, batch), 3)]


def produce_seeds(rng: random.Random) -> list[bytes]:
    """Produce requests with valid batches: plain, idempotent, transactional, several versions."""
    out = []
    now = int(time.time() * 1000)
    for version in (3, 5, 7, 8):
        for kind in ("plain", "idem", "txn"):
            n = rng.randint(1, 4)
            batch = build_batch(
                [
                    Record(
                        value=rng.randbytes(rng.randint(0, 40)),
                        key=rng.randbytes(3) if rng.random() < 0.5 else None,
                    )
                    for _ in range(n)
                ],
                producer_id=-1 if kind == "plain" else rng.randint(0, 5),
                producer_epoch=-1 if kind == "plain" else 0,
                base_sequence=-1 if kind == "plain" else rng.randint(0, 3),
                transactional=kind == "txn",
                base_timestamp=now,
            )
            tid = "fuzz-tx" if kind == "txn" else None
            topic = rng.choice(list(TOPICS))
            out.append(
                encode(
                    produce_request(
                        topic,
                        rng.randrange(TOPICS[topic]),
                        batch,
                        version=version,
                        transactional_id=tid,
                        acks=rng.choice((-1, 1, 0)),
                    )
                )
            )
    return out


def api_versions() -> Iterator[tuple[int, int]]:
    for key, (lo, hi) in sorted(VERSION_RANGES.items()):
        for v in range(lo, hi + 1):
            yield int(key), v


def _strategy(api_key: int, version: int) -> Any:
    from hypothesis import strategies as st
    from kio.static.primitive import Records

    st.register_type_strategy(Records, st.binary(max_size=200))
    return st.from_type(schema(api_key, version).request_type)


def schema_seeds(per_api: int, rng: random.Random) -> list[bytes]:
    """``per_api`` random schema-valid requests for every advertised (api, version)."""
    import warnings

    from hypothesis.errors import NonInteractiveExampleWarning

    out: list[bytes] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        for key, version in api_versions():
            strat = _strategy(key, version)
            for _ in range(per_api):
                try:
                    req = strat.example()
                    out.append(encode(req, rng.randint(0, 2**31 - 1)))
                except Exception:  # the generator made something kio cannot encode (e.g. too long)
                    continue
    return out


# ------------------------------------------------------------------ mutation
INTERESTING16 = [0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, -0x8000, 0x100]
INTERESTING32 = [0, 1, -1, 0x7FFFFFFF, -0x80000000, 0xFFFF, 0x10000, 1 << 24, 61, 49]


class Mutator:
    def __init__(self, seeds: list[bytes], rng: random.Random) -> None:
        self.seeds = seeds
        self.rng = rng
        self.produce = [s for s in seeds if len(s) >= 2 and s[0] == 0 and s[1] == 0]

    def next(self) -> bytes:
        rng = self.rng
        r = rng.random()
        if r < 0.05:
            return rng.randbytes(rng.randint(0, 64))
        if r < 0.20 and self.produce:
            return self.batch_mutation(rng.choice(self.produce))
        data = bytearray(rng.choice(self.seeds))
        keep_header = rng.random() < 0.7  # mostly fuzz bodies: the header picks the schema
        lo = min(len(data), 10) if keep_header else 0
        for _ in range(rng.choice((1, 1, 1, 2, 3, 4))):
            self.mutate(data, lo)
        return bytes(data)

    def mutate(self, data: bytearray, lo: int) -> None:
        rng = self.rng
        n = len(data)
        op = rng.randrange(9)
        pos = rng.randint(lo, n - 1) if n > lo else lo
        if op == 0 and n > lo:
            data[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and n > lo:
            data[pos] = rng.randrange(256)
        elif op == 2 and n - lo >= 2:
            pos = min(pos, n - 2)
            struct.pack_into(
                ">h",
                data,
                pos,
                rng.choice(INTERESTING16) if rng.random() < 0.8 else rng.randint(-32768, 32767),
            )
        elif op == 3 and n - lo >= 4:
            pos = min(pos, n - 4)
            struct.pack_into(">i", data, pos, rng.choice(INTERESTING32))
        elif op == 4:
            del data[pos:]
        elif op == 5:
            data[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 6 and n > lo:
            del data[pos : pos + rng.randint(1, 16)]
        elif op == 7 and n > lo:
            end = min(n, pos + rng.randint(1, 32))
            data[pos:pos] = data[pos:end]
        else:  # splice the tail of another seed
            other = rng.choice(self.seeds)
            cut = rng.randint(0, len(other))
            data[pos:] = other[cut:]

    def batch_mutation(self, seed: bytes) -> bytes:
        """Mutate a produce request's record batch header/body and fix its CRC, so validation
        goes past the checksum."""
        data = bytearray(seed)
        start = find_batch(data)
        if start is None:
            return bytes(data)
        rng = self.rng
        size = len(data) - start
        for _ in range(rng.randint(1, 3)):
            field_at = rng.choice((8, 12, 16, 21, 23, 27, 35, 43, 51, 53, 57, 61, 62, 63, 64))
            if field_at >= size:
                continue
            if field_at in (8, 12, 23, 53, 57) and field_at + 4 <= size:
                struct.pack_into(">i", data, start + field_at, rng.choice(INTERESTING32))
            elif field_at in (21, 51) and field_at + 2 <= size:
                struct.pack_into(">h", data, start + field_at, rng.choice([*INTERESTING16, 16, 32, 48, 1, 4]))
            elif field_at in (27, 35, 43) and field_at + 8 <= size:
                struct.pack_into(
                    ">q", data, start + field_at, rng.choice((0, -1, 2**63 - 1, rng.randint(0, 99)))
                )
            else:
                data[start + field_at] = rng.randrange(256)
        if size >= 61 and rng.random() < 0.9:
            struct.pack_into(">I", data, start + 17, compute_crc(data, start, size))
        return bytes(data)


def find_batch(data: bytes | bytearray) -> int | None:
    """Where the (single, last) record batch of a one-partition produce seed starts."""
    # produce seeds end with the batch; scan for a magic-2 header whose length runs to the end
    for start in range(10, len(data) - 61):
        if data[start + 16] == 2:
            (length,) = _SIZE.unpack_from(data, start + 8)
            if start + 12 + length == len(data):
                return start
    return None


async def run_inprocess(
    inputs: int,
    seed: int,
    *,
    per_api: int = 8,
    report_every: int = 0,
    deadline: float | None = None,
    health_every: int = 5000,
    last: Any = None,
    progress: Any = None,
) -> Stats:
    """Feed ``inputs`` mutated requests to an in-process broker; returns the stats.

    ``last``: a writable buffer that receives each input before it is fed (post-mortems);
    ``progress(stats)`` is called every 1000 inputs."""
    rng = random.Random(seed)
    seeds = schema_seeds(per_api, rng) + produce_seeds(rng) + health_requests()
    mut = Mutator(seeds, rng)
    stats = Stats()
    ib = await InProcessBroker().open()
    ib.last = last
    started = time.monotonic()
    try:
        for s in seeds:  # every seed as is, first
            await ib.feed(s, stats)
        while stats.total < inputs:
            if deadline is not None and time.monotonic() > deadline:
                break
            await ib.feed(mut.next(), stats)
            if health_every and stats.total % health_every == 0 and not await ib.healthy():
                stats.crashes.append((b"", f"health check failed after {stats.total} inputs"))
            if progress is not None and stats.total % 1000 == 0:
                progress(stats)
            if report_every and stats.total % report_every == 0:
                rate = stats.total / (time.monotonic() - started)
                print(f"  in-process: {stats.total} inputs, {rate:.0f}/s, {dict(stats.outcomes)}", flush=True)
    finally:
        await ib.close()
    return stats
