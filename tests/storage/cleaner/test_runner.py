"""The cleaner threads: passes run off the calling thread, the swap on the owner, and a pass whose
segments were deleted meanwhile is dropped (``runner``)."""

from __future__ import annotations

import dataclasses
import gc
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exactly.storage.cleaner.manager import LogCleanerManager
from exactly.storage.cleaner.priority import WORKER_NICENESS
from exactly.storage.cleaner.runner import CleanerConfig, LogCleaner
from exactly.storage.cleaner.sched_slice import MIN_SLICE_NS, slice_ns
from exactly.storage.cleaner.swap import SwapStep
from exactly.storage.cleaner.worker import FAULT_EXIT_AFTER_FIRST_GROUP, Throttler, collector_paused
from exactly.storage.partition_log import PartitionLog
from tests.storage.cleaner.helpers import NOW, append_keyed, key_values, offsets_in, open_compacted

CONFIG = CleanerConfig(backoff_ms=10, dedupe_buffer_size=1 << 20)


class Owner:
    """Plays the event loop: runs submitted functions on the test's thread, in ``pump``."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[tuple[Callable[[], None], queue.Queue[BaseException | None]]] = queue.Queue()
        self.threads: list[str] = []

    def run_on_owner(self, fn: Callable[[], None]) -> None:
        reply: queue.Queue[BaseException | None] = queue.Queue()
        self.jobs.put((fn, reply))
        error = reply.get()
        if error is not None:
            raise error

    def pump(self, timeout: float = 0.05) -> None:
        try:
            fn, reply = self.jobs.get(timeout=timeout)
        except queue.Empty:
            return
        self.threads.append(threading.current_thread().name)
        try:
            fn()
        except BaseException as exc:  # handed back to the cleaner thread
            reply.put(exc)
        else:
            reply.put(None)


def test_cleaner_thread_compacts_and_swaps_on_the_owner(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    for i in range(60):
        append_keyed(log, [(i % 5, i)])
    log.roll(NOW)
    expected = key_values(log)
    manager = LogCleanerManager(tmp_path)
    owner = Owner()
    swap_threads: dict[SwapStep, str] = {}
    cleaner = LogCleaner(
        CONFIG,
        manager,
        lambda: [log],
        clock_ms=lambda: NOW,
        hook=lambda step: swap_threads.__setitem__(step, threading.current_thread().name),
    )
    cleaner.start(owner.run_on_owner)
    try:
        while cleaner.metrics.passes == 0:
            owner.pump()
    finally:
        stopper = threading.Thread(target=cleaner.stop)
        stopper.start()
        while stopper.is_alive():
            owner.pump(0.01)
    assert key_values(log) == expected and offsets_in(log) == [55, 56, 57, 58, 59]
    # the commit (renames, step 1's fsync, the segment list) ran on the owner; the last fsync and
    # the removal of the replaced files on the cleaner's thread
    owner_name = threading.current_thread().name
    assert swap_threads[SwapStep.SWAP_COMMITTED] == swap_threads[SwapStep.NEW_LOG_RENAMED] == owner_name
    assert swap_threads[SwapStep.SWAP_DONE] == swap_threads[SwapStep.OLD_FILES_DELETED] == "log-cleaner-0"
    assert not list(tmp_path.rglob("*.deleted")) and not list(tmp_path.rglob("*.swap"))
    assert cleaner.metrics.owner_hops >= 2 and cleaner.metrics.owner_hop_max_s > 0
    assert manager.checkpoints()[log.tp] == log.segments[-1].base_offset
    assert cleaner.metrics.bytes_written < cleaner.metrics.bytes_read
    log.close()


Job = tuple[Callable[[], None], queue.Queue[BaseException | None]]


def _next_job(owner: Owner, cleaner: LogCleaner) -> Job:
    """The cleaner thread's next request to the owner, however long the work before it takes.

    Not a fixed wait: the pass runs in a worker process at nice 19 / SCHED_BATCH that yields to
    everything else, so at a load of 10-15 on two cores a pass outlasted a 30 s ``get`` (which
    raised queue.Empty). Waits while the cleaner thread lives, and fails as soon as it ended
    (then no request can come); pytest's timeout bounds the rest."""
    while True:
        try:
            return owner.jobs.get(timeout=0.5)
        except queue.Empty:
            if not cleaner.running:
                try:
                    return owner.jobs.get_nowait()  # put just before the thread ended
                except queue.Empty:
                    raise AssertionError("the cleaner thread ended without asking the owner") from None


def _run_job(owner: Owner, cleaner: LogCleaner) -> None:
    fn, reply = _next_job(owner, cleaner)
    try:
        fn()
    except BaseException as exc:
        reply.put(exc)
    else:
        reply.put(None)


