"""`exactly topics|produce|consume` run as subprocesses against the real broker."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from exactly.testing.wait import wait_until
from tests.support.broker import Broker, child_env
from tests.support.clients import consume, create_topic, produce_values, producer

pytestmark = pytest.mark.timeout(120)


def exactly(
    *args: str, stdin: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    env = child_env()
    proc = subprocess.run(
        [sys.executable, "-m", "exactly", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
        env=env,
    )
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    return proc


def ok(*args: str, stdin: bytes | None = None) -> str:
    proc = exactly(*args, stdin=stdin)
    assert proc.returncode == 0, f"exactly {' '.join(args)} -> {proc.returncode}: {proc.stderr.decode()}"
    return proc.stdout.decode()


def fails(*args: str, stdin: bytes | None = None) -> str:
    """Runs a command that must fail with exit 1 and exactly one error line; returns that line."""
    proc = exactly(*args, stdin=stdin)
    assert proc.returncode == 1, f"expected exit 1, got {proc.returncode}: {proc.stderr.decode()}"
    errors = [line for line in proc.stderr.decode().splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr.decode()
    return errors[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------- topics
def test_topics_create_list_describe_delete(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    out = ok(
        "topics",
        "create",
        topic,
        "--partitions",
        "3",
        "--config",
        "retention.ms=1000000",
        "--config",
        "cleanup.policy=delete",
        *bs,
    )
    assert topic in out
    assert topic in ok("topics", "list", *bs).splitlines()

    desc = ok("topics", "describe", topic, *bs).splitlines()
    assert desc[0].startswith(f"Topic: {topic}\tPartitionCount: 3\tReplicationFactor: 1\tConfigs: ")
    assert "retention.ms=1000000" in desc[0]
    parts = [line for line in desc[1:] if line.startswith("\tTopic:")]
    assert [line.split("\t")[2] for line in parts] == ["Partition: 0", "Partition: 1", "Partition: 2"]
    assert all("Leader: " in line and "Isr: " in line for line in parts)
    assert f"Topic: {topic}\t" in ok("topics", "describe", *bs)  # all topics

    ok("topics", "delete", topic, *bs)
    wait_until(lambda: topic not in ok("topics", "list", *bs).splitlines(), 10, f"{topic} gone", interval=0.2)


def test_topics_create_with_broker_default_partitions(broker: Broker, topic: str) -> None:
    ok("topics", "create", topic, "--bootstrap-server", broker.bootstrap)
    assert "PartitionCount: 1\t" in ok("topics", "describe", topic, "--bootstrap-server", broker.bootstrap)


def test_topics_errors(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    ok("topics", "create", topic, *bs)
    assert "already exists" in fails("topics", "create", topic, *bs)
    assert "invalid topic name" in fails("topics", "create", "bad name!", *bs)
    assert "does not exist" in fails("topics", "delete", topic + "-nope", *bs)
    assert "does not exist" in fails("topics", "describe", topic + "-nope", *bs)
    assert "INVALID_CONFIG" in fails("topics", "create", topic + "-2", "--config", "no.such.config=1", *bs)


def test_topics_alter_partitions(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    ok("topics", "create", topic, "--partitions", "2", *bs)
    assert (
        ok("topics", "alter", topic, "--partitions", "5", *bs).strip()
        == f"Topic {topic} now has 5 partitions."
    )
    desc = ok("topics", "describe", topic, *bs).splitlines()
    assert desc[0].startswith(f"Topic: {topic}\tPartitionCount: 5\t")
    assert [line.split("\t")[2] for line in desc[1:]] == [f"Partition: {p}" for p in range(5)]
    line = fails("topics", "alter", topic, "--partitions", "3", *bs)
    assert "INVALID_PARTITIONS" in line and "which is higher than the requested 3" in line
    assert "does not exist" in fails("topics", "alter", topic + "-nope", "--partitions", "3", *bs)


def test_topics_delete_records(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    ok("topics", "create", topic, "--partitions", "2", *bs)
    ok("topics", "create", topic + "-c", "--config", "cleanup.policy=compact", *bs)
    for partition in (0, 1):
        produce_values(broker.bootstrap, topic, [b"v%d" % i for i in range(20)], partition=partition)
    out = ok("topics", "delete-records", topic, "--partition", "0", "--partition", "1", "--offset", "12", *bs)
    assert out.splitlines() == ["Partition 0: low watermark 12", "Partition 1: low watermark 12"]
    assert [g.offset for g in consume(broker.bootstrap, topic, 8, partitions=(1,))] == list(range(12, 20))
    assert ok("topics", "delete-records", topic, "--offset", "end", *bs) == "Partition 0: low watermark 20\n"
    assert "beyond the high watermark" in fails("topics", "delete-records", topic, "--offset", "21", *bs)
    assert "cleanup.policy" in fails("topics", "delete-records", topic + "-c", "--offset", "0", *bs)
    assert "has no partition 5" in fails(
        "topics", "delete-records", topic, "--partition", "5", "--offset", "0", *bs
    )
    assert "has no partition 0" in fails("topics", "delete-records", topic + "-nope", "--offset", "0", *bs)


@pytest.mark.parametrize(
    "args",
    [
        ["topics"],
        ["topics", "alter", "x"],
        ["topics", "alter", "x", "--partitions", "0"],
        ["topics", "delete-records", "x"],
        ["topics", "delete-records", "x", "--offset", "-2"],
        ["topics", "delete-records", "x", "--offset", "1", "--partition", "-1"],
        ["topics", "create"],
        ["topics", "create", "x", "--partitions", "0"],
        ["topics", "create", "x", "--partitions", "many"],
        ["topics", "create", "x", "--config", "novalue"],
        ["topics", "list", "--bogus"],
        ["topics", "frobnicate"],
        ["produce"],
        ["produce", "t", "--acks", "2"],
        ["consume", "t", "--from-beginning", "--offset", "3"],
        ["consume", "t", "--max-messages", "0"],
        ["consume", "t", "--isolation-level", "dirty"],
        ["topics", "list", "--bootstrap-server", "no-port-here"],
    ],
    ids=lambda a: " ".join(a),
)
def test_bad_arguments_exit_1(args: list[str]) -> None:
    proc = exactly(*args)
    assert proc.returncode == 1, (proc.returncode, proc.stderr.decode())
    assert b"error:" in proc.stderr


def test_unreachable_broker_is_one_line_error() -> None:
    start = time.monotonic()
    line = fails("topics", "list", "--bootstrap-server", f"127.0.0.1:{free_port()}", "--request-timeout", "2")
    assert "broker" in line or "127.0.0.1" in line
    assert time.monotonic() - start < 20


# ---------------------------------------------------------------------------- produce / consume
def test_produce_and_consume_with_keys_and_offsets(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic, partitions=2)
    lines = b"".join(f"k{i}:value {i}: with colon\n".encode() for i in range(20))
    ok("produce", topic, "--key-separator", ":", "--partition", "1", *bs, stdin=lines)

    out = ok(
        "consume",
        topic,
        "--from-beginning",
        "--max-messages",
        "20",
        "--print-key",
        "--print-offset",
        "--timeout",
        "20",
        *bs,
    )
    assert out.splitlines() == [f"Partition:1\tOffset:{i}\tk{i}\tvalue {i}: with colon" for i in range(20)]
    # and the records are really there, keys split off at the first separator
    got = consume(broker.bootstrap, topic, 20, partitions=(1,))
    assert [(g.key, g.value) for g in got] == [
        (f"k{i}".encode(), f"value {i}: with colon".encode()) for i in range(20)
    ]


def test_produce_plain_lines_and_consume_from_offset(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    ok("produce", topic, *bs, stdin=b"one\ntwo\r\n\nfour")  # CRLF, an empty line, no final newline
    assert ok("consume", topic, "--from-beginning", "--timeout", "3", *bs).splitlines() == [
        "one",
        "two",
        "",
        "four",
    ]
    assert ok(
        "consume", topic, "--offset", "1", "--partition", "0", "--max-messages", "2", *bs
    ).splitlines() == [
        "two",
        "",
    ]
    assert (
        ok(
            "consume",
            topic,
            "--offset",
            "3",
            "--print-key",
            "--max-messages",
            "1",
            "--isolation-level",
            "read_uncommitted",
            *bs,
        )
        == "null\tfour\n"
    )


def test_produce_non_idempotent_acks_1(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    ok(
        "produce",
        topic,
        "--no-idempotent",
        "--acks",
        "1",
        "--bootstrap-server",
        broker.bootstrap,
        stdin=b"a\nb\n",
    )
    assert [g.value for g in consume(broker.bootstrap, topic, 2)] == [b"a", b"b"]


def test_consume_default_starts_at_end(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    produce_values(broker.bootstrap, topic, [b"old-1", b"old-2"])
    env = child_env()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exactly",
            "consume",
            topic,
            "--max-messages",
            "2",
            "--timeout",
            "30",
            "--bootstrap-server",
            broker.bootstrap,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        # keep producing until the consumer (which starts at the end, whenever it gets there)
        # has printed its two records
        i = 0
        while proc.poll() is None and i < 100:
            produce_values(broker.bootstrap, topic, [f"new-{i}".encode()])
            i += 1
            time.sleep(0.3)  # a record every 0.3 s: the pace, not a synchronisation
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert len(lines) == 2 and all(line.startswith("new-") for line in lines), lines
    first = int(lines[0].removeprefix("new-"))
    assert lines == [f"new-{first}", f"new-{first + 1}"]


def test_consume_timeout_with_nothing_to_read(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    start = time.monotonic()
    assert (
        ok("consume", topic, "--from-beginning", "--timeout", "1.5", "--bootstrap-server", broker.bootstrap)
        == ""
    )
    assert time.monotonic() - start < 20


def test_console_errors(broker: Broker, topic: str) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    create_topic(broker.bootstrap, topic)
    assert "does not exist" in fails("consume", topic + "-nope", "--timeout", "1", *bs)
    assert "no partition 7" in fails("consume", topic, "--partition", "7", "--timeout", "1", *bs)
    assert "no partition 7" in fails("produce", topic, "--partition", "7", *bs, stdin=b"x\n")
    assert "key separator" in fails(
        "produce", topic, "--key-separator", "=", *bs, stdin=b"a=1\nno separator\n"
    )
    assert "--acks all" in fails("produce", topic, "--acks", "1", *bs, stdin=b"x\n")


def test_produce_to_missing_topic_without_auto_create(fresh_broker: object, topic: str) -> None:
    b: Broker = fresh_broker(**{"auto.create.topics.enable": "false"})  # type: ignore[operator]
    line = fails("produce", topic, "--bootstrap-server", b.bootstrap, "--request-timeout", "5", stdin=b"x\n")
    assert "does not exist" in line


# ---------------------------------------------------------------------------- serve
@pytest.mark.parametrize(
    "option, message",
    [
        ("no.such.setting=1", "no.such.setting"),
        ("num.partitions=zero", "num.partitions"),
        ("offsets.retention.minutes=0", "offsets.retention.minutes must be at least 1"),
    ],
)
def test_serve_refuses_bad_config_with_one_line(tmp_path: Path, option: str, message: str) -> None:
    proc = exactly("serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path), "-o", option)
    assert proc.returncode == 2, proc.stderr.decode()
    assert message in proc.stderr.decode().splitlines()[-1]


def test_serve_refuses_a_sasl_inter_broker_listener_without_credentials(tmp_path: Path) -> None:
    """Checked before ZooKeeper is contacted (none listens on port 1): the broker would otherwise
    start and never replicate."""
    options = [
        "zookeeper.connect=127.0.0.1:1",
        "listeners=SASL_PLAINTEXT://127.0.0.1:0",
        "inter.broker.listener.name=SASL_PLAINTEXT",
        "sasl.enabled.mechanisms=SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
    ]
    proc = exactly("serve", "--data-dir", str(tmp_path), *(a for o in options for a in ("-o", o)))
    assert proc.returncode == 2, proc.stderr.decode()
    line = proc.stderr.decode().splitlines()[-1]
    assert "inter-broker listener SASL_PLAINTEXT uses SASL SCRAM-SHA-512" in line
    assert "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config" in line


def test_topics_describe_shows_dirty_ratio_of_compacted_topics(
    fresh_broker: Callable[..., Broker], topic: str
) -> None:
    """A compacted topic's partition lines carry the cleaner's dirty ratio (min.cleanable.dirty.ratio
    1.0 keeps the log uncleaned, so the ratio stays that of the written log: every closed segment
    dirty); a delete-policy topic has no such column, and a full DescribeConfigs (what Kafka's
    tools send) does not list the read-only ratio key."""
    b = fresh_broker(**{"log.cleaner.backoff.ms": "100"})
    bs = ("--bootstrap-server", b.bootstrap)
    compacted = topic + "-c"
    create_topic(
        b.bootstrap,
        compacted,
        partitions=2,
        config={"cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "1.0"},
    )
    create_topic(b.bootstrap, topic, config={"cleanup.policy": "delete"})
    p = producer(b.bootstrap)
    for i in range(200):  # small flushed batches, so the log rolls into many segments
        p.produce(compacted, key=b"k%d" % (i % 5), value=b"v" * 100, partition=0)
        if i % 10 == 9:
            assert p.flush(30) == 0

    def ratios() -> dict[int, str]:
        lines = ok("topics", "describe", compacted, *bs).splitlines()[1:]
        found = {}
        for line in lines:
            fields = dict(f.split(": ", 1) for f in line.strip().split("\t"))
            found[int(fields["Partition"])] = fields.get("DirtyRatio", "absent")
        return found

    def dirty() -> bool:  # the cleaner's next look after the writes (an earlier one saw 0.0000)
        value = ratios()[0]
        return value not in ("-", "absent") and float(value) > 0.5

    wait_until(dirty, 30, "partition 0's dirty ratio after the writes", interval=0.3)
    got = ratios()
    assert float(got[0]) <= 1.0  # many closed segments, none cleaned; the active one is not counted
    assert got[1] == "0.0000"  # empty partition: nothing dirty
    assert "DirtyRatio" not in ok("topics", "describe", topic, *bs)

    resource = ConfigResource(ResourceType.TOPIC, compacted)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    entries = admin.describe_configs([resource])[resource].result(30)
    assert "cleanup.policy" in entries
    assert not any(name.startswith("exactly.") for name in entries)
