"""Topic changes on a real broker write their files off the event loop (server.topic_writes):
os.fsync records the thread of every call; the CreateTopics / DeleteTopics / CreatePartitions
handlers, auto-creation and internal topics answer only after the change is durable and
published; a cancelled caller still gets its change completed."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from exactly.server.broker import Broker
from exactly.server.config import BrokerConfig
from exactly.server.handlers import create_topics
from exactly.storage.log_manager import TOPICS_FILE, NewTopic
from exactly.topics import CONSUMER_OFFSETS_TOPIC
from exactly.types import TopicPartition


@pytest.fixture
def broker() -> Iterator[Broker]:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        conf = {
            "log.dirs": str(data_dir),
            "auto.create.topics.enable": "true",
            "num.partitions": "2",
            "offsets.topic.num.partitions": "3",
        }
        b = Broker.open(BrokerConfig.load(None, conf), data_dir)
        try:
            yield b
        finally:
            b.logs.close()
            b.topic_writes.close()


def _recording_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    threads: list[threading.Thread] = []
    real = os.fsync

    def recording(fd: int) -> None:
        threads.append(threading.current_thread())
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return threads


def _request(*topics: tuple[str, int]) -> Any:
    return SimpleNamespace(
        topics=[
            SimpleNamespace(name=n, num_partitions=p, replication_factor=1, assignments=(), configs=())
            for n, p in topics
        ],
        validate_only=False,
    )


def test_every_topic_change_fsyncs_off_the_loop(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs = _recording_fsyncs(monkeypatch)

    async def script() -> threading.Thread:
        logs = broker.logs
        # CreateTopics' single-broker path: one change for the whole request
        outcomes = await create_topics._create_together(
            broker, [NewTopic("a", 2, {}), NewTopic("b", 1, {"retention.ms": "5"})]
        )
        assert [code for code, _m, _i in outcomes] == [ErrorCode.none, ErrorCode.none]
        assert {"a", "b"} <= set(logs.topics()) and logs.get_partition(TopicPartition("a", 1)) is not None
        info = await broker.auto_create("auto")  # Metadata's auto-creation
        assert info is not None and info.partitions == 2 and logs.topic("auto") == info
        assert await broker.internal.request(CONSUMER_OFFSETS_TOPIC) == ErrorCode.none
        offsets = logs.topic(CONSUMER_OFFSETS_TOPIC)
        assert offsets is not None and offsets.internal and offsets.partitions == 3
        await broker.topic_writes.apply(logs.prepare_add_partitions("b", 3, now_ms=0))
        assert logs.get_partition(TopicPartition("b", 2)) is not None
        await broker.topic_writes.apply(logs.prepare_delete("a"))
        assert logs.topic("a") is None and not (broker.data_dir / "a-0").exists()
        return threading.current_thread()

    loop_thread = asyncio.run(script())
    monkeypatch.undo()
    assert len(fsyncs) >= 4 * 2 + 5  # epoch checkpoints, topics.json, checkpoints
    assert loop_thread not in fsyncs
    assert {t.name.split("_")[0] for t in fsyncs} == {"topic-writes"}
    listed = (broker.data_dir / TOPICS_FILE).read_text()
    assert '"b"' in listed and '"auto"' in listed and '"a"' not in listed


def test_a_name_in_flight_is_taken_and_a_cancelled_caller_still_completes(broker: Broker) -> None:
    async def script() -> None:
        logs = broker.logs
        plan = logs.prepare_create([NewTopic("t", 1, {})], now_ms=0)
        caller = asyncio.create_task(broker.topic_writes.apply(plan))
        await asyncio.sleep(0)
        # while it is in flight: CreateTopics answers TOPIC_ALREADY_EXISTS, Metadata's
        # auto-creation waits (None: LEADER_NOT_AVAILABLE), the coordinator lookup likewise
        code, _m, _i = create_topics._validate_one(broker, _request(("t", 1)).topics[0], {"t": 1})
        assert code == ErrorCode.topic_already_exists
        assert await broker.auto_create("t") is None
        caller.cancel()  # the client went away: the change completes all the same
        await asyncio.gather(caller, return_exceptions=True)
        for _ in range(1000):  # a bound on the wait, not a timing assertion
            if not logs.topic_busy("t"):
                break
            await asyncio.sleep(0.01)
        assert logs.topic("t") is not None and logs.get_partition(TopicPartition("t", 0)) is not None

    asyncio.run(script())