def test_pass_is_dropped_when_the_owner_deleted_its_segments(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    for i in range(60):
        append_keyed(log, [(i % 5, i)])
    log.roll(NOW)
    expected = key_values(log)
    manager = LogCleanerManager(tmp_path)
    owner = Owner()
    cleaner = LogCleaner(CONFIG, manager, lambda: [log], clock_ms=lambda: NOW)
    cleaner.start(owner.run_on_owner)
    try:
        _run_job(owner, cleaner)  # the pass's first request: load the segments' metadata
        # The swap request waits: meanwhile DeleteRecords removes the first segments.
        fn, reply = _next_job(owner, cleaner)
        log.increment_log_start_offset(log.segments[2].base_offset)
        try:
            fn()
        except BaseException as exc:
            reply.put(exc)
            assert type(exc).__name__ == "CleaningAbortedError"
        else:
            raise AssertionError("the swap of deleted segments must be refused")
        # The pass was dropped, not failed: the thread comes back for a new one.
        _run_job(owner, cleaner)
        _run_job(owner, cleaner)
        assert log.tp not in manager.uncleanable()
    finally:
        stopper = threading.Thread(target=cleaner.stop)
        stopper.start()
        while stopper.is_alive():
            owner.pump(0.01)
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    assert key_values(log) == expected
    assert cleaner.metrics.passes >= 1
    log.close()


def test_throttler_holds_the_rate() -> None:
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    throttle = Throttler(1000.0, clock=lambda: clock[0], sleep=sleep)
    for _ in range(4):
        throttle(500)  # 2000 bytes at 1000 B/s: two seconds
    assert abs(clock[0] - 2.0) < 1e-9
    unlimited = Throttler(1.7976931348623157e308, clock=lambda: 0.0, sleep=sleep)
    slept.clear()
    unlimited(10**9)
    assert slept == []


def _stop(cleaner: LogCleaner, owner: Owner) -> None:
    stopper = threading.Thread(target=cleaner.stop)
    stopper.start()
    while stopper.is_alive():
        owner.pump(0.01)


def _compactable_log(tmp_path: Path, records: int = 60) -> PartitionLog:
    log = open_compacted(tmp_path)
    for i in range(records):
        append_keyed(log, [(i % 5, i)])
    log.roll(NOW)
    return log


def test_the_pass_runs_in_a_worker_process(tmp_path: Path) -> None:
    log = _compactable_log(tmp_path)
    manager = LogCleanerManager(tmp_path)
    owner = Owner()
    cleaner = LogCleaner(CONFIG, manager, lambda: [log], clock_ms=lambda: NOW)
    cleaner.start(owner.run_on_owner)
    try:
        while cleaner.metrics.passes == 0:
            owner.pump()
        pids = cleaner.worker_pids
    finally:
        _stop(cleaner, owner)
    assert len(pids) == 1 and pids[0] != os.getpid()
    assert cleaner.worker_pids == []  # stopped with the cleaner
    assert offsets_in(log) == [55, 56, 57, 58, 59]
    log.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling")
def test_the_worker_runs_in_its_own_session_at_background_priority(tmp_path: Path) -> None:
    # In the broker's session the worker would draw on that session's share of the CPU (with
    # autogroups); alone in its own, at nice 19, it yields to every other session.
    log = _compactable_log(tmp_path)
    manager = LogCleanerManager(tmp_path)
    owner = Owner()
    cleaner = LogCleaner(CONFIG, manager, lambda: [log], clock_ms=lambda: NOW)
    cleaner.start(owner.run_on_owner)
    try:
        while cleaner.metrics.passes == 0:
            owner.pump()
        (pid,) = cleaner.worker_pids
        session, policy = os.getsid(pid), os.sched_getscheduler(pid)
        nice = os.getpriority(os.PRIO_PROCESS, pid)
        autogroup = Path(f"/proc/{pid}/autogroup")
        group = autogroup.read_text() if autogroup.exists() else None
        worker_slice, own_slice = slice_ns(pid), slice_ns()
    finally:
        _stop(cleaner, owner)
    assert session == pid != os.getsid(0)
    assert policy == os.SCHED_BATCH and nice == WORKER_NICENESS
    if group is not None:
        assert group.split()[-1] == str(WORKER_NICENESS)
    # the shortest EEVDF slice, where the kernel reports slices (6.12+: this process's default
    # one reads as nonzero)
    if own_slice:
        assert own_slice != MIN_SLICE_NS and worker_slice == MIN_SLICE_NS
    log.close()


def test_a_worker_dying_in_every_pass_marks_the_partition_uncleanable(tmp_path: Path) -> None:
    # The worker exits abruptly after writing its first .cleaned segment, each time: the first
    # death drops the pass (retried), the second marks the partition uncleanable. The log is
    # untouched, the leftovers are gone and the cleaner thread lives on.
    log = _compactable_log(tmp_path)
    expected = (key_values(log), offsets_in(log))
    manager = LogCleanerManager(tmp_path)
    owner = Owner()
    cleaner = LogCleaner(
        CONFIG, manager, lambda: [log], clock_ms=lambda: NOW, worker_fault=FAULT_EXIT_AFTER_FIRST_GROUP
    )
    cleaner.start(owner.run_on_owner)
    try:
        while log.tp not in manager.uncleanable():
            owner.pump()
        assert cleaner.running and cleaner.dead_threads == 0
    finally:
        _stop(cleaner, owner)
    assert cleaner.metrics.worker_deaths == 2 and cleaner.metrics.passes == 0
    assert "died 2 times" in manager.uncleanable()[log.tp]
    assert (key_values(log), offsets_in(log)) == expected
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    log.close()


def test_a_worker_killed_mid_pass_is_replaced_and_the_pass_retried(tmp_path: Path) -> None:
    log = _compactable_log(tmp_path, 300)
    expected = key_values(log)
    total = sum(s.size for s in log.segments[:-1])
    # Throttled so the pass lasts a couple of seconds: the worker is surely busy when killed.
    slow = dataclasses.replace(CONFIG, max_io_bytes_per_second=total)
    manager = LogCleanerManager(tmp_path)
    owner = Owner()
    cleaner = LogCleaner(slow, manager, lambda: [log], clock_ms=lambda: NOW)
    cleaner.start(owner.run_on_owner)
    try:
        _run_job(owner, cleaner)  # the choice and description of the pass; the worker now runs it
        while not cleaner.worker_pids:
            time.sleep(0.01)
        os.kill(cleaner.worker_pids[0], signal.SIGKILL)
        while cleaner.metrics.passes == 0:
            owner.pump()
    finally:
        _stop(cleaner, owner)
    assert cleaner.metrics.worker_deaths == 1 and log.tp not in manager.uncleanable()
    assert key_values(log) == expected and offsets_in(log) == [295, 296, 297, 298, 299]
    assert not list(tmp_path.glob("*.cleaned"))
    log.close()


def test_stopping_kills_a_busy_worker_and_drops_its_pass(tmp_path: Path) -> None:
    log = _compactable_log(tmp_path, 300)
    expected = (key_values(log), offsets_in(log))
    total = sum(s.size for s in log.segments[:-1])
    slow = dataclasses.replace(CONFIG, max_io_bytes_per_second=total / 20)  # ~40 s per pass
    manager = LogCleanerManager(tmp_path)
    owner = Owner()
    cleaner = LogCleaner(slow, manager, lambda: [log], clock_ms=lambda: NOW)
    cleaner.start(owner.run_on_owner)
    _run_job(owner, cleaner)
    while not cleaner.worker_pids:
        time.sleep(0.01)
    pid = cleaner.worker_pids[0]
    _stop(cleaner, owner)
    assert not cleaner.running and cleaner.worker_pids == []
    assert not _alive(pid)
    assert (key_values(log), offsets_in(log)) == expected
    assert not list(tmp_path.glob("*.cleaned")) and log.tp not in manager.checkpoints()
    log.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _open_cleaned_files() -> list[str]:
    """This process's descriptors on ``.cleaned`` segment files (their names, once deleted too)."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if ".cleaned" in target:
            names.append(target)
    return names


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/fd")
def test_a_swap_that_never_reached_the_owner_closes_the_segments_it_opened(tmp_path: Path) -> None:
    """The cleaner thread opens the cleaned segments before its hop to the owner; when
    ``run_on_owner`` fails before the swap ran (the loop closing, say), their descriptors are
    closed again and the cleaned files removed, the log untouched."""
    log = _compactable_log(tmp_path)
    expected = key_values(log)
    manager = LogCleanerManager(tmp_path)
    owner = Owner()
    cleaner = LogCleaner(CONFIG, manager, lambda: [log], clock_ms=lambda: NOW)
    cleaner.start(owner.run_on_owner)
    try:
        _run_job(owner, cleaner)  # choose
        _fn, reply = _next_job(owner, cleaner)  # the swap: never run, the owner refuses it
        assert _open_cleaned_files()  # held open by the cleaner thread for the swap
        reply.put(RuntimeError("the event loop is closed"))
        # the thread comes back for its next pass once it has handled the failure
        _fn, reply = _next_job(owner, cleaner)
        reply.put(RuntimeError("the event loop is closed"))
        assert _open_cleaned_files() == []
    finally:
        _stop(cleaner, owner)
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    assert key_values(log) == expected
    log.close()


def test_a_pass_runs_with_the_cyclic_collector_paused() -> None:
    """The worker runs each pass with the cyclic collector off (its full collections were 25 ms
    stretches no duty-cycle tick could split) and restores it after, even on an error; a block
    entered with the collector already off leaves it off."""
    assert gc.isenabled()
    try:
        with collector_paused():
            assert not gc.isenabled()
            raise ValueError("a failing pass")
    except ValueError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
