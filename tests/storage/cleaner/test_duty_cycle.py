"""The worker's CPU duty cycle (``duty_cycle.DutyCycle``, ``worker.CpuLimiter``): never sleeps
under its share, never in tiny slices, and holds the share over any 100 ms window."""

from __future__ import annotations

import bisect
import itertools

import pytest

from exactly.storage.cleaner.duty_cycle import MAX_BURST_S, MIN_SLEEP_S, YIELD_S, DutyCycle
from exactly.storage.cleaner.worker import CpuLimiter


class FakeProcess:
    """A simulated worker: ``work`` advances its CPU and wall clocks together (one core, no
    contention), ``wait`` advances the wall clock only (disk I/O), ``sleep`` is what the limiter
    calls. Every stretch of CPU is recorded so windows can be checked."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.now = 0.0
        self.sleeps: list[float] = []
        self.busy: list[tuple[float, float]] = []  # (start, end) of each stretch on the CPU

    def work(self, seconds: float) -> None:
        self.busy.append((self.now, self.now + seconds))
        self.cpu += seconds
        self.now += seconds

    def wait(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def limiter(self, share: float) -> CpuLimiter:
        return CpuLimiter(share, cpu_clock=lambda: self.cpu, clock=lambda: self.now, sleep=self.sleep)

    def cpu_until(self, t: float, starts: list[float], before: list[float]) -> float:
        """CPU used from 0 to ``t`` (``starts``: the stretches' starts; ``before``: the CPU used
        before each stretch)."""
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return 0.0
        a, b = self.busy[i]
        return before[i] + min(b, t) - a

    def max_cpu_in_window(self, window: float, step: float = 0.0005) -> float:
        starts = [a for a, _ in self.busy]
        before = list(itertools.accumulate((b - a for a, b in self.busy), initial=0.0))[:-1]
        worst, t = 0.0, 0.0
        while t + window <= self.now:
            used = self.cpu_until(t + window, starts, before) - self.cpu_until(t, starts, before)
            worst = max(worst, used)
            t += step
        return worst


@pytest.mark.parametrize("share", [0.1, 0.2, 0.5])
@pytest.mark.parametrize("step_s", [0.00005, 0.0005, 0.002])
def test_holds_the_share_over_any_100ms_window(share: float, step_s: float) -> None:
    proc = FakeProcess()
    limit = proc.limiter(share)
    limit.start()
    while proc.now < 3.0:
        proc.work(step_s)  # one batch
        limit()
    # Over the whole run: the share, give or take one burst.
    assert proc.cpu <= share * proc.now + limit.duty.burst_s + step_s
    assert proc.cpu >= share * proc.now * 0.9  # it is held back to the share, not below it
    # Over any 100 ms: the share of it plus at most one burst of work and one batch.
    burst = 2 * share * MIN_SLEEP_S / (1 - share)
    assert proc.max_cpu_in_window(0.1) <= share * 0.1 + burst + step_s + 1e-9


def test_never_sleeps_under_its_share() -> None:
    proc = FakeProcess()
    limit = proc.limiter(0.25)
    limit.start()
    for _ in range(2000):  # runs within the burst cap, so only the share could make it sleep
        proc.work(MAX_BURST_S * 0.8)
        proc.wait(MAX_BURST_S * 2.6)  # 0.8 of CPU per 3.4: ~0.24 of a core
        limit()
    assert proc.sleeps == []


def test_never_sleeps_in_tiny_slices() -> None:
    """A worker over its share sleeps only in slices of at least MIN_SLEEP_S, however small its
    batches: no spinning on the clock, no per-batch micro-sleeps."""
    proc = FakeProcess()
    limit = proc.limiter(0.2)
    limit.start()
    calls = 0
    while proc.now < 1.0:
        proc.work(0.00002)
        limit()
        calls += 1
    assert proc.sleeps
    # duty-cycle sleeps are never shorter than MIN_SLEEP_S; the burst cap's short ones are rare
    assert all(s >= MIN_SLEEP_S or s == YIELD_S for s in proc.sleeps)
    assert sum(s >= MIN_SLEEP_S for s in proc.sleeps) > sum(s == YIELD_S for s in proc.sleeps)
    assert len(proc.sleeps) < calls / 10


def test_a_starved_worker_still_breaks_its_bursts() -> None:
    """On a loaded box the worker gets less CPU than its share, so it is always in credit; still,
    each time it runs without a break it sleeps briefly after MAX_BURST_S of CPU, so a task woken
    on its core does not wait for the scheduler's tick."""
    proc = FakeProcess()
    limit = proc.limiter(0.2)
    limit.start()
    longest, run = 0.0, 0.0
    for _ in range(50):
        for _ in range(40):  # picked by the scheduler: up to 4 ms on the CPU ...
            proc.work(0.0001)
            run += 0.0001
            slept = len(proc.sleeps)
            limit()
            if len(proc.sleeps) > slept:
                longest, run = max(longest, run), 0.0
        longest, run = max(longest, run), 0.0
        proc.wait(0.05)  # ... then preempted for 50 ms: 0.07 of a core, far under its share
    assert proc.cpu < 0.2 * proc.now
    assert YIELD_S in proc.sleeps  # the burst cap, where the duty cycle alone would not sleep yet
    assert longest <= MAX_BURST_S + 0.0001 + 1e-9


