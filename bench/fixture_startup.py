"""Start-up time of the pytest plugin's broker (``exactly.testing.broker()``, what ``exactly_broker``
runs for every test), to a broker that answers ApiVersions.

    PYTHONPATH=src .venv/bin/python bench/fixture_startup.py               # 10 starts -> bench/results/fixture-startup.md
    PYTHONPATH=src .venv/bin/python bench/fixture_startup.py --repeat 30 --out /tmp/startup.md

Per start: seconds from entering ``with exactly.testing.broker()`` to (a) the ``exactly listening``
line (``Broker.listening_s``, measured from the ``Popen``) and (b) the first ApiVersions v0 answer
on a fresh TCP connection (what a client's first request needs), and the teardown (``with`` exit:
SIGTERM, wait, directory removed). Then where the start goes: the interpreter alone, and the
import of the broker's modules (``python -X importtime``), split by package, once as installed and
once with ``hypothesis`` hidden (kio imports it, when present, only to register strategies for its
types; a production install has no hypothesis). The report states the 1-minute load average
before and after: 2 cores shared with other work make these figures move.

Target (issue #14): <= 0.5 s to ApiVersions. testcontainers is not measured here (see the note in
the report): it needs Docker and a JVM broker image.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import exactly.testing
from exactly.testing.broker import child_env

TARGET_S = 0.5
RESULTS = Path(__file__).resolve().parent / "results"
IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)")
TESTCONTAINERS_NOTE = """\
**testcontainers, for comparison (not measured here).** `testcontainers.kafka.KafkaContainer` needs a
running Docker daemon (and the permission to use it), pulls a JVM Kafka image (apache/kafka or
confluentinc/cp-kafka, several hundred MB) on first use, and then starts a JVM broker in a container:
typically 10 s or more per container start, which is why suites share one container per session. This
machine has no Docker, so no figure is claimed here. `exactly_broker` needs neither Docker nor Java
(only `exactly_cluster` needs Java, for ZooKeeper), and is cheap enough to give every test its own broker.
"""


def api_versions(host: str, port: int, timeout: float = 5.0) -> int:
    """Send ApiVersions v0 and return the error code of the answer (0 = answered)."""
    client_id = b"startup-bench"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _read(sock, 4))[0]
        payload = _read(sock, size)
    correlation, error = struct.unpack(">ih", payload[:6])
    assert correlation == 1
    return int(error)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def one_start() -> dict[str, float]:
    t0 = time.perf_counter()
    with exactly.testing.broker() as b:
        entered = time.perf_counter()
        host, port = b.launcher.host, int(b.launcher.port or 0)
        error = api_versions(host, port)
        answered = time.perf_counter()
        if error:
            raise RuntimeError(f"ApiVersions error {error}")
        listening = b.launcher.listening_s
        root = b.data_dir.parent
    closed = time.perf_counter()
    if root.exists():
        raise RuntimeError(f"{root} left behind")
    return {
        "listening_s": listening,
        "with_s": entered - t0,
        "api_versions_s": answered - t0,
        "teardown_s": closed - answered,
    }


SERVE_IMPORTS = "import exactly.cli.serve, exactly.server.broker"
HIDE_HYPOTHESIS = "import sys; sys.modules['hypothesis'] = None; "


def child_wall_s(code: str, repeat: int = 5) -> float:
    """Median wall seconds of ``python -c code`` (interpreter start, the code, exit)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=child_env(), check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def import_profile(hide_hypothesis: bool) -> tuple[float, list[tuple[str, float]]]:
    """Total self import time (s) of the broker's modules and the biggest packages."""
    code = (HIDE_HYPOTHESIS if hide_hypothesis else "") + SERVE_IMPORTS
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    by_package: collections.Counter[str] = collections.Counter()
    for line in run.stderr.splitlines():
        m = IMPORT_LINE.match(line)
        if m:
            parts = m.group(2).split(".")
            key = ".".join(parts[:2]) if parts[0] in ("exactly", "kio") else parts[0]
            by_package[key] += int(m.group(1))
    total = sum(by_package.values()) / 1e6
    return total, [(k, v / 1e6) for k, v in by_package.most_common(8)]


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS / "fixture-startup.md")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    one_start()  # warm: bytecode caches, page cache
    samples = [one_start() for _ in range(args.repeat)]
    python_s = child_wall_s("pass")
    import_wall = child_wall_s(SERVE_IMPORTS)
    import_wall_no_hyp = child_wall_s(HIDE_HYPOTHESIS + SERVE_IMPORTS)
    imports, top = import_profile(hide_hypothesis=False)
    imports_no_hyp, _ = import_profile(hide_hypothesis=True)
    load_after = os.getloadavg()[0]

    answered = [s["api_versions_s"] for s in samples]
    median = statistics.median(answered)
    verdict = "met" if median <= TARGET_S else "not met"
    lines = [
        "# Fixture start-up: `exactly_broker` / `exactly.testing.broker()`",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {args.repeat} starts after one warm-up, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, 1-min load average {load_before:.2f} before, "
        f"{load_after:.2f} after. Median (min-max).",
        "",
        "| step | time |",
        "| --- | --- |",
        f"| `with broker()` entered -> ApiVersions answered (target <= {TARGET_S} s: **{verdict}**) | {fmt(answered)} |",
        f"| `with broker()` entered (the listening line read) | {fmt([s['with_s'] for s in samples])} |",
        f"| of which `Popen` -> listening line | {fmt([s['listening_s'] for s in samples])} |",
        f"| teardown (SIGTERM, wait, rmtree) | {fmt([s['teardown_s'] for s in samples])} |",
        "",
        "Where the start goes (one child each):",
        "",
        f"- interpreter start (`python -c pass`): {python_s:.3f} s",
        f"- interpreter start plus importing the broker's modules (`python -c '{SERVE_IMPORTS}'`): "
        f"{import_wall:.3f} s; with `hypothesis` hidden: {import_wall_no_hyp:.3f} s",
        f"- the rest of `Popen` -> listening line (config, storage load, coordinators, bind), as the "
        f"difference of the medians: {statistics.median([s['listening_s'] for s in samples]) - import_wall:+.3f} s "
        f"(the import child also pays interpreter exit, so near zero means: the start is the imports)",
        f"- `-X importtime` self times summed (inflated by the instrumentation, for the split): {imports:.3f} s, "
        f"{imports_no_hyp:.3f} s without `hypothesis`; biggest: "
        + ", ".join(f"`{k}` {v:.3f} s" for k, v in top),
        "",
        TESTCONTAINERS_NOTE,
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
