"""A CPU duty cycle for the cleaner's worker: how long to sleep so that the CPU it uses stays at or
under a share of one core (``log.cleaner.cpu.max.share``).

Why a CPU share and not a byte rate: the cleaner's cost that hurts others on a small box is the
core it occupies (a nice-19 worker yields to runnable tasks but takes any *idle* core, and on a
2-core box that idle core is where the broker's clients run). Bytes per second
(``log.cleaner.io.max.bytes.per.second``) bound CPU only for one record size: 1 KB records cost
far less CPU per byte than 100 B ones.

Sans-IO: ``DutyCycle.observe(cpu_s, now_s)`` takes the process's CPU clock and a monotonic wall
clock and returns the seconds to sleep (0.0 for none); the caller sleeps. The worker calls it at
the same points as the byte throttle (each batch read while filling the key map, each batch
filtered and written) and every ``batch_filter.TICK_RECORDS`` records decoded within a batch, so
the work between two calls is well under a millisecond (a 1 MB batch of 100 B records is ~40 ms
of CPU: per batch alone, the bursts were that long).

Why short bursts: while the worker runs it holds a core, and a task woken there (the broker's
loop, its clients) waits until the worker sleeps or the scheduler's tick preempts it (4 ms at
HZ=250): the length of a burst, not only the share, is what shows in a produce p99.

Accounting (a leaky bucket over CPU): ``credit`` is CPU the worker may still use; it grows by
``share * wall`` and shrinks by the CPU used. Invariants:

- ``credit <= burst_s`` (``share * min_sleep_s``): idle time (between passes, waiting on the disk)
  earns at most that much, so a pass never starts with a long burst at full speed;
- when ``credit >= 0`` nothing sleeps (under its share, the worker is never slowed);
- a sleep is asked for only once the debt is worth ``min_sleep_s`` of wall time; it repays the
  debt exactly (``-credit / share``), so the worker never sleeps in sub-millisecond slices nor
  spins on the clock. Work runs in bursts of about ``share / (1 - share) * min_sleep_s`` of CPU
  (0.25 ms at 0.2 and the 1 ms default), so over any window of ``window_s`` (100 ms) the CPU used
  is the share of it plus at most one burst and the work between two calls;
- a sleep that overslept is credit up to ``burst_s`` only (lost, not banked); one that woke early
  leaves the rest of the debt, repaid at the next call.

A cap on bursts, whatever the credit: a worker held back by a loaded box (it gets less CPU than
its share) is always in credit and so never sleeps, and each time the scheduler picks it, it ran
until the next tick (3-4.4 ms traced, ``bench/cleaner_burst_trace.py``) while tasks woken on its
core waited. So after ``max_burst_s`` (0.25 ms) of CPU run without a break (no gap between the wall
and CPU clocks since the previous call) it sleeps ``yield_s`` (0.2 ms): off the run queue, it
lets whatever waits on its core run. A gap of ``off_cpu_gap_s`` or more (the worker was
preempted, or waited on the disk) starts a new burst.

``share >= 1.0`` disables it (Kafka's behaviour: its cleaner threads are not CPU-limited).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Shortest sleep asked for: a timer sleep shorter than this is mostly syscall and wake-up cost
#: (1,000 sleeps a second at most, ~1% of a core). It sets the burst length (see the docstring):
#: 10 ms (2.5 ms bursts) before 2026-11-25, then 4 ms (1 ms bursts); 1 ms since session 18, where
#: the waits of tasks woken behind the worker made the busy windows' produce p99 (see
#: ``bench/results/cleantail-s18.md``).
MIN_SLEEP_S = 0.001
#: Most CPU run without a break before a short sleep, whatever the credit (see the docstring):
#: a task woken behind the worker waits at most about this long (1 ms before session 18).
MAX_BURST_S = 0.00025
#: That short sleep: long enough to leave the run queue, short against the bursts.
YIELD_S = 0.0002
#: Wall time beyond the CPU used between two calls that counts as a break (off the CPU).
OFF_CPU_GAP_S = 0.0002


@dataclass(slots=True)
class DutyCycle:
    """Keeps one process's CPU at or under ``share`` of one core; see the module docstring."""

    share: float
    min_sleep_s: float = MIN_SLEEP_S
    max_burst_s: float = MAX_BURST_S
    yield_s: float = YIELD_S
    credit: float = 0.0
    _cpu: float | None = None
    _now: float = 0.0
    _burst: float = 0.0  # CPU run since the last break

    def __post_init__(self) -> None:
        if not self.share > 0:  # NaN too
            raise ValueError(f"a CPU share must be positive, not {self.share}")
        if self.min_sleep_s <= 0:
            raise ValueError("min_sleep_s must be positive")

    @property
    def unlimited(self) -> bool:
        return self.share >= 1.0

    @property
    def burst_s(self) -> float:
        """The most CPU credit kept: what ``min_sleep_s`` of wall time earns."""
        return self.share * self.min_sleep_s

    def start(self, cpu_s: float, now_s: float) -> None:
        """Begin accounting (a pass starts): no credit from the time before."""
        self._cpu, self._now, self.credit, self._burst = cpu_s, now_s, 0.0, 0.0

    def observe(self, cpu_s: float, now_s: float) -> float:
        """The CPU clock and the wall clock now; returns the seconds to sleep before going on."""
        if self.unlimited:
            return 0.0
        if self._cpu is None:
            self.start(cpu_s, now_s)
            return 0.0
        used = max(cpu_s - self._cpu, 0.0)
        wall = max(now_s - self._now, 0.0)
        self._cpu, self._now = cpu_s, now_s
        self._burst = used if wall - used >= OFF_CPU_GAP_S else self._burst + used
        self.credit = min(self.credit + self.share * wall - used, self.burst_s)
        pause = -self.credit / self.share if self.credit < 0 else 0.0
        if pause >= self.min_sleep_s:
            self._burst = 0.0
            return pause
        if self._burst >= self.max_burst_s:
            self._burst = 0.0
            return self.yield_s
        return 0.0
