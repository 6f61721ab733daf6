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

Cluster mode (``zookeeper.connect``) takes Kafka's ZooKeeper admin path (ZkAdminManager.
createPartitions): the same checks against the assignment read from ZooKeeper and the live
brokers, plus Kafka's INVALID_TOPIC_EXCEPTION for a topic queued for deletion and
REASSIGNMENT_IN_PROGRESS; the new partitions' replicas are the request's or Kafka's placement
(``assign_added_partitions``; INVALID_REPLICATION_FACTOR when fewer brokers are live than the
topic's replication factor); ``/brokers/topics/<t>`` is rewritten with the topic id kept; the
controller's assignment watch creates the new partitions' states and each hosting broker its
replica; the answer waits until every partition has a leader. Differences from Kafka: any broker
answers (Kafka's ZooKeeper mode sends NOT_CONTROLLER from the others, as for CreateTopics), and
the rewrite is conditional on the version read, so two requests racing on different brokers
cannot drop each other's partitions (the second is checked again against the first's result).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.controller.assignment import InvalidPartitionsError as PlacementError
from exactly.controller.assignment import InvalidReplicationFactorError
from exactly.protocol.apis import ApiKey, build
from exactly.server.authz import ALTER, TOPIC, authorize
from exactly.server.clock import now_ms
from exactly.storage.log_manager import InvalidPartitionsError, UnknownTopicError
from exactly.topics import INTERNAL_TOPICS

if TYPE_CHECKING:
    from exactly.server.broker import Broker
    from exactly.server.cluster_topics import ClusterTopics, ObservedTopic
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
    """What validation needs to know of a topic that exists (the last two only in cluster mode)."""

    partitions: int
    replication_factor: int  # of partition 0, which new assignments must match
    internal: bool
    queued_for_deletion: bool = False
    being_reassigned: bool = False


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
    if topic.queued_for_deletion:
        return Refusal(t.name, ErrorCode.invalid_topic_exception, "The topic is queued for deletion.")
    if topic.being_reassigned:
        return Refusal(
            t.name,
            ErrorCode.reassignment_in_progress,
            f"A partition reassignment is in progress for the topic '{t.name}'.",
        )
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
    # ALTER on each topic, before anything looks the topic up
    denied = [
        build(
            mod.CreatePartitionsTopicResult,
            name=t.name,
            error_code=ErrorCode.topic_authorization_failed,
            error_message="Authorization failed.",
        )
        for t in topics
        if not authorize(broker, ctx, ALTER, TOPIC, t.name)
    ]
    for _ in denied:
        broker.metrics.error(ApiKey.CREATE_PARTITIONS, ErrorCode.topic_authorization_failed)
    refused_names = {r.name for r in denied}
    topics = [t for t in topics if t.name not in refused_names]
    timeout_ms = request.timeout // datetime.timedelta(milliseconds=1)
    if broker.replicas is not None:
        outcomes = await _create_in_cluster(broker.replicas.topics, topics, request.validate_only, timeout_ms)
        results = list(denied)
        for name, code, message in outcomes:
            broker.metrics.error(ApiKey.CREATE_PARTITIONS, code)
            results.append(
                build(mod.CreatePartitionsTopicResult, name=name, error_code=code, error_message=message)
            )
        return build(ctx.api.response_type, results=tuple(results))

    def existing(name: str) -> ExistingTopic | None:
        info = broker.logs.topic(name)
        if info is None:
            return None
        return ExistingTopic(info.partitions, 1, info.internal or name in INTERNAL_TOPICS)

    results = list(denied)
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


# ---- cluster mode -----------------------------------------------------------------------------
MAX_WRITE_ROUNDS = 5  # conditional rewrites of one topic's assignment before giving up


async def _create_in_cluster(
    cluster: ClusterTopics, topics: Sequence[TopicRequest], validate_only: bool, timeout_ms: int
) -> list[tuple[str, ErrorCode, str | None]]:
    """Kafka's ZooKeeper admin path: the same checks against the assignments read from ZooKeeper
    and the live brokers, a conditional rewrite of every valid topic's ``/brokers/topics/<t>``
    (the controller then creates the new partitions' states, the hosting brokers their
    replicas), and one wait, bounded by the request's timeout, until every grown topic has a
    leader for every partition (Kafka's DelayedCreatePartitions)."""
    observed = {name: await cluster.read_topic(name) for name in dict.fromkeys(t.name for t in topics)}
    live = frozenset(cluster.cache.brokers)
    requests = {t.name: t for t in topics}
    answers: dict[str, tuple[ErrorCode, str | None]] = {}
    grown: dict[str, int] = {}  # topic -> the count written
    for outcome in plan(topics, lambda name: _existing(cluster, name, observed[name]), live):
        if isinstance(outcome, Refusal):
            answers[outcome.name] = outcome.error_code, outcome.message
            continue
        answer = await _grow_in_cluster(
            cluster, requests[outcome.name], observed[outcome.name], live, validate_only
        )
        if answer is None:
            grown[outcome.name] = requests[outcome.name].count
        else:
            answers[outcome.name] = answer
    deadline = time.monotonic() + timeout_ms / 1000
    for name, count in grown.items():
        if timeout_ms <= 0:
            answers[name] = ErrorCode.request_timed_out, None
        elif await cluster.wait_for_partitions(name, count, deadline - time.monotonic()):
            answers[name] = ErrorCode.none, None
        else:
            answers[name] = (
                ErrorCode.request_timed_out,
                f"Timed out waiting for leaders of {name}'s new partitions",
            )
    for name, (code, message) in answers.items():
        if code not in (ErrorCode.none, ErrorCode.request_timed_out):
            log.info("CreatePartitions for topic %s refused: %s (%s)", name, code.name, message)
    return [(name, *answers[name]) for name in observed]


def _existing(cluster: ClusterTopics, name: str, observed: ObservedTopic | None) -> ExistingTopic | None:
    if observed is None:
        # The coordinators' internal topics may still be local to each broker: refused all the same.
        local = cluster.logs.topic(name) if name in INTERNAL_TOPICS else None
        return None if local is None else ExistingTopic(local.partitions, 1, internal=True)
    partitions = observed.assignment.partitions
    return ExistingTopic(
        partitions=len(partitions),
        replication_factor=len(partitions.get(0, ())),
        internal=name in INTERNAL_TOPICS,
        queued_for_deletion=observed.queued_for_deletion,
        being_reassigned=observed.being_reassigned,
    )


async def _grow_in_cluster(
    cluster: ClusterTopics,
    request: TopicRequest,
    observed: ObservedTopic | None,
    live: frozenset[int],
    validate_only: bool,
) -> tuple[ErrorCode, str | None] | None:
    """Place and write conditionally (None: written). A lost race (another request changed the
    assignment since it was read) reads and checks again, so the answer is the one this request
    would have got had it come second: usually INVALID_PARTITIONS."""
    for _round in range(MAX_WRITE_ROUNDS):
        assert observed is not None  # checked by the caller's plan, or below
        try:
            grown = cluster.place_added_partitions(observed.assignment, request.count, request.assignments)
        except InvalidReplicationFactorError as exc:  # more replicas than live brokers
            return ErrorCode.invalid_replication_factor, str(exc)
        except PlacementError as exc:  # an assignment in ZooKeeper without partition 0
            return ErrorCode.invalid_partitions, str(exc)
        if validate_only:
            return ErrorCode.none, None
        if await cluster.write_assignment(request.name, grown, observed.zk_version):
            log.info(
                "topic %s grows from %d to %d partitions",
                request.name,
                len(observed.assignment.partitions),
                request.count,
            )
            return None
        log.info("assignment of topic %s changed since it was read: checking again", request.name)
        observed = await cluster.read_topic(request.name)
        outcome = check_topic(request, _existing(cluster, request.name, observed), live)
        if isinstance(outcome, Refusal):
            return outcome.error_code, outcome.message
    log.warning("CreatePartitions for %s kept racing with other assignment changes", request.name)
    return ErrorCode.unknown_server_error, "The topic's assignment kept changing; try again."
