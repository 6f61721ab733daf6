"""Cluster-wide unique producer ids: blocks of 1000 from ``/latest_producer_id_block`` (Kafka's
``ZkProducerIdManager``), behind the same ``generate()`` as the single-broker
``exactly.coordinator.producer_id.manager.ProducerIdManager``.

Why
---
Every broker's transaction coordinator hands out producer ids. Taking blocks by a conditional set
of one znode (read data + version, write the next block at that version, retry on BADVERSION)
makes the blocks disjoint across brokers and across restarts: a restarted broker always takes a
*new* block; the unused rest of its previous block is skipped, never reused.

Blocking: ``generate()`` is synchronous like the single-broker manager's. To keep the ZooKeeper
round trip off the caller's path, the next block is fetched in the background (a kazoo handler
thread) once 90% of the current one is used (Kafka's RPC variant does the same); only if it has not
arrived when the block runs out does ``generate()`` fetch synchronously.

Invariants: ids are increasing within one manager; two managers (any brokers, any incarnations)
never return the same id; the znode's format is Kafka's (start/end as JSON strings).
"""

from __future__ import annotations

import logging
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from exactly.cluster import znodes as zn
from exactly.cluster.zk_base import STARTUP_RETRY_DEADLINE_S, call_with_retry
from exactly.cluster.znodes import ProducerIdBlock, next_producer_id_block
from exactly.types import ProducerId

log = logging.getLogger(__name__)

PREFETCH_FRACTION = 0.9


def allocate_block(
    client: KazooClient,
    broker_id: int,
    size: int = zn.PRODUCER_ID_BLOCK_SIZE,
    *,
    deadline_s: float | None = None,
) -> ProducerIdBlock:
    """Take the next block: read, compute, conditional set; on BADVERSION read again.

    ``deadline_s``: retry the whole read-compute-set through a lost connection until then
    (:func:`~exactly.cluster.zk_base.call_with_retry`); None: one attempt, its connection errors
    raise (the synchronous fetch of :meth:`ZkProducerIdManager.generate` runs on the event loop,
    which must not wait out a ZooKeeper outage).

    A retried attempt is correct whatever the lost one did: it reads the znode again and
    conditions its set on that read, so if the lost set was applied (the connection dropped
    before its answer) the retry sees that block as the latest and takes the one after it. The
    block written by the lost set is then skipped, never handed out (as the unused rest of a
    restarted broker's block). Kafka's ``ZkProducerIdManager`` instead claims it: on BADVERSION
    its checker reads the znode and succeeds if it holds exactly the block it tried to write.
    That is unsafe here: this manager's background prefetch and a synchronous fetch of
    ``generate`` can run at once, with the same broker id and the same predecessor, so they
    compute byte-identical blocks, and equal data would not tell which of them wrote it (Kafka's
    manager allocates under one lock). Skipping costs one block of 2**63 ids."""
    if deadline_s is None:
        return _allocate_block(client, broker_id, size)
    return call_with_retry(client, _allocate_block, client, broker_id, size, deadline_s=deadline_s)


def _allocate_block(client: KazooClient, broker_id: int, size: int) -> ProducerIdBlock:
    while True:
        try:
            data, stat = client.get(zn.LATEST_PRODUCER_ID_BLOCK)
        except NoNodeError:
            client.ensure_path(zn.LATEST_PRODUCER_ID_BLOCK)
            continue
        block = next_producer_id_block(ProducerIdBlock.decode(data), broker_id, size)
        try:
            client.set(zn.LATEST_PRODUCER_ID_BLOCK, block.encode(), version=stat.version)
        except BadVersionError:
            log.debug("producer id block taken concurrently, retrying")
            continue
        log.info("broker %d took producer ids %d..%d", broker_id, block.block_start, block.block_end)
        return block


class ZkProducerIdManager:
    """Hands out producer ids from ZooKeeper blocks; a drop-in for ``ProducerIdManager``."""

    def __init__(
        self, client: KazooClient, broker_id: int, *, block_size: int = zn.PRODUCER_ID_BLOCK_SIZE
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.client = client
        self.broker_id = broker_id
        self.block_size = block_size
        self._lock = threading.Lock()
        self._block: ProducerIdBlock | None = None
        self._next = 0
        self._prefetched: ProducerIdBlock | None = None
        self._prefetching = False

    @property
    def has_block(self) -> bool:
        """Whether the next ``generate`` can answer without a ZooKeeper round trip."""
        with self._lock:
            current = self._block is not None and self._next <= self._block.block_end
            return current or self._prefetched is not None

    def prefetch(self) -> None:
        """Fetch the first block in the background (call at start-up, so that the first
        ``generate`` on the event loop does not wait for ZooKeeper)."""
        with self._lock:
            if self._block is not None or self._prefetched is not None or self._prefetching:
                return
            self._prefetching = True
        self.client.handler.spawn(self._prefetch)

    def generate(self) -> ProducerId:
        with self._lock:
            if self._block is None or self._next > self._block.block_end:
                block = self._prefetched
                self._prefetched = None
                if block is None:
                    block = allocate_block(self.client, self.broker_id, self.block_size)
                self._block, self._next = block, block.block_start
            pid = self._next
            self._next += 1
            used = pid - self._block.block_start + 1
            start_prefetch = (
                used >= PREFETCH_FRACTION * self._block.size
                and self._prefetched is None
                and not self._prefetching
            )
            if start_prefetch:
                self._prefetching = True
        if start_prefetch:
            self.client.handler.spawn(self._prefetch)
        return ProducerId(pid)

    def _prefetch(self) -> None:
        block: ProducerIdBlock | None = None
        try:
            # A kazoo thread, off the event loop: wait out a dropped connection (the first
            # prefetch runs at start-up, when a restarting broker may meet one).
            block = allocate_block(
                self.client, self.broker_id, self.block_size, deadline_s=STARTUP_RETRY_DEADLINE_S
            )
        except Exception:
            log.exception(
                "broker %d: producer id block prefetch failed; will fetch when needed", self.broker_id
            )
        with self._lock:
            self._prefetching = False
            # The current block ran out while this was in flight and a later block was taken
            # synchronously: this one is older, drop it (unused ids are skipped, never reused) so
            # ids keep increasing.
            if block is not None and (self._block is None or block.block_start > self._block.block_start):
                self._prefetched = block
