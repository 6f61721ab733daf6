"""librdkafka's idempotent producer through a fault proxy: lost responses, cut connections, a
blackhole, a broker crash. Whatever happens on the way, the partition must end up holding every
number exactly once, in order (Kafka's transactions_test shape, one partition)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError

from tests.support.clients import consume, create_topic, producer, watermarks
from tests.support.proxy import ProxiedBroker

API_PRODUCE = 0

FAULT_PRODUCER: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight": 5,
    "linger.ms": 2,
    "batch.num.messages": 50,
    "message.timeout.ms": 120_000,
    "request.timeout.ms": 3_000,
    "socket.timeout.ms": 3_000,
    "retry.backoff.ms": 20,
    "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 500,
}


class Numbers:
    """Produces 0..n-1 as zero-padded values and records every delivery report."""

    def __init__(self, pb: ProxiedBroker, topic: str, n: int, **conf: Any) -> None:
        self.topic = topic
        self.n = n
        self.acked: list[int] = []
        self.errors: list[KafkaError] = []
        self.producer = producer(pb.bootstrap, **{**FAULT_PRODUCER, **conf})

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.append(int(msg.value()))

    def produce(self, start: int = 0, stop: int | None = None, pace: float = 0.0) -> None:
        for i in range(start, self.n if stop is None else stop):
            while True:
                try:
                    self.producer.produce(
                        self.topic, value=b"%06d" % i, partition=0, on_delivery=self.on_delivery
                    )
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.producer.poll(0)
            if pace and i % 100 == 99:
                time.sleep(pace)  # a production rate the faults can land between, not a synchronisation

    def finish(self, timeout: float = 150) -> None:
        left = self.producer.flush(timeout)
        assert not self.errors, f"delivery errors: {self.errors[:5]}"
        assert left == 0, f"{left} messages still undelivered after {timeout}s"


def assert_exactly_once_in_order(pb: ProxiedBroker, topic: str, n: int) -> None:
    pb.proxy.clear_faults()
    low, high = watermarks(pb.bootstrap, topic)
    assert low == 0
    got = consume(pb.bootstrap, topic, high, timeout=90)
    assert len(got) == high
    values = [int(g.value or b"-1") for g in got]
    dups = len(values) - len(set(values))
    missing = sorted(set(range(n)) - set(values))
    assert dups == 0, f"{dups} duplicates, e.g. {sorted(v for v in set(values) if values.count(v) > 1)[:10]}"
    assert not missing, f"{len(missing)} missing, e.g. {missing[:10]}"
    assert values == list(range(n)), "all there once, but out of order"
    assert [g.offset for g in got] == list(range(n))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_lost_produce_responses_do_not_duplicate(proxied_broker: Any, topic: str) -> None:
    pb: ProxiedBroker = proxied_broker()
    create_topic(pb.bootstrap, topic)
    n = 5000
    job = Numbers(pb, topic, n)
    # every 9th Produce response vanishes and its connection is closed: the request reached the
    # broker and was written; librdkafka retries it (and everything in flight behind it)
    pb.proxy.drop_every(9, api_keys=API_PRODUCE, close=True)
    job.produce(pace=0.005)
    job.finish()
    assert pb.proxy.stats.dropped_by_api.get(API_PRODUCE, 0) >= 10, pb.proxy.stats
    assert sorted(job.acked) == list(range(n))
    assert_exactly_once_in_order(pb, topic, n)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_silently_lost_responses_then_timeout_retry(proxied_broker: Any, topic: str) -> None:
    """Responses dropped on a live connection: the client only sees its request time out."""
    pb: ProxiedBroker = proxied_broker()
    create_topic(pb.bootstrap, topic)
    n = 2000
    job = Numbers(pb, topic, n, **{"request.timeout.ms": 1500, "socket.timeout.ms": 1500})
    job.produce(stop=500)
    pb.proxy.drop_responses(3, api_keys=API_PRODUCE, close=False)
    t0 = time.monotonic()
    job.produce(start=500, stop=1500, pace=0.01)
    job.producer.flush(60)
    t1 = time.monotonic()
    pb.proxy.set_delay(0.2, api_keys=API_PRODUCE)
    job.produce(start=1500)
    job.finish()
    print(f"drop phase {t1 - t0:.1f}s, delay phase {time.monotonic() - t1:.1f}s")
    assert pb.proxy.stats.dropped_by_api.get(API_PRODUCE, 0) == 3
    assert_exactly_once_in_order(pb, topic, n)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cuts_and_blackhole(proxied_broker: Any, topic: str) -> None:
    pb: ProxiedBroker = proxied_broker()
    create_topic(pb.bootstrap, topic)
    n = 4000
    job = Numbers(pb, topic, n)
    done = threading.Event()
    faults = {"cut": 0, "blackhole": 0}

    def chaos() -> None:
        while not done.wait(0.25):
            faults["cut"] += pb.proxy.cut()
            if done.wait(0.25):
                return
            pb.proxy.blackhole(0.4)
            faults["blackhole"] += 1

    t = threading.Thread(target=chaos, daemon=True)
    t.start()
    try:
        job.produce(pace=0.01)
        job.producer.flush(10)
    finally:
        done.set()
        t.join(5)
    job.finish()
    assert faults["cut"] >= 3 and faults["blackhole"] >= 3, faults
    assert_exactly_once_in_order(pb, topic, n)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_broker_kill9_midstream_with_idempotent_retries(proxied_broker: Any, topic: str) -> None:
    """kill -9 the broker while records are in flight, restart it on the same port: the producer's
    retries are deduplicated against the recovered producer state; nothing acked is lost."""
    pb: ProxiedBroker = proxied_broker()
    create_topic(pb.bootstrap, topic)
    n = 4000
    job = Numbers(pb, topic, n)
    job.produce(stop=2000, pace=0.005)
    pb.restart(clean=False)
    job.produce(start=2000, pace=0.005)
    job.finish()
    assert_exactly_once_in_order(pb, topic, n)
