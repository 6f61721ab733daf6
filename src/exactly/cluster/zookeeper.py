"""A local standalone ZooKeeper for development and tests (``exactly zookeeper``).

Why
---
The cluster mode coordinates brokers through a real ZooKeeper, not a home-made consensus. Debian's
``zookeeper`` package (3.8) ships the server jars; this class runs one standalone server from them
as a child process so that a developer, the test suite and the benchmarks all get the same thing
with one call.

How
---
A ``zoo.cfg`` is generated in the data directory: the client port binds to ``127.0.0.1`` only
(``clientPortAddress``), the admin HTTP server is off (it would otherwise bind 0.0.0.0:8080), and
the ``srvr`` and ``ruok`` four-letter words are allowed. The tick is 500 ms so sessions as short as
1 s can be negotiated (tests use 2 s), with the upper bound raised to 60 s so Kafka's default
``zookeeper.session.timeout.ms`` of 18 s is accepted too.

Readiness is ``srvr`` answering ``Mode: standalone``. ``ruok`` is not enough: it answers ``imok``
while the database is still loading (3.8 then logs a NullPointerException for the probe).

Invariants: :meth:`start` returns only once clients can connect; :meth:`stop` always reaps the
process (SIGTERM, then SIGKILL after a grace period); the data directory survives a restart, so a
restarted server keeps every znode.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

JAVA_DIR = Path("/usr/share/java")
SERVER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEFAULT_PORT = 2181
TICK_MS = 500
MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 60_000


class ZooKeeperError(Exception):
    """ZooKeeper is not installed, or did not start / answer in time."""


@dataclass(frozen=True, slots=True)
class ZooKeeperAddress:
    host: str
    port: int

    @property
    def connect(self) -> str:
        """The ``zookeeper.connect`` value (without chroot)."""
        return f"{self.host}:{self.port}"


def classpath() -> str:
    """The Debian jars: ``zookeeper.jar``'s manifest lists its own dependencies; slf4j-simple (when
    present) turns the server's logging on, at WARN, instead of slf4j's no-op fallback."""
    server = JAVA_DIR / "zookeeper.jar"
    if not server.exists():
        raise ZooKeeperError(f"{server} is missing: install Debian's zookeeper package (make setup)")
    jars = [server]
    simple = JAVA_DIR / "slf4j-simple.jar"
    if simple.exists():
        jars.append(simple)
    return os.pathsep.join(str(j) for j in jars)


def four_letter_word(address: ZooKeeperAddress, word: str, timeout: float = 1.0) -> str:
    """Send a four-letter command and return the whole answer ('' if the server closed at once)."""
    with socket.create_connection((address.host, address.port), timeout=timeout) as sock:
        sock.sendall(word.encode())
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(data_dir: Path, port: int) -> Path:
    config = data_dir / "zoo.cfg"
    lines = [
        f"tickTime={TICK_MS}",
        f"dataDir={data_dir / 'data'}",
        f"clientPort={port}",
        "clientPortAddress=127.0.0.1",
        "admin.enableServer=false",
        "4lw.commands.whitelist=srvr,ruok",
        f"minSessionTimeout={MIN_SESSION_TIMEOUT_MS}",
        f"maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}",
        "maxClientCnxns=0",
    ]
    config.write_text("\n".join(lines) + "\n")
    return config


class ZooKeeperServer:
    """One standalone ZooKeeper child process on 127.0.0.1 (``port=0`` picks a free port)."""

    def __init__(self, data_dir: Path, port: int = DEFAULT_PORT, *, log_path: Path | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.log_path = log_path if log_path is not None else data_dir / "zookeeper.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> ZooKeeperAddress:
        return ZooKeeperAddress("127.0.0.1", self.port)

    def start(self, timeout: float = 30.0) -> ZooKeeperAddress:
        if self.process is not None and self.process.poll() is None:
            return self.address
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        config = write_config(self.data_dir, self.port)
        command = [
            "java",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # C1 only: starts faster, ZooKeeper's load here is tiny
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath(),
            SERVER_MAIN,
            str(config),
        ]
        with open(self.log_path, "ab") as log:
            try:
                self.process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            except FileNotFoundError as exc:
                raise ZooKeeperError("java is missing: install openjdk-17-jre-headless (make setup)") from exc
        try:
            self._await_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self.address

    def _await_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise ZooKeeperError(
                    f"ZooKeeper exited with {self.process.returncode} before serving; see {self.log_path}"
                )
            try:
                if "Mode: standalone" in four_letter_word(self.address, "srvr"):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ZooKeeperError(f"ZooKeeper not serving on {self.address.connect} after {timeout}s")
            time.sleep(0.05)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait, SIGKILL if it lingers. Idempotent."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
