"""TLS against plaintext on one broker, side by side in one run.

    PYTHONPATH=src .venv/bin/python bench/tls_ab.py                  # -> bench/results/tls.md
    PYTHONPATH=src .venv/bin/python bench/tls_ab.py --records 50000 --repeat 1 --out /tmp/tls.md
    PYTHONPATH=src .venv/bin/python bench/tls_ab.py --variant zstd:compression.type=zstd \
        --variant big:batch.size=4000000,message.max.bytes=4000000 --broker-conf message.max.bytes=8388608

One broker with two listeners, PLAINTEXT and SSL (server certificate only; made with the openssl
command line in the scratch dir), so both paths share the process, the disk and the page cache.
Per repetition and transport (order alternating): produce ``--records`` 1 KB records with
kcat (acks=all, idempotent, linger.ms=10, 1 MB batches: bench/benchlib/drivers.PRODUCE_CONF) to
a fresh 1-partition topic, then consume them back with kcat from offset 0. kcat rather than
confluent-kafka in this process, so the Python client's CPU does not cap the figure. Reported:
MB/s (record bytes / wall s, median of the repetitions, min-max), broker and client (kcat) CPU-s/GB,
the ratio TLS / plaintext per repetition (target: >= 0.7 for produce and consume, printed with the
report), the load average at the start and the end, and the TLS version and cipher the broker
negotiates with an OpenSSL client using OpenSSL's defaults (as librdkafka does).

On a shared box MB/s moves with the load; CPU-s/GB (CPU time per byte) much less, so compare those
when the load average is not near zero; the "CPU ratio" column puts them together (plaintext's total
CPU per GB over TLS's), which is what the produce MB/s ratio follows when the box is busy.

``--variant NAME:key=value,...`` adds produce runs with those kcat settings on top of the default
ones, in the same repetitions and on both transports; they are reported beside the default figures,
which stay the headline (the default settings are what the target is about). librdkafka writes one
TLS record per buffer segment and its Produce buffers put many 1 KB values in segments of their own
(bench/results/tls-s14.md), so settings that change the segment layout (compression that shrinks
the batch, bigger batches) change the TLS record count, and with it the TLS cost on both ends.

Beside kcat, every repetition also produces the same records with bench/benchlib/batch_producer
(rows "produce (full TLS records)", unless ``--no-full-records``): prebuilt ~1 MB batches of the
same 1 KB values, one Produce request per batch written with one ``sendall``, acks=1, 5 in flight,
on both transports. Over TLS OpenSSL cuts each request into full 16 KB records (~61 per MB, as
the Java client, kafka-python and aiokafka send), where librdkafka sends ~450. Those rows show the
broker's TLS capability apart from librdkafka's fragmentation; they are not the headline (the
target is about what a Kafka user's default client does). Their client CPU is the send phase's
(the Python producer's start-up and batch building excluded); kcat's is its whole process.

On TLS the broker copies Fetch answers through the TLS transport (no sendfile) and encrypts
in OpenSSL; the CPU-s/GB column shows what that costs."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import batch_producer, drivers, kafka, procstat
from exactly.testing.broker import Broker

TRANSPORTS = ("PLAINTEXT", "SSL")
FULL_RECORDS = "produce (full TLS records)"  # the batch producer's rows: not the headline


def make_server_cert(directory: Path) -> tuple[Path, Path]:
    """(keystore PEM with key + certificate, CA certificate) for 127.0.0.1."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench-ca")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    keystore = directory / "server-keystore.pem"
    keystore.write_text((directory / "server.key").read_text() + (directory / "server.pem").read_text())
    return keystore, directory / "ca.pem"


