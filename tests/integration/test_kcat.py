"""kcat (librdkafka command line tool, Debian package) against the real broker."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from exactly.testing.wait import next_millisecond
from tests.support.broker import Broker
from tests.support.clients import consume, create_topic, produce_values

pytestmark = pytest.mark.timeout(90)


def _kcat(kcat: str, broker: Broker, *args: str, stdin: bytes | None = None, timeout: float = 30) -> bytes:
    proc = subprocess.run(
        [kcat, "-b", broker.bootstrap, "-m", "10", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"kcat {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()}"
    return proc.stdout


def test_kcat_produce_then_consume(kcat: str, broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=2)
    lines = b"".join(f"key{i}:value {i}\n".encode() for i in range(100))
    _kcat(
        kcat,
        broker,
        "-P",
        "-t",
        topic,
        "-p",
        "1",
        "-K",
        ":",
        "-H",
        "source=kcat",
        "-X",
        "enable.idempotence=true",
        stdin=lines,
    )

    out = _kcat(kcat, broker, "-C", "-t", topic, "-p", "1", "-o", "beginning", "-e", "-f", "%p|%o|%k|%s|%h\n")
    rows = [line.split("|") for line in out.decode().splitlines()]
    assert [r[1] for r in rows] == [str(i) for i in range(100)]
    assert all(r[0] == "1" for r in rows)
    assert [r[2] for r in rows] == [f"key{i}" for i in range(100)]
    assert [r[3] for r in rows] == [f"value {i}" for i in range(100)]
    assert all(r[4] == "source=kcat" for r in rows)

    # the same records through another librdkafka-based path
    got = consume(broker.bootstrap, topic, 100, partitions=(1,))
    assert [g.key for g in got] == [f"key{i}".encode() for i in range(100)]


def test_kcat_consume_offsets_and_count(kcat: str, broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    produce_values(broker.bootstrap, topic, [f"r{i}".encode() for i in range(30)])
    out = _kcat(kcat, broker, "-C", "-t", topic, "-p", "0", "-o", "25", "-e", "-f", "%o:%s\n")
    assert out.decode().splitlines() == [f"{i}:r{i}" for i in range(25, 30)]
    out = _kcat(kcat, broker, "-C", "-t", topic, "-p", "0", "-o", "-3", "-e", "-f", "%s\n")
    assert out.decode().splitlines() == ["r27", "r28", "r29"]
    out = _kcat(kcat, broker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-c", "4", "-f", "%s\n")
    assert out.decode().splitlines() == ["r0", "r1", "r2", "r3"]


def test_kcat_metadata_json(kcat: str, broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=3)
    out = _kcat(kcat, broker, "-L", "-J", "-t", topic)
    md = json.loads(out)
    (b,) = md["brokers"]
    assert b["name"] == f"{broker.host}:{broker.port}"
    (t,) = md["topics"]
    assert t["topic"] == topic
    assert "error" not in t or not t["error"]
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
    assert all(p["leader"] == b["id"] for p in t["partitions"])

    out_all = _kcat(kcat, broker, "-L", "-J")
    assert topic in {x["topic"] for x in json.loads(out_all)["topics"]}


def test_kcat_query_offset_by_timestamp(kcat: str, broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    base = int(time.time() * 1000) - 600_000
    lines = b"".join(f"v{i}\n".encode() for i in range(5))
    # kcat has no per-line timestamps: produce in 5 calls with distinct broker-visible timestamps instead
    for i in range(5):
        _kcat(
            kcat,
            broker,
            "-P",
            "-t",
            topic,
            "-p",
            "0",
            "-X",
            f"enable.idempotence={'true' if i else 'false'}",
            stdin=lines.splitlines(keepends=True)[i],
        )
        next_millisecond()
    got = consume(broker.bootstrap, topic, 5)
    ts = [g.timestamp for g in got]
    assert ts == sorted(ts) and ts[0] > base
    out = _kcat(kcat, broker, "-Q", "-t", f"{topic}:0:{ts[2]}")
    # kcat -Q prints: "<topic> [<partition>] offset <N>"
    assert out.decode().split()[-1] == "2", out.decode()
