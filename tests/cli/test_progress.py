"""Progress of long commands: a rich bar on a terminal, plain periodic lines elsewhere, nothing
with --quiet; always on stderr, so stdout stays what scripts read."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exactly.cli.progress import progress
from tests.cli.test_ops_cli import exactly
from tests.support.broker import Broker, child_env
from tests.support.clients import consume, create_topic

pytestmark = pytest.mark.timeout(180)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with progress("load", 200, unit="orders", stream=out, interval=0.0) as tracker:
        tracker.advance(100)
        tracker.update(200)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("load: 100/200 orders (50%), ")
    assert "orders/s" in lines[0] and "ETA " in lines[0]
    assert lines[-1].startswith("load: 200/200 orders (100%), ") and "done in " in lines[-1]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_lines_are_periodic_not_per_step() -> None:
    out = io.StringIO()
    with progress("load", 10_000, stream=out, interval=3600.0) as tracker:
        for _ in range(10_000):
            tracker.advance()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[-1]]
    assert "10,000/10,000 records (100%)" in out.getvalue()


def test_without_a_total_a_count_and_a_rate() -> None:
    out = io.StringIO()
    with progress("read", stream=out, interval=0.0) as tracker:
        tracker.advance(7)
    (first, last) = out.getvalue().splitlines()
    assert first.startswith("read: 7 records, ") and "ETA" not in first and "%" not in first
    assert "done in" in last


def test_the_end_is_shown_when_the_work_fails() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress("load", 10, stream=out) as tracker:
        tracker.advance(3)
        raise RuntimeError("boom")
    assert out.getvalue().startswith("load: 3/10 records (30%)")


def test_quiet_prints_nothing() -> None:
    out = FakeTerminal()
    with progress("load", 10, stream=out, quiet=True) as tracker:
        tracker.advance(10)
    assert out.getvalue() == ""


def test_a_bar_with_rate_and_eta_on_a_terminal() -> None:
    out = FakeTerminal()
    with progress("load", 100, unit="orders", stream=out) as tracker:
        tracker.advance(40)
    text = out.getvalue()
    assert "load" in text and "40/100" in text
    assert "orders/s" in text
    assert re.search(r"ETA \d+:\d\d:\d\d", text)
    assert "━" in text  # the bar


# ---------------------------------------------------------------------------- the commands
def test_produce_from_a_file_reports_bytes_on_stderr(broker: Broker, topic: str, tmp_path: Path) -> None:
    create_topic(broker.bootstrap, topic)
    data = tmp_path / "lines.txt"
    data.write_bytes(b"".join(f"value-{i}\n".encode() for i in range(500)))
    proc = exactly("produce", topic, "--file", str(data), "--bootstrap-server", broker.bootstrap)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b""
    last = proc.stderr.decode().splitlines()[-1]
    size = data.stat().st_size
    assert last.startswith(f"produce {topic}: {size:,}/{size:,} bytes (100%), "), last
    assert "done in" in last
    got = consume(broker.bootstrap, topic, 500, timeout=30)
    assert [g.value for g in got] == [f"value-{i}".encode() for i in range(500)]

    quiet = exactly("produce", topic, "--file", str(data), "--quiet", "--bootstrap-server", broker.bootstrap)
    assert quiet.returncode == 0 and quiet.stderr == b""
    missing = exactly(
        "produce", topic, "--file", str(tmp_path / "nope"), "--bootstrap-server", broker.bootstrap
    )
    assert missing.returncode == 1
    assert "cannot read" in missing.stderr.decode()


def test_produce_from_a_pipe_counts_records(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    env = child_env()
    proc = subprocess.run(
        [sys.executable, "-m", "exactly", "produce", topic, "--bootstrap-server", broker.bootstrap],
        input=b"a\nb\nc\n",
        capture_output=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr.decode().splitlines()[-1].startswith(f"produce {topic}: 3 records, ")


def test_produce_draws_a_bar_on_a_terminal(broker: Broker, topic: str, tmp_path: Path) -> None:
    create_topic(broker.bootstrap, topic)
    data = tmp_path / "lines.txt"
    data.write_bytes(b"x\n" * 100)
    bs = ("--bootstrap-server", broker.bootstrap)
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "exactly", "produce", topic, "--file", str(data), *bs],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=secondary,
            timeout=60,
            env=child_env(extra={"COLUMNS": "200"}),  # the pty's default 80 columns truncate the bar
        )
        os.close(secondary)
        secondary = -1
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal's other side is closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    assert proc.returncode == 0
    assert proc.stdout == b""
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert "━" in shown and "200/200" in shown, shown
    assert "B/s" in shown, shown


def test_pipeline_generate_reports_orders(broker: Broker, topic: str) -> None:
    args = ("pipeline", "generate", "--orders", "300", "--txn-size", "100", "--topic-prefix", f"{topic}-")
    proc = exactly(*args, "--bootstrap-server", broker.bootstrap)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().startswith("generated 300 committed orders")
    last = proc.stderr.decode().splitlines()[-1]
    assert last.startswith(f"generate {topic}-order-completed: 300/300 orders (100%), "), last
    quiet = exactly(*args, "--quiet", "--first-order-id", "300", "--bootstrap-server", broker.bootstrap)
    assert quiet.returncode == 0 and quiet.stderr == b"", quiet.stderr.decode()