def negotiated(address: str, ca: Path) -> str:
    """The TLS version and cipher suite the broker picks for a client with OpenSSL's defaults."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        cipher = tls.cipher()
        return f"{tls.version()} {cipher[0] if cipher else '?'}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:key=value,...",
        help="extra produce runs with these kcat settings, reported beside the default ones",
    )
    parser.add_argument(
        "--no-full-records",
        action="store_true",
        help="skip the batch producer's produce rows (full-size TLS records, see above)",
    )
    parser.add_argument(
        "--broker-conf", action="append", default=[], metavar="key=value", help="broker setting"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "tls.md")
    args = parser.parse_args()
    variants = {name: _settings(spec) for name, _, spec in (v.partition(":") for v in args.variant)}
    if shutil.which("kcat") is None:
        print("tls_ab: kcat is needed", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="exactly-bench-tls-"))
    try:
        keystore, ca = make_server_cert(scratch)
        broker = Broker(
            scratch / "data",
            scratch / "broker.log",
            overrides={
                "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                "ssl.keystore.location": str(keystore),
                **_settings(",".join(args.broker_conf)),
            },
            name="tls-bench",
        )
        load_start = os.getloadavg()[0]
        broker.start()
        pid = broker.pid
        assert pid is not None
        env = drivers.kcat_env("bundled", scratch)
        pool = drivers.payload_pool()
        lines = drivers.write_lines_file(scratch / "records.txt", args.records, pool)
        conf = {
            "PLAINTEXT": {},
            "SSL": {"security.protocol": "SSL", "ssl.ca.location": str(ca)},
        }
        tls = negotiated(broker.listener_address("SSL"), ca)
        rows: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        ratios: dict[str, list[float]] = {"produce": [], "consume": []}
        ratios.update({f"produce ({name})": [] for name in variants})
        if not args.no_full_records:
            ratios[FULL_RECORDS] = []
        timeout = 600.0
        for rep in range(args.repeat):
            order = TRANSPORTS if rep % 2 == 0 else tuple(reversed(TRANSPORTS))
            mbps: dict[tuple[str, str], float] = {}
            for transport in order:
                address = broker.listener_address(transport)
                topic = f"tls-{transport.lower()}-{rep}-{time.monotonic_ns()}"
                cpu0 = procstat.cpu_seconds(pid)
                run = drivers.kcat_produce(
                    address, topic, lines, args.records, drivers.RECORD_SIZE, timeout, env, conf[transport]
                )
                cpu1 = procstat.cpu_seconds(pid)
                if run.errors or run.records != args.records:
                    raise RuntimeError(
                        f"{transport} produce failed: {run.errors[:3]} ({run.records} records)"
                    )
                gb = run.bytes / 1e9
                rows.setdefault(("produce", transport), []).append(
                    (run.bytes / run.wall_s / 1e6, (cpu1 - cpu0) / gb, run.client_cpu_s / gb)
                )
                mbps[("produce", transport)] = run.bytes / run.wall_s / 1e6
                cpu0 = procstat.cpu_seconds(pid)
                run = drivers.kcat_consume(
                    address, topic, args.records, drivers.RECORD_SIZE, timeout, env, conf[transport]
                )
                cpu1 = procstat.cpu_seconds(pid)
                if run.errors or run.records != args.records:
                    raise RuntimeError(
                        f"{transport} consume failed: {run.errors[:3]} ({run.records} records)"
                    )
                gb = run.bytes / 1e9
                rows.setdefault(("consume", transport), []).append(
                    (run.bytes / run.wall_s / 1e6, (cpu1 - cpu0) / gb, run.client_cpu_s / gb)
                )
                mbps[("consume", transport)] = run.bytes / run.wall_s / 1e6
                for name, settings in variants.items():
                    kind = f"produce ({name})"
                    cpu0 = procstat.cpu_seconds(pid)
                    run = drivers.kcat_produce(
                        address, f"{topic}-{name}", lines, args.records, drivers.RECORD_SIZE, timeout,
                        env, {**conf[transport], **settings},
                    )  # fmt: skip
                    cpu1 = procstat.cpu_seconds(pid)
                    if run.errors:
                        raise RuntimeError(f"{transport} {kind} failed: {run.errors[:3]}")
                    gb = run.bytes / 1e9
                    rows.setdefault((kind, transport), []).append(
                        (run.bytes / run.wall_s / 1e6, (cpu1 - cpu0) / gb, run.client_cpu_s / gb)
                    )
                    mbps[(kind, transport)] = run.bytes / run.wall_s / 1e6
                if not args.no_full_records:
                    full_topic = f"{topic}-full"
                    kafka.create_topic(broker.listener_address("PLAINTEXT"), full_topic, 1)
                    cpu0 = procstat.cpu_seconds(pid)
                    run = batch_producer.run(
                        address, full_topic, args.records, timeout, ca if transport == "SSL" else None
                    )
                    cpu1 = procstat.cpu_seconds(pid)
                    if run.errors or run.records != args.records:
                        raise RuntimeError(f"{transport} {FULL_RECORDS} failed: {run.errors[:3]}")
                    gb = run.bytes / 1e9
                    rows.setdefault((FULL_RECORDS, transport), []).append(
                        (run.bytes / run.wall_s / 1e6, (cpu1 - cpu0) / gb, run.client_cpu_s / gb)
                    )
                    mbps[(FULL_RECORDS, transport)] = run.bytes / run.wall_s / 1e6
            for kind in ratios:
                ratios[kind].append(mbps[(kind, "SSL")] / mbps[(kind, "PLAINTEXT")])
            print(
                f"repetition {rep + 1}: " + ", ".join(f"{k} {t} {v:.1f} MB/s" for (k, t), v in mbps.items()),
                flush=True,
            )
        broker.stop()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report(args, rows, ratios, load_start, tls, variants))
        print(args.out.read_text())
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fmt(values: list[float], digits: int = 1) -> str:
    med = statistics.median(values)
    d = digits
    return f"{med:.{d}f} [{min(values):.{d}f}-{max(values):.{d}f}]" if len(values) > 1 else f"{med:.{d}f}"


def report(
    args: argparse.Namespace,
    rows: dict[tuple[str, str], list[tuple[float, float, float]]],
    ratios: dict[str, list[float]],
    load_start: float,
    tls: str,
    variants: dict[str, dict[str, str]],
) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    lines = [
        "# TLS vs plaintext (bench/tls_ab.py)",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, {platform.node()}, "
        f"{os.cpu_count()} cores, load average {load_start:.2f} at the start and {load[0]:.2f} at the end; "
        f"{args.records:,} x 1 KB records, {args.repeat} repetition(s), kcat (librdkafka) over PLAINTEXT "
        f"and SSL listeners of one broker; TLS negotiated: {tls}.",
        *(
            []
            if args.no_full_records
            else [
                f"{FULL_RECORDS}: bench/benchlib/batch_producer.py (whole ~1 MB Produce requests, acks=1, "
                "5 in flight: ~61 TLS records per MB against kcat's ~450; not the headline)."
            ]
        ),
        *(
            [
                "Variants (produce only, not the headline): "
                + "; ".join(
                    f"{n}: {', '.join(f'{k}={v}' for k, v in s.items())}" for n, s in variants.items()
                )
                + (f"; broker: {', '.join(args.broker_conf)}" if args.broker_conf else "")
                + "."
            ]
            if variants
            else []
        ),
        "",
        "| workload | transport | MB/s | broker CPU-s/GB | client CPU-s/GB |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (kind, transport), samples in sorted(rows.items()):
        lines.append(
            f"| {kind} | {transport} | {_fmt([s[0] for s in samples])} | {_fmt([s[1] for s in samples], 2)} "
            f"| {_fmt([s[2] for s in samples], 2)} |"
        )
    lines += [
        "",
        "| ratio TLS / plaintext MB/s | median [min-max] | target | CPU ratio |",
        "| --- | --- | --- | --- |",
    ]
    for kind, values in ratios.items():
        med = statistics.median(values)
        verdict = ("met" if med >= 0.7 else "missed") if kind in ("produce", "consume") else "variant"
        lines.append(f"| {kind} | {_fmt_ratio(values)} | >= 0.7 ({verdict}) | {_cpu_ratio(rows, kind):.2f} |")
    lines += [
        "",
        "CPU ratio: (broker + client CPU-s/GB over PLAINTEXT) / (the same over SSL), medians. With both",
        "processes busy on a small box, the produce MB/s ratio follows it, and it moves much less than",
        "MB/s with other load; consume MB/s is bound by latency instead (one Fetch in flight).",
        "",
    ]
    return "\n".join(lines)


def _cpu_ratio(rows: dict[tuple[str, str], list[tuple[float, float, float]]], kind: str) -> float:
    """Total CPU per GB over PLAINTEXT / over SSL (medians of broker and client CPU-s/GB)."""

    def total(transport: str) -> float:
        samples = rows[(kind, transport)]
        return statistics.median(x[1] for x in samples) + statistics.median(x[2] for x in samples)

    return total("PLAINTEXT") / total("SSL")


def _settings(spec: str) -> dict[str, str]:
    """``key=value,key=value`` -> dict (empty for an empty spec)."""
    return dict(item.split("=", 1) for item in spec.split(",") if item)


def _fmt_ratio(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:.2f} [{min(values):.2f}-{max(values):.2f}]" if len(values) > 1 else f"{med:.2f}"


if __name__ == "__main__":
    sys.exit(main())
