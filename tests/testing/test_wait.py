"""wait_until and wait_until_async follow one rule: the condition's first truthy value is
returned, the condition is evaluated once more when the deadline has passed, and a wait that runs
out raises WaitTimeout naming what was awaited and the last state described."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from exactly.testing.wait import WaitTimeout, wait_until, wait_until_async


def run_sync(cond: Callable[[], Any], timeout: float, **kw: Any) -> Any:
    return wait_until(cond, timeout, "the thing", interval=0.001, **kw)


def run_async(cond: Callable[[], Any], timeout: float, **kw: Any) -> Any:
    return asyncio.run(wait_until_async(cond, timeout, "the thing", interval=0.001, **kw))


WAITS = pytest.mark.parametrize("wait", [run_sync, run_async], ids=["sync", "async"])


def answers(*values: object) -> Callable[[], object]:
    it: Iterator[object] = iter(values)
    return lambda: next(it)


@WAITS
def test_the_first_truthy_value_is_returned(wait: Callable[..., Any]) -> None:
    assert wait(answers(0, None, "", [3]), 10.0) == [3]


@WAITS
def test_the_condition_is_evaluated_once_more_after_the_deadline(wait: Callable[..., Any]) -> None:
    assert wait(answers(False, "late"), 0.0) == "late"


@WAITS
def test_a_wait_that_runs_out_names_what_and_the_last_state(wait: Callable[..., Any]) -> None:
    with pytest.raises(WaitTimeout, match=r"the thing: not reached within 0.0s; last state: 7") as raised:
        wait(lambda: False, 0.0, describe=lambda: 7)
    assert isinstance(raised.value, AssertionError)
