"""The cleaner threads: passes run off the calling thread, the swap on the owner, and a pass whose
segments were deleted meanwhile is dropped (``runner``)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path

from exactly.storage.cleaner.manager import LogCleanerManager
from exactly.storage.cleaner.runner import CleanerConfig, LogCleaner
from exactly.storage.cleaner.worker import Throttler
from exactly.storage.cleaner.swap import SwapStep
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
    swap_threads: list[str] = []
    cleaner = LogCleaner(
        CONFIG,
        manager,
        lambda: [log],
        clock_ms=lambda: NOW,
        hook=lambda step: (
            swap_threads.append(threading.current_thread().name) if step is SwapStep.SWAP_DONE else None
        ),
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
    assert set(swap_threads) == {threading.current_thread().name}  # the swap ran on the owner
    assert manager.checkpoints()[log.tp] == log.segments[-1].base_offset
    assert cleaner.metrics.bytes_written < cleaner.metrics.bytes_read
    log.close()


def _run_job(owner: Owner) -> None:
    fn, reply = owner.jobs.get(timeout=30)
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
        _run_job(owner)  # the pass's first request: load the segments' metadata
        # The swap request waits: meanwhile DeleteRecords removes the first segments.
        fn, reply = owner.jobs.get(timeout=30)
        log.increment_log_start_offset(log.segments[2].base_offset)
        try:
            fn()
        except BaseException as exc:
            reply.put(exc)
            assert type(exc).__name__ == "CleaningAbortedError"
        else:
            raise AssertionError("the swap of deleted segments must be refused")
        # The pass was dropped, not failed: the thread comes back for a new one.
        _run_job(owner)
        _run_job(owner)
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
