"""The log cleaner's threads and worker processes (Kafka's LogCleaner and CleanerThread) and its
broker-level settings (Kafka's CleanerConfig).

Theory of operation
-------------------
Cleaning reads and rewrites whole segments and decodes every record: far too slow for the
broker's event loop, and, in CPython, too slow for a thread of the broker too (a thread decoding
records holds the GIL the event loop needs for every syscall it returns from). So each of the
``log.cleaner.threads`` cleaner threads drives a worker *process* of its own (``worker``), and
the thread itself only waits:

1. on the owner (``run_on_owner``, the event loop): load the segments' lazy metadata, pick the
   filthiest eligible log (``LogCleanerManager.grab_filthiest``: the cleanable range from the
   LSO, the active segment and the compaction lag) and describe the pass as plain values
   (``job.describe_pass``: segment paths and sizes, aborted transactions, active producers'
   last batches, configs). Short: no record is read.
2. in the worker (the thread blocks on a pipe, holding no GIL): the offset map, the filtering and
   rebuilding of batches, the ``.cleaned`` segments written and flushed
   (``cleaner.run_pass``), with the worker's share of ``log.cleaner.io.max.bytes.per.second``
   and ``log.cleaner.dedupe.buffer.size``.
3. for up to ``SWAP_GROUPS_PER_HOP`` cleaned segments at a time: the thread fsyncs the log's
   directory (so the owner's fsync below commits a small journal transaction) and opens them
   (their indexes read: files only the cleaner knows yet), then on the owner the swap's commit
   (``cleaner.swap_in_groups``: the segments they replace must still be the log's, unchanged;
   the renames, step 1's directory fsync, the segment list), then on the thread again the
   swap's last directory fsync and the removal of the replaced files
   (``swap.finish_segment_groups``, which touches no file a segment list still names). Then the
   cleaner checkpoint (``done_cleaning``, written on the thread).

Every owner hop is timed (``CleanerMetrics.owner_hop_max_s``, a log line past
``SLOW_OWNER_HOP_S``): that is the time the cleaner takes from the event loop.

The log's owner may delete or truncate segments (retention, DeleteRecords, a follower's
truncation, topic deletion) during step 2; the swap then finds them changed and the pass is
dropped (``CleaningAbortedError``), the partition simply stays dirty. A worker that dies
mid-pass (killed, out of memory) loses nothing: its ``.cleaned`` files are removed, a new worker
is started, and the partition is retried; after ``MAX_WORKER_DEATHS`` deaths in a row on the same
partition it is marked uncleanable with a log line. The broker keeps serving throughout.

``run_on_owner(fn)`` must run ``fn`` on the owning thread and return when it has (raising its
exception in the calling cleaner thread); the server builds it on the event loop. Its stop must
not block that thread while a cleaner waits on it (the server stops the runner from an executor);
stopping kills a worker in the middle of a pass (its work is dropped).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from exactly.storage.cleaner.cleaner import CleaningAbortedError, open_cleaned_segments, swap_in_groups
from exactly.storage.cleaner.job import CleanedSegment, CleaningJob, describe_pass, remove_cleaned_files
from exactly.storage.cleaner.manager import Candidate, LogCleanerManager, PassResult
from exactly.storage.cleaner.swap import SwapHook, finish_segment_groups
from exactly.storage.cleaner.worker import (
    CleaningStoppedError,
    WorkerDiedError,
    WorkerProcess,
    WorkRequest,
    WorkResponse,
)
from exactly.storage.durable import fsync_directory
from exactly.storage.partition_log import PartitionLog
from exactly.storage.segment import LogSegment
from exactly.types import TopicPartition

log = logging.getLogger(__name__)

RunOnOwner = Callable[[Callable[[], None]], None]
#: What a swap committed: each cleaned segment with the segments it replaced.
Groups = list[tuple[LogSegment, list[LogSegment]]]

MAX_MAP_MEMORY_PER_THREAD = 2**31 - 1  # as Kafka: a thread's map is at most 2 GiB
#: A partition whose pass killed its worker this many times in a row is marked uncleanable.
MAX_WORKER_DEATHS = 2
#: Cleaned segments swapped in per hop on the owner: one pair of directory fsyncs (milliseconds
#: each) for all of them instead of one pair per segment, while one hop stays short (opening a
#: cleaned segment and its dozen renames are well under a millisecond).
SWAP_GROUPS_PER_HOP = 8
#: ``log.cleaner.cpu.max.share``'s default: on a 2-core box an unlimited worker takes the core the
#: broker's clients need (produce p99 while cleaning many times the idle one); a fifth of a core
#: kept it near the idle p99 while the cleaner still progresses (README, compaction).
DEFAULT_CPU_SHARE = 0.2
#: An owner hop (choosing a log, swapping a chunk in) this long is logged: the event loop served
#: nothing else meanwhile.
SLOW_OWNER_HOP_S = 0.005


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
    #: ``log.cleaner.cpu.max.share`` (exactly's own, not Kafka's): each worker's CPU, as a share
    #: of one core (``duty_cycle``); 1.0 is Kafka's unlimited cleaner.
    max_cpu_share: float = DEFAULT_CPU_SHARE

    @property
    def map_memory_per_thread(self) -> int:
        return min(self.dedupe_buffer_size // max(self.num_threads, 1), MAX_MAP_MEMORY_PER_THREAD)


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
    worker_deaths: int = 0
    owner_hops: int = 0
    owner_hop_max_s: float = 0.0
    owner_hop_total_s: float = 0.0

    def record_hop(self, seconds: float) -> None:
        self.owner_hops += 1
        self.owner_hop_total_s += seconds
        self.owner_hop_max_s = max(self.owner_hop_max_s, seconds)

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


def _swap_on_owner(
    entered: list[bool],
    committed: list[Groups],
    plog: PartitionLog,
    job: CleaningJob,
    chunk: Sequence[CleanedSegment],
    hook: SwapHook | None,
    opened: list[LogSegment],
) -> None:
    """The owner's part of a chunk's swap; ``entered`` tells the thread that the swap took
    ``opened`` over (it closes or deletes them itself on a failure; on success the log owns
    them)."""
    entered.append(True)
    committed.append(swap_in_groups(plog, job, chunk, hook, opened=opened, finish=False))


def _finish(job: CleaningJob, groups: Groups, hook: SwapHook | None) -> None:
    """Off the owner: the swap's last directory fsync and the replaced files' removal. A failure
    here loses nothing (the log is whole; a restart's recovery removes ``.deleted`` files)."""
    try:
        finish_segment_groups(job.directory, groups, hook)
    except OSError as exc:  # the partition was deleted meanwhile, say
        log.info("finishing the swap of %s: %s", job.tp, exc)


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


class LogCleaner:
    """The cleaner threads of one data directory, each with its worker process.

    Lifecycle: ``start`` (after the logs are loaded), ``stop`` (before they are closed; waits for
    the threads, whose current pass may need the owner to run its swap, and kills the workers).
    ``logs`` returns the logs to consider, called on the owner. ``worker_fault`` (tests) is handed
    to every worker (``worker.FAULT_*``)."""

    def __init__(
        self,
        config: CleanerConfig,
        manager: LogCleanerManager,
        logs: Callable[[], Iterable[PartitionLog]],
        *,
        clock_ms: Callable[[], int],
        hook: SwapHook | None = None,
        worker_fault: str = "",
        replica_floor: Callable[[TopicPartition], int | None] | None = None,
    ) -> None:
        self.config = config
        # A cluster's replica floor of a partition (``batch_filter``), read on the owner when a
        # pass is described; None: a single broker, no floor.
        self._replica_floor = replica_floor
        self.manager = manager
        self._logs = logs
        self._clock_ms = clock_ms
        self._hook = hook
        self._worker_fault = worker_fault
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers: list[WorkerProcess] = []
        self._deaths: dict[TopicPartition, int] = {}
        self._deaths_lock = threading.Lock()
        self.metrics = CleanerMetrics()

    def start(self, run_on_owner: RunOnOwner) -> None:
        for i in range(max(self.config.num_threads, 1)):
            worker = WorkerProcess(f"log-cleaner-{i}")
            thread = threading.Thread(
                target=self._run, args=(worker, run_on_owner), name=f"log-cleaner-{i}", daemon=True
            )
            self._workers.append(worker)
            self._threads.append(thread)
            thread.start()
        log.info("started %d log cleaner thread(s)", len(self._threads))

    def _run(self, worker: WorkerProcess, run_on_owner: RunOnOwner) -> None:
        backoff_s = self.config.backoff_ms / 1000
        try:
            while not self._stop.is_set():
                result: PassResult | None = None
                try:
                    result = self._clean_filthiest(worker, run_on_owner)
                except CleaningStoppedError:
                    return
                except Exception:  # the thread must live on
                    log.exception("log cleaner pass failed")
                if result is None:
                    self._stop.wait(backoff_s)
                else:
                    self.metrics.record(result)
        finally:
            worker.kill()

    def _choose(self, now_ms: int) -> tuple[Candidate, CleaningJob] | None:
        """On the owner: the filthiest eligible log, described for a worker."""
        logs = list(self._logs())
        load_segment_metadata(logs)
        candidate = self.manager.grab_filthiest(logs, now_ms)
        if candidate is None:
            return None
        try:
            floor = None if self._replica_floor is None else self._replica_floor(candidate.tp)
            return candidate, describe_pass(candidate.log, candidate.to_clean, now_ms, replica_floor=floor)
        except Exception:
            self.manager.abort_cleaning(candidate.tp)
            raise

    def _clean_filthiest(self, worker: WorkerProcess, run_on_owner: RunOnOwner) -> PassResult | None:
        now_ms = self._clock_ms()
        chosen: list[tuple[Candidate, CleaningJob] | None] = [None]

        def choose() -> None:
            chosen[0] = self._choose(now_ms)

        self._on_owner(run_on_owner, "choose", choose)
        if chosen[0] is None:
            return None
        candidate, job = chosen[0]
        tp = candidate.tp
        bases = [s.base_offset for s in job.segments]
        request = WorkRequest(
            job,
            self.config.map_memory_per_thread,
            self.config.io_buffer_load_factor,
            self.config.io_buffer_size,
            self.config.max_io_bytes_per_second / max(self.config.num_threads, 1),
            cpu_share=self.config.max_cpu_share,
            fault=self._worker_fault,
        )
        try:
            response = worker.run(request, self._stop)
        except CleaningStoppedError:
            remove_cleaned_files(job.directory, bases)
            self.manager.abort_cleaning(tp)
            raise
        except WorkerDiedError as exc:
            remove_cleaned_files(job.directory, bases)
            self._worker_died(tp, exc)
            return None
        if response.error == "aborted":
            log.info("cleaning %s aborted: %s", tp, response.message)
            self.manager.abort_cleaning(tp)
            return None
        if response.error or response.stats is None:
            log.error("cleaning %s failed; marking it uncleanable: %s", tp, response.message)
            self.manager.mark_uncleanable(tp, response.message)
            return None
        with self._deaths_lock:
            self._deaths.pop(tp, None)
        return self._swap_all(candidate, job, response, run_on_owner)

    def _worker_died(self, tp: TopicPartition, exc: WorkerDiedError) -> None:
        self.metrics.worker_deaths += 1
        with self._deaths_lock:
            deaths = self._deaths[tp] = self._deaths.get(tp, 0) + 1
        if deaths >= MAX_WORKER_DEATHS:
            log.error("cleaning %s: %s, %d times in a row; marking it uncleanable", tp, exc, deaths)
            self.manager.mark_uncleanable(tp, f"the cleaner worker died {deaths} times: {exc}")
            with self._deaths_lock:
                self._deaths.pop(tp, None)
        else:
            log.warning("cleaning %s: %s; the pass is dropped and will be retried", tp, exc)
            self.manager.abort_cleaning(tp)

    def _swap_all(
        self,
        candidate: Candidate,
        job: CleaningJob,
        response: WorkResponse,
        run_on_owner: RunOnOwner,
    ) -> PassResult | None:
        tp, plog, hook = candidate.tp, candidate.log, self._hook
        stats = response.stats
        assert stats is not None
        for i in range(0, len(response.cleaned), SWAP_GROUPS_PER_HOP):
            chunk = response.cleaned[i : i + SWAP_GROUPS_PER_HOP]
            committed: list[Groups] = []
            entered: list[bool] = []
            opened: list[LogSegment] = []
            try:
                # Commit the file system's journal here first: the owner's directory fsync (the
                # swap's commit point) then writes out little more than its own renames instead
                # of every dirty page of the broker's appends since the last commit (measured at
                # load ~10: 0.3-1.3 ms on the owner with it, 0.7-26.6 without).
                fsync_directory(job.directory)
                # The cleaned files are this thread's until the swap renames them: open them and
                # read their indexes here, not on the owner.
                opened = open_cleaned_segments(job, chunk)
                swap = functools.partial(_swap_on_owner, entered, committed, plog, job, chunk, hook, opened)
                self._on_owner(run_on_owner, "swap", swap)
            except Exception as exc:
                if not entered:  # run_on_owner failed before the swap took the segments over
                    for segment in opened:
                        segment.close()
                remove_cleaned_files(job.directory, [c.base_offset for c in response.cleaned[i:]])
                if isinstance(exc, CleaningAbortedError | FileNotFoundError):
                    log.info("cleaning %s aborted: %s", tp, exc)
                    self.manager.abort_cleaning(tp)
                else:
                    log.exception("swapping in the cleaned segments of %s failed; marking it uncleanable", tp)
                    self.manager.mark_uncleanable(tp, f"{type(exc).__name__}: {exc}")
                return None
            _finish(job, committed[0], hook)
        self.manager.done_cleaning(tp, response.end_offset)
        log.info(
            "cleaned %s up to %d: %d -> %d bytes, %d -> %d records in %.3f s",
            tp,
            response.end_offset,
            stats.bytes_read,
            stats.bytes_written,
            stats.records_read,
            stats.records_written,
            stats.elapsed_s,
        )
        return PassResult(tp, response.end_offset, stats, candidate.to_clean.cleanable_ratio)

    def _on_owner(self, run_on_owner: RunOnOwner, what: str, fn: Callable[[], None]) -> None:
        """``run_on_owner(fn)``, timing ``fn`` on the owner: the time the event loop is kept from
        everything else (``/metrics``; a log line past ``SLOW_OWNER_HOP_S``)."""
        took: list[float] = []

        def timed() -> None:
            t0 = time.perf_counter()
            try:
                fn()
            finally:
                took.append(time.perf_counter() - t0)

        run_on_owner(timed)
        if took:
            self.metrics.record_hop(took[0])
            if took[0] >= SLOW_OWNER_HOP_S:
                log.info("log cleaner %s on the event loop took %.1f ms", what, took[0] * 1000)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("%s did not stop within %.0f s", thread.name, timeout_s)
        for worker in self._workers:
            worker.kill()
        self._threads.clear()
        self._workers.clear()

    @property
    def worker_pids(self) -> list[int]:
        """The running workers' process ids (tests, diagnostics)."""
        return [pid for w in self._workers if (pid := w.pid) is not None]

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    @property
    def dead_threads(self) -> int:
        """Threads that ended without being stopped (Kafka's dead-thread-count)."""
        if self._stop.is_set():
            return 0
        return sum(not t.is_alive() for t in self._threads)
