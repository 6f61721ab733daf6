"""One chaos client process (confluent-kafka), writing its history (tests/chaos/history.py).

    python -m tests.chaos.client --role {idem,txn,reader} --name NAME --bootstrap HOST:PORT
        --topic T --partitions N --history FILE --stop-file PATH --seed S [--iso rc|ru]
        [--tid TID] [--abort-prob 0.3] [--rate 50]

* ``idem``: an idempotent producer (acks=all) sending unique values to random partitions at
  ``--rate`` values/s; each send and each delivery report is a history line.
* ``txn``: a transactional producer (``--tid``) running transactions of 1-5 values over random
  partitions; ``--abort-prob`` of them are aborted on purpose. Flushes before commit/abort so an
  aborted value really reached the broker. A fatal error (e.g. fenced after a SIGSTOP) makes a new
  producer generation with the same transactional.id.
* ``reader``: assigns every partition from the beginning under ``--iso`` and logs what it reads.

All run until ``--stop-file`` exists (writers flush first), or SIGTERM. A SIGKILL is the point:
the history keeps every line written before it.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.chaos.history import HistoryWriter, make_value

QUIET: dict[str, Any] = {"log_level": 0}
# CHAOS_WRITER_DEBUG=eos,msg (librdkafka debug contexts) traces the writers into their .log files
if os.environ.get("CHAOS_WRITER_DEBUG"):
    QUIET = {"debug": os.environ["CHAOS_WRITER_DEBUG"], "log_level": 7}
_stop = False


def _on_term(_sig: int, _frame: Any) -> None:
    global _stop
    _stop = True


def stopping(args: argparse.Namespace, deadline: float) -> bool:
    return _stop or os.path.exists(args.stop_file) or time.monotonic() > deadline


def err_text(exc: BaseException) -> tuple[str, KafkaError | None]:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError):
        return f"{err.name()}: {err.str()}", err
    return repr(exc), None


# ---------------------------------------------------------------------------------- idempotent
def run_idem(args: argparse.Namespace, h: HistoryWriter, rng: random.Random, deadline: float) -> int:
    writer = f"{args.name}/0"
    p = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 20_000,
            # The broker answers an acks=all Produce it could not complete with REQUEST_TIMED_OUT
            # after request.timeout.ms; kept below socket.timeout.ms (as Kafka's defaults, 30 s <
            # 60 s) so the client hears that answer and retries with the same sequence (dedup),
            # instead of timing the request out itself: an unknown outcome makes librdkafka bump
            # the epoch and resend appended records under new sequences (duplicates no broker
            # can detect).
            "request.timeout.ms": 4_000,
            "socket.timeout.ms": 5_000,
            **QUIET,
        }
    )

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        v = msg.value().decode()
        if err is None:
            h.write("ack", v=v, p=int(msg.partition()), o=msg.offset())  # None: acked, offset unknown
        else:
            h.write("nack", v=v, err=f"{err.name()}: {err.str()}")

    n = 0
    interval = 1.0 / args.rate
    next_at = time.monotonic()
    while not stopping(args, deadline):
        now = time.monotonic()
        if now < next_at:
            p.poll(min(0.05, next_at - now))
            continue
        next_at += interval
        v = make_value(writer, n)
        part = rng.randrange(args.partitions)
        h.write("send", v=v, p=part)
        try:
            p.produce(args.topic, value=v.encode(), partition=part, on_delivery=on_delivery)
        except BufferError:
            h.write("nack", v=v, err="local queue full")
        n += 1
        p.poll(0)
    left = p.flush(25)
    h.write("done", sent=n, unflushed=left)
    return 0


# ---------------------------------------------------------------------------------- transactional
class TxnWriter:
    def __init__(self, args: argparse.Namespace, h: HistoryWriter, rng: random.Random) -> None:
        self.args = args
        self.h = h
        self.rng = rng
        self.gen = -1
        self.n = 0
        self.txns = 0
        self.p: Producer | None = None

    def new_producer(self, deadline: float) -> bool:
        self.gen += 1
        self.n = 0
        self.p = Producer(
            {
                "bootstrap.servers": self.args.bootstrap,
                "transactional.id": self.args.tid,
                "transaction.timeout.ms": 10_000,
                "message.timeout.ms": 9_000,
                "request.timeout.ms": 4_000,  # below socket.timeout.ms, see run_idem
                "socket.timeout.ms": 5_000,
                "linger.ms": 2,
                **QUIET,
            }
        )
        while not stopping(self.args, deadline):
            try:
                self.p.init_transactions(10)
                self.h.write("init", gen=self.gen)
                return True
            except KafkaException as exc:
                text, err = err_text(exc)
                self.h.write("init_failed", gen=self.gen, err=text)
                if err is not None and err.fatal():
                    return self.new_producer(deadline)
                time.sleep(0.2)
        return False

    def one(self, deadline: float) -> None:
        p = self.p
        assert p is not None
        args, h = self.args, self.h
        writer = f"{args.name}/{self.gen}"
        txn = f"{args.name}/{self.gen}/{self.txns}"
        self.txns += 1
        try:
            p.begin_transaction()
        except KafkaException as exc:
            h.write("begin_failed", err=err_text(exc)[0])
            self.recover(exc, deadline)
            return
        h.write("txn_begin", txn=txn)
        failed: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            v = msg.value().decode()
            if err is None:
                h.write("ack", v=v, p=int(msg.partition()), o=msg.offset())  # None: acked, offset unknown
            else:
                failed.append(v)
                h.write("nack", v=v, err=f"{err.name()}: {err.str()}")

        for _ in range(self.rng.randint(1, 5)):
            v = make_value(writer, self.n)
            self.n += 1
            part = self.rng.randrange(args.partitions)
            h.write("txn_send", txn=txn, v=v, p=part)
            try:
                p.produce(args.topic, value=v.encode(), partition=part, on_delivery=on_delivery)
            except (BufferError, KafkaException) as exc:
                failed.append(v)
                h.write("nack", v=v, err=repr(exc))
        intent = "abort" if self.rng.random() < args.abort_prob else "commit"
        left = p.flush(12)
        if left or failed:
            intent = "abort"
        self.end(txn, intent, deadline, settled=not left and not failed)

    def end(self, txn: str, intent: str, deadline: float, *, settled: bool = True) -> None:
        """Commit or abort ``txn``. An abort with batches still unsettled (``settled`` False: not
        all delivery reports came, or one failed) or after an abortable error is followed by a new
        producer: librdkafka's abort purges a batch waiting for a retry and the next transaction
        would reuse its sequence numbers, which the broker (any Kafka broker) takes for a
        duplicate of the purged batch if that one was written (notes/broker-bugs.md); a new
        producer's epoch makes that impossible."""
        p = self.p
        assert p is not None
        h = self.h
        for _attempt in range(5):
            try:
                if intent == "commit":
                    p.commit_transaction(15)
                else:
                    p.abort_transaction(15)
                h.write("txn_end", txn=txn, intent=intent, result="ok")
                if intent == "abort" and not settled:
                    self.new_producer(deadline)
                return
            except KafkaException as exc:
                text, err = err_text(exc)
                if err is not None and err.retriable() and not err.fatal():
                    h.write("end_retry", txn=txn, intent=intent, err=text)
                    time.sleep(0.2)
                    continue
                if err is not None and err.txn_requires_abort() and not err.fatal():
                    try:
                        p.abort_transaction(15)
                        h.write(
                            "txn_end",
                            txn=txn,
                            intent=intent,
                            result="aborted" if intent == "commit" else "ok",
                            err=text,
                        )
                        self.new_producer(deadline)
                    except KafkaException as exc2:
                        h.write("txn_end", txn=txn, intent=intent, result="unknown", err=err_text(exc2)[0])
                        self.recover(exc2, deadline)
                    return
                h.write("txn_end", txn=txn, intent=intent, result="unknown", err=text)
                self.recover(exc, deadline)
                return
        h.write("txn_end", txn=txn, intent=intent, result="unknown", err="retries exhausted")
        self.recover(None, deadline)

    def recover(self, exc: BaseException | None, deadline: float) -> None:
        """After an error we cannot continue from: a new producer generation (fences the old)."""
        err = err_text(exc)[1] if exc is not None else None
        if err is not None and not err.fatal():
            p = self.p
            assert p is not None
            try:  # an abortable state: abort (then a new producer, see ``end``)
                p.abort_transaction(15)
            except KafkaException:
                pass
        self.new_producer(deadline)


