"""The cleaner's worker processes: a pass's heavy part (``cleaner.run_pass``: reading the dirty
segments, the offset map, filtering and rebuilding batches, writing ``.cleaned`` segments) runs
in a process of its own, so it never holds the broker's GIL.

Theory of operation
-------------------
``WorkerProcess`` (broker side, one per cleaner thread) starts ``python -m
exactly.storage.cleaner.worker_main <fd>`` on first use -- a fresh interpreter, never a fork of the
broker with its event loop and threads -- and talks to it over a socket pair with
``multiprocessing.connection`` framing: one ``WorkRequest`` (a ``job.CleaningJob`` and the
cleaner's settings) in, one ``WorkResponse`` out. The worker keeps nothing between requests but
its offset map's memory; it writes only ``.cleaned`` files, which the broker swaps in.

Failure: an exception in the pass comes back as a response (``error`` set, the ``.cleaned`` files
removed); a worker that dies (killed, out of memory) is seen as the end of its pipe
(``WorkerDiedError``), its leftovers are removed by the caller and a new worker is started for
the next request. The worker exits when its pipe closes, so it never outlives the broker.

Priority: cleaning is background work, and on a box with fewer free cores than runnable
processes a worker at the broker's priority takes the event loop's time slices, which shows up
directly as produce latency (bench's ``cleaner-produce-latency``). The worker therefore starts in
a session of its own and lowers four things (``priority.lower_priority``, best effort, Linux;
``worker_main`` does it before it imports the rest, ~0.7 s of CPU):

- its *autogroup's* nice value to ``WORKER_NICENESS`` (19). With ``CONFIG_SCHED_AUTOGROUP`` (on
  in most distributions' kernels; ``/proc/sys/kernel/sched_autogroup_enabled``) a process's nice
  value only ranks it inside its session: a worker in the broker's session at nice 19 still drew
  on that whole session's fair share against every other session on the box, so the broker's
  group went on paying for it (measured on a 2-core box at load 7-10: the worker took 0.13-0.17
  cores in the broker's session, 0.01-0.02 alone in a session at nice 19);
- its policy to ``SCHED_BATCH`` (no wake-up preemption of others: it is a CPU-bound batch job).
  ``SCHED_IDLE`` was measured against it (bench's ``cleaner-produce-latency-priority``, three
  runs at load 2-3) and could not be told apart: whichever held the bench's first busy slot did
  worse. SCHED_BATCH stays, since a worker starved at the lowest weight would also hold whatever
  it holds (a file, a file system journal handle while it writes) longer;
- its own nice value to 19 (what counts when autogroups are off, and what the I/O scheduler
  derives a best-effort level from);
- its EEVDF slice to the shortest, 0.1 ms (``sched_slice``, Linux 6.12+): weight decides how
  often the worker runs, the slice how long it keeps a core once picked; with the default one a
  task woken on its core waited for the next tick (3-4.4 ms traced on this box, HZ=250).

Nice 19 leaves the worker a small share of a saturated CPU (weight 15 against a nice-0 group's
1024) and all of an idle one, so cleaning slows under load but never stops. A worker in its own
session no longer gets the broker's process-group signals; it still dies with the broker (the
parent-death signal, and its pipe's end). Kafka's cleaner threads run at the JVM's normal priority
and are held back only by ``log.cleaner.io.max.bytes.per.second`` (here too); the lowered
priority is a deliberate difference (a cleaner starved by a saturated box only cleans later).

CPU share: the lowered priority yields to *runnable* tasks, not to idle cores, so on a quiet
2-core box an unlimited worker takes the idle core (~0.6 of a core measured), which is where the
broker's clients run: their run-queue wait, not the broker, then made the produce p99 while
cleaning 3.7-46x the idle one (``bench/results/compaction-worker-session.md``). Each worker
therefore holds its CPU to ``log.cleaner.cpu.max.share`` of one core (``duty_cycle.DutyCycle``:
it reads its own CPU clock at each batch it reads or writes and every ``TICK_RECORDS`` records
it decodes, and sleeps in >= 1 ms slices when over its share, so it runs in bursts of about a
quarter of a millisecond; and, under its share on a loaded box, it still breaks each run of
0.25 ms of CPU with a 0.2 ms sleep). The bursts' length matters as much as the share: a client woken on the core the
worker holds waits for the worker to sleep or for the scheduler's tick (4 ms at HZ=250), which
is also why the worker takes the shortest EEVDF slice (above). With one check per batch a burst
was a whole 1 MB batch of 100 B records, ~40 ms of CPU, and the busy windows' produce p99 sat at
3-4.5 ms on a quiet box (``bench/results/cleaner-tail-s17.md``).
This is a deliberate difference from Kafka, whose cleaner threads run at
normal priority and are unthrottled by default; ``log.cleaner.cpu.max.share=1.0`` restores that.
The share is per worker (each of ``log.cleaner.threads`` workers may use that much of a core).

Throttle: each worker keeps its own share of ``log.cleaner.io.max.bytes.per.second`` (the rate
divided by the number of workers; Kafka's threads share one throttler, which a set of processes
cannot without a shared clock and counter). It applies as well: both are consulted at each batch.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import exactly
from exactly.storage.cleaner.batch_filter import UncleanableBatchError
from exactly.storage.cleaner.cleaner import CleanerStats, run_pass
from exactly.storage.cleaner.duty_cycle import DutyCycle
from exactly.storage.cleaner.job import CleanedSegment, CleaningJob, remove_cleaned_files
from exactly.storage.cleaner.offset_map import OffsetMap

log = logging.getLogger(__name__)

#: Test fault: the worker exits abruptly once it has written its first ``.cleaned`` segment.
FAULT_EXIT_AFTER_FIRST_GROUP = "exit_after_first_group"
POLL_S = 0.1
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class WorkRequest:
    job: CleaningJob
    map_memory: int
    load_factor: float
    io_buffer_size: int
    io_bytes_per_second: float
    cpu_share: float = 1.0
    fault: str = ""


@dataclass(frozen=True, slots=True)
class WorkResponse:
    """A pass's outcome: the cleaned segments to swap in (in offset order), the new first dirty
    offset and the statistics; or ``error`` (``aborted``: the log changed under the pass, a
    source segment was deleted; ``failed``: the partition cannot be cleaned) and its message."""

    cleaned: tuple[CleanedSegment, ...] = ()
    end_offset: int = -1
    stats: CleanerStats | None = None
    error: str = ""
    message: str = ""


class WorkerDiedError(Exception):
    """The worker process ended without answering."""


class Throttler:
    """Keeps the bytes read and written at or under a rate by sleeping (Kafka's Throttler);
    called once per batch read or written."""

    def __init__(
        self,
        bytes_per_second: float,
        *,
        window_s: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = bytes_per_second
        self.window_s = window_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._start = clock()
        self._bytes = 0

    def __call__(self, nbytes: int) -> None:
        if self.rate >= 1e300:
            return
        with self._lock:
            self._bytes += nbytes
            now = self._clock()
            elapsed = now - self._start
            pause = self._bytes / self.rate - elapsed
            if pause <= 0 and elapsed >= self.window_s:
                self._start, self._bytes = now, 0
        if pause > 0:
            self._sleep(pause)


def _yield_core() -> None:
    """``sched_yield()`` where there is one (POSIX); nothing elsewhere."""
    sched_yield = getattr(os, "sched_yield", None)
    if sched_yield is not None:
        sched_yield()


class CpuLimiter:
    """The worker's CPU duty cycle at its hook points: asks ``DutyCycle`` and sleeps what it says;
    at every hook point where it does not sleep it yields its core (``sched_yield``) to whatever
    is queued on it (the clocks, the sleep and the yield are parameters for tests).

    Why the yield (``bench/results/cleanerp99-s19.md``): a task woken onto the core the worker
    holds does not run at once. The scheduler protects the running entity's slice at wake-up
    (EEVDF's ``RUN_TO_PARITY``: at least the worker's 0.1 ms, ``sched_slice``) and, once that has
    passed, nothing looks at the queue again until the worker sleeps (the end of its burst, up to
    ``duty_cycle.MAX_BURST_S`` plus the work between two hook points) or the scheduler's tick
    (4 ms at HZ=250). ``sched_yield`` is such a look, every hook point (every
    ``batch_filter.TICK_RECORDS`` records, ~50-120 us of work): a waiting task then runs within a
    hook point's work of the slice's end. With nothing else queued on the core it returns at once
    (a system call, ~1 us: ~1 % of the worker's CPU), so an uncontended worker cleans as fast as
    before; a contended one was going to be preempted anyway, a little later. Unlimited workers
    (share 1.0) yield too: it is about the core's waiting tasks, not the share."""

    def __init__(
        self,
        share: float,
        *,
        cpu_clock: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        yield_core: Callable[[], None] = _yield_core,
    ) -> None:
        self.duty = DutyCycle(share)
        self._cpu_clock = cpu_clock
        self._clock = clock
        self._sleep = sleep
        self._yield = yield_core
        self.slept_s = 0.0
        self.yields = 0

    def start(self) -> None:
        self.duty.start(self._cpu_clock(), self._clock())

    def __call__(self) -> None:
        pause = 0.0 if self.duty.unlimited else self.duty.observe(self._cpu_clock(), self._clock())
        if pause > 0:
            self._sleep(pause)
            self.slept_s += pause
        else:  # a sleep already leaves the core; otherwise let whatever waits on it run now
            self._yield()
            self.yields += 1


# --- the worker's side ---------------------------------------------------------------------------
class _Work:
    """The worker's state between requests: the offset map (reused while its size fits)."""

    def __init__(self) -> None:
        self.offset_map: OffsetMap | None = None
        self.map_size = (0, 0.0)
        self.throttler: Throttler | None = None
        self.cpu: CpuLimiter | None = None

    def handle(self, request: WorkRequest) -> WorkResponse:
        if self.offset_map is None or self.map_size != (request.map_memory, request.load_factor):
            self.offset_map = OffsetMap(request.map_memory, request.load_factor)
            self.map_size = (request.map_memory, request.load_factor)
        if self.throttler is None or self.throttler.rate != request.io_bytes_per_second:
            self.throttler = Throttler(request.io_bytes_per_second)
        if self.cpu is None or self.cpu.duty.share != request.cpu_share:
            self.cpu = CpuLimiter(request.cpu_share)
        throttler, cpu = self.throttler, self.cpu
        cpu.start()

        def throttle(nbytes: int) -> None:
            throttler(nbytes)
            cpu()

        job = request.job
        written: list[CleanedSegment] = []

        def on_cleaned(cleaned: CleanedSegment) -> None:
            written.append(cleaned)
            if request.fault == FAULT_EXIT_AFTER_FIRST_GROUP:
                os._exit(70)

        try:
            end_offset, stats = run_pass(
                job,
                self.offset_map,
                on_cleaned,
                io_buffer_size=request.io_buffer_size,
                throttle=throttle,
                tick=cpu,
            )
        except FileNotFoundError as exc:
            remove_cleaned_files(job.directory, [c.base_offset for c in written])
            return WorkResponse(error="aborted", message=f"a segment went away: {exc}")
        except (UncleanableBatchError, OSError, ValueError, MemoryError) as exc:
            remove_cleaned_files(job.directory, [c.base_offset for c in written])
            return WorkResponse(error="failed", message=f"{type(exc).__name__}: {exc}")
        return WorkResponse(tuple(written), end_offset, stats)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after it).

    Why, in a pass: the collector's full (generation 2) collections scan every live object in one
    C call, and a pass allocates millions (decoded records, key lists), so it ran 2-3 times a pass
    at ~25 ms each (measured, 1 MB batches of 100 B records): stretches no duty-cycle tick can
    split, during which a task woken on the worker's core waits. A pass frees what it allocates by
    reference counting (its objects hold no cycles that matter: at worst an exception's traceback,
    freed by the next collection, between passes)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def serve(conn: Connection) -> None:
    """Answer requests until the broker closes the pipe."""
    work = _Work()
    gc.freeze()  # the imports' objects are never garbage: no collection scans them again
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        try:
            with collector_paused():
                response = work.handle(request)
        except Exception as exc:  # answer rather than die: the broker marks the partition
            log.exception("cleaning %s failed", request.job.tp)
            response = WorkResponse(error="failed", message=f"{type(exc).__name__}: {exc}")
        try:
            conn.send(response)
        except OSError:
            return


def _die_with_parent(parent_pid: int) -> None:
    """Linux: be killed when the broker dies (its pipe's end is seen only at the next read, and a
    worker still writing ``.cleaned`` files after a kill -9 could meet the restarted broker's
    recovery or next pass in the same directory)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the prctl
        os._exit(0)


def main(argv: list[str]) -> int:
    """``worker_main <fd> <broker pid>``."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="cleaner-worker %(levelname)s %(name)s: %(message)s"
    )
    _die_with_parent(int(argv[2]))
    serve(Connection(int(argv[1])))
    return 0


