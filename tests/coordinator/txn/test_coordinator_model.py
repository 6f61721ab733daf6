"""Randomized runs of the coordinator: whatever happens, the log alone rebuilds the live state.

Hypothesis drives random interleavings of client requests (from current and from fenced
producers), append failures, held-back markers, timeouts and expiry, and checks after every step:

* recovery is replay: a coordinator rebuilt from ``__transaction_state`` has the same state for
  every id (up to the in-memory-only last epoch);
* a (producer id, epoch) handed to a client is never handed out twice, and is newer than every
  marker already written for that producer id (a fenced epoch is never handed out again);
* a fenced producer's requests are rejected; nothing stays pending between requests except
  marker rounds, and once markers are released no transaction is left in Prepare*.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from exactly.coordinator.txn import TransactionCoordinator, TransactionState

from .harness import TIMEOUT_MS, Shell, tp

E = ErrorCode
IDS = ("a", "b")

ops = st.lists(
    st.one_of(
        st.tuples(st.just("init"), st.sampled_from(IDS)),
        st.tuples(st.just("add"), st.sampled_from(IDS), st.booleans(), st.integers(0, 2)),
        st.tuples(st.just("end"), st.sampled_from(IDS), st.booleans(), st.booleans()),
        st.tuples(st.just("fail_next"), st.sampled_from([E.request_timed_out, E.not_leader_or_follower])),
        st.tuples(st.just("hold"), st.booleans()),
        st.tuples(st.just("tick"), st.integers(0, 2 * TIMEOUT_MS)),
        st.tuples(st.just("expire"), st.integers(1, 10 * TIMEOUT_MS)),
    ),
    max_size=30,
)


def replayed(shell: Shell) -> TransactionCoordinator:
    coord = TransactionCoordinator(shell.pids)
    coord.begin_load(1)
    for _p, key, value in shell.log:
        coord.replay(key, value)
    coord.end_load(shell.now)
    return coord


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_log_replay_always_matches_live_state(operations: list[tuple[Any, ...]]) -> None:
    shell = Shell()
    # what each producer instance believes it holds; "stale" requests use the previous instance
    held: dict[str, list[tuple[int, int]]] = {tid: [] for tid in IDS}
    handed_out: set[tuple[int, int]] = set()
    max_epoch: dict[int, int] = {}

    for op in operations:
        kind, *args = op
        if kind == "init":
            (tid,) = args
            res = shell.init(tid)
            if res.error == E.none:
                pair = (res.producer_id, res.producer_epoch)
                assert pair not in handed_out, "a (producer id, epoch) was handed out twice"
                handed_out.add(pair)
                # strictly newer than any marker of this producer id: a fenced epoch is never reused
                assert res.producer_epoch > max_epoch.get(res.producer_id, -1)
                held[tid].append(pair)
        elif kind in ("add", "end") and held[args[0]]:
            tid, stale = args[0], args[1]
            pid, epoch = held[tid][-2] if stale and len(held[tid]) > 1 else held[tid][-1]
            if kind == "add":
                res = shell.add(tid, pid, epoch, tp("t", args[2]))
            else:
                res = shell.end(tid, pid, epoch, args[2])
            if stale and len(held[tid]) > 1 and held[tid][-2][0] == held[tid][-1][0]:
                assert res.error in (E.producer_fenced, E.invalid_producer_id_mapping), res
        elif kind == "fail_next":
            shell.append_errors.append(args[0])
        elif kind == "hold":
            if args[0]:
                shell.hold_markers = True
            else:
                shell.release_markers()
        elif kind == "tick":
            shell.now += args[0]
            shell.run(shell.coord.expire_timed_out(shell.now))
        elif kind == "expire":
            shell.run(shell.coord.expire_transactional_ids(shell.now, expiration_ms=args[0]))

        for m in shell.markers:
            max_epoch[m.producer_id] = max(max_epoch.get(m.producer_id, -1), m.producer_epoch)
        _check_replay(shell)

    # finally everything can be completed: release markers, and the log still agrees
    shell.append_errors.clear()
    shell.release_markers()
    for m in shell.coord.pending_completions(shell.now):
        shell.run(
            shell.coord.on_markers_written(m.transactional_id, m.producer_id, m.producer_epoch, m.result)
        )
    _check_replay(shell)
    for tid in shell.coord.transactional_ids():
        txn = shell.coord.transaction(tid)
        assert txn is not None and not txn.state.is_prepare


def _check_replay(shell: Shell) -> None:
    rebuilt = replayed(shell)
    live = {tid: shell.coord.transaction(tid) for tid in shell.coord.transactional_ids()}
    again = {tid: rebuilt.transaction(tid) for tid in rebuilt.transactional_ids()}
    assert again.keys() == live.keys()
    for tid, txn in live.items():
        assert txn is not None
        assert again[tid] == dataclasses.replace(txn, last_producer_epoch=-1), tid
        assert txn.state is not TransactionState.PREPARE_EPOCH_FENCE
    for tid in IDS:
        assert shell.coord.pending_state(tid) in (
            None,
            TransactionState.COMPLETE_COMMIT,
            TransactionState.COMPLETE_ABORT,
        ), "only marker rounds may stay pending between requests"
