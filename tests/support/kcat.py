"""Find (or install) kcat, the librdkafka command line client.

A fresh CI machine does not have it: when it is missing and we are root with apt-get, it is
installed once per test session (``apt-get install -y kcat``, after ``apt-get update`` if the
first attempt fails). Otherwise ``ensure_kcat`` returns the reason it is unavailable, and the kcat
tests skip with that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess

_cached: tuple[str | None, str] | None = None


def _run(cmd: list[str], timeout: float) -> tuple[bool, str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]


def ensure_kcat() -> tuple[str | None, str]:
    """-> (path to kcat or None, reason when None)."""
    global _cached
    if _cached is not None:
        return _cached
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path:
        _cached = (path, "")
        return _cached
    if os.environ.get("EXACTLY_NO_INSTALL"):
        _cached = (None, "kcat not installed and EXACTLY_NO_INSTALL is set")
        return _cached
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        _cached = (None, "kcat not installed and cannot install it (needs root and apt-get)")
        return _cached
    ok, out = _run(["apt-get", "install", "-y", "--no-install-recommends", "kcat"], 300)
    if not ok:
        _run(["apt-get", "update"], 300)
        ok, out = _run(["apt-get", "install", "-y", "--no-install-recommends", "kcat"], 300)
    path = shutil.which("kcat")
    if not ok or path is None:
        _cached = (None, f"kcat not installed and 'apt-get install -y kcat' failed: {out.strip()[-500:]}")
        return _cached
    _cached = (path, "")
    return _cached
