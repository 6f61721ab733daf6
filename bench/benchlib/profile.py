"""py-spy sampling of the broker during a workload (``run.py --profile``).

Writes collapsed stacks (``--format raw``: load into speedscope or flamegraph.pl) plus a text summary
of the hottest frames by self time and by inclusive time.
"""

from __future__ import annotations

import collections
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


def pyspy_binary() -> str | None:
    cand = Path(sys.executable).parent / "py-spy"
    return str(cand) if cand.exists() else shutil.which("py-spy")


_LINE = re.compile(r"^(.*) (\d+)$")
_LINENO = re.compile(r":\d+\)$")


def summarize(collapsed: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample counts per frame (line numbers folded into the function)."""
    self_c: collections.Counter[str] = collections.Counter()
    incl_c: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        n = int(m.group(2))
        frames = [_LINENO.sub(")", f) for f in m.group(1).split(";")]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")] or frames
        total += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl_c[f] += n
    return {"samples": total, "self": self_c.most_common(top), "inclusive": incl_c.most_common(top)}


def format_summary(summary: dict[str, Any]) -> str:
    total = summary["samples"] or 1
    out = [f"{summary['samples']} samples", "", "top self:"]
    out += [f"  {n / total:6.1%}  {f}" for f, n in summary["self"]]
    out += ["", "top inclusive:"]
    out += [f"  {n / total:6.1%}  {f}" for f, n in summary["inclusive"]]
    return "\n".join(out) + "\n"


class PySpy:
    def __init__(self, pid: int, stem: Path, rate: int = 100) -> None:
        self.pid, self.stem, self.rate = pid, stem, rate
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = pyspy_binary()
        if exe is None:
            print("   (py-spy not installed: pip install py-spy)", flush=True)
            return
        self.raw = self.stem.with_suffix(".collapsed.txt")
        self.err = self.stem.with_suffix(".pyspy.log")
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    exe,
                    "record",
                    "--pid",
                    str(self.pid),
                    "--rate",
                    str(self.rate),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--subprocesses",
                    "-o",
                    str(self.raw),
                ],
                stdout=err,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    def stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if not self.raw.exists():
            return {"error": self.err.read_text(errors="replace")[-500:]}
        summary = summarize(self.raw)
        txt = self.stem.with_suffix(".top.txt")
        txt.write_text(format_summary(summary))
        return {
            "collapsed": str(self.raw),
            "summary_file": str(txt),
            "samples": summary["samples"],
            "self": summary["self"][:10],
            "inclusive": summary["inclusive"][:10],
        }
