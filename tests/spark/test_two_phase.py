"""The two-phase sink (``atomicBatches``, KIP-939): a batch is all-or-nothing, decided once by the
driver, and a driver that stops between its decision and its commits is resumed from the decision.

The broker of this module allows two-phase commit (``transaction.two.phase.commit.enable``), so
the sink picks the atomic mode by itself. The crash tests run the write tasks and the driver's
``commit`` here in the test process, as executors and the driver would run them, so the driver can
"die" at an exact point; the batch-job test runs a real ``df.write`` on the session's Spark.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exactly.client.broker_pool import BrokerPool
from exactly.client.txn_admin import describe_one, list_transactions
from exactly.spark import sink
from exactly.spark.faults import InjectedFault
from exactly.spark.options import SinkOptions, parse_sink_options
from tests.spark.helpers import read_all, stream_copy
from tests.support.broker import Broker
from tests.support.clients import create_topic, produce_values
from tests.support.txn_helpers import txn_broker_config

pytestmark = pytest.mark.timeout(300)

ROWS = 10


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, str]:
    return txn_broker_config(**{"transaction.two.phase.commit.enable": "true"})


@pytest.fixture
def bootstrap(module_broker: Broker) -> str:
    return module_broker.bootstrap


def _options(bootstrap: str, topic: str, hooks: Path, **extra: str) -> SinkOptions:
    return parse_sink_options(
        {"kafka.bootstrap.servers": bootstrap, "topic": topic, "testing.hookDir": str(hooks), **extra}
    )


def _writer(options: SinkOptions) -> sink.ExactlyStreamWriter:
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    schema = StructType([StructField("value", StringType()), StructField("partition", IntegerType())])
    return sink.ExactlyStreamWriter(options, schema)  # "on the driver": resolves the mode


def _task_runner(
    monkeypatch: pytest.MonkeyPatch, topic: str, write_id: str, batch: int
) -> Callable[[sink.ExactlyStreamWriter, int], sink.SinkCommitMessage]:
    """Run the write task of Spark partition p (writing Kafka partition p) as an executor would."""

    def run(writer: sink.ExactlyStreamWriter, partition: int) -> sink.SinkCommitMessage:
        monkeypatch.setattr(sink, "_task", lambda: (partition, 0, write_id, batch))
        rows = iter([(topic, None, b"p%d-%d" % (partition, i), partition, None) for i in range(ROWS)])
        return sink.write_exactly_once(
            writer.options, writer.progress_partitions, write_id, batch, rows, atomic=writer.atomic
        )

    return run


def _visible(bootstrap: str, topic: str) -> list[bytes]:
    return sorted(g.value for g in read_all(bootstrap, topic, range(2)))


def _everything() -> list[bytes]:
    return sorted(b"p%d-%d" % (p, i) for p in range(2) for i in range(ROWS))


def _open_txns(bootstrap: str, prefix: str) -> list[str]:
    with BrokerPool.connect(bootstrap, timeout=30) as pool:
        return [
            t.transactional_id
            for t in list_transactions(pool, states=("Ongoing",))
            if t.transactional_id.startswith(prefix)
        ]


def test_driver_stops_between_decision_and_commits_and_the_replay_commits_the_decision(
    bootstrap: str, unique_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_name("decided")
    create_topic(bootstrap, topic, partitions=2)
    options = _options(bootstrap, topic, tmp_path / "hooks", **{"testing.crashAfterDecision": "true"})
    writer = _writer(options)
    assert writer.atomic  # the broker allows 2PC: atomic batches by default
    write_id, batch = f"q-{topic}", 3
    run = _task_runner(monkeypatch, topic, write_id, batch)

    first = [run(writer, p) for p in range(2)]
    assert all(m.prepared is not None and m.records == ROWS for m in first)
    assert _visible(bootstrap, topic) == []  # prepared, flushed, not visible
    with BrokerPool.connect(bootstrap, timeout=30) as pool:
        for m in first:
            assert m.prepared is not None
            state = describe_one(pool, m.prepared[0])
            assert (state.transaction_state, state.producer_epoch) == ("Ongoing", m.prepared[2])
    with pytest.raises(InjectedFault):  # the driver "dies" right after its decision is durable
        writer.commit(list(first), batch)
    assert _visible(bootstrap, topic) == []

    # a new driver: Spark replays batch 3 (no commit log entry); each task finds its transaction
    # decided, commits it instead of aborting it, then finds its progress marker and skips
    restarted = _writer(options)
    replay = [run(restarted, p) for p in range(2)]
    assert [(m.skipped, m.prepared) for m in replay] == [(True, None), (True, None)]
    assert _visible(bootstrap, topic) == _everything()
    restarted.commit(list(replay), batch)
    restarted.commit(list(replay), batch)
    assert _visible(bootstrap, topic) == _everything()
    assert _open_txns(bootstrap, f"exactly-spark-{write_id}-") == []


def test_driver_stops_before_deciding_and_the_replay_aborts_and_rewrites(
    bootstrap: str, unique_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_name("undecided")
    create_topic(bootstrap, topic, partitions=2)
    options = _options(bootstrap, topic, tmp_path / "hooks")
    write_id, batch = f"q-{topic}", 8
    run = _task_runner(monkeypatch, topic, write_id, batch)
    writer = _writer(options)
    prepared = [run(writer, p) for p in range(2)]
    assert all(m.prepared is not None for m in prepared)
    # the driver dies before commit(): no decision. The replay aborts and rewrites the batch.
    restarted = _writer(options)
    replay = [run(restarted, p) for p in range(2)]
    assert all(m.prepared is not None and not m.skipped for m in replay)
    assert _visible(bootstrap, topic) == []
    restarted.commit(list(replay), batch)
    assert _visible(bootstrap, topic) == _everything()
    restarted.commit(list(replay), batch)  # Spark may repeat the commit of a batch: harmless
    assert _visible(bootstrap, topic) == _everything()
    # the first attempt's records are in the log, aborted: read_uncommitted sees them
    assert len(read_all(bootstrap, topic, range(2), committed=False)) == 4 * ROWS


def test_abort_before_the_decision_leaves_nothing_visible(
    bootstrap: str, unique_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_name("aborted")
    create_topic(bootstrap, topic, partitions=2)
    options = _options(bootstrap, topic, tmp_path / "hooks", **{"testing.failAfterPrepare": "1"})
    write_id, batch = f"q-{topic}", 2
    run = _task_runner(monkeypatch, topic, write_id, batch)
    writer = _writer(options)
    done = run(writer, 0)
    with pytest.raises(InjectedFault):  # task 1 prepared, then failed: it sends no message
        run(writer, 1)
    assert len(_open_txns(bootstrap, f"exactly-spark-{write_id}-")) == 2
    writer.abort([done, None], batch)
    assert _open_txns(bootstrap, f"exactly-spark-{write_id}-") == []
    assert _visible(bootstrap, topic) == []


def _numbers(spark: Any, n: int, partitions: int) -> Any:
    return spark.range(0, n, 1, partitions).selectExpr(
        "cast(id as string) as key", "concat('v', id) as value"
    )


def test_batch_job_whose_last_task_fails_for_good_leaves_nothing_and_its_retry_writes_once(
    spark: Any, bootstrap: str, unique_name: Any, tmp_path: Path
) -> None:
    topic = unique_name("job")
    create_topic(bootstrap, topic, partitions=3)
    prefix = unique_name("job-tx")

    def write(**extra: str) -> None:
        writer = (
            _numbers(spark, 300, 3)
            .write.format("exactly")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("transactionalIdPrefix", prefix)
            .mode("append")
        )
        for key, value in extra.items():
            writer = writer.option(key, value)
        writer.save()

    with pytest.raises(Exception, match="injected failure after prepare"):
        write(**{"testing.hookDir": str(tmp_path / "hooks"), "testing.failAfterPrepare": "2"})
    assert read_all(bootstrap, topic, range(3)) == []  # the tasks that finished are not visible
    assert _open_txns(bootstrap, prefix) == []  # and nothing is left open to hold the LSO
    assert len(read_all(bootstrap, topic, range(3), committed=False)) >= 300  # they did write

    write()
    values = sorted(g.value for g in read_all(bootstrap, topic, range(3)))
    assert values == sorted(b"v%d" % i for i in range(300))


def test_streaming_micro_batches_are_atomic_and_a_replay_is_skipped(
    spark: Any, bootstrap: str, unique_name: Any, tmp_path: Path
) -> None:
    """A real streaming query in two-phase mode; then Spark's replay of its last batch (the commit
    log entry removed, as a driver dying after the sink's commit leaves it) writes nothing again."""
    source, target = unique_name("atomic-in"), unique_name("atomic-out")
    create_topic(bootstrap, source)
    create_topic(bootstrap, target, partitions=2)
    produce_values(bootstrap, source, [b"r%03d" % i for i in range(100)])
    ckpt = tmp_path / "ckpt"

    def run() -> Any:
        query = stream_copy(spark, bootstrap, source, target, ckpt, "exactly_once", atomicBatches="true")
        assert query.awaitTermination(180)
        assert query.exception() is None
        return query

    run()
    expected = Counter(b"R%03d" % i for i in range(100))
    assert Counter(g.value for g in read_all(bootstrap, target, range(2))) == expected
    commits = [p for p in (ckpt / "commits").iterdir() if p.name.isdigit()]
    last = max(commits, key=lambda p: int(p.name))
    last.unlink()
    crc = ckpt / "commits" / f".{last.name}.crc"
    if crc.exists():
        crc.unlink()
    replay = run()
    assert any(p["batchId"] == int(last.name) and p["numInputRows"] > 0 for p in replay.recentProgress)
    assert Counter(g.value for g in read_all(bootstrap, target, range(2))) == expected


