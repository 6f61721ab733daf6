"""Progress of long commands (``pipeline generate``, ``pipeline run``, ``produce`` from a file, the
benchmarks), always on stderr so that stdout stays what scripts parse.

Three shapes, picked by :func:`progress`:

* a terminal (the stream is a TTY): a ``rich`` bar with count, rate and ETA, redrawn in place
  (``exactly.cli.progress_bar``);
* anything else (a pipe, a CI log, a file): one plain line every ``interval`` seconds and a last
  line at the end - no carriage returns or colour codes in logs;
* ``quiet``: nothing at all.

Without a ``total`` (a stream whose length is unknown) there is no bar and no ETA, only the count
and the rate. ``unit`` names what is counted (``records``, ``bytes``, ``orders``, ``runs``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["Tracker", "human_rate", "progress"]


def human_rate(per_second: float, unit: str) -> str:
    if unit == "bytes":
        for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if per_second >= scale:
                return f"{per_second / scale:.1f} {name}/s"
        return f"{per_second:.0f} B/s"
    return f"{per_second:,.0f} {unit}/s"


class Tracker:
    """What a command reports to: ``advance`` by a step, or ``update`` to an absolute count."""

    def __init__(self, total: float | None) -> None:
        self.total = total
        self.completed = 0.0

    def advance(self, amount: float = 1) -> None:
        self.update(self.completed + amount)

    def update(self, completed: float) -> None:
        self.completed = completed
        self._changed()

    def _changed(self) -> None:
        """A subclass shows the change (the base class is the quiet tracker)."""

    def _close(self) -> None:
        """A subclass shows the end."""


class _Lines(Tracker):
    """Plain periodic lines for a log: ``DESC: N/TOTAL unit (P%), R unit/s, ETA Ss``."""

    def __init__(self, description: str, total: float | None, unit: str, stream: IO[str], interval: float):
        super().__init__(total)
        self.description = description
        self.unit = unit
        self.stream = stream
        self.interval = interval
        self.started = self.last = time.monotonic()

    def _changed(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self._line(now, final=False)

    def _close(self) -> None:
        self._line(time.monotonic(), final=True)

    def _line(self, now: float, *, final: bool) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = self.completed / elapsed
        count = f"{self.completed:,.0f}"
        parts = []
        if self.total:
            share = min(self.completed / self.total, 1.0)
            count += f"/{self.total:,.0f} {self.unit} ({share:.0%})"
        else:
            count += f" {self.unit}"
        parts.append(count)
        parts.append(human_rate(rate, self.unit))
        if final:
            parts.append(f"done in {elapsed:.1f}s")
        elif self.total and rate > 0:
            parts.append(f"ETA {max(self.total - self.completed, 0) / rate:.0f}s")
        print(f"{self.description}: {', '.join(parts)}", file=self.stream, flush=True)


class _Terminal(Tracker):
    """The rich bar of :mod:`exactly.cli.progress_bar`."""

    def __init__(self, description: str, total: float | None, unit: str, stream: IO[str]):
        super().__init__(total)
        # imported here, not at the top: rich costs every command that imports this module
        # (produce, consume, pipeline) about 60 ms, and only a terminal needs the bar
        from exactly.cli.progress_bar import Bar

        self._bar = Bar(description, total, unit, stream, lambda speed: human_rate(speed, unit))

    def _changed(self) -> None:
        self._bar.show(self.completed)

    def _close(self) -> None:
        self._bar.close(self.completed)


@contextmanager
def progress(
    description: str,
    total: float | None = None,
    *,
    unit: str = "records",
    quiet: bool = False,
    stream: IO[str] | None = None,
    interval: float = 5.0,
) -> Iterator[Tracker]:
    """A tracker for the duration of the ``with`` block (see the module docstring for the shape).

    The end is shown even when the block raises, so a log says how far the work got."""
    out: Any = sys.stderr if stream is None else stream
    tracker: Tracker
    if quiet:
        tracker = Tracker(total)
    elif out.isatty():
        tracker = _Terminal(description, total, unit, out)
    else:
        tracker = _Lines(description, total, unit, out, interval)
    try:
        yield tracker
    finally:
        tracker._close()
