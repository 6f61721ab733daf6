"""Kafka's replication protocol, sans-IO: the leader's view of its followers (HW, ISR, acks=all),
follower truncation (KIP-101 / KIP-279), and how a broker derives its
role for a partition from the partition state it observes (acting on epochs, never event order). The leader-epoch cache rules live with the checkpoint
they keep, in ``exactly.storage.leader_epoch``.

Nothing here performs I/O or imports asyncio: the broker's replica manager feeds events (a follower
fetch, a local append, an observed state znode, a timer tick with ``now_ms``) and executes the
returned decisions (write the ISR conditionally, truncate the log, start/stop a fetcher).

Design, event/decision table and next steps: ``exactly/cluster/README.md``.
"""
