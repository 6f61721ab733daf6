"""Connections to the brokers of a cluster for the admin tools: who leads a partition, who
coordinates a transactional id, every live broker -- the routing Kafka's admin client does.

Why: on a single broker the bootstrap broker is the leader of every partition and the
coordinator of every id, so the tools could send everything there. On a cluster:

* DescribeProducers and WriteTxnMarkers go to the partition's **leader** (Metadata; a follower
  answers NOT_LEADER_OR_FOLLOWER), as ``Admin.describeProducers`` / ``abortTransaction`` do;
* DescribeTransactions and InitProducerId go to the id's **coordinator** (FindCoordinator with
  key type 1, then that broker), as ``Admin.describeTransactions`` does;
* ListTransactions goes to **every** live broker and the answers are merged (each coordinator
  knows only the ids of the ``__transaction_state`` partitions it leads), as
  ``Admin.listTransactions`` does.

Lookups answered NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS / COORDINATOR_NOT_AVAILABLE /
NOT_LEADER_OR_FOLLOWER are retried after a fresh lookup (a coordinator or a leader is moving)
until the pool's timeout; then the error is the caller's.

A :class:`BrokerPool` opens one blocking :class:`WireClient` per broker on demand and closes them
all on :meth:`BrokerPool.close` (or leaving its ``with`` block); every connection uses the
bootstrap connection's client configuration (TLS, SASL credentials). Not thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from exactly.client.replica_verification import METADATA_MAX_VERSION, PartitionReplicas
from exactly.client.wire import ApiKey, WireClient, WireError, error_name
from exactly.protocol.apis import build
from exactly.types import TopicPartition

__all__ = ["RETRIABLE", "BrokerPool", "Retry"]

T = TypeVar("T")

COORDINATOR_TYPE_TRANSACTION = 1
FIND_COORDINATOR_MAX_VERSION = 3  # one key per request is all the tools need
RETRIABLE = frozenset(
    {
        "NOT_COORDINATOR",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
    }
)


class Retry(Exception):
    """Raised inside :meth:`BrokerPool.retrying` by an attempt that met a retriable error."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class BrokerPool:
    """The bootstrap connection plus one connection per broker id, opened when first needed."""

    def __init__(self, bootstrap: WireClient, *, timeout: float) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self._clients: dict[int, WireClient] = {}
        self._addresses: dict[int, str] = {}
        self._live: set[int] = set()

    @classmethod
    def connect(
        cls, bootstrap: str, *, timeout: float, config: Mapping[str, Any] | None = None
    ) -> BrokerPool:
        return cls(WireClient.connect(bootstrap, timeout=timeout, config=config), timeout=timeout)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self.bootstrap.close()

    def __enter__(self) -> BrokerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ metadata
    def partitions(self, topics: Sequence[str] | None = None) -> list[PartitionReplicas]:
        """Every partition of ``topics`` (default: every non-internal topic) with its leader;
        refreshes the broker addresses. A named topic that does not exist is a WireError; one
        whose leaders are being elected is retried (:class:`Retry`)."""
        version = self.bootstrap.version_for(ApiKey.METADATA, METADATA_MAX_VERSION)
        module: Any = self.bootstrap.module(ApiKey.METADATA, version)
        wanted = None if topics is None else tuple(build(module.MetadataRequestTopic, name=t) for t in topics)
        response = self.bootstrap.call(
            ApiKey.METADATA, version, topics=wanted, allow_auto_topic_creation=False
        )
        self._learn({int(b.node_id): f"{b.host}:{int(b.port)}" for b in response.brokers})
        partitions: list[PartitionReplicas] = []
        for topic in response.topics:
            code = error_name(topic.error_code)
            if code == "UNKNOWN_TOPIC_OR_PARTITION":
                raise WireError(f"topic '{topic.name}' does not exist")
            if code in RETRIABLE:
                raise Retry(code)
            if int(topic.error_code):
                raise WireError(f"topic '{topic.name}': {code}")
            if topics is None and topic.is_internal:
                continue
            for p in topic.partitions:
                tp = TopicPartition(str(topic.name), int(p.partition_index))
                partitions.append(
                    PartitionReplicas(tp, int(p.leader_id), tuple(int(r) for r in p.replica_nodes))
                )
        partitions.sort(key=lambda p: (p.tp.topic, p.tp.partition))
        return partitions

    def broker_ids(self) -> list[int]:
        """The live brokers (Metadata)."""
        self.partitions(())
        return sorted(self._live)

    def _learn(self, brokers: dict[int, str]) -> None:
        self._live = set(brokers)
        for broker_id, address in brokers.items():
            if self._addresses.get(broker_id) != address:
                old = self._clients.pop(broker_id, None)
                if old is not None:
                    old.close()
            self._addresses[broker_id] = address

    def client(self, broker_id: int) -> WireClient:
        """The connection to ``broker_id`` (opened now if needed)."""
        client = self._clients.get(broker_id)
        if client is not None:
            return client
        address = self._addresses.get(broker_id)
        if address is None:
            self.broker_ids()
            address = self._addresses.get(broker_id)
            if address is None:
                raise WireError(f"broker {broker_id} is not alive")
        if address == self.bootstrap.address:
            client = self.bootstrap
        else:
            client = WireClient.connect(address, timeout=self.timeout, config=self.bootstrap.config)
        self._clients[broker_id] = client
        return client

    def drop(self, broker_id: int) -> None:
        """Forget a connection that failed; the next :meth:`client` reconnects."""
        client = self._clients.pop(broker_id, None)
        if client is not None and client is not self.bootstrap:
            client.close()

    def leader(self, tp: TopicPartition) -> WireClient:
        """The connection to ``tp``'s current leader; WireError when the partition does not
        exist, Retry while it has no leader."""
        try:
            found = [p for p in self.partitions([tp.topic]) if p.tp == tp]
        except WireError as exc:
            if "does not exist" not in str(exc):
                raise
            found = []
        if not found:
            raise WireError(f"topic '{tp.topic}' has no partition {tp.partition}")
        if found[0].leader < 0:
            raise Retry("LEADER_NOT_AVAILABLE")
        return self.client(found[0].leader)

    def coordinator(self, transactional_id: str) -> WireClient:
        """The connection to the transaction coordinator of ``transactional_id``."""
        return self.client(self.coordinator_id(transactional_id))

    def coordinator_id(self, transactional_id: str) -> int:
        """The broker id of ``transactional_id``'s coordinator (FindCoordinator, key type 1)."""
        version = self.bootstrap.version_for(ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_MAX_VERSION)
        response = self.bootstrap.call(
            ApiKey.FIND_COORDINATOR, version, key=transactional_id, key_type=COORDINATOR_TYPE_TRANSACTION
        )
        code = error_name(response.error_code)
        if int(response.error_code):
            if code in RETRIABLE:
                raise Retry(code)
            raise WireError(f"FindCoordinator for '{transactional_id}' failed: {code}")
        broker_id = int(response.node_id)
        address = f"{response.host}:{int(response.port)}"
        if self._addresses.get(broker_id) != address:
            self.drop(broker_id)
            self._addresses[broker_id] = address
        return broker_id

    # ------------------------------------------------------------------ retries
    def retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """Run ``attempt()`` until it does not raise :class:`Retry`, backing off, for at most
        the pool's timeout; then raise a WireError naming the last code."""
        deadline = time.monotonic() + self.timeout
        backoff = 0.05
        while True:
            try:
                return attempt()
            except Retry as retry:
                if time.monotonic() + backoff > deadline:
                    raise WireError(f"{what}: {retry.code} (still, after {self.timeout:g}s)") from None
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
