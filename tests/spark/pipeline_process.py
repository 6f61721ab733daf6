"""The orders pipeline as a killable subprocess, shared by the crash tests.

``exactly pipeline run`` runs in its own process group: ``spark-submit`` execs ``java``, a child of
the pipeline process, so a test can SIGKILL that JVM (the driver) and then the whole group (the
Python driver and its Spark workers), and restart the job from its checkpoint.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from exactly.spark.orders import Topics
from exactly.testing.wait import wait_until
from tests.support.broker import child_env

PROGRESS = re.compile(r"^batch (\d+): (\d+) orders")


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Pipeline:
    """``exactly pipeline run`` in its own process group, output in its own log file."""

    runs = 0

    def __init__(self, logs: Path, bootstrap: str, topics: Topics, ckpt: Path, *args: str) -> None:
        Pipeline.runs += 1
        logs.mkdir(parents=True, exist_ok=True)
        self.log = log = logs / f"run-{Pipeline.runs}.log"
        env = child_env()
        prefix = topics.orders[: -len("order-completed")]
        cmd = [
            sys.executable, "-m", "exactly", "pipeline", "run", "--bootstrap-server", bootstrap,
            "--topic-prefix", prefix, "--checkpoint", str(ckpt), "--master", "local[2]",
            "--shuffle-partitions", "4", *args,
        ]  # fmt: skip
        with log.open("a") as out:
            out.write(f"=== {' '.join(cmd)}\n")
        self.proc = subprocess.Popen(
            cmd, stdout=log.open("a"), stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def batches_seen(self) -> int:
        return sum(1 for line in self.text().splitlines() if PROGRESS.match(line))

    def wait_until(self, check: Any, timeout: float, what: str) -> None:
        """``check()`` within ``timeout``; fails at once if the pipeline exits first."""

        def done() -> bool:
            if check():
                return True
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"pipeline exited ({self.proc.returncode}) before {what}:\n{self.text()[-4000:]}"
                )
            return False

        wait_until(done, timeout, what, describe=lambda: self.text()[-4000:])

    def kill_jvm(self) -> int:
        """SIGKILL the driver JVM, then everything else the pipeline started. Returns the JVM pid."""

        def jvms() -> list[int]:
            found = [pid for pid in descendants(self.proc.pid) if comm(pid) == "java"]
            if not found and self.proc.poll() is not None:
                raise AssertionError(f"pipeline exited ({self.proc.returncode}):\n{self.text()[-4000:]}")
            return found

        javas = wait_until(jvms, 30, f"a java process under pipeline pid {self.proc.pid}")
        for pid in javas:
            os.kill(pid, signal.SIGKILL)
        self.kill_all()
        return javas[0]

    def kill_all(self) -> None:
        if self.proc.poll() is None or descendants(self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(
                f"pipeline did not finish within {timeout}s:\n{self.text()[-4000:]}"
            ) from None


def crash_topics(tag: str) -> Topics:
    return Topics.with_prefix(f"crash-{tag}-{random.randrange(16**6):06x}-")


def all_logs(logs: Path) -> str:
    return "".join(
        p.read_text(errors="replace") for p in sorted(logs.glob("run-*.log"), key=lambda p: p.stat().st_mtime)
    )[-6000:]


def catch_up(log: Path, bootstrap: str, topics: Topics, ckpt: Path, *args: str) -> None:
    """Restart the job from its checkpoint and run it to the end of its input (availableNow)."""
    final = Pipeline(
        log, bootstrap, topics, ckpt, "--trigger", "availableNow", "--max-offsets-per-trigger", "2000", *args
    )
    code = final.finish(300)
    assert code == 0, final.text()[-4000:]
