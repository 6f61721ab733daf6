"""Start-up time of the pytest plugin's broker (``exactly.testing.broker()``, what ``exactly_broker``
runs for every test), to a broker that answers ApiVersions.

    PYTHONPATH=src .venv/bin/python bench/fixture_startup.py               # 10 starts -> bench/results/fixture-startup.md
    PYTHONPATH=src .venv/bin/python bench/fixture_startup.py --repeat 30 --out /tmp/startup.md
    PYTHONPATH=src .venv/bin/python bench/fixture_startup.py --baseline /tmp/old/src   # side by side

Per start (``broker()``'s steps, run by its launcher so that another checkout's tree can be
started the same way: temp dir, start, ApiVersions, close, rmtree): seconds from the start to
(a) the ``exactly listening`` line (``Broker.listening_s``, measured from the ``Popen``) and (b) the first ApiVersions v0 answer
on a fresh TCP connection (what a client's first request needs), and the teardown (``with`` exit:
SIGTERM, wait, directory removed), and the CPU seconds the broker process had used when it
answered (what the start costs; on a busy machine the wall times wait for a core, this does not).
Then where the start goes: the interpreter alone, and the
import of the broker's modules (``python -X importtime``), split by package, with ``hypothesis``
hidden as ``exactly serve`` hides it (kio imports it, when present, only to register strategies
for its types). The report states the 1-minute load average
before and after: 2 cores shared with other work make these figures move.

Bytecode: both trees are byte-compiled first (``compileall``, what pip does when it installs a
wheel), so the figures are those of an installed package. A source tree run with
``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` compiles every module of the broker at every
start instead; the report gives that figure too (one row: starts of a copy of the tree without
``__pycache__``).

``--baseline SRC`` (another checkout's ``src``) starts the two trees alternately, start for
start, so both see the same load on this shared machine, and reports them side by side.

Target (issue #14): <= 0.5 s to ApiVersions. testcontainers is not measured here (see the note in
the report): it needs Docker and a JVM broker image.
"""

from __future__ import annotations

import argparse
import collections
import compileall
import contextlib
import datetime
import os
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from exactly.testing.broker import SRC_DIR, Broker, child_env

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


