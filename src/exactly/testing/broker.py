"""The one way to run ``exactly serve`` as a subprocess: tests, benchmarks and the demo use it.

``Broker`` starts ``python -m exactly serve --listen HOST:0 --data-dir DIR``, waits for the one
``exactly listening on HOST:PORT`` line the command prints on stdout once its listener is bound,
and keeps everything the process prints (stdout and stderr) in a log file, so whoever started it
can show what the broker said when something goes wrong.

Lifecycle: ``start()`` -> (``stop()`` clean SIGTERM | ``kill()`` SIGKILL) -> ``restart()`` on the
same data dir (a new port unless ``same_port=True``). A Broker that was never started, or was
stopped, has no bootstrap address. ``close()`` is the never-raising teardown; processes still
alive when the interpreter exits are killed (a crashed test run leaves no brokers behind).

Why the listening line rather than the ``bound-address`` file the broker also writes: the line is
printed after the file is complete, and reading it needs no polling of a half-written file.
``listening_s`` is the time from ``Popen`` to that line, stamped by the thread that reads it (the
benchmarks report it as start-up time).

``src`` picks the package tree the child runs (default: the tree this module was imported from),
so a benchmark can compare two checkouts of the broker side by side.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

__all__ = [
    "LISTEN_PREFIX",
    "SRC_DIR",
    "Broker",
    "BrokerError",
    "child_env",
    "serve_command",
]

LISTEN_PREFIX = "exactly listening on "
LISTENER_PREFIX = "exactly listener "  # ``exactly listener NAME on HOST:PORT``, one per listener
# the ``src`` directory holding the ``exactly`` package this module belongs to
SRC_DIR = Path(__file__).resolve().parents[2]

_LIVE: weakref.WeakSet[Broker] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    """A run that dies must not leave broker processes behind."""
    for broker in list(_LIVE):
        broker._kill_quietly()


class BrokerError(RuntimeError):
    """The broker did not start or did not stop as it should."""


def child_env(
    src: Path | None = None, extra: Mapping[str, str] | None = None, *, paths: Sequence[Path] = ()
) -> dict[str, str]:
    """The environment of a child ``python -m exactly ...`` (a broker, a CLI command, a test
    client): this process's, with ``src`` (default :data:`SRC_DIR`) and then ``paths`` first on
    PYTHONPATH, unbuffered output and the fault handler on, plus ``extra``."""
    env = dict(os.environ)
    entries = [str(src or SRC_DIR), *map(str, paths), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in entries if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.update(extra or {})
    return env


def serve_command(
    data_dir: Path,
    listen: str = "127.0.0.1:0",
    *,
    config_file: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``python -m exactly serve`` command line (also for tests that expect it to fail).
    ``listen`` is left out when the overrides give ``listeners`` (named listeners, TLS, SASL)."""
    cmd = [sys.executable, "-m", "exactly", "serve", "--data-dir", str(data_dir)]
    if "listeners" not in (overrides or {}):
        cmd[4:4] = ["--listen", listen]
    if config_file is not None:
        cmd += ["--config", str(config_file)]
    for key, value in (overrides or {}).items():
        cmd += ["-o", f"{key}={value}"]
    return cmd + list(extra_args)


