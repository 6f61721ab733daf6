"""``exactly console``: a live web page of what decides exactly-once on a Kafka-compatible cluster.

The usual Kafka UIs show topics, messages and consumer lag; this page shows the state behind
exactly-once: each partition's high watermark and last stable offset, the producers a partition
knows (DescribeProducers), the transactions the coordinators track (ListTransactions /
DescribeTransactions) with the ones that hang highlighted, and consumer groups' lag measured
against the LSO, which is what a read_committed consumer can reach.

* :mod:`~exactly.webconsole.model` - the snapshot's records and the pure "is it hanging" rules;
* :mod:`~exactly.webconsole.gather` - the blocking admin calls that take a snapshot and abort;
* :mod:`~exactly.webconsole.app` - the Starlette application (pages, JSON, abort), which runs
  every admin call in one worker thread so the event loop never waits on the cluster.

Only standard Kafka admin APIs are used, so the page works against any Kafka-compatible cluster.
"""