@contextlib.contextmanager
def _launched(src: Path, env: dict[str, str]) -> Iterator[Broker]:
    """``broker()``'s steps with the launcher of ``src``'s tree: temp dir, start, close, rmtree."""
    root = Path(tempfile.mkdtemp(prefix="exactly-broker-"))
    launcher = Broker(root / "data", root / "broker.log", src=src, env=env)
    try:
        launcher.start()
        yield launcher
    finally:
        launcher.close()
        shutil.rmtree(root, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds a process has used so far (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_start_of(src: Path, env: dict[str, str] | None = None) -> dict[str, float]:
    t0 = time.perf_counter()
    with _launched(src, env or {}) as launcher:
        entered = time.perf_counter()
        error = api_versions(launcher.host, int(launcher.port or 0))
        answered = time.perf_counter()
        if error:
            raise RuntimeError(f"ApiVersions error {error}")
        listening = launcher.listening_s
        cpu = cpu_seconds(int(launcher.pid or 0))
    return {
        "cpu_s": cpu,
        "listening_s": listening,
        "with_s": entered - t0,
        "api_versions_s": answered - t0,
        "teardown_s": time.perf_counter() - answered,
    }


def byte_compile(src: Path) -> None:
    """What pip does on install: ``__pycache__`` for every module of the tree."""
    if not compileall.compile_dir(str(src / "exactly"), quiet=1, workers=1):
        raise RuntimeError(f"compileall failed for {src}")


SERVE_IMPORTS = "import exactly.cli.main, exactly.cli.serve, exactly.server.broker, uvloop"
HIDE_HYPOTHESIS = "import sys; sys.modules['hypothesis'] = None; "


def child_wall_s(code: str, repeat: int = 5, src: Path | None = None) -> float:
    """Median wall seconds of ``python -c code`` (interpreter start, the code, exit)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=child_env(src), check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def child_walls(code: str, trees: dict[str, Path], repeat: int) -> dict[str, list[float]]:
    """Wall seconds of ``python -c code`` with each tree, the trees alternating."""
    out: dict[str, list[float]] = {name: [] for name in trees}
    names = list(trees)
    for round_ in range(repeat):
        for name in names if round_ % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=child_env(trees[name]), check=True)
            out[name].append(time.perf_counter() - t0)
    return out


def import_profile(hide_hypothesis: bool, src: Path | None = None) -> tuple[float, list[tuple[str, float]]]:
    """Total self import time (s) of the broker's modules and the biggest packages."""
    code = (HIDE_HYPOTHESIS if hide_hypothesis else "") + SERVE_IMPORTS
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=child_env(src),
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


def without_bytecode(src: Path, into: Path) -> Path:
    """A copy of the ``exactly`` tree without ``__pycache__`` (run with PYTHONDONTWRITEBYTECODE=1,
    its modules are compiled at every start; the venv's packages keep their bytecode)."""
    shutil.copytree(src / "exactly", into / "exactly", ignore=shutil.ignore_patterns("__pycache__"))
    return into


def measure(trees: dict[str, Path], repeat: int, cold_repeat: int) -> dict[str, dict[str, list[float]]]:
    """Starts of every tree, interleaved (the order flips every round), after one warm-up each;
    then ``cold_repeat`` starts each without bytecode caches."""
    out: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(list) for name in trees}
    names = list(trees)
    for name in names:
        one_start_of(trees[name])  # warm: page cache
    for round_ in range(repeat):
        for name in names if round_ % 2 == 0 else names[::-1]:
            for key, value in one_start_of(trees[name]).items():
                out[name][key].append(value)
    with tempfile.TemporaryDirectory(prefix="exactly-no-pyc-") as scratch:
        cold = {
            name: without_bytecode(src, Path(scratch) / str(i)) for i, (name, src) in enumerate(trees.items())
        }
        for round_ in range(cold_repeat):
            for name in names if round_ % 2 == 0 else names[::-1]:
                sample = one_start_of(cold[name], {"PYTHONDONTWRITEBYTECODE": "1"})
                out[name]["cold_api_versions_s"].append(sample["api_versions_s"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--cold-repeat", type=int, default=5, help="starts without bytecode caches")
    parser.add_argument("--baseline", type=Path, help="another checkout's src, measured side by side")
    parser.add_argument("--baseline-label", default="", help="what the baseline is (e.g. its commit)")
    parser.add_argument("--out", type=Path, default=RESULTS / "fixture-startup.md")
    args = parser.parse_args()

    trees = {"this tree": SRC_DIR}
    if args.baseline is not None:
        trees = {"baseline": args.baseline.resolve(), "this tree": SRC_DIR}
    for src in trees.values():
        byte_compile(src)
    load_before = os.getloadavg()[0]
    samples = measure(trees, args.repeat, args.cold_repeat)
    python_s = child_wall_s("pass")
    walls = child_walls(HIDE_HYPOTHESIS + SERVE_IMPORTS, trees, 9)
    import_wall = {name: statistics.median(values) for name, values in walls.items()}
    imports, top = import_profile(hide_hypothesis=True)
    load_after = os.getloadavg()[0]

    mine = samples["this tree"]
    median = statistics.median(mine["api_versions_s"])
    verdict = "met" if median <= TARGET_S else "not met"
    names = list(trees)
    header = "| step | " + " | ".join(names) + " |"

    def row(label: str, key: str) -> str:
        return f"| {label} | " + " | ".join(fmt(samples[n][key]) for n in names) + " |"

    lines = [
        "# Fixture start-up: `exactly_broker` / `exactly.testing.broker()`",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {args.repeat} starts per tree after one "
        f"warm-up{', the trees alternating' if len(trees) > 1 else ''}, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cores, 1-min load average {load_before:.2f} before, {load_after:.2f} after. "
        "Median (min-max). Bytecode compiled first, as an installed wheel has it."
        + (f" Baseline: {args.baseline_label or f'`{args.baseline}`'}." if args.baseline else ""),
        "",
        header,
        "| --- |" + " --- |" * len(names),
        row(
            f"`with broker()` entered -> ApiVersions answered (target <= {TARGET_S} s: **{verdict}**)",
            "api_versions_s",
        ),
        row("`with broker()` entered (the listening line read)", "with_s"),
        row("of which `Popen` -> listening line", "listening_s"),
        row("teardown (SIGTERM, wait, rmtree)", "teardown_s"),
        row(
            "CPU the broker process used up to the answer (user + system; what the start costs, "
            "less moved by other work on the machine than the wall times above)",
            "cpu_s",
        ),
        row(
            f"-> ApiVersions without bytecode caches ({args.cold_repeat} starts: a source tree under "
            "`PYTHONDONTWRITEBYTECODE=1` compiles every module at every start)",
            "cold_api_versions_s",
        ),
        "",
        "Where the start goes (the interpreter: median of 5 children; the imports: of 9 per tree, "
        "the trees alternating):",
        "",
        f"- interpreter start (`python -c pass`): {python_s:.3f} s",
        f"- interpreter start plus importing the broker's modules (`python -c '{SERVE_IMPORTS}'`, "
        "`hypothesis` hidden as `serve` hides it): "
        + ", ".join(f"{name} {wall:.3f} s" for name, wall in import_wall.items()),
        f"- the rest of `Popen` -> listening line (config, storage load, coordinators, bind), as the "
        f"difference of the medians: {statistics.median(mine['listening_s']) - import_wall['this tree']:+.3f} s "
        f"(the import child also pays interpreter exit, so near zero means: the start is the imports)",
        f"- `-X importtime` self times summed, this tree (inflated by the instrumentation, for the split): "
        f"{imports:.3f} s; biggest: " + ", ".join(f"`{k}` {v:.3f} s" for k, v in top),
        "",
        TESTCONTAINERS_NOTE,
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
