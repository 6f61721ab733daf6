"""The ``exactly`` sink: columns, exactly-once under retries and replays, visibility per task."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from exactly.testing.wait import wait_until
from tests.spark.helpers import read_all, stream_copy
from tests.support.clients import create_topic, produce_values

pytestmark = pytest.mark.timeout(300)


def _write(df: Any, bootstrap: str, **options: str) -> None:
    writer = df.write.format("exactly").option("kafka.bootstrap.servers", bootstrap).mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def _numbers(spark: Any, n: int, partitions: int = 2) -> Any:
    """n rows value="v<i>" spread over ``partitions`` Spark partitions."""
    return spark.range(0, n, 1, partitions).selectExpr(
        "cast(id as string) as key", "concat('v', id) as value"
    )


def test_batch_write_columns_as_spark_kafka_sink(spark: Any, bootstrap: str, unique_name: Any) -> None:
    a, b = unique_name("sink-a"), unique_name("sink-b")
    create_topic(bootstrap, a, partitions=3)
    create_topic(bootstrap, b, partitions=2)
    df = spark.createDataFrame(
        [
            ("k1", b"v1", a, None, [("h", b"1")]),
            ("k2", b"v2", b, 1, None),
            (None, b"v3", a, 2, []),
        ],
        "key string, value binary, topic string, partition int, headers array<struct<key:string,value:binary>>",
    )
    _write(df, bootstrap)
    got_a = read_all(bootstrap, a, range(3))
    got_b = read_all(bootstrap, b, range(2))
    assert sorted((g.value, g.key) for g in got_a) == [(b"v1", b"k1"), (b"v3", None)]
    assert [(g.partition, g.key, g.value) for g in got_b] == [(1, b"k2", b"v2")]
    v1 = next(g for g in got_a if g.value == b"v1")
    assert v1.headers == (("h", b"1"),)
    assert next(g for g in got_a if g.value == b"v3").partition == 2


def test_topic_option_overrides_column_and_at_least_once_mode(
    spark: Any, bootstrap: str, unique_name: Any
) -> None:
    target, other = unique_name("sink-opt"), unique_name("sink-unused")
    create_topic(bootstrap, target)
    df = _numbers(spark, 50).selectExpr("key", "value", f"'{other}' as topic")
    _write(df, bootstrap, topic=target, deliveryGuarantee="at_least_once")
    assert sorted(g.value for g in read_all(bootstrap, target)) == sorted(b"v%d" % i for i in range(50))


def test_missing_value_column_fails_on_the_driver(spark: Any, bootstrap: str, topic: str) -> None:
    with pytest.raises(Exception, match="needs a 'value' column"):
        _write(spark.range(3).selectExpr("cast(id as string) as key"), bootstrap, topic=topic)


def test_output_invisible_until_each_task_commits(
    spark: Any, bootstrap: str, topic: str, tmp_path: Path
) -> None:
    """Records are in the log (read_uncommitted sees them) but read_committed readers see nothing
    until a task commits, and then exactly that task's records: visibility is per Spark partition.
    (Each task writes its own Kafka partition here: on a shared one, Kafka's LSO would also hold a
    committed task's records back behind an earlier-started transaction that is still open.)"""
    create_topic(bootstrap, topic, partitions=2)
    hooks = tmp_path / "hooks"
    df = spark.range(0, 40, 1, 2).selectExpr(
        "cast(id as string) as key",
        "concat('p', spark_partition_id()) as value",
        "spark_partition_id() as partition",
    )
    errors: list[BaseException] = []

    def write() -> None:
        try:
            # a new thread has no active JVM session, and Python data sources are registered per session
            spark._get_j_spark_session_class(spark._jvm).setActiveSession(spark._jsparkSession)
            _write(
                df,
                bootstrap,
                topic=topic,
                **{"testing.hookDir": str(hooks), "testing.pauseBeforeCommit": "true"},
            )
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    wait_until(
        lambda: errors or ((hooks / "paused-0").exists() and (hooks / "paused-1").exists()),
        120,
        "both write tasks paused before their commit",
        interval=0.1,
    )
    assert not errors, errors
    both = range(2)
    assert read_all(bootstrap, topic, both) == []
    assert Counter(g.value for g in read_all(bootstrap, topic, both, committed=False)) == {
        b"p0": 20,
        b"p1": 20,
    }
    (hooks / "resume-0").touch()
    wait_until(lambda: read_all(bootstrap, topic, both), 60, "task 0's records visible after its commit")
    assert Counter(g.value for g in read_all(bootstrap, topic, both)) == {b"p0": 20}
    (hooks / "resume-1").touch()
    thread.join(120)
    assert not errors, errors
    assert Counter(g.value for g in read_all(bootstrap, topic, both)) == {b"p0": 20, b"p1": 20}


@pytest.mark.parametrize("stage", ["before-commit", "after-commit"])
def test_write_task_fails_once_and_is_retried(
    spark: Any, bootstrap: str, topic: str, tmp_path: Path, stage: str
) -> None:
    """A task attempt that dies before its commit is fenced and rewritten; one that dies after its
    commit is retried, finds its progress marker and skips: every record exactly once."""
    create_topic(bootstrap, topic, partitions=2)
    hooks = tmp_path / "hooks"
    _write(
        _numbers(spark, 300),
        bootstrap,
        topic=topic,
        **{"testing.hookDir": str(hooks), "testing.failOnce": stage},
    )
    assert sorted(p.name for p in hooks.iterdir()) == [f"failed-{stage}-0-0", f"failed-{stage}-0-1"]
    values = [g.value for g in read_all(bootstrap, topic, range(2))]
    assert sorted(values) == sorted(b"v%d" % i for i in range(300))
    # the aborted first attempt (flushed before it failed) is in the log, for read_uncommitted only
    dirty = [g.value for g in read_all(bootstrap, topic, range(2), committed=False)]
    assert len(dirty) == (600 if stage == "before-commit" else 300)


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_replayed_batch_is_skipped(
    spark: Any, bootstrap: str, unique_name: Any, tmp_path: Path, guarantee: str
) -> None:
    """Spark replays the last batch (same id, same offsets) when its commit log entry is missing -
    exactly what a driver crash after the sink's commit leaves behind. The exactly-once sink skips
    it; the at-least-once sink writes it again (which shows the replay really happened)."""
    source, target = unique_name("replay-in"), unique_name("replay-out")
    create_topic(bootstrap, source)
    create_topic(bootstrap, target)
    produce_values(bootstrap, source, [b"r%03d" % i for i in range(100)])
    ckpt = tmp_path / "ckpt"
    query = stream_copy(spark, bootstrap, source, target, ckpt, guarantee)
    assert query.awaitTermination(180)
    assert query.exception() is None
    first = sorted(g.value for g in read_all(bootstrap, target))
    assert first == sorted(b"R%03d" % i for i in range(100))
    commits = sorted((ckpt / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()  # "the driver died after the sink committed, before Spark's commit log"
    crc = ckpt / "commits" / f".{last.name}.crc"
    if crc.exists():
        crc.unlink()
    replay = stream_copy(spark, bootstrap, source, target, ckpt, guarantee)
    assert replay.awaitTermination(180)
    assert replay.exception() is None
    assert any(p["batchId"] == int(last.name) and p["numInputRows"] > 0 for p in replay.recentProgress)
    values = Counter(g.value for g in read_all(bootstrap, target))
    if guarantee == "exactly_once":
        assert values == Counter(first)
    else:
        assert sum(values.values()) == 100 + 20 and max(values.values()) == 2  # last batch: 100 - 2*40


def test_driver_commit_and_abort_leave_what_readers_see_to_the_tasks(
    bootstrap: str, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tasks commit their own transactions; the driver's ``commit`` (which Spark may call twice)
    and ``abort`` only report. So a read_committed reader sees a committed task's records once,
    before and after the driver's abort and commits, never a failed attempt's records; and Spark's
    replay of the batch skips the committed task and rewrites the failed one.

    Two write tasks of micro-batch 5 run here in the test process, as an executor would run them:
    task 0 writes Kafka partition 0 and commits; task 1 writes Kafka partition 1 and dies before
    its commit (``testing.failOnce``), leaving its transaction open."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from exactly.spark import sink
    from exactly.spark.faults import InjectedFault
    from exactly.spark.options import parse_sink_options

    create_topic(bootstrap, topic, partitions=2)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "failed-before-commit-5-0").touch()  # task 0 has had its failure: it commits
    options = parse_sink_options(
        {
            "kafka.bootstrap.servers": bootstrap,
            "topic": topic,
            "testing.hookDir": str(hooks),
            "testing.failOnce": "before-commit",
        }
    )
    schema = StructType([StructField("value", StringType()), StructField("partition", IntegerType())])
    writer = sink.ExactlyStreamWriter(options, schema)  # on the driver: creates the progress topic
    write_id, batch = f"q-{topic}", 5
    attempts = Counter[int]()

    def run_task(partition: int) -> sink.SinkCommitMessage:
        attempt = attempts[partition]
        attempts[partition] += 1
        monkeypatch.setattr(sink, "_task", lambda: (partition, attempt, write_id, batch))
        rows = iter([(topic, None, b"p%d-%d" % (partition, i), partition, None) for i in range(10)])
        return sink.write_exactly_once(options, writer.progress_partitions, write_id, batch, rows)

    def visible() -> dict[int, list[bytes]]:
        got = read_all(bootstrap, topic, range(2))
        return {p: [g.value for g in got if g.partition == p] for p in range(2)}

    task0 = run_task(0)
    assert (task0.records, task0.skipped) == (10, False)
    with pytest.raises(InjectedFault):
        run_task(1)
    only_task0 = {0: [b"p0-%d" % i for i in range(10)], 1: []}
    assert visible() == only_task0
    assert len(read_all(bootstrap, topic, [1], committed=False)) == 10  # flushed, not committed

    writer.abort([task0, None], batch)  # the job failed: task 0's records stay, task 1's stay out
    assert visible() == only_task0

    retried = run_task(1)  # Spark's replay of batch 5: fences task 1's open transaction, rewrites
    replayed = run_task(0)  # ... and finds task 0's progress marker
    assert (retried.records, retried.skipped) == (10, False)
    assert (replayed.records, replayed.skipped) == (0, True)
    both = {0: [b"p0-%d" % i for i in range(10)], 1: [b"p1-%d" % i for i in range(10)]}
    assert visible() == both
    writer.commit([replayed, retried], batch)
    writer.commit([replayed, retried], batch)  # Spark may repeat the commit of a batch
    assert visible() == both
    # the aborted first attempt of task 1 is in the log, for read_uncommitted readers only
    assert len(read_all(bootstrap, topic, [1], committed=False)) == 20
