"""CreatePartitions (37): grow topics' partition counts, v0-v3 (v2+ flexible).

Validation follows Kafka's ZooKeeper-mode broker (KafkaApis.handleCreatePartitionsRequest,
ZkAdminManager.createPartitions, AdminZkClient.validateReplicaAssignment), with its error codes
and messages, in its order:

1. a topic named more than once in the request: INVALID_REQUEST (one result for the name);
2. an unknown topic: UNKNOWN_TOPIC_OR_PARTITION;
3. a count that is not an increase: INVALID_PARTITIONS ("Topic already has N partitions." when
   equal, "... which is higher than the requested M." when smaller);
4. manual assignments: every broker id must be a live broker, there must be exactly one
   assignment per new partition, none empty, no broker twice, and each with the replication
   factor of partition 0 - INVALID_REPLICA_ASSIGNMENT;
5. ``validate_only``: the same answers, nothing changes;
6. ``timeout_ms <= 0`` (and not validate_only): the partitions are created and the topic is
   answered REQUEST_TIMED_OUT, as Kafka does when not asked to wait (librdkafka hides that code
   when its operation timeout is 0).

Deliberate differences, and why:

* Internal topics (``__consumer_offsets``, ``__transaction_state``) are refused with
  POLICY_VIOLATION. Kafka accepts the request, but a group's or transactional id's coordinator
  partition is ``hash % partition count``: a new count moves them (after the next start) to
  partitions that do not hold their state, silently losing committed offsets and open
  transactions.
* At most MAX_NEW_PARTITIONS_PER_REQUEST partitions are added by one request; a topic that
  would go beyond gets POLICY_VIOLATION with the message Kafka's KRaft controller uses for an
  over-large operation (its bound is the same 10,000 metadata records). The ZooKeeper broker has
  no bound; here every partition is a directory with open files, so a count of 2**31 - 1 would
  take the broker down.
* No topic is ever "queued for deletion" (Kafka: INVALID_TOPIC_EXCEPTION): deletion completes
  inside the DeleteTopics request.

New partitions get the topic's config (its overrides over the broker defaults) and start empty at
leader epoch 0; Metadata lists them at once. The change is persisted by LogManager.add_partitions
(see its crash-safety notes).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.protocol.apis import ApiKey, build
from exactly.server.clock import now_ms
from exactly.storage.log_manager import InvalidPartitionsError, UnknownTopicError
from exactly.topics import INTERNAL_TOPICS

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.dispatch import RequestContext

API_KEY = ApiKey.CREATE_PARTITIONS

log = logging.getLogger("exactly.admin")

MAX_NEW_PARTITIONS_PER_REQUEST = 10_000
TOO_LARGE_MESSAGE = "Unable to perform excessively large batch operation."


@dataclass(frozen=True, slots=True)
class TopicRequest:
    """One topic entry of the request, as plain values."""

    name: str
    count: int
    assignments: tuple[tuple[int, ...], ...] | None  # one replica list per new partition


@dataclass(frozen=True, slots=True)
class ExistingTopic:
    """What validation needs to know of a topic that exists."""

    partitions: int
    replication_factor: int  # of partition 0, which new assignments must match
    internal: bool


@dataclass(frozen=True, slots=True)
class Increase:
    """A valid entry: grow ``name`` from ``current`` to ``count`` partitions."""

    name: str
    current: int
    count: int


@dataclass(frozen=True, slots=True)
class Refusal:
    name: str
    error_code: ErrorCode
    message: str | None


def plan(
    topics: Sequence[TopicRequest],
    existing: Callable[[str], ExistingTopic | None],
    live_brokers: frozenset[int],
) -> list[Increase | Refusal]:
    """Decide every entry of a request without changing anything: one outcome per distinct
    topic name, in the order the names first appear."""
    counts: dict[str, int] = {}
    for t in topics:
        counts[t.name] = counts.get(t.name, 0) + 1
    outcomes: list[Increase | Refusal] = []
    budget = MAX_NEW_PARTITIONS_PER_REQUEST
    done: set[str] = set()
    for t in topics:
        if t.name in done:
            continue
        done.add(t.name)
        if counts[t.name] > 1:
            outcomes.append(Refusal(t.name, ErrorCode.invalid_request, "Duplicate topic in request."))
            continue
        outcome = check_topic(t, existing(t.name), live_brokers)
        if isinstance(outcome, Increase):
            added = outcome.count - outcome.current
            if added > budget:
                outcome = Refusal(t.name, ErrorCode.policy_violation, TOO_LARGE_MESSAGE)
            else:
                budget -= added
        outcomes.append(outcome)
    return outcomes


def check_topic(
    t: TopicRequest, topic: ExistingTopic | None, live_brokers: frozenset[int]
) -> Increase | Refusal:
    """Kafka's checks for one topic entry, in Kafka's order."""
    if topic is None:
        return Refusal(t.name, ErrorCode.unknown_topic_or_partition, f"The topic '{t.name}' does not exist.")
    if topic.internal:
        return Refusal(
            t.name,
            ErrorCode.policy_violation,
            f"The partition count of the internal topic '{t.name}' cannot change: it decides "
            "which partition holds each coordinator's state.",
        )
    increase = t.count - topic.partitions
    if increase < 0:
        return Refusal(
            t.name,
            ErrorCode.invalid_partitions,
            f"Topic currently has {topic.partitions} partitions, which is higher than the requested {t.count}.",
        )
    if increase == 0:
        return Refusal(
            t.name, ErrorCode.invalid_partitions, f"Topic already has {topic.partitions} partitions."
        )
    if t.assignments is not None:
        problem = assignment_error(t.assignments, increase, topic, live_brokers)
        if problem is not None:
            return Refusal(t.name, ErrorCode.invalid_replica_assignment, problem)
    return Increase(t.name, topic.partitions, t.count)


def assignment_error(
    assignments: tuple[tuple[int, ...], ...],
    increase: int,
    topic: ExistingTopic,
    live_brokers: frozenset[int],
) -> str | None:
    """Why manual assignments for the new partitions are invalid, or None (Kafka's messages)."""
    unknown = {b for replicas in assignments for b in replicas} - live_brokers
    if unknown:
        return f"Unknown broker(s) in replica assignment: {_join(sorted(unknown))}."
    if len(assignments) != increase:
        return (
            f"Increasing the number of partitions by {increase} but {len(assignments)} assignments provided."
        )
    for index, replicas in enumerate(assignments):
        partition = topic.partitions + index
        if not replicas:
            return f"Cannot have replication factor of 0 for partition id {partition}."
        if len(set(replicas)) != len(replicas):
            return (
                f"Duplicate brokers not allowed in replica assignment: {_join(replicas)} "
                f"for partition id {partition}."
            )
    bad = [
        (topic.partitions + index, len(replicas))
        for index, replicas in enumerate(assignments)
        if len(replicas) != topic.replication_factor
    ]
    if bad:
        return (
            "Inconsistent replication factor between partitions, partition 0 has "
            f"{topic.replication_factor} while partitions [{_join(p for p, _ in bad)}] have "
            f"replication factors [{_join(rf for _, rf in bad)}], respectively."
        )
    return None


def _join(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in values)


# ---- the request ------------------------------------------------------------------------------
async def handle(broker: Broker, ctx: RequestContext, request: Any) -> Any:
    mod = ctx.api.response_module
    topics = [
        TopicRequest(
            name=t.name,
            count=int(t.count),
            assignments=None
            if t.assignments is None
            else tuple(tuple(int(b) for b in a.broker_ids) for a in t.assignments),
        )
        for t in request.topics
    ]
    timeout_ms = request.timeout // datetime.timedelta(milliseconds=1)
    if broker.replicas is not None:
        # Cluster mode does not grow topics yet (the controller has no partition-addition event);
        # refused rather than growing only this broker's local copy.
        refusal = "CreatePartitions is not supported in cluster mode yet"
        for _topic in request.topics:
            broker.metrics.error(ApiKey.CREATE_PARTITIONS, ErrorCode.invalid_request)
        return build(
            ctx.api.response_type,
            results=tuple(
                build(
                    mod.CreatePartitionsTopicResult,
                    name=t.name,
                    error_code=ErrorCode.invalid_request,
                    error_message=refusal,
                )
                for t in request.topics
            ),
        )

    def existing(name: str) -> ExistingTopic | None:
        info = broker.logs.topic(name)
        if info is None:
            return None
        return ExistingTopic(info.partitions, 1, info.internal or name in INTERNAL_TOPICS)

    results = []
    for outcome in plan(topics, existing, frozenset({broker.node_id})):
        if isinstance(outcome, Increase):
            code, message = _apply(broker, outcome, request.validate_only, timeout_ms)
        else:
            code, message = outcome.error_code, outcome.message
            log.info("CreatePartitions for topic %s refused: %s (%s)", outcome.name, code.name, message)
        broker.metrics.error(ApiKey.CREATE_PARTITIONS, code)
        results.append(
            build(mod.CreatePartitionsTopicResult, name=outcome.name, error_code=code, error_message=message)
        )
    return build(ctx.api.response_type, results=tuple(results))


def _apply(
    broker: Broker, increase: Increase, validate_only: bool, timeout_ms: int
) -> tuple[ErrorCode, str | None]:
    if validate_only:
        return ErrorCode.none, None
    try:
        broker.logs.add_partitions(increase.name, increase.count, now_ms=now_ms())
    except UnknownTopicError as exc:  # not reachable on one loop; kept for the storage contract
        return ErrorCode.unknown_topic_or_partition, str(exc)
    except InvalidPartitionsError as exc:
        return ErrorCode.invalid_partitions, str(exc)
    except OSError as exc:
        log.error("could not add partitions to topic %s: %s", increase.name, exc)
        return ErrorCode.kafka_storage_error, str(exc)
    log.info("topic %s now has %d partitions (was %d)", increase.name, increase.count, increase.current)
    if timeout_ms <= 0:
        return ErrorCode.request_timed_out, None
    return ErrorCode.none, None
