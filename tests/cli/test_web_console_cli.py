"""``exactly console``'s command line: help with an example, one-line errors (exit code 1) for a
bad bootstrap address or a port in use. What it serves is tested in tests/webconsole/."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.support.broker import child_env


def exactly(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "exactly", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_help_lists_the_console_and_shows_an_example() -> None:
    listed = exactly("--help")
    assert listed.returncode == 0 and "console" in listed.stdout
    helped = exactly("console", "--help")
    assert helped.returncode == 0
    assert "exactly console --bootstrap-server 127.0.0.1:9092 --port 8090" in helped.stdout
    assert "--hanging-after-ms" in helped.stdout and "default 127.0.0.1" in helped.stdout


def test_a_bad_bootstrap_address_is_one_line() -> None:
    proc = exactly("console", "--bootstrap-server", "nohost", "--port", "0")
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == "exactly console: error: invalid --bootstrap-server 'nohost' (expected HOST:PORT)"
    )


def test_a_port_in_use_is_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = exactly("console", "--bootstrap-server", "127.0.0.1:9", "--port", str(port))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"exactly console: error: cannot listen on 127.0.0.1:{port}: ")
    assert proc.stdout == ""
