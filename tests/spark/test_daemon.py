"""The preloading worker daemon (``exactly.spark.daemon``): its imports leave the process with one
thread, so forking workers from it is as safe as from Spark's own daemon."""

from __future__ import annotations

import subprocess
import sys

from exactly.spark import daemon
from tests.support.broker import child_env

CHECK = """
import sys
from exactly.spark import daemon
ok = daemon.preload()
print(ok, daemon.threads(), sorted(m for m in ("pyarrow", "pandas") if m in sys.modules))
"""


def test_preload_is_thread_free_and_leaves_out_pyarrow_and_pandas() -> None:
    out = (
        subprocess.run(
            [sys.executable, "-c", CHECK],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=120,
            check=True,
        )
        .stdout.strip()
        .split(maxsplit=2)
    )
    assert out == ["True", "1", "[]"], out


def test_a_thread_started_by_an_import_is_seen() -> None:
    script = "import threading, time; from exactly.spark import daemon\n"
    script += "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
    script += "print(daemon.preload())"
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
        check=True,
    ).stdout.strip()
    assert out == "False"
    assert daemon.STOCK_DAEMON == "pyspark.daemon"
