"""Cluster mode on ZooKeeper: Kafka's znode layout and formats, the kazoo shell (registration,
controller election and fencing, conditional partition-state writes, producer-id blocks) and a
local ZooKeeper launcher. Design: ``README.md`` in this directory."""
