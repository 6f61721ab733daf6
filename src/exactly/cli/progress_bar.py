"""The terminal's progress bar (``rich``), for :func:`exactly.cli.progress.progress`: description,
bar, ``done/total``, rate and ETA; without a total, the count, rate and elapsed time.

Knows nothing of the trackers (``exactly.cli.progress`` imports this module, not the reverse):
it is told the count with :meth:`Bar.show` and formats rates with the function it is given."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

RateText = Callable[[float], str]

__all__ = ["Bar"]


def _speed(task: Task) -> float | None:
    """rich's windowed speed once it has two samples, else the average since the start (a
    command that reports rarely, once per transaction, still shows a rate and an ETA)."""
    if task.finished_speed or task.speed:
        return task.finished_speed or task.speed
    elapsed = task.elapsed
    return task.completed / elapsed if elapsed and task.completed else None


class _RateColumn(ProgressColumn):
    """``N unit/s`` (rich has no such column for counts)."""

    def __init__(self, rate_text: RateText) -> None:
        super().__init__()
        self.rate_text = rate_text

    def render(self, task: Task) -> Text:
        speed = _speed(task)
        return Text("-" if speed is None else self.rate_text(speed), style="progress.data.speed")


class _EtaColumn(ProgressColumn):
    """``ETA H:MM:SS`` from :func:`_speed`."""

    def render(self, task: Task) -> Text:
        speed = _speed(task)
        if task.total is None or not speed:
            return Text("ETA -:--:--", style="progress.remaining")
        left = int(max(task.total - task.completed, 0) / speed)
        return Text(f"ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}", style="progress.remaining")


class Bar:
    """A live bar on ``stream`` from construction to :meth:`close`."""

    def __init__(
        self, description: str, total: float | None, unit: str, stream: IO[str], rate_text: RateText
    ):
        columns: list[ProgressColumn | str] = [TextColumn("[progress.description]{task.description}")]
        if total:
            columns += [BarColumn(), MofNCompleteColumn(), _RateColumn(rate_text), _EtaColumn()]
        else:
            columns += [
                TextColumn("{task.completed:,.0f} " + unit),
                _RateColumn(rate_text),
                TimeElapsedColumn(),
            ]
        self._progress = Progress(*columns, console=Console(file=stream), transient=False)
        self._task = self._progress.add_task(description, total=total)
        self._progress.start()

    def show(self, completed: float) -> None:
        self._progress.update(self._task, completed=completed)

    def close(self, completed: float) -> None:
        self._progress.update(self._task, completed=completed)
        self._progress.stop()
