"""TransactionCoordinator driven through its results (writes with completions, marker effects),
as the coordinator runtime drives it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from exactly.coordinator.result import AppendOutcome, CoordinatorResult, Write
from exactly.coordinator.txn import (
    AddOffsetsResult,
    AddPartitionsResult,
    AppendPurpose,
    EndTxnResult,
    InitProducerIdResult,
    TransactionState,
    TxnCoordinatorConfig,
    WriteMarkers,
)
from exactly.coordinator.txn.log import (
    CONSUMER_OFFSETS_TOPIC,
    decode_key,
    decode_value,
    encode_key,
    encode_transit,
    offsets_partition_for,
    partition_for,
)
from exactly.records.control import ControlType
from exactly.types import MAX_PRODUCER_EPOCH, TopicPartition

from .harness import T0, TIMEOUT_MS, Shell, tp

E = ErrorCode
S = TransactionState
TID = "txn-a"


def logged_states(shell: Shell) -> list[TransactionState | None]:
    return [None if v is None else S.from_id(decode_value(v).transaction_status) for _, _, v in shell.log]


def only_write(result: CoordinatorResult[Any]) -> Write:
    """The single ``__transaction_state`` write of ``result``."""
    assert result.response is None  # nothing is answered before the append is durable
    (write,) = result.writes
    return write


def done(write: Write, error: ErrorCode = ErrorCode.none, *, now: int = T0) -> CoordinatorResult[Any]:
    """Report ``write`` as the runtime would (no log kept: the write is not replayed)."""
    return write.complete(AppendOutcome(now_ms=now, error=error))


def markers_of(result: CoordinatorResult[Any]) -> tuple[WriteMarkers, ...]:
    assert all(isinstance(e, WriteMarkers) for e in result.effects)
    return tuple(e for e in result.effects if isinstance(e, WriteMarkers))


def started(shell: Shell, tid: str = TID, *partitions: TopicPartition) -> InitProducerIdResult:
    """InitProducerId + AddPartitions: an Ongoing transaction."""
    r = shell.init(tid)
    assert r.error == E.none
    assert (
        shell.add(tid, r.producer_id, r.producer_epoch, *(partitions or (tp("out", 0), tp("out", 1)))).error
        == E.none
    )
    return r


# -- happy paths --------------------------------------------------------------------------------


def test_init_creates_id_with_epoch_zero() -> None:
    shell = Shell()
    write = only_write(shell.coord.init_producer_id(TID, TIMEOUT_MS, now_ms=T0))
    assert write.describe == f"{AppendPurpose.INIT_PRODUCER_ID.value} {TID}"
    assert write.partition == partition_for(TID) and not write.transactional
    ((key, value),) = write.records
    assert decode_key(key) == TID and value is not None
    assert (decode_value(value).producer_id, decode_value(value).producer_epoch) == (1000, 0)
    assert shell.txn(TID).producer_epoch == -1
    assert done(write).response == InitProducerIdResult(E.none, 1000, 0)
    assert shell.txn(TID).state is S.EMPTY


def test_commit_flow_end_to_end() -> None:
    shell = Shell()
    r = started(shell)
    end = only_write(shell.coord.end_txn(TID, r.producer_id, r.producer_epoch, True, now_ms=T0 + 5))
    prepared = done(end, now=T0 + 6)
    assert prepared.response == EndTxnResult(E.none, r.producer_id, r.producer_epoch)
    (markers,) = markers_of(prepared)
    assert markers == WriteMarkers(TID, r.producer_id, r.producer_epoch, 0, ControlType.COMMIT,
                                   frozenset({tp("out", 0), tp("out", 1)}))  # fmt: skip
    assert shell.txn(TID).state is S.PREPARE_COMMIT
    complete = only_write(
        shell.coord.on_markers_written(TID, r.producer_id, r.producer_epoch, ControlType.COMMIT)
    )
    assert complete.describe == f"{AppendPurpose.COMPLETE.value} {TID}"
    assert shell.txn(TID).state is S.PREPARE_COMMIT
    assert done(complete, now=T0 + 7).empty
    txn = shell.coord.transaction(TID)
    assert txn is not None and (txn.state, txn.partitions, txn.producer_epoch) == (
        S.COMPLETE_COMMIT,
        frozenset(),
        0,
    )


def test_abort_flow_persists_every_step() -> None:
    shell = Shell()
    r = started(shell)
    assert shell.end(TID, r.producer_id, r.producer_epoch, False) == EndTxnResult(E.none, 1000, 0)
    assert [m.result for m in shell.markers] == [ControlType.ABORT]
    assert logged_states(shell) == [S.EMPTY, S.ONGOING, S.PREPARE_ABORT, S.COMPLETE_ABORT]


def test_next_transaction_reuses_producer_and_restarts_clock() -> None:
    shell = Shell()
    r = started(shell)
    shell.end(TID, r.producer_id, r.producer_epoch, True)
    shell.now += 1000
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("x")).error == E.none
    txn = shell.coord.transaction(TID)
    assert txn is not None and (txn.state, txn.partitions, txn.txn_start_timestamp) == (
        S.ONGOING,
        {tp("x")},
        shell.now,
    )


def test_add_offsets_adds_the_group_partition() -> None:
    shell = Shell()
    r = shell.init(TID)
    assert shell.add_offsets(TID, r.producer_id, r.producer_epoch, "my-group") == AddOffsetsResult(E.none)
    group_tp = TopicPartition(CONSUMER_OFFSETS_TOPIC, offsets_partition_for("my-group"))
    assert group_tp == TopicPartition("__consumer_offsets", 12)  # Java: abs("my-group".hashCode()) % 50
    assert shell.txn(TID).partitions == {group_tp}
    shell.end(TID, r.producer_id, r.producer_epoch, True)
    assert shell.markers[-1].partitions == {group_tp}


def test_adding_known_partitions_needs_no_append() -> None:
    shell = Shell()
    r = started(shell, TID, tp("a"), tp("b"))
    appends = shell.appends
    step = shell.coord.add_partitions_to_txn(TID, r.producer_id, r.producer_epoch, [tp("a")], now_ms=T0)
    assert step.writes == () and step.response == AddPartitionsResult(((tp("a"), E.none),))
    step2 = shell.coord.add_offsets_to_txn(TID, r.producer_id, r.producer_epoch, "g", now_ms=T0)
    only_write(step2)  # the group partition is new
    assert shell.appends == appends


def test_add_partitions_response_lists_each_requested_partition_once() -> None:
    shell = Shell()
    r = shell.init(TID)
    res = shell.add(TID, r.producer_id, r.producer_epoch, tp("a"), tp("b"), tp("a"))
    assert res.as_dict() == {tp("a"): E.none, tp("b"): E.none} and len(res.partition_errors) == 2


def test_null_transactional_id_gets_fresh_idempotent_producer() -> None:
    shell = Shell()
    step = shell.coord.init_producer_id(None, 0, now_ms=T0)
    assert step.writes == () and step.response == InitProducerIdResult(E.none, 1000, 0)
    assert list(shell.coord.transactional_ids()) == []


# -- EndTxn retries and wrong states ------------------------------------------------------------


def test_retried_end_txn_after_completion() -> None:
    shell = Shell()
    r = started(shell)
    shell.end(TID, r.producer_id, r.producer_epoch, True)
    appends = shell.appends
    assert shell.end(TID, r.producer_id, r.producer_epoch, True) == EndTxnResult(E.none, 1000, 0)
    assert shell.end(TID, r.producer_id, r.producer_epoch, False).error == E.invalid_txn_state
    assert shell.appends == appends  # a retry persists nothing


def test_end_txn_without_transaction_is_invalid_state() -> None:
    shell = Shell()
    r = shell.init(TID)
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.invalid_txn_state


def test_requests_while_markers_are_in_flight_get_concurrent_transactions() -> None:
    shell = Shell()
    r = started(shell)
    shell.hold_markers = True
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.none
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.concurrent_transactions
    assert shell.end(TID, r.producer_id, r.producer_epoch, False).error == E.concurrent_transactions
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("z")).error == E.concurrent_transactions
    assert shell.init(TID).error == E.concurrent_transactions
    v = shell.coord.verify_partitions_in_txn(TID, r.producer_id, r.producer_epoch, [tp("out")])
    assert v.error == E.concurrent_transactions
    shell.release_markers()
    assert shell.txn(TID).state is S.COMPLETE_COMMIT
    assert shell.init(TID).producer_epoch == 1


def test_requests_while_an_append_is_in_flight_get_concurrent_transactions() -> None:
    shell = Shell()
    r = shell.init(TID)
    step = shell.coord.add_partitions_to_txn(TID, r.producer_id, r.producer_epoch, [tp("a")], now_ms=T0)
    assert shell.coord.pending_state(TID) is S.ONGOING
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("b")).error == E.concurrent_transactions
    assert shell.end(TID, r.producer_id, r.producer_epoch, False).error == E.concurrent_transactions
    assert shell.init(TID).error == E.concurrent_transactions
    assert shell.run(step).error == E.none


# -- persist failures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("append_error", "client_error"),
    [
        (E.request_timed_out, E.coordinator_not_available),
        (E.not_enough_replicas, E.coordinator_not_available),
        (E.not_leader_or_follower, E.not_coordinator),
        (E.kafka_storage_error, E.not_coordinator),
        (E.message_too_large, E.unknown_server_error),
    ],
)
def test_failed_add_leaves_state_unchanged(append_error: ErrorCode, client_error: ErrorCode) -> None:
    shell = Shell()
    r = started(shell, TID, tp("a"))
    before = shell.coord.transaction(TID)
    shell.append_errors = [append_error]
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("b")).error == client_error
    assert shell.coord.transaction(TID) == before and shell.coord.pending_state(TID) is None
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("b")).error == E.none  # retry works


def test_failed_first_init_forgets_the_new_id() -> None:
    shell = Shell()
    shell.append_errors = [E.request_timed_out]
    assert shell.init(TID) == InitProducerIdResult(E.coordinator_not_available)
    assert shell.coord.transaction(TID) is None and shell.log == []
    assert shell.init(TID) == InitProducerIdResult(E.none, 1001, 0)  # the first id is never reused


def test_failed_end_txn_writes_no_markers() -> None:
    shell = Shell()
    r = started(shell)
    before = shell.coord.transaction(TID)
    shell.append_errors = [E.request_timed_out]
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.coordinator_not_available
    assert shell.markers == [] and shell.coord.transaction(TID) == before
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.none
    assert len(shell.markers) == 1


def test_failed_complete_append_is_retried_via_on_markers_written() -> None:
    shell = Shell()
    r = started(shell)
    shell.append_errors = [E.none, E.request_timed_out]  # PrepareCommit ok, CompleteCommit fails
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.none
    assert shell.txn(TID).state is S.PREPARE_COMMIT
    assert [m.result for m in shell.coord.pending_completions(T0)] == [ControlType.COMMIT]
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.concurrent_transactions
    shell.run(shell.coord.on_markers_written(TID, r.producer_id, r.producer_epoch, ControlType.COMMIT))
    assert shell.txn(TID).state is S.COMPLETE_COMMIT
    assert shell.coord.pending_completions(T0) == ()


def test_stale_markers_report_is_ignored() -> None:
    shell = Shell()
    r = started(shell)
    shell.end(TID, r.producer_id, r.producer_epoch, True)
    assert shell.coord.on_markers_written(TID, r.producer_id, r.producer_epoch, ControlType.COMMIT).empty
    shell.hold_markers = True
    r2 = started(shell, "other")
    shell.end("other", r2.producer_id, r2.producer_epoch, False)
    wrong = shell.coord.on_markers_written("other", r2.producer_id, r2.producer_epoch, ControlType.COMMIT)
    assert wrong.empty


# -- crash and replay ---------------------------------------------------------------------------


def test_crash_after_prepare_commit_completes_on_restart() -> None:
    shell = Shell()
    r = started(shell)
    shell.hold_markers = True
    shell.end(TID, r.producer_id, r.producer_epoch, True)
    assert logged_states(shell) == [S.EMPTY, S.ONGOING, S.PREPARE_COMMIT]
    pending = shell.restart(coordinator_epoch=3)  # markers never written
    assert [(m.result, m.producer_epoch, m.coordinator_epoch, m.partitions) for m in pending] == [
        (ControlType.COMMIT, 0, 3, frozenset({tp("out", 0), tp("out", 1)}))
    ]
    assert shell.coord.pending_completions(T0) == tuple(pending)  # idempotent listing
    # a client retrying EndTxn meanwhile is told to wait
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.concurrent_transactions
    shell.hold_markers = False
    for m in pending:
        shell.run(
            shell.coord.on_markers_written(m.transactional_id, m.producer_id, m.producer_epoch, m.result)
        )
    assert logged_states(shell)[-1] is S.COMPLETE_COMMIT
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.none


def test_crash_with_ongoing_transaction_times_out_after_restart() -> None:
    shell = Shell()
    r = started(shell)
    assert shell.restart() == ()
    shell.now += TIMEOUT_MS + 1
    shell.run(shell.coord.expire_timed_out(shell.now))
    assert shell.markers[-1].result is ControlType.ABORT
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.producer_fenced


def test_replay_rebuilds_the_live_state() -> None:
    shell = Shell()
    a = started(shell, "a")
    shell.end("a", a.producer_id, a.producer_epoch, True)
    started(shell, "b")
    c = started(shell, "c")
    shell.end("c", c.producer_id, c.producer_epoch, False)
    shell.init("c")
    live = {tid: shell.coord.transaction(tid) for tid in shell.coord.transactional_ids()}
    shell.restart()
    replayed = {tid: shell.coord.transaction(tid) for tid in shell.coord.transactional_ids()}
    assert replayed.keys() == live.keys()
    for tid, txn in live.items():
        assert txn is not None
        assert replayed[tid] == dataclasses.replace(txn, last_producer_epoch=-1)


def test_requests_during_load_are_refused() -> None:
    shell = Shell()
    r = started(shell)
    shell.coord.begin_load(5)
    assert shell.init(TID).error == E.coordinator_load_in_progress
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("q")).error == E.coordinator_load_in_progress
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.coordinator_load_in_progress
    assert shell.coord.describe_transactions([TID])[0].error == E.coordinator_load_in_progress
    assert shell.coord.list_transactions(now_ms=T0).error == E.coordinator_load_in_progress
    assert shell.coord.expire_timed_out(T0 + 10**9).empty


def test_append_reported_after_reload_is_not_applied() -> None:
    shell = Shell()
    r = shell.init(TID)
    write = only_write(
        shell.coord.add_partitions_to_txn(TID, r.producer_id, r.producer_epoch, [tp("a")], now_ms=T0)
    )
    coord = shell.coord
    shell.restart()  # the coordinator reloads while the append is in flight
    assert shell.coord is not coord
    coord.begin_load(1)  # the old shard is reloaded too: its in-flight write is stale
    coord.end_load(T0)
    assert done(write).response == AddPartitionsResult(((tp("a"), E.not_coordinator),))
    assert shell.txn(TID).state is S.EMPTY


def test_ids_of_partitions_not_loaded_get_not_coordinator_not_a_mapping_error() -> None:
    """Kafka's ``getTransactionState``: an id whose ``__transaction_state`` partition this
    coordinator does not own is answered NOT_COORDINATOR, checked when the request runs. A
    cluster broker that resigned the partition (a reload with no partitions) while a request
    waited for the operation lock must not answer it from the now empty map: INVALID_PRODUCER_ID
    _MAPPING on AddOffsetsToTxn made librdkafka abort and bump the epoch, and its EndTxn(ABORT)
    then met INVALID_TXN_STATE at the real coordinator (a fatal error) -- nor may InitProducerId
    hand out a fresh producer id for an id it merely does not hold."""
    config = TxnCoordinatorConfig(transaction_state_partitions=4)
    shell = Shell(config=config)
    r = started(shell)
    ours = partition_for(TID, 4)
    calls = shell.pids.calls
    # resigned everything (unload; the runtime then begins and ends a load of nothing: the
    # same answers, asserted by the second pass)
    for step in ("resigned", "empty load ended"):
        if step == "resigned":
            shell.coord.unload(T0)
        else:
            shell.coord.begin_load(partitions=())
            shell.coord.end_load(T0)
        assert shell.coord.owner_error(TID) == E.not_coordinator, step
        assert shell.add_offsets(TID, r.producer_id, r.producer_epoch, "group").error == E.not_coordinator, (
            step
        )
        assert shell.init(TID).error == E.not_coordinator, step
    assert shell.add_offsets(TID, r.producer_id, r.producer_epoch, "group").error == E.not_coordinator
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("q")).error == E.not_coordinator
    assert shell.end(TID, r.producer_id, r.producer_epoch, False).error == E.not_coordinator
    assert shell.init(TID).error == E.not_coordinator
    verified = shell.coord.verify_partitions_in_txn(TID, r.producer_id, r.producer_epoch, [tp("q")])
    assert verified == AddPartitionsResult(((tp("q"), E.not_coordinator),))
    assert shell.pids.calls == calls  # no producer id handed out
    # a load of another partition: still not ours
    shell.coord.begin_load(2, partitions=[(ours + 1) % 4])
    shell.coord.end_load(T0)
    assert shell.end(TID, r.producer_id, r.producer_epoch, False).error == E.not_coordinator
    # a load of the id's own partition: an id it does not hold is unknown there (Kafka's answer)
    shell.coord.begin_load(3, partitions=[ours])
    shell.coord.end_load(T0)
    assert shell.end(TID, r.producer_id, r.producer_epoch, False).error == E.invalid_producer_id_mapping


def test_replay_of_tombstone_and_unknown_records() -> None:
    shell = Shell()
    shell.init(TID)
    shell.log.append((0, encode_key(TID), None))
    shell.log.append((0, b"\x00\x05junk", b"whatever"))
    shell.restart()
    assert shell.coord.transaction(TID) is None and shell.coord.skipped_records == 1


# -- fencing ------------------------------------------------------------------------------------


def test_new_instance_fences_old_one() -> None:
    shell = Shell()
    old = shell.init(TID)
    new = shell.init(TID)
    assert (new.producer_id, new.producer_epoch) == (old.producer_id, 1)
    assert shell.add(TID, old.producer_id, old.producer_epoch, tp("a")).error == E.producer_fenced
    assert shell.end(TID, old.producer_id, old.producer_epoch, True).error == E.producer_fenced
    assert shell.add_offsets(TID, old.producer_id, old.producer_epoch, "g").error == E.producer_fenced


@pytest.mark.parametrize(
    ("api", "version", "expected"),
    [
        ("add", 1, E.invalid_producer_epoch),
        ("add", 2, E.producer_fenced),
        ("offsets", 1, E.invalid_producer_epoch),
        ("offsets", 2, E.producer_fenced),
        ("end", 1, E.invalid_producer_epoch),
        ("end", 2, E.producer_fenced),
    ],
)
def test_old_request_versions_get_invalid_producer_epoch(api: str, version: int, expected: ErrorCode) -> None:
    shell = Shell()
    old = shell.init(TID)
    shell.init(TID)
    if api == "add":
        res = shell.add(TID, old.producer_id, old.producer_epoch, tp("a"), request_version=version)
    elif api == "offsets":
        res = shell.add_offsets(TID, old.producer_id, old.producer_epoch, "g", request_version=version)
    else:
        res = shell.end(TID, old.producer_id, old.producer_epoch, True, request_version=version)
    assert res.error == expected


@pytest.mark.parametrize(("version", "expected"), [(3, E.invalid_producer_epoch), (4, E.producer_fenced)])
def test_init_producer_id_fenced_error_by_version(version: int, expected: ErrorCode) -> None:
    shell = Shell()
    r = shell.init(TID)
    shell.init(TID)
    res = shell.init(TID, producer_id=r.producer_id, producer_epoch=7, request_version=version)
    assert res.error == expected


def test_init_during_ongoing_aborts_with_bumped_epoch_then_bumps_again() -> None:
    shell = Shell()
    old = started(shell)
    res = shell.init(TID)
    assert res == InitProducerIdResult(E.concurrent_transactions)
    (abort,) = shell.markers
    assert (abort.result, abort.producer_epoch) == (ControlType.ABORT, 1)  # markers fence epoch 0
    assert logged_states(shell)[-2:] == [S.PREPARE_ABORT, S.COMPLETE_ABORT]
    retry = shell.init(TID)
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.none, old.producer_id, 2)
    assert shell.end(TID, old.producer_id, old.producer_epoch, True).error == E.producer_fenced


def test_failed_fence_append_leaves_transaction_open_and_retry_bumps_once() -> None:
    shell = Shell()
    old = started(shell)
    before = shell.coord.transaction(TID)
    shell.append_errors = [E.request_timed_out]
    assert shell.init(TID).error == E.coordinator_not_available
    assert shell.coord.transaction(TID) == before
    assert shell.init(TID).error == E.concurrent_transactions
    assert shell.markers[-1].producer_epoch == old.producer_epoch + 1


def test_timeout_aborts_with_epoch_bump_and_fences_the_producer() -> None:
    shell = Shell()
    r = started(shell)
    start = shell.txn(TID).txn_start_timestamp
    assert shell.coord.expire_timed_out(start + TIMEOUT_MS).empty  # not yet: strictly older
    write = only_write(shell.coord.expire_timed_out(start + TIMEOUT_MS + 1))
    assert write.describe == f"{AppendPurpose.TIMEOUT_ABORT.value} {TID}"
    ((_key, value),) = write.records
    assert value is not None and decode_value(value).producer_epoch == 1
    assert shell.coord.expire_timed_out(start + TIMEOUT_MS + 2).empty  # already being aborted
    aborted = done(write, now=start + TIMEOUT_MS + 1)
    assert aborted.response is None
    (markers,) = markers_of(aborted)
    assert (markers.result, markers.producer_epoch) == (ControlType.ABORT, 1)
    shell.run(shell.coord.on_markers_written(TID, r.producer_id, 1, ControlType.ABORT))
    assert shell.txn(TID).state is S.COMPLETE_ABORT
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.producer_fenced
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("x")).error == E.producer_fenced
    # the application restarts and carries on with a new epoch
    assert shell.init(TID).producer_epoch == 2


def test_unknown_and_mismatched_ids() -> None:
    shell = Shell()
    assert shell.add("nope", 1, 0, tp("a")).error == E.invalid_producer_id_mapping
    assert shell.end("nope", 1, 0, True).error == E.invalid_producer_id_mapping
    assert shell.add_offsets("nope", 1, 0, "g").error == E.invalid_producer_id_mapping
    r = shell.init(TID)
    assert shell.add(TID, r.producer_id + 1, r.producer_epoch, tp("a")).error == E.invalid_producer_id_mapping
    assert shell.end(TID, r.producer_id + 1, r.producer_epoch, True).error == E.invalid_producer_id_mapping
    assert shell.add("", 1, 0, tp("a")).error == E.invalid_request
    assert shell.end("", 1, 0, True).error == E.invalid_request
    assert shell.init("").error == E.invalid_request


@pytest.mark.parametrize(
    ("timeout", "ok"), [(0, False), (-5, False), (1, True), (900_000, True), (900_001, False)]
)
def test_transaction_timeout_bound(timeout: int, ok: bool) -> None:
    res = Shell().init(TID, timeout)
    assert res.error == (E.none if ok else E.invalid_transaction_timeout)


def test_timeout_bound_is_configurable() -> None:
    shell = Shell(config=TxnCoordinatorConfig(transaction_max_timeout_ms=1000))
    assert shell.init(TID, 1001).error == E.invalid_transaction_timeout


# -- KIP-360 and epoch exhaustion ---------------------------------------------------------------


def test_kip360_recovery_and_retry() -> None:
    shell = Shell()
    r = shell.init(TID)
    bumped = shell.init(TID, producer_id=r.producer_id, producer_epoch=r.producer_epoch)
    assert bumped.producer_epoch == 1
    retried = shell.init(TID, producer_id=r.producer_id, producer_epoch=r.producer_epoch)  # lost response
    assert retried.producer_epoch == 1
    assert shell.init(TID, producer_id=r.producer_id, producer_epoch=5).error == E.producer_fenced
    assert shell.init(TID, producer_id=999, producer_epoch=1).error == E.producer_fenced
    assert shell.init(TID, producer_id=r.producer_id).error == E.invalid_request  # epoch missing
    assert shell.init(TID, producer_epoch=1).error == E.invalid_request


def test_kip360_request_for_new_id_gets_fresh_producer() -> None:
    shell = Shell()
    res = shell.init(TID, producer_id=4242, producer_epoch=3)  # the id expired on the broker
    assert (res.error, res.producer_id, res.producer_epoch) == (E.none, 1000, 0)


def exhausted_shell(epoch: int) -> tuple[Shell, int]:
    shell = Shell()
    r = shell.init(TID)
    transit = shell.coord.transaction(TID)
    assert transit is not None
    shell.log.append((0, encode_key(TID), encode_transit(dataclasses.replace(transit, producer_epoch=epoch))))
    shell.restart()
    return shell, r.producer_id


def test_epoch_exhaustion_rotates_producer_id() -> None:
    shell, pid = exhausted_shell(MAX_PRODUCER_EPOCH - 2)
    calls = shell.pids.calls
    assert shell.init(TID).producer_epoch == MAX_PRODUCER_EPOCH - 1
    rotated = shell.init(TID)
    assert rotated.producer_id != pid and rotated.producer_epoch == 0
    assert shell.pids.calls == calls + 1
    txn = shell.coord.transaction(TID)
    assert txn is not None and txn.prev_producer_id == pid


def test_kip360_retry_of_a_rotating_call_gets_the_same_new_id() -> None:
    shell, pid = exhausted_shell(MAX_PRODUCER_EPOCH - 1)
    held = {"producer_id": pid, "producer_epoch": MAX_PRODUCER_EPOCH - 1}
    rotated = shell.init(TID, **held)
    assert rotated.error == E.none and rotated.producer_id != pid and rotated.producer_epoch == 0
    calls = shell.pids.calls
    retry = shell.init(TID, **held)  # the response was lost: same request again
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.none, rotated.producer_id, 0)
    assert shell.pids.calls == calls
    # without the exhausted epoch the old id is just a zombie
    assert shell.init(TID, producer_id=pid, producer_epoch=5).error == E.producer_fenced


def test_exhausted_epoch_with_open_transaction_fences_then_rotates() -> None:
    shell, pid = exhausted_shell(MAX_PRODUCER_EPOCH - 1)
    assert shell.add(TID, pid, MAX_PRODUCER_EPOCH - 1, tp("a")).error == E.none
    assert shell.init(TID).error == E.concurrent_transactions
    assert shell.markers[-1].producer_epoch == MAX_PRODUCER_EPOCH  # the fence uses the reserve epoch
    res = shell.init(TID)
    assert res.error == E.none and res.producer_id != pid and res.producer_epoch == 0


# -- KIP-890 verification -----------------------------------------------------------------------


def test_verify_only_reports_membership_without_persisting() -> None:
    shell = Shell()
    r = started(shell, TID, tp("a"))
    appends = shell.appends
    v5 = shell.coord.verify_partitions_in_txn(TID, r.producer_id, r.producer_epoch, [tp("a"), tp("b")])
    assert v5.as_dict() == {tp("a"): E.none, tp("b"): E.transaction_abortable}
    v4 = shell.coord.verify_partitions_in_txn(
        TID, r.producer_id, r.producer_epoch, [tp("b")], request_version=4
    )
    assert v4.as_dict() == {tp("b"): E.invalid_txn_state}
    fenced = shell.coord.verify_partitions_in_txn(TID, r.producer_id, r.producer_epoch + 1, [tp("a")])
    assert fenced.error == E.producer_fenced
    unknown = shell.coord.verify_partitions_in_txn("zzz", r.producer_id, 0, [tp("a")])
    assert unknown.error == E.invalid_producer_id_mapping
    assert shell.appends == appends and shell.txn(TID).partitions == {tp("a")}


def test_verify_after_commit_rejects_late_write() -> None:
    shell = Shell()
    r = started(shell, TID, tp("a"))
    shell.end(TID, r.producer_id, r.producer_epoch, True)
    v = shell.coord.verify_partitions_in_txn(TID, r.producer_id, r.producer_epoch, [tp("a")])
    assert v.error == E.transaction_abortable


# -- expiration ---------------------------------------------------------------------------------

DAY = 24 * 3600 * 1000


def test_idle_ids_expire_with_tombstones() -> None:
    shell = Shell()
    shell.init("idle")
    r = started(shell, "busy")
    assert shell.coord.expire_transactional_ids(T0 + 7 * DAY - 1).empty
    tomb = only_write(shell.coord.expire_transactional_ids(T0 + 7 * DAY))
    ((key, value),) = tomb.records
    assert (
        value is None and tomb.describe.startswith(AppendPurpose.EXPIRE.value) and decode_key(key) == "idle"
    )
    assert shell.coord.expire_transactional_ids(T0 + 7 * DAY).empty  # already pending
    assert shell.coord.describe_transactions(["idle"])[0].error == E.transactional_id_not_found
    done(tomb, now=T0 + 7 * DAY)
    assert shell.coord.transaction("idle") is None
    assert shell.coord.transaction("busy") is not None  # Ongoing never expires
    assert shell.add("busy", r.producer_id, r.producer_epoch, tp("more")).error == E.none


def test_failed_tombstone_keeps_the_id() -> None:
    shell = Shell()
    shell.init("idle")
    tomb = only_write(shell.coord.expire_transactional_ids(T0 + 10 * DAY, expiration_ms=DAY))
    assert done(tomb, E.request_timed_out).response is None
    assert shell.coord.transaction("idle") is not None and shell.coord.pending_state("idle") is None


def test_expired_id_starts_over_after_replay() -> None:
    shell = Shell()
    shell.init(TID)
    shell.run(shell.coord.expire_transactional_ids(T0 + 8 * DAY))
    shell.restart()
    assert shell.coord.transaction(TID) is None
    assert shell.init(TID) == InitProducerIdResult(E.none, 1001, 0)


# -- Describe / List ----------------------------------------------------------------------------


def test_describe_transactions() -> None:
    shell = Shell()
    started(shell, TID, tp("b", 1), tp("a", 2))
    (d, missing, empty) = shell.coord.describe_transactions([TID, "missing", ""])
    assert (d.error, d.state, d.producer_id, d.producer_epoch) == (E.none, "Ongoing", 1000, 0)
    assert (d.transaction_timeout_ms, d.transaction_start_time_ms) == (TIMEOUT_MS, T0)
    assert d.partitions == (tp("a", 2), tp("b", 1))
    assert missing.error == E.transactional_id_not_found and empty.error == E.invalid_request


def test_list_transactions_filters() -> None:
    shell = Shell()
    a = started(shell, "a")
    shell.end("a", a.producer_id, a.producer_epoch, True)
    shell.now += 5000
    started(shell, "b")
    shell.init("c")

    def names(**kw: Any) -> list[str]:
        res = shell.coord.list_transactions(now_ms=shell.now + 10_000, **kw)
        assert res.error == E.none
        return [t.transactional_id for t in res.transactions]

    assert names() == ["a", "b", "c"]
    assert names(state_filters=["Ongoing"]) == ["b"]
    assert names(state_filters=["CompleteCommit", "Empty"]) == ["a", "c"]
    res = shell.coord.list_transactions(now_ms=shell.now, state_filters=["Bogus"])
    assert res.unknown_state_filters == ("Bogus",) and res.transactions == ()
    assert names(producer_id_filters=[1001]) == ["b"]
    assert names(duration_filter_ms=12_000) == ["a"]  # a started 15 s before "now", b 10 s
    assert names(duration_filter_ms=9_000) == ["a", "b"]
    assert names(transactional_id_pattern="[ab]") == ["a", "b"]
    assert shell.coord.list_transactions(now_ms=0, transactional_id_pattern="(").error == E.invalid_request


def test_write_carries_the_prepared_record_and_answers_on_completion() -> None:
    shell = Shell()
    shell.init(TID)
    stale = only_write(shell.coord.init_producer_id(TID, TIMEOUT_MS, now_ms=T0, request_version=2))
    ((_key, value),) = stale.records
    assert value == encode_transit(
        dataclasses.replace(shell.txn(TID), producer_epoch=1, txn_last_update_timestamp=T0)
    )
    assert done(stale).response == InitProducerIdResult(E.none, 1000, 1)


def test_value_version_0_log_replays_without_previous_producer_id() -> None:
    shell = Shell(config=TxnCoordinatorConfig(log_value_version=0))
    r = started(shell)
    shell.end(TID, r.producer_id, r.producer_epoch, True)
    assert all(v is not None and v[:2] == b"\x00\x00" for _, _, v in shell.log)
    live = shell.txn(TID)
    shell.restart()
    assert shell.txn(TID) == dataclasses.replace(live, prev_producer_id=-1, last_producer_epoch=-1)


def test_unload_forgets_state_and_stales_writes_in_flight() -> None:
    shell = Shell()
    r = started(shell)
    write = only_write(shell.coord.end_txn(TID, r.producer_id, r.producer_epoch, True, now_ms=T0))
    assert shell.coord.unload(T0).empty
    assert shell.coord.transaction(TID) is None
    # resigned, not loading: Kafka's getTransactionState for a partition it does not own
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.not_coordinator
    assert shell.coord.owner_error(TID) == E.not_coordinator
    assert shell.coord.describe_transactions([TID])[0].error == E.not_coordinator
    assert shell.coord.list_transactions(now_ms=T0).error == E.none  # owns nothing: an empty list
    assert done(write).response == EndTxnResult(E.not_coordinator)
    shell.coord.begin_load(partitions=None)  # LOAD_IN_PROGRESS only while a load runs
    assert shell.end(TID, r.producer_id, r.producer_epoch, True).error == E.coordinator_load_in_progress
    assert shell.coord.describe_transactions([TID])[0].error == E.coordinator_load_in_progress
