"""The orders example without Spark: topics, the event generator, and the verifier.

Input ``order-completed``: JSON ``{"order_id", "category", "amount" (cents), "completed_at" (ms)}``,
keyed by order id. Outputs (written by the Spark job in ``pipeline.py``), keyed by category on
``category-sales`` and by ``total`` on ``total-sales``; each record is one update of a running
total in one micro-batch::

    {"key": "books", "batch": 7, "total_cents": 123456, "orders": 42,
     "delta_cents": 2345, "delta_orders": 3}

``verify`` recomputes the truth from the *committed* input (read_committed up to the LSO, so aborted
orders never count) and checks the outputs as a read_committed reader sees them:

* the latest update per key equals the exact total (cents and count);
* no (batch, key) appears twice - a duplicated micro-batch would show up here;
* every update equals the previous total plus that batch's delta, batch ids strictly increase,
  and the deltas sum to the total - a lost or doubled batch breaks the chain.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

CATEGORIES = ("books", "electronics", "garden", "grocery", "toys", "sports", "music", "beauty")
TOTAL_KEY = "total"
# further librdkafka settings of the helpers' clients (a secured cluster's: security.protocol, sasl.*,
# ssl.*); bootstrap.servers is the helpers' own argument
ClientSettings = Mapping[str, Any] | None


@dataclass(frozen=True)
class Topics:
    orders: str = "order-completed"
    category: str = "category-sales"
    total: str = "total-sales"

    @classmethod
    def with_prefix(cls, prefix: str) -> Topics:
        return cls(f"{prefix}order-completed", f"{prefix}category-sales", f"{prefix}total-sales")


def create_topics(
    bootstrap: str, topics: Topics, partitions: int = 3, timeout: float = 30, *, client: ClientSettings = None
) -> None:
    """Create the three topics (input with ``partitions``, category-sales 3, total-sales 1).
    ``client``: further librdkafka settings (here and below: a secured cluster's)."""
    admin = AdminClient({**(client or {}), "bootstrap.servers": bootstrap, "log_level": 3})
    wanted = [
        NewTopic(topics.orders, num_partitions=partitions, replication_factor=-1),
        NewTopic(topics.category, num_partitions=3, replication_factor=-1),
        NewTopic(topics.total, num_partitions=1, replication_factor=-1),
    ]
    for name, future in admin.create_topics(wanted, request_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaException(f"cannot create {name}: {exc}") from None


# ---------------------------------------------------------------------------- generate
@dataclass
class Generated:
    committed: int = 0
    aborted: int = 0
    transactions: int = 0
    aborted_transactions: int = 0
    cents: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


def generate(
    bootstrap: str,
    topics: Topics,
    orders: int,
    *,
    transactional: bool = True,
    txn_size: int = 200,
    abort_every: int = 5,
    seed: int = 7,
    first_order_id: int = 0,
    transactional_id: str | None = None,
    progress: Callable[[Generated], None] | None = None,
    client: ClientSettings = None,
) -> Generated:
    """Write ``orders`` committed order-completed events; ``progress`` gets the running result
    after each transaction (idempotent mode: every ``txn_size`` orders).

    Transactional mode: transactions of ``txn_size`` orders; every ``abort_every``-th transaction
    (0 = never) is flushed to the broker and then **aborted**: its extra orders are in the log but
    must never be counted. Idempotent mode: one idempotent producer, nothing aborted."""
    rng = random.Random(seed)
    result = Generated()
    conf: dict[str, Any] = {
        **(client or {}),
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "log_level": 3,
    }
    if transactional:
        conf["transactional.id"] = transactional_id or f"orders-generator-{topics.orders}-{seed}"
    producer = Producer(conf)
    failures: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    started = time.monotonic()
    next_id = first_order_id
    if transactional:
        producer.init_transactions(30)

    def event() -> tuple[str, int, bytes, bytes]:
        nonlocal next_id
        category = rng.choice(CATEGORIES)
        amount = rng.randint(100, 50_000)
        body = {
            "order_id": next_id,
            "category": category,
            "amount": amount,
            "completed_at": int(time.time() * 1000),
        }
        key = str(next_id).encode()
        next_id += 1
        return category, amount, key, json.dumps(body, separators=(",", ":")).encode()

    while result.committed < orders:
        if not transactional:
            category, amount, key, value = event()
            _produce(producer, topics.orders, key, value, on_delivery)
            result.committed += 1
            result.cents[category] += amount
            if progress is not None and (result.committed % txn_size == 0 or result.committed == orders):
                progress(result)
            continue
        result.transactions += 1
        abort = abort_every > 0 and result.transactions % abort_every == 0
        size = txn_size if abort else min(txn_size, orders - result.committed)
        producer.begin_transaction()
        batch: Counter[str] = Counter()
        for _ in range(size):
            category, amount, key, value = event()
            _produce(producer, topics.orders, key, value, on_delivery)
            batch[category] += amount
        if abort:
            producer.flush(30)  # make sure the doomed records really reach the log
            producer.abort_transaction(30)
            result.aborted += size
            result.aborted_transactions += 1
            failures.clear()  # purged/aborted deliveries are expected to fail
        else:
            producer.commit_transaction(30)
            result.committed += size
            result.cents.update(batch)
        if progress is not None:
            progress(result)
    if producer.flush(60) != 0 or failures:
        raise KafkaException(f"generator: {len(failures)} deliveries failed: {failures[:3]}")
    result.seconds = time.monotonic() - started
    return result


def _produce(producer: Producer, topic: str, key: bytes, value: bytes, on_delivery: Any) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)


# ---------------------------------------------------------------------------- read committed
@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def read_committed(
    bootstrap: str, topic: str, timeout: float = 60, *, client: ClientSettings = None
) -> list[Record]:
    """Every record a read_committed consumer sees, from the log start up to the current LSO."""
    consumer = Consumer(
        {
            **(client or {}),
            "bootstrap.servers": bootstrap,
            "group.id": "exactly-orders-verify",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is None or metadata.error is not None:
            raise KafkaException(f"topic {topic} does not exist")
        ends: dict[int, int] = {}
        for p in metadata.partitions:
            low, lso = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if lso > low:
                ends[p] = lso
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[Record] = []
        pending = dict(ends)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} did not reach their LSO")
            for msg in consumer.consume(5000, timeout=0.2):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    continue
                partition, offset = msg.partition() or 0, msg.offset() or 0
                if partition in pending and offset < pending[partition]:
                    out.append(Record(partition, offset, msg.key(), msg.value()))
            for tp in consumer.position([TopicPartition(topic, p) for p in list(pending)]):
                if tp.offset >= pending[tp.partition]:
                    del pending[tp.partition]
        return out
    finally:
        consumer.close()


# ---------------------------------------------------------------------------- verify
@dataclass
class Verification:
    orders: int = 0
    truth_cents: dict[str, int] = field(default_factory=dict)
    truth_orders: dict[str, int] = field(default_factory=dict)
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    updates: int = 0
    batches: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if self.ok:
            return (
                f"OK: {self.orders} committed orders, {len(self.truth_cents) - 1} categories, "
                f"{self.updates} updates over {self.batches} micro-batches; every total exact, "
                "no duplicate (batch, key), every update = previous total + batch delta"
            )
        shown = "\n  ".join(self.problems[:20])
        more = f"\n  ... {len(self.problems) - 20} more" if len(self.problems) > 20 else ""
        return f"FAILED ({len(self.problems)} problems):\n  {shown}{more}"


def truth(
    bootstrap: str, topics: Topics, *, client: ClientSettings = None
) -> tuple[int, dict[str, int], dict[str, int]]:
    cents: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    seen: set[int] = set()
    for rec in read_committed(bootstrap, topics.orders, client=client):
        order = json.loads(rec.value or b"{}")
        seen.add(int(order["order_id"]))
        cents[order["category"]] += int(order["amount"])
        counts[order["category"]] += 1
    cents[TOTAL_KEY] = sum(v for k, v in cents.items() if k != TOTAL_KEY)
    counts[TOTAL_KEY] = sum(v for k, v in counts.items() if k != TOTAL_KEY)
    return len(seen), dict(cents), dict(counts)


def verify(bootstrap: str, topics: Topics, *, client: ClientSettings = None) -> Verification:
    n, cents, counts = truth(bootstrap, topics, client=client)
    report = Verification(orders=n, truth_cents=cents, truth_orders=counts)
    if n != counts.get(TOTAL_KEY, 0):
        report.problems.append(
            f"input: {counts.get(TOTAL_KEY, 0)} committed records but {n} distinct order ids"
        )
    chains: dict[str, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
    partitions: dict[str, set[tuple[str, int]]] = defaultdict(set)
    batches: set[int] = set()
    for topic in (topics.category, topics.total):
        for rec in read_committed(bootstrap, topic, client=client):
            update = json.loads(rec.value or b"{}")
            key = (rec.key or b"").decode()
            if update.get("key") != key:
                report.problems.append(
                    f"{topic}-{rec.partition}@{rec.offset}: key {key!r} but value {update}"
                )
            if (topic == topics.total) != (key == TOTAL_KEY):
                report.problems.append(
                    f"{topic}-{rec.partition}@{rec.offset}: key {key!r} on the wrong topic"
                )
            chains[key].append((rec.partition, rec.offset, update))
            partitions[key].add((topic, rec.partition))
            batches.add(int(update["batch"]))
            report.updates += 1
    report.batches = len(batches)
    for key in sorted(set(cents) | set(chains)):
        _check_chain(
            report, key, chains.get(key, []), partitions.get(key, set()), cents.get(key), counts.get(key)
        )
    return report


def _check_chain(
    report: Verification,
    key: str,
    chain: list[tuple[int, int, dict[str, Any]]],
    where: set[tuple[str, int]],
    cents: int | None,
    orders: int | None,
) -> None:
    if cents is None:
        report.problems.append(f"{key}: updates exist for a key with no committed orders")
        return
    if not chain:
        report.problems.append(f"{key}: no update at all (expected total {cents})")
        return
    if len(where) > 1:
        report.problems.append(f"{key}: updates spread over several partitions {sorted(where)}")
    chain.sort(key=lambda item: (item[0], item[1]))
    seen: dict[int, int] = {}
    prev_cents = prev_orders = 0
    prev_batch = -1
    for _partition, offset, update in chain:
        batch = int(update["batch"])
        if batch in seen:
            report.problems.append(f"{key}: batch {batch} written twice (offsets {seen[batch]} and {offset})")
        seen[batch] = offset
        if batch < prev_batch:
            report.problems.append(f"{key}@{offset}: batch {batch} after batch {prev_batch}")
        want_cents = prev_cents + int(update["delta_cents"])
        want_orders = prev_orders + int(update["delta_orders"])
        if int(update["total_cents"]) != want_cents or int(update["orders"]) != want_orders:
            report.problems.append(
                f"{key}@{offset} batch {batch}: total {update['total_cents']}/{update['orders']} != previous "
                f"{prev_cents}/{prev_orders} + delta {update['delta_cents']}/{update['delta_orders']}"
            )
        prev_cents, prev_orders, prev_batch = int(update["total_cents"]), int(update["orders"]), batch
    last = chain[-1][2]
    report.latest[key] = last
    if int(last["total_cents"]) != cents or int(last["orders"]) != orders:
        report.problems.append(
            f"{key}: latest total {last['total_cents']} cents / {last['orders']} orders, "
            f"expected {cents} / {orders}"
        )


def category_table(report: Verification) -> str:
    """The latest totals per category, as the README shows them."""
    lines = [f"{'category':<14} {'orders':>8} {'sales':>16}", "-" * 40]
    for key in sorted(k for k in report.latest if k != TOTAL_KEY):
        row = report.latest[key]
        lines.append(f"{key:<14} {int(row['orders']):>8,} {int(row['total_cents']) / 100:>16,.2f}")
    total = report.latest.get(TOTAL_KEY)
    if total is not None:
        lines.append("-" * 40)
        lines.append(f"{'TOTAL':<14} {int(total['orders']):>8,} {int(total['total_cents']) / 100:>16,.2f}")
    return "\n".join(lines)
