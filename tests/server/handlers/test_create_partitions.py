"""The sans-IO validation of CreatePartitions: Kafka's error codes and messages, in Kafka's order."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from exactly.server.handlers.create_partitions import (
    MAX_NEW_PARTITIONS_PER_REQUEST,
    TOO_LARGE_MESSAGE,
    ExistingTopic,
    Increase,
    Refusal,
    TopicRequest,
    plan,
)

LIVE = frozenset({0})
TOPICS = {
    "a": ExistingTopic(partitions=2, replication_factor=1, internal=False),
    "b": ExistingTopic(partitions=1, replication_factor=1, internal=False),
    "__consumer_offsets": ExistingTopic(partitions=50, replication_factor=1, internal=True),
}


def decide(*entries: TopicRequest, topics: dict[str, ExistingTopic] = TOPICS) -> list[Increase | Refusal]:
    return plan(list(entries), topics.get, LIVE)


def refusal(entry: TopicRequest, topics: dict[str, ExistingTopic] = TOPICS) -> tuple[ErrorCode, str | None]:
    (outcome,) = decide(entry, topics=topics)
    assert isinstance(outcome, Refusal), outcome
    return outcome.error_code, outcome.message


def test_increases_in_request_order() -> None:
    assert decide(TopicRequest("b", 4, None), TopicRequest("a", 3, None)) == [
        Increase("b", 1, 4),
        Increase("a", 2, 3),
    ]


def test_count_must_grow() -> None:
    assert refusal(TopicRequest("a", 2, None)) == (
        ErrorCode.invalid_partitions,
        "Topic already has 2 partitions.",
    )
    assert refusal(TopicRequest("a", 1, None)) == (
        ErrorCode.invalid_partitions,
        "Topic currently has 2 partitions, which is higher than the requested 1.",
    )
    assert refusal(TopicRequest("a", -1, None))[0] == ErrorCode.invalid_partitions


def test_unknown_topic() -> None:
    assert refusal(TopicRequest("nope", 3, None)) == (
        ErrorCode.unknown_topic_or_partition,
        "The topic 'nope' does not exist.",
    )


def test_duplicate_topic_gets_one_invalid_request_and_the_others_proceed() -> None:
    outcomes = decide(TopicRequest("a", 3, None), TopicRequest("b", 2, None), TopicRequest("a", 4, None))
    assert outcomes == [
        Refusal("a", ErrorCode.invalid_request, "Duplicate topic in request."),
        Increase("b", 1, 2),
    ]


def test_internal_topics_are_refused() -> None:
    code, message = refusal(TopicRequest("__consumer_offsets", 60, None))
    assert code == ErrorCode.policy_violation
    assert message is not None and "internal topic '__consumer_offsets'" in message


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        (((1,), (0,)), "Unknown broker(s) in replica assignment: 1."),
        (((0,), (3, 2)), "Unknown broker(s) in replica assignment: 2, 3."),
        (((0,),), "Increasing the number of partitions by 2 but 1 assignments provided."),
        ((), "Increasing the number of partitions by 2 but 0 assignments provided."),
        (((0,), (0,), (0,)), "Increasing the number of partitions by 2 but 3 assignments provided."),
        (((0,), ()), "Cannot have replication factor of 0 for partition id 3."),
        (((0, 0), (0,)), "Duplicate brokers not allowed in replica assignment: 0, 0 for partition id 2."),
    ],
)
def test_assignments_are_checked(assignments: tuple[tuple[int, ...], ...], message: str) -> None:
    assert refusal(TopicRequest("a", 4, assignments)) == (ErrorCode.invalid_replica_assignment, message)


def test_assignments_must_keep_the_replication_factor() -> None:
    topics = {"r": ExistingTopic(partitions=1, replication_factor=2, internal=False)}
    live = frozenset({0, 1, 2})
    (ok,) = plan([TopicRequest("r", 3, ((0, 1), (1, 2)))], topics.get, live)
    assert ok == Increase("r", 1, 3)
    (bad,) = plan([TopicRequest("r", 4, ((0, 1), (2,), (0, 1, 2)))], topics.get, live)
    assert bad == Refusal(
        "r",
        ErrorCode.invalid_replica_assignment,
        "Inconsistent replication factor between partitions, partition 0 has 2 while partitions "
        "[2, 3] have replication factors [1, 3], respectively.",
    )


def test_valid_assignments_on_one_broker() -> None:
    assert decide(TopicRequest("a", 4, ((0,), (0,)))) == [Increase("a", 2, 4)]


def test_one_request_adds_at_most_the_bound() -> None:
    big = 1 + MAX_NEW_PARTITIONS_PER_REQUEST
    assert decide(TopicRequest("b", big, None)) == [Increase("b", 1, big)]  # adds exactly the bound
    assert refusal(TopicRequest("b", big + 1, None)) == (ErrorCode.policy_violation, TOO_LARGE_MESSAGE)
    assert refusal(TopicRequest("b", 2**31 - 1, None)) == (ErrorCode.policy_violation, TOO_LARGE_MESSAGE)
    # the bound is per request: the second topic no longer fits
    outcomes = decide(
        TopicRequest("a", 2 + MAX_NEW_PARTITIONS_PER_REQUEST - 5, None), TopicRequest("b", 7, None)
    )
    assert outcomes == [
        Increase("a", 2, 2 + MAX_NEW_PARTITIONS_PER_REQUEST - 5),
        Refusal("b", ErrorCode.policy_violation, TOO_LARGE_MESSAGE),
    ]


def test_cluster_topics_queued_for_deletion_or_being_reassigned_are_refused() -> None:
    queued = {
        "a": ExistingTopic(partitions=2, replication_factor=1, internal=False, queued_for_deletion=True)
    }
    assert refusal(TopicRequest("a", 3, None), queued) == (
        ErrorCode.invalid_topic_exception,
        "The topic is queued for deletion.",
    )
    moving = {"a": ExistingTopic(partitions=2, replication_factor=1, internal=False, being_reassigned=True)}
    assert refusal(TopicRequest("a", 3, None), moving) == (
        ErrorCode.reassignment_in_progress,
        "A partition reassignment is in progress for the topic 'a'.",
    )
