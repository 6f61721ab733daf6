"""What a read_committed reader sees of the orders pipeline's micro-batches, for the crash tests.

``BatchView`` reads category-sales and total-sales once and tells which batches are seen in part
(a topic without the batch, or category deltas not adding up to the total's delta).
``PartialWatch`` takes such views continuously while a job runs and keeps every batch seen in
part outside its commit phase. A view is only judged when it is *stable*: no partition of either
topic moved its last stable offset (LSO) while it was read, so both topics were read in one
state (any transaction ending below or at the LSO moves it). In a stable view, only the newest
batch may be partial -- the one whose commits (one EndTxn per task) are under way; Spark starts
the next micro-batch's tasks only after the driver's ``commit`` returned, and a task's next
transaction waits on the coordinator until the previous one's markers are written.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import defaultdict

from confluent_kafka import Consumer, KafkaException, TopicPartition

from exactly.client.broker_pool import BrokerPool
from exactly.client.txn_admin import list_transactions
from exactly.client.wire import WireError
from exactly.spark.orders import TOTAL_KEY, Topics, read_committed


class BatchView:
    """What a read_committed reader sees of each micro-batch in the two output topics."""

    def __init__(self, bootstrap: str, topics: Topics) -> None:
        self.category: dict[int, int] = defaultdict(int)  # batch -> sum of the category deltas
        self.total: dict[int, int] = {}  # batch -> the total's delta
        self.records: dict[int, int] = defaultdict(int)
        for topic in (topics.category, topics.total):
            for rec in read_committed(bootstrap, topic):
                update = json.loads(rec.value or b"{}")
                batch = int(update["batch"])
                self.records[batch] += 1
                if update["key"] == TOTAL_KEY:
                    assert batch not in self.total, f"batch {batch}: two total updates"
                    self.total[batch] = int(update["delta_cents"])
                else:
                    self.category[batch] += int(update["delta_cents"])

    @property
    def batches(self) -> set[int]:
        return set(self.category) | set(self.total)

    def partial_batches(self) -> list[int]:
        return [b for b in sorted(self.batches) if self.category.get(b) != self.total.get(b)]

    def partial(self) -> list[str]:
        """Batches seen in part: a topic without the batch, or categories not adding up to the total."""
        return [
            f"batch {b}: categories {self.category.get(b)} vs total {self.total.get(b)}"
            for b in self.partial_batches()
        ]


def open_transactions(bootstrap: str, prefix: str) -> list[str]:
    """The sink's transactions still open (prepared and not yet committed or aborted)."""
    with BrokerPool.connect(bootstrap, timeout=30) as pool:
        return sorted(
            t.transactional_id
            for t in list_transactions(pool, states=("Ongoing",))
            if t.transactional_id.startswith(prefix)
        )


class _Lsos:
    """The read_committed end (LSO) of every partition of the output topics, from one consumer."""

    def __init__(self, bootstrap: str, topics: Topics) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"batch-view-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "log_level": 3,
            }
        )
        self.partitions: list[TopicPartition] = []
        for topic in (topics.category, topics.total):
            meta = self.consumer.list_topics(topic, timeout=30).topics[topic]
            self.partitions += [TopicPartition(topic, p) for p in sorted(meta.partitions)]

    def read(self) -> tuple[int, ...]:
        return tuple(
            int(self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1])
            for tp in self.partitions
        )

    def close(self) -> None:
        self.consumer.close()


class PartialWatch(threading.Thread):
    """Stable views in a loop until ``stop()``; ``violations`` lists every batch seen in part that
    was not the newest batch of its view, ``quiet_partial`` every partial batch seen while the
    test declared the job quiet (``quiet()``: no commit phase can be under way, e.g. while the
    driver or a task hangs before the decision)."""

    def __init__(self, bootstrap: str, topics: Topics) -> None:
        super().__init__(name="partial-watch", daemon=True)
        self.bootstrap, self.topics = bootstrap, topics
        self.stopping = threading.Event()
        self.quiet_now = threading.Event()
        self.violations: list[str] = []
        self.quiet_partial: list[str] = []
        self.stable = self.unstable = self.unreadable = 0
        self.lock = threading.Lock()

    def quiet(self, on: bool) -> None:
        """Mark the job quiet (``True``) or committing again; waits for the view in progress."""
        with self.lock:
            (self.quiet_now.set if on else self.quiet_now.clear)()

    def run(self) -> None:
        lsos: _Lsos | None = None
        while not self.stopping.wait(0.5):
            try:
                if lsos is None:
                    lsos = _Lsos(self.bootstrap, self.topics)
                self._look(lsos)
            except (KafkaException, TimeoutError, OSError, WireError, KeyError):
                self.unreadable += 1  # a broker is down or a leader is moving: look again
        if lsos is not None:
            lsos.close()

    def _look(self, lsos: _Lsos) -> None:
        with self.lock:
            quiet = self.quiet_now.is_set()
            before = lsos.read()
            view = BatchView(self.bootstrap, self.topics)
            if lsos.read() != before:
                self.unstable += 1
                return
        self.stable += 1
        partial = view.partial_batches()
        newest = max(view.batches, default=-1)
        described = dict(zip(view.partial_batches(), view.partial(), strict=True))
        self.violations += [described[b] for b in partial if b != newest]
        if quiet:
            self.quiet_partial += [described[b] for b in partial]

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)

    def summary(self) -> str:
        return f"{self.stable} stable views ({self.unstable} unstable, {self.unreadable} unreadable)"

    def check(self) -> None:
        assert not self.violations, "batches seen in part outside their commit phase:\n" + "\n".join(
            self.violations
        )
        assert not self.quiet_partial, "batches seen in part while no commit ran:\n" + "\n".join(
            self.quiet_partial
        )
        assert self.stable > 0, f"no stable view of the outputs: {self.summary()}"