class Broker:
    """One broker process bound to a data dir; restartable.

    Owns the child process, the thread that copies its stdout into ``log_path`` and the log
    file itself (appended to across restarts, each start headed by a ``=== name start #n`` line).
    ``port`` and ``host`` are those of the running process; ``starts`` counts starts.
    """

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *,
        overrides: Mapping[str, str] | None = None,
        config_file: Path | None = None,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        name: str = "broker",
        env: Mapping[str, str] | None = None,
        src: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.overrides: dict[str, str] = dict(overrides or {})
        self.config_file = config_file
        self.host = host
        self.extra_args = tuple(extra_args)
        self.name = name
        # extra environment for the broker process (e.g. EXACTLY_FAULT); edit it between restarts
        self.env: dict[str, str] = dict(env or {})
        self.src = src
        self.cwd = cwd
        self.port: int | None = None
        # listener name -> bound port, from the ``exactly listener NAME on HOST:PORT`` lines
        self.listener_ports: dict[str, int] = {}
        self.starts = 0
        self.started_at = 0.0  # time.monotonic() of the last start's Popen
        self.listening_s = 0.0  # seconds from that Popen to the listening line
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ state
    @property
    def bootstrap(self) -> str:
        """``HOST:PORT`` of the running broker."""
        if self.port is None or not self.running:
            raise BrokerError(f"{self.name} is not running")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The current (or last) child process."""
        return self._proc

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def listener_address(self, name: str) -> str:
        """``HOST:PORT`` of the running broker's listener ``name``."""
        if not self.running or name not in self.listener_ports:
            raise BrokerError(f"{self.name} has no running listener {name}")
        return f"{self.host}:{self.listener_ports[name]}"

    def log_text(self, since: int = 0) -> str:
        """What the broker printed (all starts), from byte ``since`` of the log file."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(since)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_tail(self, limit: int = 20_000) -> str:
        """The last ``limit`` characters of the log."""
        return self.log_text()[-limit:]

    def partition_dir(self, topic: str, partition: int = 0) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    # -------------------------------------------------------------- lifecycle
    def command(self, port: int = 0) -> list[str]:
        return serve_command(
            self.data_dir,
            f"{self.host}:{port}",
            config_file=self.config_file,
            overrides=self.overrides,
            extra_args=self.extra_args,
        )

    def start(self, *, port: int = 0, timeout: float = 30.0) -> Broker:
        """Start the process and return once it printed its listening line.

        Raises :class:`BrokerError` (with the broker's output) if it exits first or is silent
        for ``timeout`` seconds; in the latter case it is killed."""
        if self.running:
            raise BrokerError(f"{self.name} is already running")
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "bound-address").unlink()
        self.starts += 1
        self.listener_ports = {}
        cmd = self.command(port)
        listening = threading.Event()
        found: list[tuple[str, float]] = []  # (address, time.monotonic() when seen)
        with self.log_path.open("ab") as log:
            log.write(f"=== {self.name} start #{self.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            self.started_at = time.monotonic()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=child_env(self.src, self.env),
                cwd=self.cwd,
                start_new_session=True,  # a Ctrl-C on the parent must not kill it before cleanup
            )
        assert self._proc.stdout is not None
        self._reader = threading.Thread(
            target=self._pump_stdout,
            args=(self._proc.stdout, listening, found),
            name=f"{self.name}-stdout",
            daemon=True,
        )
        self._reader.start()
        _LIVE.add(self)
        deadline = self.started_at + timeout
        while not listening.wait(0.05):
            if self._proc.poll() is not None:
                self._reader.join(2)
                raise BrokerError(
                    f"{self.name} exited with code {self._proc.returncode} before listening.\n"
                    f"command: {' '.join(cmd)}\n--- broker output ---\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self._kill_quietly()
                raise BrokerError(
                    f"{self.name} did not print '{LISTEN_PREFIX}HOST:PORT' within {timeout}s.\n"
                    f"command: {' '.join(cmd)}\n--- broker output ---\n{self.log_tail()}"
                )
        address, seen_at = found[0]
        self.listening_s = seen_at - self.started_at
        host, _, port_text = address.rpartition(":")
        self.port = int(port_text)
        if host and host not in (self.host, "0.0.0.0", "[::]", "::"):
            self.host = host.strip("[]")
        return self

    def _pump_stdout(
        self, stream: IO[bytes], listening: threading.Event, found: list[tuple[str, float]]
    ) -> None:
        with self.log_path.open("ab", buffering=0) as log:
            for line in iter(stream.readline, b""):
                log.write(line)
                text = line.decode("utf-8", "replace").strip()
                if not listening.is_set() and text.startswith(LISTENER_PREFIX):
                    name, _, address = text[len(LISTENER_PREFIX) :].partition(" on ")
                    self.listener_ports[name] = int(address.rpartition(":")[2])
                if not listening.is_set() and text.startswith(LISTEN_PREFIX):
                    found.append((text[len(LISTEN_PREFIX) :].strip(), time.monotonic()))
                    listening.set()

    def stop(self, timeout: float = 30.0) -> int:
        """Clean shutdown (SIGTERM). Returns the exit code; raises if it hangs."""
        proc = self._proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_quietly()
                raise BrokerError(
                    f"{self.name} did not exit within {timeout}s of SIGTERM\n{self.log_tail()}"
                ) from None
        self._join_reader()
        return proc.returncode

    def kill(self) -> None:
        """Crash the broker (SIGKILL) and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        self._join_reader()
        with self.log_path.open("ab") as log:
            log.write(f"=== {self.name} killed with SIGKILL\n".encode())

    def restart(self, *, same_port: bool = False, clean: bool = True, timeout: float = 30.0) -> Broker:
        """Stop (SIGTERM if ``clean`` else SIGKILL) if running, then start on the same data dir."""
        old_port = self.port
        if self.running:
            if clean:
                self.stop()
            else:
                self.kill()
        port = old_port if (same_port and old_port is not None) else 0
        return self.start(port=port, timeout=timeout)

    def close(self) -> None:
        """Teardown: stop cleanly if possible, else kill. Never raises."""
        try:
            self.stop(timeout=15)
        except BrokerError:
            pass
        finally:
            self._kill_quietly()

    def _kill_quietly(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self._join_reader()

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        if self._proc is not None and self._proc.stdout is not None:
            with contextlib.suppress(OSError):
                self._proc.stdout.close()

    def __enter__(self) -> Broker:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"{self.host}:{self.port}" if self.running else "stopped"
        return f"<Broker {self.name} {state} data={self.data_dir}>"
