"""A Spark standalone cluster on loopback for tests: one master and N workers, each a JVM started
with the installed PySpark's own launcher (``pyspark/bin/spark-class``; the wheel ships no
``sbin/start-master.sh``).

Why the daemons get a clean environment: an executor JVM inherits its worker's environment, and a
worker started with the source tree on PYTHONPATH would let the executors' Python workers import
``exactly`` from there, hiding whether the job ships the package itself (``addPyFile``, as on a
real cluster). So the daemons see no PYTHONPATH and no PYSPARK_* variables of the test process.

Each daemon runs in its own process group (``start_new_session``): the executors a worker forks
and their Python workers stay in that group, so ``close`` ends the whole tree (SIGTERM, then
SIGKILL of whatever is left) and leaves no orphan behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"

_LOG4J = """\
rootLogger.level = info
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
"""

# the master's REST submission server would take the fixed port 6066 (one cluster per machine)
_DAEMON_PROPERTIES = """\
spark.master.rest.enabled false
spark.ui.showConsoleProgress false
"""


def spark_home() -> Path:
    """The installed pyspark package: its ``bin/`` and ``jars/`` make it a SPARK_HOME."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    """``StandaloneCluster(base, workers=2).start()``; ``url`` is ``spark://127.0.0.1:<port>``.

    Every worker offers ``cores`` cores and ``memory`` of executor memory; the daemons themselves
    run with ``daemon_memory`` of heap. Logs: ``base/master.log``, ``base/worker-<i>.log``; each
    worker's executors work (and log) under ``base/worker-<i>/<app-id>/<executor-id>/``."""

    def __init__(
        self,
        base: Path,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        daemon_memory: str = "256m",
    ) -> None:
        self.base = base
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.url = ""
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self._pgids: list[int] = []  # kept after close, for leftover_groups

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        try:
            master_log = self._launch("master", MASTER_CLASS, "--host", "127.0.0.1", "--port", "0")
            self.url = self._await(master_log, lambda text: _match_url(text), timeout, "the master's URL")
            worker_logs = []
            for i in range(self.workers):  # started together: each JVM takes seconds to come up
                work = self.base / f"worker-{i}"
                work.mkdir(exist_ok=True)
                worker_logs.append(
                    self._launch(
                        f"worker-{i}",
                        WORKER_CLASS,
                        *("--host", "127.0.0.1", "--port", "0", "--work-dir", str(work)),
                        *("--cores", str(self.cores), "--memory", self.memory),
                        self.url,
                    )
                )
            for i, log in enumerate(worker_logs):
                self._await(log, lambda text: _REGISTERED in text, timeout, f"worker {i} registered")
        except BaseException:
            self.close()
            raise
        return self

    def close(self, timeout: float = 30.0) -> None:
        """SIGTERM every daemon's process group (the master last), wait, SIGKILL what is left."""
        for proc in reversed(self.procs):
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)  # executors or Python workers that outlived it
            proc.wait()
        self.procs.clear()
        # a killed group's other members (no longer our children) take a moment to exit
        while self.leftover_groups() and time.monotonic() < deadline + 10:
            time.sleep(0.1)

    def leftover_groups(self) -> list[int]:
        """Process groups of daemons started by this cluster that still have a live member."""
        return [pid for pid in self._pgids if _group_alive(pid)]

    # ------------------------------------------------------------------ inspection
    def app_ids(self) -> set[str]:
        """The applications that ran executors on any worker so far."""
        return {p.name for i in range(self.workers) for p in (self.base / f"worker-{i}").glob("app-*")}

    def executor_dirs(self, app_id: str) -> dict[int, list[Path]]:
        """Worker index -> the executor directories it created for ``app_id``."""
        return {
            i: sorted(p for p in (self.base / f"worker-{i}" / app_id).glob("*") if p.is_dir())
            for i in range(self.workers)
        }

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}" for log in self.logs)

    # ------------------------------------------------------------------ internals
    def _launch(self, name: str, main_class: str, *args: str) -> Path:
        log = self.base / f"{name}.log"
        self.logs.append(log)
        log4j = self.base / "log4j2.properties"
        log4j.write_text(_LOG4J)
        properties = self.base / "spark-daemons.conf"
        properties.write_text(_DAEMON_PROPERTIES)
        env = daemon_env(self.base, log4j, self.daemon_memory)
        command = [str(spark_home() / "bin" / "spark-class"), main_class, *args]
        command += ["--webui-port", "0", "--properties-file", str(properties)]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.base,
                start_new_session=True,
            )
        self.procs.append(proc)
        self._pgids.append(proc.pid)
        return log

    def _await(self, log: Path, found: Callable[[str], object], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            value = found(text)
            if value:
                return value if isinstance(value, str) else text
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Spark daemon exited before {what}:\n{self.log_tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"no {what} within {timeout:.0f}s:\n{self.log_tail()}")


def daemon_env(base: Path, log4j: Path, daemon_memory: str) -> dict[str, str]:
    """This process's environment without the Python paths and PySpark settings of the tests."""
    drop = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "SPARK_CONF_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(base / "logs"),
            "SPARK_DAEMON_MEMORY": daemon_memory,
            "SPARK_DAEMON_JAVA_OPTS": f"-Dlog4j.configurationFile=file:{log4j}",
            "SPARK_NO_DAEMONIZE": "1",
        }
    )
    return env


def _match_url(text: str) -> str | None:
    match = _MASTER_URL.search(text)
    return match.group(1) if match else None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
