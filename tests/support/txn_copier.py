"""A consume-transform-produce copier process (confluent-kafka) for the zombie-fencing tests.

    python -m tests.support.txn_copier --bootstrap HOST:PORT --input IN --output OUT --group G \\
        --tid-prefix PFX --tid-mode {partition,process} --name NAME [--batch 10] [--freeze-on-batch K]

A group consumer (read_committed, manual commits) reads batches from IN; each batch is written to
OUT (same partition, key ``"<partition>:<offset>"`` of the input record, value ``b"copy:" + value``)
inside a transaction that also commits the consumed offsets (``send_offsets_to_transaction`` with
the consumer group metadata *captured when the batch was read*, as KIP-447 wants).

``--tid-mode partition``: one transactional producer per input partition, transactional.id
``PFX-IN-<partition>`` (the pre-KIP-447 design: whoever owns the partition owns the id, and a
successor's InitProducerId fences the zombie). ``--tid-mode process``: one producer per process,
transactional.id ``PFX-NAME`` (KIP-447: the group generation in TxnOffsetCommit fences the zombie).

``--abort-prob P`` (default 0): after producing (and flushing) a batch, abort its transaction on
purpose with probability P and seek the consumer back to the batch's first offsets, so the batch
is copied again (Kafka's TransactionalMessageCopier does this in transactions_test.py).

``--freeze-on-batch K``: after producing (and flushing) the K-th batch and before committing it, the
process stops itself with SIGSTOP - the zombie: frozen mid-transaction until someone sends SIGCONT.

The process exits 0 once it owns every partition of IN and its position is at IN's end (taken at
start), 3 when a commit fails (after aborting if the error allows it), 2 on other errors. It reports
progress as JSON lines on stdout: assigned, batch, freezing, resumed, committed, commit_failed,
aborted, done.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

OFFSET_INVALID = -1001


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def error_fields(exc: KafkaException) -> dict[str, Any]:
    err = exc.args[0]
    if not isinstance(err, KafkaError):
        return {"error": repr(exc), "code": None, "fatal": False, "abortable": False, "retriable": False}
    return {
        "error": err.str(),
        "code": err.name(),
        "fatal": err.fatal(),
        "abortable": err.txn_requires_abort(),
        "retriable": err.retriable(),
    }


def _debug_config() -> dict[str, Any]:
    """``COPIER_RDKAFKA_DEBUG=eos,protocol`` turns on librdkafka's debug log (to stderr), for
    finding out what a stuck transactional call waits for."""
    debug = os.environ.get("COPIER_RDKAFKA_DEBUG")
    return {"debug": debug, "log_level": 7} if debug else {}


class Copier:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.consumer = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": args.group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": args.session_timeout_ms,
                "heartbeat.interval.ms": 300,
                "max.poll.interval.ms": max(10_000, args.session_timeout_ms),
                "fetch.wait.max.ms": 100,
                "log_level": 3,
            }
        )
        self.producers: dict[str, Producer] = {}
        self.assigned: set[int] = set()
        self.batches = 0
        self.copied = 0
        self.rng = random.Random(args.seed if args.seed is not None else os.getpid())

    def producer(self, key: str) -> Producer:
        p = self.producers.get(key)
        if p is None:
            p = Producer(
                {
                    "bootstrap.servers": self.args.bootstrap,
                    "transactional.id": f"{self.args.tid_prefix}-{key}",
                    "transaction.timeout.ms": self.args.txn_timeout_ms,
                    "linger.ms": 5,
                    "log_level": 3,
                    **_debug_config(),
                }
            )
            self.call("init_transactions")
            p.init_transactions(
                self.args.api_timeout_s
            )  # fences any older instance with this transactional.id
            self.producers[key] = p
        return p

    def on_assign(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        self.assigned |= {tp.partition for tp in parts}
        emit("assigned", partitions=sorted(self.assigned))

    def on_revoke(self, _c: Consumer, parts: list[TopicPartition]) -> None:
        self.assigned -= {tp.partition for tp in parts}
        emit("revoked", partitions=sorted(tp.partition for tp in parts))

    def run(self) -> int:
        args = self.args
        c = self.consumer
        all_parts = list(c.list_topics(args.input, timeout=10).topics[args.input].partitions)
        ends = {
            p: c.get_watermark_offsets(TopicPartition(args.input, p), timeout=10, cached=False)[1]
            for p in all_parts
        }
        c.subscribe([args.input], on_assign=self.on_assign, on_revoke=self.on_revoke)
        while True:
            msgs = [m for m in c.consume(num_messages=args.batch, timeout=0.2) if m.error() is None]
            if msgs:
                group_metadata = c.consumer_group_metadata()  # the generation these records were read in
                rc = self.process(msgs, group_metadata)
                if rc is not None:
                    return rc
            elif self.finished(ends):
                emit("done", copied=self.copied, batches=self.batches)
                return 0

    def finished(self, ends: dict[int, int]) -> bool:
        if self.assigned != set(ends):
            return False
        tps = [TopicPartition(self.args.input, p) for p in sorted(ends)]
        positions = {tp.partition: tp.offset for tp in self.consumer.position(tps)}
        if any(off == OFFSET_INVALID for off in positions.values()):
            committed = {tp.partition: tp.offset for tp in self.consumer.committed(tps, timeout=10)}
            positions = {
                p: off if off != OFFSET_INVALID else committed.get(p, OFFSET_INVALID)
                for p, off in positions.items()
            }
        return all(positions[p] >= end for p, end in ends.items())

    def process(self, msgs: list[Any], group_metadata: Any) -> int | None:
        args = self.args
        self.batches += 1
        if args.tid_mode == "process":
            units = [(args.name, msgs)]
        else:
            by_part: dict[int, list[Any]] = {}
            for m in msgs:
                by_part.setdefault(int(m.partition()), []).append(m)
            units = [(f"{args.input}-{p}", ms) for p, ms in sorted(by_part.items())]
        for key, unit in units:
            rc = self.transaction(
                self.producer(key), unit, group_metadata, freeze=self.batches == args.freeze_on_batch
            )
            if rc is not None:
                return rc
        return None

    def transaction(self, p: Producer, msgs: list[Any], group_metadata: Any, freeze: bool) -> int | None:
        args = self.args
        nxt: dict[int, int] = {}
        p.begin_transaction()
        for m in msgs:
            part, off = int(m.partition()), int(m.offset())
            p.produce(
                args.output, key=f"{part}:{off}".encode(), value=b"copy:" + (m.value() or b""), partition=part
            )
            nxt[part] = off + 1
        if p.flush(30) != 0:
            emit(
                "commit_failed",
                error="flush timed out",
                code=None,
                fatal=False,
                abortable=True,
                retriable=True,
            )
            return 2
        keys = [f"{int(m.partition())}:{int(m.offset())}" for m in msgs]
        emit("batch", n=len(msgs), keys=keys, offsets={str(k): v for k, v in nxt.items()})
        if args.abort_prob > 0 and self.rng.random() < args.abort_prob:
            self.call("abort_transaction")
            p.abort_transaction(self.args.api_timeout_s)
            firsts: dict[int, int] = {}
            for m in msgs:
                firsts.setdefault(int(m.partition()), int(m.offset()))
            for part, off in firsts.items():
                self.consumer.seek(TopicPartition(args.input, part, off))
            emit("aborted_on_purpose", keys=keys)
            return None
        if freeze:
            emit("freezing", pid=os.getpid())
            os.kill(os.getpid(), signal.SIGSTOP)
            emit("resumed")
        try:
            offsets = [TopicPartition(args.input, part, off) for part, off in sorted(nxt.items())]
            self.call("send_offsets_to_transaction")
            p.send_offsets_to_transaction(offsets, group_metadata, self.args.api_timeout_s)
            self.call("commit_transaction")
            p.commit_transaction(self.args.api_timeout_s)
        except KafkaException as exc:
            info = error_fields(exc)
            emit("commit_failed", keys=keys, **info)
            if info["abortable"]:
                try:
                    self.call("abort_transaction")
                    p.abort_transaction(self.args.api_timeout_s)
                    emit("aborted", keys=keys)
                except KafkaException as exc2:
                    emit("abort_failed", **error_fields(exc2))
            return 3
        self.copied += len(msgs)
        emit("committed", n=len(msgs), keys=keys, offsets={str(k): v for k, v in nxt.items()})
        return None

    def call(self, api: str) -> None:
        """Announce a blocking transactional call. A supervisor that sees this as the last event
        long after ``--api-timeout-s`` knows the call outlived its own timeout: librdkafka 2.16's
        send_offsets_to_transaction can wait forever for a group coordinator that its re-bootstrap
        decommissioned (confluentinc/librdkafka#5511, #5456), which a single broker's restart
        triggers."""
        emit("call", api=api, timeout_s=self.args.api_timeout_s)

    def close(self) -> None:
        try:
            self.consumer.close()
        except Exception as exc:  # a fenced zombie may fail to leave cleanly; the test does not care
            emit("close_failed", error=repr(exc))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--tid-prefix", required=True)
    ap.add_argument("--tid-mode", choices=("partition", "process"), default="partition")
    ap.add_argument("--name", default="copier")
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--freeze-on-batch", type=int, default=0)
    ap.add_argument("--session-timeout-ms", type=int, default=3000)
    ap.add_argument("--txn-timeout-ms", type=int, default=60_000)
    ap.add_argument("--api-timeout-s", type=float, default=30.0)
    ap.add_argument("--abort-prob", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    copier = Copier(args)
    try:
        return copier.run()
    except KafkaException as exc:
        emit("error", **error_fields(exc))
        return 2
    finally:
        copier.close()


if __name__ == "__main__":
    sys.exit(main())