def test_unlimited_never_breaks_its_bursts() -> None:
    proc = FakeProcess()
    limit = proc.limiter(1.0)
    limit.start()
    for _ in range(1000):
        proc.work(0.0005)
        limit()
    assert proc.sleeps == []


def test_idle_time_earns_only_one_burst() -> None:
    """Time between passes, or waiting on the disk, is not banked: after a long idle stretch the
    worker may run at full speed only for about one burst."""
    duty = DutyCycle(0.2)
    duty.start(0.0, 0.0)
    assert duty.observe(0.0, 100.0) == 0.0  # 100 s idle
    assert duty.credit == pytest.approx(duty.burst_s)
    # Then 50 ms of CPU in 50 ms of wall: far over 0.2; it must sleep to repay the excess.
    pause = duty.observe(0.05, 100.05)
    expected = (0.05 - 0.2 * 0.05 - duty.burst_s) / 0.2
    assert pause == pytest.approx(expected)


def test_a_short_sleep_leaves_the_rest_of_the_debt() -> None:
    duty = DutyCycle(0.5)
    duty.start(0.0, 0.0)
    pause = duty.observe(0.1, 0.1)  # 0.1 s CPU in 0.1 s: 0.05 s over, 0.1 s to sleep
    assert pause == pytest.approx(0.1)
    # Woke after 0.04 s only: still 0.03 s of CPU owed, 0.06 s of sleep.
    assert duty.observe(0.1, 0.14) == pytest.approx(0.06)
    # An oversleep is not banked beyond one burst.
    assert duty.observe(0.1, 10.0) == 0.0
    assert duty.credit == pytest.approx(duty.burst_s)


def test_a_full_core_is_unlimited_and_bad_shares_are_refused() -> None:
    proc = FakeProcess()
    limit = proc.limiter(1.0)
    for _ in range(100):
        proc.work(0.01)
        limit()
    assert proc.sleeps == []
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError):
            DutyCycle(bad)


def test_clocks_going_backwards_do_not_add_credit() -> None:
    duty = DutyCycle(0.2)
    duty.start(5.0, 5.0)
    assert duty.observe(4.0, 4.0) == 0.0
    assert duty.credit == 0.0


class YieldCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


@pytest.mark.parametrize("share", [0.2, 1.0])
def test_yields_the_core_at_every_hook_point_it_does_not_sleep(share: float) -> None:
    """A task woken onto the worker's core runs at the next hook point (``CpuLimiter``'s
    docstring): every call either sleeps or yields, never both, never neither."""
    proc = FakeProcess()
    yields = YieldCounter()
    limit = CpuLimiter(
        share, cpu_clock=lambda: proc.cpu, clock=lambda: proc.now, sleep=proc.sleep, yield_core=yields
    )
    limit.start()
    calls = 0
    while proc.now < 0.5:
        proc.work(0.00005)
        limit()
        calls += 1
    assert yields.calls == limit.yields
    assert yields.calls + len(proc.sleeps) == calls
    if share < 1.0:
        assert proc.sleeps  # held to its share: it slept, and did not yield then
        assert 0 < yields.calls < calls
    else:
        assert yields.calls == calls and not proc.sleeps


def test_the_yield_does_not_change_the_share() -> None:
    """Yielding is not sleeping: the CPU used over a run is the same with and without it."""
    used = []
    for yield_core in (lambda: None, YieldCounter()):
        proc = FakeProcess()
        limit = CpuLimiter(
            0.2,
            cpu_clock=lambda p=proc: p.cpu,  # type: ignore[misc]
            clock=lambda p=proc: p.now,  # type: ignore[misc]
            sleep=proc.sleep,
            yield_core=yield_core,
        )
        limit.start()
        while proc.now < 1.0:
            proc.work(0.00005)
            limit()
        used.append((proc.cpu, proc.now, tuple(proc.sleeps)))
    assert used[0] == used[1]