def run_txn(args: argparse.Namespace, h: HistoryWriter, rng: random.Random, deadline: float) -> int:
    w = TxnWriter(args, h, rng)
    if not w.new_producer(deadline):
        return 0
    while not stopping(args, deadline):
        w.one(deadline)
        time.sleep(rng.uniform(0, 0.05))
    h.write("done", txns=w.txns)
    return 0


# ---------------------------------------------------------------------------------- reader
def run_reader(args: argparse.Namespace, h: HistoryWriter, rng: random.Random, deadline: float) -> int:
    c = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"chaos-reader-{args.name}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed" if args.iso == "rc" else "read_uncommitted",
            "fetch.wait.max.ms": 200,
            "socket.timeout.ms": 5_000,
            # warnings (log truncation detected, offset resets) go to the reader's log file
            "log_level": 4,
            # CHAOS_READER_DEBUG=fetch,consumer (librdkafka debug contexts) to trace a reader
            **({"debug": debug, "log_level": 7} if (debug := os.environ.get("CHAOS_READER_DEBUG")) else {}),
        }
    )
    session = f"{os.getpid()}"
    c.assign([TopicPartition(args.topic, part, OFFSET_BEGINNING) for part in range(args.partitions)])
    n = 0
    while not stopping(args, deadline):
        recs = []
        for m in c.consume(num_messages=500, timeout=0.2):
            err = m.error()
            if err is not None:
                # e.g. a log truncation the consumer detected and the reset it made: the reason
                # behind an "order" anomaly (a read going backwards), kept for diagnosis
                h.write("consumer_error", p=m.partition(), err=f"{err.name()}: {err.str()}")
                continue
            recs.append([int(m.partition() or 0), int(m.offset() or 0), (m.value() or b"").decode()])
        if recs:
            n += len(recs)
            h.write("read", iso=args.iso, session=session, recs=recs)
    c.close()
    h.write("done", read=n)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=("idem", "txn", "reader"), required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--history", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iso", choices=("rc", "ru"), default="rc")
    ap.add_argument("--tid", default=None)
    ap.add_argument("--abort-prob", type=float, default=0.3)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    rng = random.Random(f"{args.seed}/{args.name}")
    h = HistoryWriter(Path(args.history), args.name.split("#")[0])
    h.write("start", pid=os.getpid(), role=args.role, name=args.name)
    deadline = time.monotonic() + args.max_seconds
    try:
        if args.role == "idem":
            return run_idem(args, h, rng, deadline)
        if args.role == "txn":
            return run_txn(args, h, rng, deadline)
        return run_reader(args, h, rng, deadline)
    finally:
        h.close()


if __name__ == "__main__":
    sys.exit(main())
