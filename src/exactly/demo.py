"""`make run`: the embedded broker and the orders example, end to end.

Starts ``exactly serve`` as a subprocess on a free loopback port with a temporary data directory,
writes sample order-completed events with an idempotent producer (acks=all), reads them back with
a consumer, prints sales per category, checks the totals against what was produced, and stops
the broker cleanly. The Spark pipeline (issue #4) replaces the consume-and-sum step with the
exactly-once Structured Streaming job; this demo already shows the broker doing its part.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

CATEGORIES = ("books", "electronics", "garden", "grocery", "toys")
TOPIC = "order-completed"


def start_broker(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "exactly", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=open(data_dir / "broker.log", "w"),  # noqa: SIM115 - lives as long as the broker
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("exactly listening on "):
        proc.kill()
        raise SystemExit(f"broker failed to start; see {data_dir / 'broker.log'}")
    return proc, line.rsplit(" ", 1)[1]


def main(orders: int = 20_000) -> int:
    with tempfile.TemporaryDirectory(prefix="exactly-demo-") as tmp:
        data_dir = Path(tmp)
        proc, bootstrap = start_broker(data_dir)
        try:
            print(f"broker listening on {bootstrap} (data dir {data_dir})")
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=1)])[TOPIC].result(10)

            rng = random.Random(7)
            truth: Counter[str] = Counter()
            producer = Producer(
                {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
            )
            started = time.monotonic()
            for i in range(orders):
                category = rng.choice(CATEGORIES)
                amount = rng.randint(100, 50_000)
                truth[category] += amount
                event = {
                    "order_id": i,
                    "category": category,
                    "amount": amount,
                    "completed_at": int(time.time() * 1000),
                }
                producer.produce(TOPIC, key=str(i).encode(), value=json.dumps(event).encode())
                if i % 1000 == 0:
                    producer.poll(0)
            if producer.flush(30) != 0:
                raise SystemExit("producer could not deliver every order")
            produced_s = time.monotonic() - started

            consumer = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": "demo",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
            consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(3)])
            totals: Counter[str] = Counter()
            seen = 0
            deadline = time.monotonic() + 60
            while seen < orders and time.monotonic() < deadline:
                for msg in consumer.consume(1000, timeout=1.0):
                    if msg.error():
                        continue
                    event = json.loads(msg.value() or b"{}")
                    totals[event["category"]] += event["amount"]
                    seen += 1
            consumer.close()

            print(f"\nproduced {orders} orders in {produced_s:.2f} s; consumed {seen}\n")
            print(f"{'category':<12} {'sales':>14}")
            for category in sorted(totals):
                print(f"{category:<12} {totals[category] / 100:>14,.2f}")
            print(f"{'TOTAL':<12} {sum(totals.values()) / 100:>14,.2f}")
            ok = seen == orders and totals == truth
            print(f"\nverification: {'OK, every order counted exactly once' if ok else 'MISMATCH'}")
            return 0 if ok else 1
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
