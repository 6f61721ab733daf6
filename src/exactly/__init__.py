"""exactly: a Kafka-wire-compatible broker with exactly-once semantics."""

__version__ = "0.1.0"