def test_a_prepared_transaction_on_the_progress_partition_does_not_block_other_tasks(
    bootstrap: str, unique_name: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More tasks than progress partitions (a second wave of tasks, or another query's batch left
    prepared by a dead driver): a task's prepared transaction holds its progress partition's LSO
    until the driver decides, which comes only after every task of the batch finished. The other
    tasks' look-ups of their own progress must not wait behind it (a read_committed read up to the
    high watermark would, until ``progressWaitMs``, and then fail the task)."""
    topic = unique_name("shared-progress")
    create_topic(bootstrap, topic, partitions=2)
    options = _options(
        bootstrap,
        topic,
        tmp_path / "hooks",
        progressTopic=unique_name("progress"),
        progressTopicPartitions="1",
        progressWaitMs="3000",
    )
    writer = _writer(options)
    write_id, batch = f"q-{topic}", 0
    run = _task_runner(monkeypatch, topic, write_id, batch)
    first = run(writer, 0)  # prepared: its transaction stays open on progress partition 0
    second = run(writer, 1)  # the same progress partition
    assert first.prepared is not None and second.prepared is not None
    writer.commit([first, second], batch)
    assert _visible(bootstrap, topic) == _everything()

    # the next batch: a replay of batch 0 is skipped, batch 1 is written, while another write's
    # prepared transaction (undecided: its driver is gone) sits on the same progress partition
    other = _task_runner(monkeypatch, topic, f"other-{topic}", 5)(writer, 0)
    assert other.prepared is not None
    replay = [run(writer, p) for p in range(2)]
    assert [m.skipped for m in replay] == [True, True]
    nxt = _task_runner(monkeypatch, topic, write_id, 1)
    written = [nxt(writer, p) for p in range(2)]
    assert all(m.prepared is not None and not m.skipped for m in written)
    writer.abort([other], 5)
    assert _open_txns(bootstrap, f"exactly-spark-other-{topic}-") == []
