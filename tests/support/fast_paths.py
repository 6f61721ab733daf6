"""Wrappers for the fast-path equivalence tests (``tests/server/test_*fast*.py``): each test runs
the same requests through two brokers, one whose fast path is wrapped in :class:`Counting` (so the
test can assert how many requests the fast path took rather than the generic path) and one whose
fast path is :class:`Off` (every request goes the generic way). The fast-Fetch tests take such a
pair of real brokers from the ``fetch_pair`` fixture (import it; it is a factory taking the fill)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exactly.server.broker import Broker, Endpoint
from exactly.server.config import BrokerConfig

#: Creates a broker's topics and appends its records; run on both brokers of a pair, so both
#: hold the same logs.
Fill = Callable[[Broker], None]
#: ``fetch_pair``'s factory: ``make(fill, *, generic_produce_off=False) -> (fast, generic)``.
MakePair = Callable[..., tuple[Broker, Broker]]


class Counting:
    """Wraps a broker's fast path (``answer(...)`` returning None when it declines) and counts the
    requests it took."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.taken = 0

    def answer(self, *args: Any) -> Any:
        result = self.inner.answer(*args)
        self.taken += result is not None
        return result


class Off:
    """A fast path that declines everything."""

    taken = 0

    def answer(self, *args: Any) -> None:
        return None


def _open(data_dir: Path, fill: Fill) -> Broker:
    conf = {"log.dirs": str(data_dir), "auto.create.topics.enable": "false"}
    broker = Broker.open(BrokerConfig.load(None, conf), data_dir)
    broker.advertised = Endpoint("127.0.0.1", 9092)
    fill(broker)
    return broker


@pytest.fixture(name="fetch_pair")
def fetch_pair_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakePair]:
    """Two real brokers (not serving: tests dispatch frames to them), each in a directory of its
    own and filled by the same ``fill``: the first with its fast Fetch path wrapped in
    :class:`Counting`, the second with it :class:`Off`; ``generic_produce_off`` turns the second
    one's fast Produce path off too (tests that produce through both). Closed at teardown."""
    opened: list[Broker] = []

    def make(fill: Fill, *, generic_produce_off: bool = False) -> tuple[Broker, Broker]:
        fast = _open(tmp_path_factory.mktemp("fast"), fill)
        opened.append(fast)
        generic = _open(tmp_path_factory.mktemp("generic"), fill)
        opened.append(generic)
        fast.fast_fetch = Counting(fast.fast_fetch)  # type: ignore[assignment]
        generic.fast_fetch = Off()  # type: ignore[assignment]
        if generic_produce_off:
            generic.fast_produce = Off()  # type: ignore[assignment]
        return fast, generic

    yield make
    for broker in opened:
        broker.logs.close()
