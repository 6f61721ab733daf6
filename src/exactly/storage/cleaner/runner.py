"""The log cleaner's threads (Kafka's LogCleaner and CleanerThread) and its broker-level settings
(Kafka's CleanerConfig).

Theory of operation
-------------------
Cleaning reads and rewrites whole segments, decodes records and fsyncs: far too slow for the
broker's single event loop. So each cleaner thread (``log.cleaner.threads``) runs passes on its
own, with its own offset map (``log.cleaner.dedupe.buffer.size`` split between the threads), its
own file descriptors (``cleaner.segment_batches``) and a shared I/O throttle
(``log.cleaner.io.max.bytes.per.second``). When no log is eligible a thread sleeps
``log.cleaner.backoff.ms``.

Sharing a log with its owner (the event loop): the owner appends to the active segment, which the
cleaner never touches, and may delete or truncate segments (retention, DeleteRecords, a follower's
truncation, topic deletion) at any time. The cleaner thread only *reads* segments until its
``.cleaned`` segment is complete and flushed; the swap (``PartitionLog.replace_segments``: the
renames and the segment-list update) is the one step that changes the log, and it runs on the
owner's thread through ``run_on_owner``, so the owner never sees a half-updated segment list. The
owner first checks that the segments the pass rewrote are still the log's; if not (they were
deleted or truncated meanwhile), the pass is dropped (``CleaningAbortedError``) and the partition
simply stays dirty. The owner's part costs a few renames and two directory fsyncs per group.

``run_on_owner(fn)`` must run ``fn`` on the owning thread and return its result (or raise its
exception) to the calling cleaner thread; the server builds it on the event loop. Its stop must
not block that thread while a cleaner waits on it (the server stops the runner from an executor).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from exactly.storage.cleaner.cleaner import Cleaner, CleaningAbortedError
from exactly.storage.cleaner.manager import LogCleanerManager, PassResult, clean_filthiest
from exactly.storage.cleaner.offset_map import OffsetMap
from exactly.storage.cleaner.swap import SwapHook
from exactly.storage.partition_log import PartitionLog
from exactly.storage.segment import LogSegment

log = logging.getLogger(__name__)

RunOnOwner = Callable[[Callable[[], None]], None]

MAX_MAP_MEMORY_PER_THREAD = 2**31 - 1  # as Kafka: a thread's map is at most 2 GiB


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """Broker-level cleaner settings under Kafka's names (``log.cleaner.*``) and defaults."""

    enable: bool = True
    num_threads: int = 1
    dedupe_buffer_size: int = 134_217_728
    io_buffer_size: int = 524_288
    io_buffer_load_factor: float = 0.9
    backoff_ms: int = 15_000
    max_io_bytes_per_second: float = 1.7976931348623157e308  # Double.MaxValue: no limit

    @property
    def map_memory_per_thread(self) -> int:
        return min(self.dedupe_buffer_size // max(self.num_threads, 1), MAX_MAP_MEMORY_PER_THREAD)


#: A cleaner thread hands the GIL to the event loop at least this often (see Throttler)
GIL_SLICE_S = 0.002
#: ... by sleeping this long: long enough for the waiting thread to be woken and take it
GIL_YIELD_S = 0.0002


class Throttler:
    """Keeps the bytes read and written at or under a rate, by sleeping the calling thread
    (Kafka's Throttler), and yields the GIL every ``GIL_SLICE_S`` of cleaning. Shared by the
    cleaner threads, hence the lock; called once per batch read or written.

    Why the yield: a cleaner thread decoding records holds CPython's GIL; the event loop, back
    from each syscall (epoll, recv, send), waits for it up to the interpreter's switch interval
    (5 ms). A produce round trip takes several such turns, so without the yield a busy cleaner
    raised the produce p99 at 1,000 msg/s from ~20 ms to seconds (bench ``cleaner-produce-latency``).
    A short sleep releases the GIL at once; the loop takes it and the cleaner waits its turn.
    Costs at most GIL_YIELD_S / GIL_SLICE_S of the cleaner's speed (~10%, less when the
    loop is idle and the sleep returns on time). A throttle pause counts as a yield."""

    def __init__(
        self,
        bytes_per_second: float,
        *,
        window_s: float = 0.3,
        slice_s: float = GIL_SLICE_S,
        yield_s: float = GIL_YIELD_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = bytes_per_second
        self.window_s = window_s
        self.slice_s = slice_s
        self.yield_s = yield_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._start = clock()
        self._bytes = 0
        self._last_yield = self._start  # shared by the threads: a race only moves one yield

    def __call__(self, nbytes: int) -> None:
        if self.rate < 1e300:
            with self._lock:
                self._bytes += nbytes
                now = self._clock()
                elapsed = now - self._start
                pause = self._bytes / self.rate - elapsed
                if pause <= 0 and elapsed >= self.window_s:
                    self._start, self._bytes = now, 0
            if pause > 0:
                self._sleep(pause)
                self._last_yield = self._clock()
                return
        if self._clock() - self._last_yield >= self.slice_s:
            self._sleep(self.yield_s)
            self._last_yield = self._clock()


@dataclass(slots=True)
class CleanerMetrics:
    """What ``/metrics`` shows (Kafka's cleaner metrics); updated by the threads, read by the
    owner (plain int/float assignments: a reader sees a whole value)."""

    passes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    last_pass_s: float = 0.0
    last_ratio: float = 0.0
    last_recopy_ratio: float = 0.0
    max_pass_s: float = 0.0

    def record(self, result: PassResult) -> None:
        stats = result.stats
        self.passes += 1
        self.bytes_read += stats.bytes_read
        self.bytes_written += stats.bytes_written
        self.records_read += stats.records_read
        self.records_written += stats.records_written
        self.last_pass_s = stats.elapsed_s
        self.max_pass_s = max(self.max_pass_s, stats.elapsed_s)
        self.last_ratio = result.ratio
        self.last_recopy_ratio = stats.bytes_written / stats.bytes_read if stats.bytes_read else 0.0


def load_segment_metadata(logs: Iterable[PartitionLog]) -> None:
    """On the owner: load what segments read lazily (indexes, the first batch's timestamp) for
    every non-active segment, so the cleaner thread only ever finds them loaded. A lazy load on the
    thread could race one on the owner, or rebuild the indexes of a segment being deleted."""
    for plog in logs:
        if plog.closed:
            continue
        for segment in plog.segments[:-1]:
            segment.ensure_indexes()
            _ = segment.first_batch_timestamp


def replace_on_owner(
    plog: PartitionLog, cleaned: LogSegment, group: Sequence[LogSegment], hook: SwapHook | None
) -> None:
    """The swap as the owner runs it: only if the rewritten segments are still the log's."""
    if plog.closed:
        raise CleaningAbortedError(f"{plog.tp} was closed during cleaning")
    try:
        plog.replace_segments(cleaned, group, hook)
    except ValueError as exc:
        raise CleaningAbortedError(f"{plog.tp} changed during cleaning: {exc}") from None


class LogCleaner:
    """The cleaner threads of one data directory.

    Owns the threads, their offset maps and the throttle. Lifecycle: ``start`` (after the logs are
    loaded), ``stop`` (before they are closed; waits for the threads, whose current pass may need
    the owner to run its swap). ``logs`` returns the logs to consider, called on each thread."""

    def __init__(
        self,
        config: CleanerConfig,
        manager: LogCleanerManager,
        logs: Callable[[], Iterable[PartitionLog]],
        *,
        clock_ms: Callable[[], int],
        hook: SwapHook | None = None,
    ) -> None:
        self.config = config
        self.manager = manager
        self._logs = logs
        self._clock_ms = clock_ms
        self._hook = hook
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.throttler = Throttler(config.max_io_bytes_per_second)
        self.metrics = CleanerMetrics()

    def start(self, run_on_owner: RunOnOwner) -> None:
        for i in range(max(self.config.num_threads, 1)):
            cleaner = self._new_cleaner(run_on_owner)
            thread = threading.Thread(
                target=self._run, args=(cleaner, run_on_owner), name=f"log-cleaner-{i}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        log.info("started %d log cleaner thread(s)", len(self._threads))

    def _new_cleaner(self, run_on_owner: RunOnOwner) -> Cleaner:
        hook = self._hook

        def swap(plog: PartitionLog, cleaned: LogSegment, group: Sequence[LogSegment]) -> None:
            run_on_owner(lambda: replace_on_owner(plog, cleaned, group, hook))

        offset_map = OffsetMap(self.config.map_memory_per_thread, self.config.io_buffer_load_factor)
        return Cleaner(
            offset_map, io_buffer_size=self.config.io_buffer_size, swap=swap, throttle=self.throttler
        )

    def _run(self, cleaner: Cleaner, run_on_owner: RunOnOwner) -> None:
        backoff_s = self.config.backoff_ms / 1000
        while not self._stop.is_set():
            result: PassResult | None = None
            try:
                logs = list(self._logs())
                run_on_owner(functools.partial(load_segment_metadata, logs))
                result = clean_filthiest(self.manager, cleaner, logs, self._clock_ms(), retention=False)
            except Exception:  # the thread must live on
                log.exception("log cleaner pass failed")
            if result is None:
                self._stop.wait(backoff_s)
            else:
                self.metrics.record(result)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("%s did not stop within %.0f s", thread.name, timeout_s)
        self._threads.clear()

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    @property
    def dead_threads(self) -> int:
        """Threads that ended without being stopped (Kafka's dead-thread-count)."""
        if self._stop.is_set():
            return 0
        return sum(not t.is_alive() for t in self._threads)
