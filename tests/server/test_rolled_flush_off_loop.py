"""The broker's maintenance loop fsyncs rolled segments off its event loop (storage.rolled_flush):
a real broker and log manager, os.fsync recording the thread of every call."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
from tests.storage.helpers import append

from exactly.server.broker import Broker
from exactly.server.config import BrokerConfig
from exactly.types import TopicPartition

TP = TopicPartition("rolled", 0)


def test_the_maintenance_loop_fsyncs_rolled_segments_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, threading.Thread]] = []
    real = os.fsync

    def recording(fd: int) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = f"<closed fd {fd}>"
        calls.append((path, threading.current_thread()))
        real(fd)

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        conf = {
            "log.dirs": str(data_dir),
            "auto.create.topics.enable": "false",
            "log.retention.check.interval.ms": "10",
        }
        broker = Broker.open(BrokerConfig.load(None, conf), data_dir)
        try:
            now = int(time.time() * 1000)  # records of now: retention must not delete them
            broker.logs.create_topic(TP.topic, 1, {}, now_ms=now)
            plog = broker.logs.get_partition(TP)
            assert plog is not None
            append(plog, 3, now_ms=now, timestamp=now)
            plog.roll(now)
            append(plog, 1, now_ms=now, timestamp=now)
            assert plog.recovery_point == 0
            rolled = plog.segments[0].log_path.name

            async def run_maintenance() -> threading.Thread:
                loop_thread = threading.current_thread()
                task = asyncio.create_task(broker._maintenance_loop())
                try:
                    for _ in range(3000):  # a bound on the wait, not a timing assertion
                        if plog.recovery_point == 3:
                            break
                        await asyncio.sleep(0.01)
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                return loop_thread

            monkeypatch.setattr(os, "fsync", recording)
            loop_thread = asyncio.run(run_maintenance())
            monkeypatch.undo()
            assert plog.recovery_point == 3  # the rolled segment's end: fsynced, then moved
            of_rolled = [thread for path, thread in calls if Path(path).name == rolled]
            assert of_rolled, calls
            assert loop_thread not in of_rolled
        finally:
            broker.logs.close()


def test_a_failed_fsync_in_the_worker_completes_the_plans_as_not_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker drives the shared ``rolled_flush_steps``: an fsync error in its worker thread
    is re-raised on the loop after the plans were completed as not ok (recovery point stays, the
    segments are unflushed and planned again next time)."""

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        conf = {"log.dirs": str(data_dir), "auto.create.topics.enable": "false"}
        broker = Broker.open(BrokerConfig.load(None, conf), data_dir)
        try:
            now = int(time.time() * 1000)
            broker.logs.create_topic(TP.topic, 1, {}, now_ms=now)
            plog = broker.logs.get_partition(TP)
            assert plog is not None
            append(plog, 3, now_ms=now, timestamp=now)
            plog.roll(now)
            monkeypatch.setattr(os, "fsync", failing)
            with pytest.raises(OSError, match="Input/output"):
                asyncio.run(broker._flush_rolled_segments())
            monkeypatch.undo()
            assert plog.recovery_point == 0
            assert plog.segments[0].unflushed  # handed back
            asyncio.run(broker._flush_rolled_segments())  # planned afresh
            assert plog.recovery_point == 3
        finally:
            broker.logs.close()
