"""The cluster controller's decisions (Kafka's KafkaController / PartitionStateMachine /
ReplicaStateMachine / Election / AdminUtils), sans-IO.

Everything here takes a snapshot of what the controller knows (assignments, partition states with
their zkVersions, live brokers with their broker epochs) plus an event, and returns the znode writes
to make. It never talks to ZooKeeper: the kazoo shell (``exactly.cluster``) applies each write
conditionally (partition zkVersion + ``/controller_epoch`` version) and feeds the outcome back.

Design, event/decision table and next steps: ``exactly/cluster/README.md``.
"""
