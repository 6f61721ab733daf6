"""The log cleaner: compaction of ``cleanup.policy=compact`` logs with Kafka's transactional rules.

Modules, from the inside out: ``offset_map`` (the bounded key -> latest offset map),
``txn_metadata`` (which transactional batches and markers a pass may drop), ``batch_filter`` (the
per-batch and per-record retain decisions and the rebuilt batch), ``cleanable`` (the dirty section,
the cleanable range, the dirty ratio and segment grouping, as pure functions), ``swap`` (the
crash-safe replacement of segments and its recovery at log load), ``cleaner`` (one cleaning pass
over a partition log), ``manager`` (the per-directory checkpoint and the choice of the next log)
and ``runner`` (the cleaner threads off the event loop and the broker-level settings);
``describe`` carries the dirty ratios to ``exactly topics describe`` over DescribeConfigs.
"""
