"""Taking a :class:`~exactly.webconsole.model.Snapshot` of a cluster, and the abort action.

Everything here blocks on sockets, so the web application calls it from one worker thread
(:mod:`exactly.webconsole.app`); a :class:`Gatherer` is not thread-safe and must only be used
from that thread.

Which API answers what, all standard Kafka admin APIs, each sent where Kafka's admin client
sends it (:class:`~exactly.client.broker_pool.BrokerPool`):

* Metadata: brokers, the controller, partitions with leader, replicas and ISR;
* ListOffsets ``latest`` at each leader, twice: isolation READ_UNCOMMITTED gives the high
  watermark, READ_COMMITTED the last stable offset (one request per leader and level);
* DescribeProducers at each leader (one request per leader): the producers each partition knows;
* ListTransactions at every broker, DescribeTransactions at each id's coordinator;
* DescribeProducers again, only at the leaders of partitions with an open transaction no
  coordinator tracks, to keep the ones still open at the same offset (orphans, see ``model``);
* consumer groups, their members and committed offsets through confluent-kafka's AdminClient,
  which has those APIs (ListGroups, DescribeGroups, OffsetFetch); lag is taken against the LSO.

A failure of one step becomes a line in ``Snapshot.errors`` and the other steps still run; a
broken connection is dropped and the next snapshot reconnects, so a broker that comes back is
picked up without restarting the console.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from exactly.client import txn_admin
from exactly.client.broker_pool import BrokerPool
from exactly.client.cluster_status import ClusterStatus, read_status
from exactly.client.replica_verification import PartitionReplicas
from exactly.client.wire import ApiKey, WireError, error_name
from exactly.protocol.apis import build
from exactly.types import TopicPartition
from exactly.webconsole import model

T = TypeVar("T")
LOG = logging.getLogger("exactly.webconsole")
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
LIST_OFFSETS_MAX_VERSION = 7  # v2 brings the isolation level; later versions add nothing used here
LATEST = -1


class Gatherer:
    """Connections to one cluster (opened lazily, reopened after a failure) and the calls that
    read it. ``timeout_s`` bounds every request."""

    def __init__(
        self,
        bootstrap: str,
        *,
        timeout_s: float,
        hanging_after_ms: int,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        #: client security settings (librdkafka names), for the wire client and AdminClient alike
        self.config: dict[str, Any] = dict(config or {})
        self.timeout_s = timeout_s
        self.hanging_after_ms = hanging_after_ms
        self._pool: BrokerPool | None = None
        self._admin: Any = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._admin = None

    def pool(self) -> BrokerPool:
        if self._pool is None:
            self._pool = BrokerPool.connect(self.bootstrap, timeout=self.timeout_s, config=self.config)
        return self._pool

    def admin(self) -> Any:
        if self._admin is None:
            # librdkafka's own log lines go to this module's logger (the page shows the errors)
            conf: dict[str, Any] = {
                **self.config,
                "bootstrap.servers": self.bootstrap,
                "client.id": "exactly-console",
                "logger": LOG,
                "socket.timeout.ms": int(self.timeout_s * 1000),
            }
            self._admin = AdminClient(conf)
        return self._admin

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> model.Snapshot:
        errors: list[str] = []
        now = txn_admin.now_ms()

        def attempt(what: str, call: Callable[[], T], default: T) -> T:
            try:
                return call()
            except (WireError, OSError) as exc:
                errors.append(f"{what}: {exc}")
                self.close()  # the connection may be broken: reconnect next time
            except Exception as exc:  # librdkafka's KafkaException and the like: keep serving
                LOG.warning("%s failed", what, exc_info=True)
                errors.append(f"{what}: {exc}")
            return default

        status: ClusterStatus | None = attempt(
            "Metadata",
            lambda: read_status(self.bootstrap, timeout_s=self.timeout_s, config=self.config),
            None,
        )
        if status is None:
            return model.Snapshot(
                self.bootstrap, now, self.hanging_after_ms, None, -1, (), (), (), (), tuple(errors)
            )
        leaders: list[PartitionReplicas] = attempt("Metadata (leaders)", lambda: self.pool().partitions(), [])
        hw: dict[TopicPartition, int] = attempt(
            "ListOffsets (high watermark)", lambda: self._end_offsets(leaders, READ_UNCOMMITTED), {}
        )
        lso: dict[TopicPartition, int] = attempt(
            "ListOffsets (last stable offset)", lambda: self._end_offsets(leaders, READ_COMMITTED), {}
        )
        producers: dict[TopicPartition, list[txn_admin.ActiveProducer]] = attempt(
            "DescribeProducers", lambda: self._producers(leaders, errors), {}
        )
        transactions: list[model.Transaction] = attempt(
            "ListTransactions/DescribeTransactions", lambda: self._transactions(now), []
        )
        orphans: set[tuple[TopicPartition, int]] = attempt(
            "DescribeProducers (orphans)", lambda: self._orphans(leaders, producers, transactions), set()
        )
        groups: list[model.Group] = attempt("consumer groups", lambda: self._groups(lso, errors), [])
        return model.Snapshot(
            bootstrap=self.bootstrap,
            taken_at_ms=now,
            hanging_after_ms=self.hanging_after_ms,
            cluster_id=status.cluster_id,
            controller_id=status.controller_id,
            brokers=tuple(
                model.Broker(b.broker_id, b.host, b.port, b.broker_id == status.controller_id)
                for b in status.brokers
            ),
            partitions=self._partitions(status, leaders, hw, lso, producers, orphans),
            transactions=tuple(transactions),
            groups=tuple(groups),
            errors=tuple(errors),
        )

    def _partitions(
        self,
        status: ClusterStatus,
        leaders: list[PartitionReplicas],
        hw: dict[TopicPartition, int],
        lso: dict[TopicPartition, int],
        producers: dict[TopicPartition, list[txn_admin.ActiveProducer]],
        orphans: set[tuple[TopicPartition, int]],
    ) -> tuple[model.Partition, ...]:
        isr = {TopicPartition(p.topic, p.partition): p.isr for p in status.partitions}
        out = []
        for p in leaders:  # the non-internal partitions
            tp = p.tp
            known = tuple(
                model.Producer(
                    q.producer_id,
                    q.producer_epoch,
                    q.last_sequence,
                    q.last_timestamp,
                    q.coordinator_epoch,
                    q.current_txn_start_offset,
                    (tp, q.producer_id) in orphans,
                )
                for q in sorted(producers.get(tp, ()), key=lambda q: q.producer_id)
            )
            out.append(
                model.Partition(
                    tp.topic,
                    tp.partition,
                    p.leader,
                    p.replicas,
                    isr.get(tp, ()),
                    hw.get(tp, -1),
                    lso.get(tp, -1),
                    known,
                )
            )
        return tuple(out)

    def _orphans(
        self,
        leaders: list[PartitionReplicas],
        producers: dict[TopicPartition, list[txn_admin.ActiveProducer]],
        transactions: list[model.Transaction],
    ) -> set[tuple[TopicPartition, int]]:
        """(partition, producer id) of the open transactions no coordinator tracks (taken after
        ``producers``) that the partition's leader, asked again now, still has open at the
        same first offset: a transaction that ended or began between the looks is not one."""
        suspects = {
            (tp, q.producer_id): q.current_txn_start_offset
            for tp, known in producers.items()
            for q in known
            if model.untracked(
                tp.topic, tp.partition, q.producer_id, q.current_txn_start_offset, transactions
            )
        }
        if not suspects:
            return set()
        again = self._producers([p for p in leaders if any(p.tp == tp for tp, _ in suspects)], [])
        return {
            (tp, q.producer_id)
            for tp, known in again.items()
            for q in known
            if q.current_txn_start_offset >= 0
            and suspects.get((tp, q.producer_id)) == q.current_txn_start_offset
        }

    def _by_leader(self, leaders: list[PartitionReplicas]) -> dict[int, list[TopicPartition]]:
        grouped: dict[int, list[TopicPartition]] = defaultdict(list)
        for p in leaders:
            if p.leader >= 0:
                grouped[p.leader].append(p.tp)
        return grouped

    def _end_offsets(self, leaders: list[PartitionReplicas], isolation: int) -> dict[TopicPartition, int]:
        """ListOffsets latest under ``isolation`` at each leader; a partition whose leader
        answers an error is left out (shown as unknown)."""
        out: dict[TopicPartition, int] = {}
        for leader, tps in self._by_leader(leaders).items():
            client = self.pool().client(leader)
            version = client.version_for(ApiKey.LIST_OFFSETS, LIST_OFFSETS_MAX_VERSION)
            if version < 2:
                raise WireError(f"broker {leader} has no ListOffsets v2 (no isolation level, no LSO)")
            mod: Any = client.module(ApiKey.LIST_OFFSETS, version)
            topics = defaultdict(list)
            for tp in tps:
                topics[tp.topic].append(
                    build(
                        mod.ListOffsetsPartition,
                        partition_index=tp.partition,
                        timestamp=LATEST,
                        current_leader_epoch=-1,
                    )
                )
            response = client.call(
                ApiKey.LIST_OFFSETS,
                version,
                replica_id=-1,
                isolation_level=isolation,
                topics=tuple(
                    build(mod.ListOffsetsTopic, name=t, partitions=tuple(ps)) for t, ps in topics.items()
                ),
            )
            for t in response.topics:
                for p in t.partitions:
                    if not int(p.error_code):
                        out[TopicPartition(str(t.name), int(p.partition_index))] = int(p.offset)
        return out

    def _producers(
        self, leaders: list[PartitionReplicas], errors: list[str]
    ) -> dict[TopicPartition, list[txn_admin.ActiveProducer]]:
        """DescribeProducers at each leader for all the partitions it leads."""
        out: dict[TopicPartition, list[txn_admin.ActiveProducer]] = {}
        for leader, tps in self._by_leader(leaders).items():
            client = self.pool().client(leader)
            version = client.version_for(ApiKey.DESCRIBE_PRODUCERS, 0)
            mod: Any = client.module(ApiKey.DESCRIBE_PRODUCERS, version)
            topics: dict[str, list[int]] = defaultdict(list)
            for tp in tps:
                topics[tp.topic].append(tp.partition)
            response = client.call(
                ApiKey.DESCRIBE_PRODUCERS,
                version,
                topics=tuple(
                    mod.TopicRequest(name=t, partition_indexes=tuple(ps)) for t, ps in topics.items()
                ),
            )
            for t in response.topics:
                for p in t.partitions:
                    tp = TopicPartition(str(t.name), int(p.partition_index))
                    if int(p.error_code):
                        errors.append(
                            f"DescribeProducers {tp.topic}-{tp.partition}: {error_name(p.error_code)}"
                        )
                        continue
                    out[tp] = [txn_admin.ActiveProducer.from_response(s) for s in p.active_producers]
        return out

    def _transactions(self, now: int) -> list[model.Transaction]:
        pool = self.pool()
        listed = txn_admin.list_transactions(pool)
        out = []
        for d in txn_admin.describe_transactions(pool, [t.transactional_id for t in listed]):
            if d.error_code:  # gone between the two requests (expired): nothing to show
                continue
            open_ = d.transaction_state in model.OPEN_STATES
            age = (
                max(now - d.transaction_start_time_ms, 0)
                if open_ and d.transaction_start_time_ms >= 0
                else -1
            )
            out.append(
                model.Transaction(
                    transactional_id=d.transactional_id,
                    producer_id=d.producer_id,
                    producer_epoch=d.producer_epoch,
                    state=d.transaction_state,
                    timeout_ms=d.transaction_timeout_ms,
                    start_time_ms=d.transaction_start_time_ms,
                    age_ms=age,
                    partitions=tuple(sorted((t.topic, p) for t in d.topics for p in t.partitions)),
                    hanging_reason=model.overdue_reason(
                        d.transaction_state, d.transaction_timeout_ms, age, self.hanging_after_ms
                    ),
                )
            )
        # open ones first, the oldest on top; then the rest by id
        out.sort(key=lambda t: (not t.is_open, -t.age_ms if t.is_open else 0, t.transactional_id))
        return out

    def _groups(self, lso: dict[TopicPartition, int], errors: list[str]) -> list[model.Group]:
        admin = self.admin()
        wait = self.timeout_s + 5
        listed = admin.list_consumer_groups(request_timeout=self.timeout_s).result(timeout=wait)
        for err in listed.errors:
            errors.append(f"ListGroups: {err}")
        ids = sorted(g.group_id for g in listed.valid)
        if not ids:
            return []
        described = admin.describe_consumer_groups(ids, request_timeout=self.timeout_s)
        out = []
        for gid in ids:
            try:
                desc = described[gid].result(timeout=wait)
                fetched = admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(gid)], request_timeout=self.timeout_s
                )[gid].result(timeout=wait)
            except Exception as exc:  # one group's coordinator failing must not hide the others
                errors.append(f"group '{gid}': {exc}")
                continue
            owner: dict[tuple[str, int], str] = {}
            members = []
            for m in desc.members:
                tps = tuple(
                    sorted(
                        (tp.topic, tp.partition)
                        for tp in (m.assignment.topic_partitions if m.assignment else [])
                    )
                )
                members.append(model.GroupMember(m.member_id, m.client_id, m.host, tps))
                owner.update(dict.fromkeys(tps, m.member_id))
            offsets = []
            for tp in sorted(fetched.topic_partitions or [], key=lambda tp: (tp.topic, tp.partition)):
                if tp.error is not None or tp.offset < 0:
                    continue
                end = lso.get(TopicPartition(tp.topic, tp.partition), -1)
                offsets.append(
                    model.GroupOffset(
                        tp.topic,
                        tp.partition,
                        tp.offset,
                        end,
                        model.lag(tp.offset, end),
                        owner.get((tp.topic, tp.partition), ""),
                    )
                )
            coordinator = desc.coordinator.id if desc.coordinator is not None else -1
            out.append(model.Group(gid, _state_name(desc.state), coordinator, tuple(members), tuple(offsets)))
        return out

    # ------------------------------------------------------------------ abort
    def abort_transactional_id(self, tid: str) -> str:
        """What ``exactly txn abort --transactional-id`` does: InitProducerId with the id, so the
        coordinator aborts the open transaction and fences its producer. Returns a message."""
        try:
            result = txn_admin.fence_transactional_id(self.pool(), tid, timeout_s=self.timeout_s)
        except (WireError, OSError):
            self.close()
            raise
        before = result.before
        fenced = f"producer id {result.producer_id} is now at epoch {result.producer_epoch}"
        if txn_admin.is_open(before):
            return (
                f"Aborted the {before.transaction_state} transaction of '{tid}' "
                f"({txn_admin.partitions_text(before)}); {fenced}."
            )
        return f"'{tid}' had no open transaction (state {before.transaction_state}); {fenced}."

    def abort_partition(self, topic: str, partition: int, producer_id: int) -> str:
        """What ``exactly txn abort --topic --partition --producer-id`` does: an ABORT marker for
        that producer's open transaction written to the partition (WriteTxnMarkers)."""
        try:
            result = txn_admin.abort_partition_transaction(self.pool(), topic, partition, producer_id)
        except (WireError, OSError):
            self.close()
            raise
        return (
            f"Wrote an ABORT marker for producer {producer_id} on {topic}-{partition} "
            f"(its transaction started at offset {result.producer.current_txn_start_offset})."
        )


def _state_name(state: Any) -> str:
    """librdkafka's ConsumerGroupState as Kafka names it (``Stable``, ``PreparingRebalance``)."""
    name = str(getattr(state, "name", state))
    return {
        "PREPARING_REBALANCING": "PreparingRebalance",
        "COMPLETING_REBALANCING": "CompletingRebalance",
    }.get(name, name.title().replace("_", ""))
