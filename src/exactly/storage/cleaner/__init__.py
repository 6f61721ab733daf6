"""The log cleaner: compaction of ``cleanup.policy=compact`` logs with Kafka's transactional rules.

Modules, from the inside out: ``offset_map`` (the bounded key -> latest offset map),
``txn_metadata`` (which transactional batches and markers a pass may drop), ``batch_filter`` (the
per-batch and per-record retain decisions and the rebuilt batch), ``cleanable`` (the dirty section,
the cleanable range, the dirty ratio and segment grouping, as pure functions), ``swap`` (the
crash-safe replacement of segments and its recovery at log load), ``job`` (a pass described as
plain picklable values, and the broker's side of its swap), ``cleaner`` (one cleaning pass over a
job, and the in-process ``Cleaner``), ``manager`` (the per-directory checkpoint and the choice of
the next log), ``worker`` (the worker process a pass runs in, off the broker's GIL) and ``runner``
(the cleaner threads that drive the workers, and the broker-level settings); ``describe`` carries
the dirty ratios to ``exactly topics describe`` over DescribeConfigs.
"""
