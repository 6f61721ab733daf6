"""Run the real broker as a subprocess for integration tests.

``Broker`` starts ``python -m exactly serve --listen HOST:0 --data-dir DIR``, waits for the one
``exactly listening on HOST:PORT`` line, and keeps everything the process prints (stdout and
stderr) in a log file next to the data dir, so a failing test can show what the broker said.

Lifecycle: ``start()`` -> (``stop()`` clean SIGTERM | ``kill()`` SIGKILL) -> ``restart()`` on the
same data dir (a new port unless ``same_port=True``). A Broker that was never started, or was
stopped, has no bootstrap address.
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

LISTEN_PREFIX = "exactly listening on "
SRC_DIR = Path(__file__).resolve().parents[2] / "src"


_LIVE: weakref.WeakSet[Broker] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    """A test run that dies must not leave broker processes behind."""
    for broker in list(_LIVE):
        broker._kill_quietly()


class BrokerError(RuntimeError):
    """The broker did not start or did not stop as it should."""


class Broker:
    """One broker process bound to a data dir; restartable."""

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
        self.port: int | None = None
        self.starts = 0
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
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

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

    def partition_dir(self, topic: str, partition: int = 0) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    # -------------------------------------------------------------- lifecycle
    def command(self, port: int = 0) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "exactly",
            "serve",
            "--listen",
            f"{self.host}:{port}",
            "--data-dir",
            str(self.data_dir),
        ]
        if self.config_file is not None:
            cmd += ["--config", str(self.config_file)]
        for key, value in self.overrides.items():
            cmd += ["-o", f"{key}={value}"]
        cmd += list(self.extra_args)
        return cmd

    def start(self, *, port: int = 0, timeout: float = 30.0) -> Broker:
        if self.running:
            raise BrokerError(f"{self.name} is already running")
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "bound-address").unlink()
        self.starts += 1
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_DIR), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("PYTHONFAULTHANDLER", "1")
        env.update(self.env)
        cmd = self.command(port)
        with self.log_path.open("ab") as log:
            log.write(f"=== {self.name} start #{self.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,  # a Ctrl-C on pytest must not kill it before cleanup
            )
        listening = threading.Event()
        found: list[str] = []
        assert self._proc.stdout is not None
        self._reader = threading.Thread(
            target=self._pump_stdout,
            args=(self._proc.stdout, listening, found),
            name=f"{self.name}-stdout",
            daemon=True,
        )
        self._reader.start()
        _LIVE.add(self)
        deadline = time.monotonic() + timeout
        while not listening.wait(0.05):
            if self._proc.poll() is not None:
                self._reader.join(2)
                raise BrokerError(
                    f"{self.name} exited with code {self._proc.returncode} before listening.\n"
                    f"command: {' '.join(cmd)}\n--- broker output ---\n{self._tail()}"
                )
            if time.monotonic() > deadline:
                self._kill_quietly()
                raise BrokerError(
                    f"{self.name} did not print '{LISTEN_PREFIX}HOST:PORT' within {timeout}s.\n"
                    f"command: {' '.join(cmd)}\n--- broker output ---\n{self._tail()}"
                )
        address = found[0]
        host, _, port_text = address.rpartition(":")
        self.port = int(port_text)
        if host and host not in (self.host, "0.0.0.0", "[::]", "::"):
            self.host = host.strip("[]")
        return self

    def _pump_stdout(self, stream: object, listening: threading.Event, found: list[str]) -> None:
        readline = stream.readline  # type: ignore[attr-defined]
        with self.log_path.open("ab", buffering=0) as log:
            for line in iter(readline, b""):
                log.write(line)
                text = line.decode("utf-8", "replace").strip()
                if not listening.is_set() and text.startswith(LISTEN_PREFIX):
                    found.append(text[len(LISTEN_PREFIX) :].strip())
                    listening.set()

    def _tail(self, limit: int = 20_000) -> str:
        text = self.log_text()
        return text[-limit:]

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
                    f"{self.name} did not exit within {timeout}s of SIGTERM\n{self._tail()}"
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
        """Test teardown: stop cleanly if possible, else kill. Never raises."""
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
