"""The chaos history: what every client process did and saw, one JSON object per line.

Each client process appends to its own ``hist-<proc>.jsonl`` (flushed per line, so a kill -9
loses at most a torn last line, which the loader skips). The runner adds ``hist-runner.jsonl``
(faults and the final reads). ``load_history`` merges them; the checker needs no order between
files, only the order of lines within one process.

Events (``t`` is the type; ``proc`` is added from the file when missing):

* ``send``      ``v`` ``p``            an idempotent produce was invoked (value, partition)
* ``ack``       ``v`` ``p`` ``o``      a delivery report said OK at offset ``o``
* ``nack``      ``v`` ``err``          a delivery report said failed (the write is indeterminate)
* ``txn_begin`` ``txn``                a transaction started (``txn`` is unique in the run)
* ``txn_send``  ``txn`` ``v`` ``p``    a transactional produce was invoked
* ``txn_end``   ``txn`` ``intent`` ``result`` [``err``]
      ``intent`` commit|abort; ``result`` ok (the intent happened) | aborted (a commit failed and
      the abort that followed succeeded) | unknown. A txn without ``txn_end`` is unknown.
* ``read``      ``iso`` (rc|ru) ``session`` ``recs`` [[p, o, v], ...] [``final`` ``upto`` {p: pos}]
      records a consumer returned, in order; final reads also say how far they got.
* ``hung``      ``hw`` ``lso``         transactions still open after everything was healed
* ``fault``     ``what`` ...           informational

Values are unique strings ``<writer>:<n>`` where ``<writer>`` names one producer instance
(process name + generation) and ``n`` grows with every value it sends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Event = dict[str, Any]


def make_value(writer: str, n: int) -> str:
    return f"{writer}:{n}"


def parse_value(value: str) -> tuple[str, int] | None:
    """``"<writer>:<n>"`` -> (writer, n); None for a value no chaos writer makes."""
    writer, sep, n = value.rpartition(":")
    if not sep or not writer or not n.isdigit():
        return None
    return writer, int(n)


class HistoryWriter:
    """Append-only JSON-lines writer; every line reaches the kernel before ``write`` returns."""

    def __init__(self, path: Path, proc: str) -> None:
        self.path = path
        self.proc = proc
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, t: str, **fields: Any) -> None:
        line = json.dumps({"t": t, "proc": self.proc, **fields}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def iter_file(path: Path) -> Iterator[Event]:
    proc = path.stem.removeprefix("hist-")
    with path.open("rb") as f:
        for raw in f:
            try:
                event = json.loads(raw)
            except ValueError:
                continue  # a torn last line of a killed process
            if isinstance(event, dict) and "t" in event:
                event.setdefault("proc", proc)
                yield event


def load_history(directory: Path) -> list[Event]:
    events: list[Event] = []
    for path in sorted(directory.glob("hist-*.jsonl")):
        events.extend(iter_file(path))
    return events
