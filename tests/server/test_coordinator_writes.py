"""ResultDriver on its own (the runtime's tests drive it through CoordinatorRuntime): the local
and the replicated drive walk a result in the same order and gather the same answers (the last
response, every reply in order), and an append that raises something other than AppendFailed
reaches its completion as UNKNOWN_SERVER_ERROR, logged, instead of escaping the drive."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast

import pytest

from exactly.coordinator.result import AppendOutcome, CoordinatorResult, Record, Reply, Write
from exactly.server.coordinator_writes import Answers, ResultDriver
from exactly.server.internal_topics import InternalTopics

TOPIC = "__test_state"


class Log:
    """Both append calls over one list; ``broken`` makes every append raise a plain bug."""

    def __init__(self, *, broken: bool = False) -> None:
        self.events: list[str] = []
        self.broken = broken

    def append(self, topic: str, partition: int, records: Sequence[Record], **kw: Any) -> int:
        if self.broken:
            raise RuntimeError("a bug in storage")
        self.events.append(f"append {records[0][0]!r}")
        return len(self.events) - 1

    async def append_replicated(
        self, topic: str, partition: int, records: Sequence[Record], **kw: Any
    ) -> int:
        await asyncio.sleep(0)  # yields to the loop, as an ISR wait does
        return self.append(topic, partition, records, **kw)


def write(log: Log, key: bytes, then: CoordinatorResult[Any] | None = None) -> Write:
    def complete(outcome: AppendOutcome) -> CoordinatorResult[Any]:
        log.events.append(f"complete {key!r} {outcome.error.name}")
        return then if then is not None else CoordinatorResult()

    return Write(partition=0, records=((key, b"v"),), complete=complete)


def drive(log: Log, result: CoordinatorResult[Any], *, replicated: bool, **kw: Any) -> Answers:
    driver = ResultDriver(
        "test", TOPIC, cast(InternalTopics, log), kw.get("side_effect"), logging.getLogger("t")
    )
    return asyncio.run(driver.drive_replicated(result)) if replicated else driver.drive(result)


@pytest.mark.parametrize("replicated", [False, True])
def test_both_drives_walk_depth_first_and_gather_the_last_response_and_every_reply(replicated: bool) -> None:
    log = Log()

    def side_effect(effect: object) -> CoordinatorResult[Any]:
        return CoordinatorResult(response="from effect", replies=(Reply(3, "c"),))

    inner = CoordinatorResult(response="inner", replies=(Reply(2, "b"),), writes=(write(log, b"a2"),))
    result: CoordinatorResult[Any] = CoordinatorResult(
        response="outer",
        replies=(Reply(1, "a"),),
        writes=(write(log, b"a", inner), write(log, b"b")),
        effects=("markers",),
    )
    answers = drive(log, result, replicated=replicated, side_effect=side_effect)
    assert log.events == [
        "append b'a'",
        "complete b'a' none",
        "append b'a2'",
        "complete b'a2' none",
        "append b'b'",
        "complete b'b' none",
    ]
    assert answers.response == "from effect"
    assert [r.response for r in answers.replies] == ["a", "b", "c"]


@pytest.mark.parametrize("replicated", [False, True])
def test_an_unexpected_append_error_reaches_the_completion_as_unknown_server_error(
    replicated: bool, caplog: pytest.LogCaptureFixture
) -> None:
    log = Log(broken=True)
    with caplog.at_level(logging.ERROR, logger="t"):
        drive(log, CoordinatorResult(writes=(write(log, b"a"),)), replicated=replicated)
    assert log.events == ["complete b'a' unknown_server_error"]
    assert "unexpected error appending to __test_state-0" in caplog.text