# --- the broker's side ---------------------------------------------------------------------------
def _pythonpath() -> str:
    """The worker imports this very ``exactly`` package, wherever the broker found it."""
    src = str(Path(exactly.__file__).resolve().parents[1])
    current = os.environ.get("PYTHONPATH", "")
    return src if not current else f"{src}{os.pathsep}{current}"


class WorkerProcess:
    """One worker process, started on first use and again after it died. Used by one cleaner
    thread at a time; ``kill`` may be called from another thread (the broker stopping)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _start(self) -> tuple[subprocess.Popen[bytes], Connection]:
        ours, theirs = socket.socketpair()
        try:
            env = dict(os.environ, PYTHONPATH=_pythonpath())
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "exactly.storage.cleaner.worker_main",
                    str(theirs.fileno()),
                    str(os.getpid()),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own autogroup (see the module docstring)
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        log.info("started log cleaner worker %s (pid %d)", self.name, proc.pid)
        return proc, conn

    def run(self, request: WorkRequest, stop: threading.Event) -> WorkResponse:
        """Send one request and wait for its answer, polling ``stop`` (then the worker is killed
        and CleaningStoppedError raised). Raises WorkerDiedError when the worker ended."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None or self._conn is None:
                self._close_locked()
                self._proc, self._conn = self._start()
            proc, conn = self._proc, self._conn
        try:
            conn.send(request)
            while not conn.poll(POLL_S):
                if stop.is_set():
                    self.kill()
                    raise CleaningStoppedError("the cleaner is stopping")
                if proc.poll() is not None and not conn.poll(0):
                    raise WorkerDiedError(f"worker {self.name} exited with {proc.returncode}")
            response: WorkResponse = conn.recv()
            return response
        except (EOFError, OSError) as exc:
            code = proc.poll()
            self.kill()
            raise WorkerDiedError(f"worker {self.name} ended (exit code {code}): {exc!r}") from None
        except WorkerDiedError:
            self.kill()
            raise

    def kill(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None


class CleaningStoppedError(Exception):
    """The broker stopped while a pass ran: its work is dropped."""
