"""KIP-939 two-phase commit on the real broker, driven as the Spark sink drives it: librdkafka writes
and flushes a transaction, then the project's wire client adopts it (InitProducerId v6 with
enable_2pc + keep_prepared_txn) and decides it later -- after the writer died, after a SIGKILL of
the broker, and long after the writer's transaction.timeout.ms."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from exactly.client.broker_pool import BrokerPool
from exactly.client.two_phase import (
    PreparedTxn,
    TwoPhaseError,
    adopt_prepared,
    end_prepared,
    supports_two_phase_commit,
)
from exactly.client.txn_admin import describe_one, list_transactions
from exactly.security import acl
from exactly.security.acl_store import ACL_FILE, AclStore
from exactly.security.authorizer import Authorizer, AuthorizerConfig
from tests.conftest import BrokerFactory
from tests.support.broker import Broker, child_env
from tests.support.clients import create_topic
from tests.support.txn_helpers import (
    READ_COMMITTED,
    end_offsets,
    fresh_config,
    produce_flush,
    read_to_end,
    txn_producer,
    values,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TWO_PC = {"transaction.two.phase.commit.enable": "true"}
ANON = "User:ANONYMOUS"
SHORT_TIMEOUT_MS = 1500


def _flushed_txn(
    bootstrap: str, tid: str, topic: str, n: int, timeout_ms: int = SHORT_TIMEOUT_MS
) -> tuple[int, int]:
    """A librdkafka producer writes ``n`` records in a transaction, flushes, and is dropped
    without committing: the (producer id, epoch) the open transaction has at its coordinator."""
    p = txn_producer(
        bootstrap, tid, **{"transaction.timeout.ms": timeout_ms, "message.timeout.ms": timeout_ms}
    )
    p.init_transactions(15)
    p.begin_transaction()
    produce_flush(p, [(topic, i % 2, f"{tid}-{i}".encode()) for i in range(n)])
    with BrokerPool.connect(bootstrap, timeout=10) as pool:
        state = describe_one(pool, tid)
    assert state.transaction_state == "Ongoing"
    del p  # the writer is gone; its transaction stays open
    return state.producer_id, state.producer_epoch


def test_enable_2pc_is_refused_unless_the_broker_allows_it(
    broker: Broker, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("no2pc")
    create_topic(broker.bootstrap, topic, partitions=2)
    tid = unique_name("no2pc-tx")
    _flushed_txn(broker.bootstrap, tid, topic, 4, timeout_ms=60_000)
    with BrokerPool.connect(broker.bootstrap, timeout=10) as pool:
        assert not supports_two_phase_commit(pool)
        with pytest.raises(TwoPhaseError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            adopt_prepared(pool, tid, timeout_s=10)
        assert describe_one(pool, tid).transaction_state == "Ongoing"  # untouched


def test_prepared_txn_survives_writer_death_broker_kill_and_its_timeout(
    fresh_broker: BrokerFactory, unique_name: Callable[[str], str]
) -> None:
    b = fresh_broker(**fresh_config(**TWO_PC))
    topic = unique_name("p2pc")
    create_topic(b.bootstrap, topic, partitions=2)
    tid, control = unique_name("prepared"), unique_name("plain")
    pid, epoch = _flushed_txn(b.bootstrap, tid, topic, 10)
    with BrokerPool.connect(b.bootstrap, timeout=15) as pool:
        assert supports_two_phase_commit(pool)
        adopted = adopt_prepared(pool, tid, timeout_s=15)
    # the answer names the transaction the writer left open, and a new holder epoch
    assert (adopted.ongoing_producer_id, adopted.ongoing_producer_epoch) == (pid, epoch)
    assert (adopted.holder.producer_id, adopted.holder.producer_epoch) == (pid, epoch + 1)

    b.kill()
    b.restart()
    # a plain transaction with the same 1.5 s timeout, started after the restart: once the
    # coordinator has aborted it, the 2PC transaction has been through the same timeout scans
    _flushed_txn(b.bootstrap, control, topic, 2)
    with BrokerPool.connect(b.bootstrap, timeout=15) as pool:
        wait_until(
            lambda: describe_one(pool, control).transaction_state == "CompleteAbort",
            30,
            "the plain transaction timed out",
        )
        state = describe_one(pool, tid)
        assert (state.transaction_state, state.producer_epoch) == ("Ongoing", epoch + 1)
        assert state.transaction_timeout_ms == 2**31 - 1  # the 2PC mark, replayed from the log
        listed = {t.transactional_id: t.state for t in list_transactions(pool, states=("Ongoing",))}
        assert listed.get(tid) == "Ongoing"
        assert values(read_to_end(b.bootstrap, topic, [0, 1], READ_COMMITTED)) == []

        # repeated commits by the holder are harmless; the old epoch is fenced
        with pytest.raises(TwoPhaseError, match="PRODUCER_FENCED"):
            end_prepared(pool, PreparedTxn(tid, pid, epoch), commit=True, timeout_s=10)
        end_prepared(pool, adopted.holder, commit=True, timeout_s=15)
        end_prepared(pool, adopted.holder, commit=True, timeout_s=15)
        with pytest.raises(TwoPhaseError, match="INVALID_TXN_STATE"):
            end_prepared(pool, adopted.holder, commit=False, timeout_s=10)
    got = sorted(values(read_to_end(b.bootstrap, topic, [0, 1], READ_COMMITTED)))
    assert got == sorted(f"{tid}-{i}".encode() for i in range(10))
    ends = end_offsets(b.bootstrap, topic, [0, 1], READ_COMMITTED)
    assert sum(ends.values()) > 10  # records + markers: the LSO is past the whole transaction


def _cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "exactly", *args], capture_output=True, timeout=60, env=child_env(), input=b""
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def _rows(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def test_exactly_txn_shows_a_prepared_transaction_and_aborts_it_by_hand(
    fresh_broker: BrokerFactory, unique_name: Callable[[str], str]
) -> None:
    b = fresh_broker(**fresh_config(**TWO_PC))
    topic = unique_name("a2pc")
    create_topic(b.bootstrap, topic, partitions=2)
    tid = unique_name("abort-by-hand")
    _flushed_txn(b.bootstrap, tid, topic, 6)
    with BrokerPool.connect(b.bootstrap, timeout=15) as pool:
        adopt_prepared(pool, tid, timeout_s=15)
    bs = ("--bootstrap-server", b.bootstrap)
    listed = {r["TransactionalId"]: r for r in _rows(_cli("txn", "list", "--state", "Ongoing", *bs))}
    assert tid in listed
    (row,) = _rows(_cli("txn", "describe", tid, *bs))
    assert row["TransactionState"] == "Ongoing"
    assert row["TransactionTimeoutMs"] == str(2**31 - 1)  # the 2PC mark
    assert int(row["TransactionDurationMs"]) >= 0  # its age
    assert "Aborted the Ongoing transaction" in _cli("txn", "abort", "--transactional-id", tid, *bs)
    with BrokerPool.connect(b.bootstrap, timeout=15) as pool:
        assert describe_one(pool, tid).transaction_state == "Empty"  # aborted, then the epoch bumped
    assert values(read_to_end(b.bootstrap, topic, [0, 1], READ_COMMITTED)) == []


def test_enable_2pc_needs_the_two_phase_commit_acl(fresh_broker: BrokerFactory) -> None:
    """With an authorizer, KIP-939 needs TWO_PHASE_COMMIT on the transactional id besides WRITE."""
    b = fresh_broker(
        start=False,
        **{
            **TWO_PC,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        },
    )
    b.data_dir.mkdir(parents=True, exist_ok=True)
    store = AclStore(b.data_dir / ACL_FILE, Authorizer(AuthorizerConfig(frozenset(), False)))
    allow = acl.AclPermissionType.ALLOW
    store.add(
        [
            *(
                acl.binding(
                    acl.ResourceType.TRANSACTIONAL_ID, prefix, 4, ANON, "*", acl.AclOperation.WRITE, allow
                )
                for prefix in ("write-only-", "two-phase-")
            ),
            acl.binding(
                acl.ResourceType.TRANSACTIONAL_ID,
                "two-phase-",
                4,
                ANON,
                "*",
                acl.AclOperation.TWO_PHASE_COMMIT,
                allow,
            ),
        ]
    )
    b.start()
    with BrokerPool.connect(b.bootstrap, timeout=15) as pool:
        with pytest.raises(TwoPhaseError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            adopt_prepared(pool, "write-only-1", timeout_s=10)
        adopted = adopt_prepared(pool, "two-phase-1", timeout_s=10)
    assert adopted.holder.producer_epoch == 0 and not adopted.kept
