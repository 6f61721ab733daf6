"""KIP-939 two-phase commit over the wire: adopt a prepared transaction, then commit or abort it.

librdkafka (confluent-kafka 2.16) sends neither ``enable_2pc`` nor ``keep_prepared_txn`` and has no
way to commit a transaction it did not start, so the Spark sink writes with librdkafka and uses
these calls for the rest:

* :func:`adopt_prepared` -- InitProducerId v6 with ``enable_2pc`` and ``keep_prepared_txn`` for a
  transactional.id whose producer flushed its transaction and stopped: the coordinator keeps the
  open transaction (marked 2PC, so ``transaction.timeout.ms`` no longer aborts it) and bumps the
  epoch, fencing the producer that wrote it. The answer is the new holder's (producer id, epoch)
  and the (producer id, epoch) the transaction was written under -- which lets the caller check
  that the transaction it adopted is the one it meant.
* :func:`end_prepared` -- EndTxn under the holder's epoch. Idempotent: repeating a commit that
  completed answers OK (the coordinator remembers the outcome until the id's next transaction),
  so a driver that crashed in the middle of its commits can simply do them all again.
* :func:`supports_two_phase_commit` -- InitProducerId v6 advertised and
  ``transaction.two.phase.commit.enable`` true on the broker (DescribeConfigs).

Every call goes to the id's coordinator through a :class:`~exactly.client.broker_pool.BrokerPool`
and is retried, finding the coordinator again, while the answer is retriable (the coordinator
moved or is loading, markers of the same id are still being written, a broker is unreachable).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from exactly.client.broker_pool import RETRIABLE, BrokerPool, Retry
from exactly.client.wire import WireError, error_name
from exactly.protocol.apis import ApiKey, build

T = TypeVar("T")

TWO_PHASE_COMMIT_CONFIG = "transaction.two.phase.commit.enable"
KIP_939_INIT_PRODUCER_ID_VERSION = 6
BROKER_RESOURCE = 4
_RETRY = RETRIABLE | {"CONCURRENT_TRANSACTIONS", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION"}
_ANY_TIMEOUT = datetime.timedelta(milliseconds=60_000)  # ignored by the coordinator with enable_2pc


class TwoPhaseError(WireError):
    """The prepared transaction cannot be adopted or ended; the message says why."""


@dataclass(frozen=True, slots=True)
class PreparedTxn:
    """A transaction prepared by a task: who may end it (the id and the holder's producer)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class Adopted:
    """InitProducerId(keep_prepared_txn): the holder, and the transaction it kept (-1: none)."""

    holder: PreparedTxn
    ongoing_producer_id: int
    ongoing_producer_epoch: int

    @property
    def kept(self) -> bool:
        return self.ongoing_producer_id >= 0


def _at_coordinator(pool: BrokerPool, tid: str, what: str, timeout_s: float, call: Callable[[Any], T]) -> T:
    """``call(client)`` at ``tid``'s coordinator until it answers without a retriable error."""
    deadline = time.monotonic() + timeout_s
    backoff = 0.02
    last = "no answer"
    while True:
        broker_id = -1
        try:
            broker_id = pool.coordinator_id(tid)
            return call(pool.client(broker_id))
        except (_Retriable, Retry) as exc:  # Retry: the pool's FindCoordinator
            last = exc.code
        except TwoPhaseError:
            raise
        except (OSError, WireError) as exc:  # the coordinator's broker is down or moving
            last = str(exc)
            if broker_id >= 0:
                pool.drop(broker_id)
        if time.monotonic() + backoff > deadline:
            raise TwoPhaseError(f"{what} for '{tid}': {last} (still, after {timeout_s:g}s)")
        time.sleep(backoff)
        backoff = min(backoff * 2, 0.5)


class _Retriable(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _check(response: Any, what: str, tid: str) -> None:
    code = error_name(response.error_code)
    if not int(response.error_code):
        return
    if code in _RETRY:
        raise _Retriable(code)
    raise TwoPhaseError(f"{what} for '{tid}' failed: {code}")


def adopt_prepared(pool: BrokerPool, tid: str, *, timeout_s: float) -> Adopted:
    """Take over ``tid``'s open transaction (if any) as a 2PC transaction; see the module doc."""

    def attempt(client: Any) -> Adopted:
        version = client.version_for(ApiKey.INIT_PRODUCER_ID)
        if version < KIP_939_INIT_PRODUCER_ID_VERSION:
            raise TwoPhaseError(
                f"the broker at {client.address} does not support KIP-939 (InitProducerId v6)"
            )
        response = client.call(
            ApiKey.INIT_PRODUCER_ID,
            version,
            transactional_id=tid,
            transaction_timeout=_ANY_TIMEOUT,
            producer_id=-1,
            producer_epoch=-1,
            enable2_pc=True,
            keep_prepared_txn=True,
        )
        _check(response, "InitProducerId(keep_prepared_txn)", tid)
        return Adopted(
            PreparedTxn(tid, int(response.producer_id), int(response.producer_epoch)),
            int(response.ongoing_txn_producer_id),
            int(response.ongoing_txn_producer_epoch),
        )

    return _at_coordinator(pool, tid, "InitProducerId(keep_prepared_txn)", timeout_s, attempt)


def end_prepared(pool: BrokerPool, txn: PreparedTxn, *, commit: bool, timeout_s: float) -> None:
    """EndTxn(commit or abort) as the holder; OK again if that outcome is already complete.

    Raises :class:`TwoPhaseError` when the transaction ended the other way (INVALID_TXN_STATE)
    or another holder took it over (PRODUCER_FENCED): the caller's decision can no longer be
    carried out and must not be reported as done.
    """
    tid = txn.transactional_id

    def attempt(client: Any) -> None:
        version = client.version_for(ApiKey.END_TXN, 4)
        response = client.call(
            ApiKey.END_TXN,
            version,
            transactional_id=tid,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            committed=commit,
        )
        _check(response, "EndTxn(commit)" if commit else "EndTxn(abort)", tid)

    _at_coordinator(pool, tid, "EndTxn", timeout_s, attempt)


def supports_two_phase_commit(pool: BrokerPool) -> bool:
    """InitProducerId v6 and ``transaction.two.phase.commit.enable=true`` at a broker.

    A broker that does not describe the setting (other Kafka-compatible brokers may not) counts
    as not supporting it: the caller then falls back to its one-phase mode.
    """
    try:
        broker_id = pool.broker_ids()[0]
        client = pool.client(broker_id)
        supported = client.api_versions.get(int(ApiKey.INIT_PRODUCER_ID), (0, -1))[1]
        if supported < KIP_939_INIT_PRODUCER_ID_VERSION:
            return False
        version = client.version_for(ApiKey.DESCRIBE_CONFIGS)
        module: Any = client.module(ApiKey.DESCRIBE_CONFIGS, version)
        resource = build(
            module.DescribeConfigsResource,
            resource_type=BROKER_RESOURCE,
            resource_name=str(broker_id),
            configuration_keys=(TWO_PHASE_COMMIT_CONFIG,),
        )
        response = client.call(
            ApiKey.DESCRIBE_CONFIGS, version, resources=(resource,), include_synonyms=False
        )
    except (OSError, WireError, IndexError):
        return False
    for result in response.results:
        if int(result.error_code):
            return False
        for entry in result.configs:
            if entry.name == TWO_PHASE_COMMIT_CONFIG:
                return str(entry.value).lower() == "true"
    return False
