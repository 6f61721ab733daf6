"""Riding out a leader or coordinator change, as Kafka's Java clients (and Spark's Kafka connector,
which uses them) do.

librdkafka retries produce and fetch requests itself, but some calls hand a transient error to
the application: the watermark and ListOffsets lookups (``get_watermark_offsets``,
``AdminClient.list_offsets``) answer NOT_LEADER_OR_FOLLOWER, OFFSET_NOT_AVAILABLE (a new leader
whose high watermark has not caught up with its epoch yet) or a transport error while a
partition's leadership moves to another broker; ``init_transactions`` and ``commit_transaction``
give up with a retriable error when the transaction coordinator is away for longer than their
timeout; a consumer's poll reports a lost broker connection as an error event. The Java clients
retry such errors until ``default.api.timeout.ms``; ``call_retrying`` does the same until a
deadline, and anything else - fatal errors (a fenced producer), errors that need an abort,
configuration errors - is raised at once (the Spark task fails; its retry starts from scratch with
a new client).

Retriable: ``KafkaError.retriable()`` says so, or the code is one of ``LEADERSHIP_MOVED`` (codes
that mean "ask again, maybe elsewhere", which librdkafka does not flag retriable on every API).
Never retriable: ``KafkaError.fatal()``, ``txn_requires_abort()`` (the transaction must be aborted
first), and a ``KafkaException`` carrying a plain message rather than a ``KafkaError``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

log = logging.getLogger("exactly.spark.retries")

T = TypeVar("T")

LEADERSHIP_MOVED = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_OR_PART,  # metadata of a broker that has not heard of it yet
        # librdkafka's local form of the same: its metadata (from a broker just restarted, say)
        # does not list the partition yet; a kept client asks again on its next refresh
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
    }
)
MAX_BACKOFF_S = 1.0


def retriable(error: object) -> bool:
    """Whether a ``KafkaError`` (or a ``KafkaException`` carrying one) may be retried as is."""
    if isinstance(error, KafkaException):
        error = error.args[0] if error.args else None
    if not isinstance(error, KafkaError):
        return False
    if error.fatal() or error.txn_requires_abort():
        return False
    return bool(error.retriable()) or error.code() in LEADERSHIP_MOVED


def call_retrying(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """``call()``, again after a retriable ``KafkaException`` (backoff 0.1 s doubling to 1 s)
    until ``timeout_s`` passed; the last error is raised then, a non-retriable one at once."""
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        try:
            return call()
        except KafkaException as exc:
            if not retriable(exc) or time.monotonic() + delay > deadline:
                raise
            log.info("%s: %s; retrying in %.1fs", what, exc.args[0], delay)
        time.sleep(delay)  # backoff between attempts, not a synchronisation
        delay = min(delay * 2, MAX_BACKOFF_S)
