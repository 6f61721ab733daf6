"""Options of the ``exactly`` data source, parsed once on the driver into picklable dataclasses.

The names mirror Spark's own Kafka connector (``spark-sql-kafka-0-10``) so a job can switch
between ``format("kafka")`` and ``format("exactly")`` by changing the format string only:

=========================== ====================================================================
``kafka.bootstrap.servers`` required; every other ``kafka.*`` option goes to the librdkafka client
                            (``kafka.`` stripped), except the ones the connector manages itself.
``subscribe``               comma-separated topic list
``subscribePattern``        regular expression, matched against whole topic names
``assign``                  JSON ``{"topic": [0, 1]}``
``startingOffsets``         ``earliest`` | ``latest`` | JSON ``{"topic": {"0": 23, "1": -2}}``
                            (-2 = earliest, -1 = latest); default ``latest`` for streams,
                            ``earliest`` for batch reads
``endingOffsets``           batch reads only: ``latest`` | JSON (-1 = latest); default ``latest``
``maxOffsetsPerTrigger``    admission control: at most this many offsets per micro-batch
``failOnDataLoss``          ``true`` (default): fail when offsets vanished (retention, deleted
                            partition) instead of silently skipping them
``kafka.isolation.level``   ``read_committed`` (default) | ``read_uncommitted``
``includeHeaders``          add the ``headers`` column (default ``false``, as Spark)
``kafkaConsumer.pollTimeoutMs`` how long read() may wait for the records it was promised
                            (default 120000, as Spark)
=========================== ====================================================================

Writer options (see ``sink.py``): ``topic``, ``deliveryGuarantee`` (``exactly_once`` default |
``at_least_once``), ``transactionalIdPrefix``, ``progressTopic``, ``progressTopicPartitions``,
``kafka.transaction.timeout.ms``, ``atomicBatches`` (``auto`` default: two-phase where the broker
allows KIP-939 | ``true``: required | ``false``: per-task transactions; see ``two_phase.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exactly.client.security import ClientConfigError, translate_java_security
from exactly.spark.faults import Faults, parse_faults

# Options the connector sets itself; a user value would break its guarantees (Spark rejects most).
_MANAGED_CLIENT_KEYS = frozenset(
    {
        "bootstrap.servers",
        "isolation.level",
        "enable.auto.commit",
        "auto.offset.reset",
        "enable.partition.eof",
        "group.id",
        "transactional.id",
        "enable.idempotence",
        "key.deserializer",
        "value.deserializer",
        "key.serializer",
        "value.serializer",
    }
)

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
EARLIEST = -2
LATEST = -1


class OptionError(ValueError):
    """An option is missing or malformed (raised on the driver, before any task runs)."""


def _get(options: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    """Case-insensitive lookup (Spark hands us a CaseInsensitiveDict, tests may pass a plain dict)."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return str(value)
    return default


def _bool(options: Mapping[str, Any], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, got {text!r}")


def _int(options: Mapping[str, Any], name: str, default: int | None) -> int | None:
    text = _get(options, name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {text!r}") from None


def client_config(options: Mapping[str, Any]) -> dict[str, str]:
    """The ``kafka.*`` options as a librdkafka configuration (prefix stripped, managed keys dropped)."""
    conf: dict[str, str] = {}
    bootstrap = _get(options, "kafka.bootstrap.servers")
    if not bootstrap:
        raise OptionError("option kafka.bootstrap.servers is required")
    for key, value in options.items():
        lowered = key.lower()
        if lowered.startswith("kafka.") and lowered[len("kafka.") :] not in _MANAGED_CLIENT_KEYS:
            conf[lowered[len("kafka.") :]] = str(value)
    conf["bootstrap.servers"] = bootstrap
    _translate_java_security(conf)
    return conf


def _translate_java_security(conf: dict[str, str]) -> None:
    """The Java client's ``sasl.jaas.config`` and PEM truststore, as librdkafka settings."""
    try:
        translated = translate_java_security(conf)
    except ClientConfigError as exc:
        raise OptionError(f"kafka.{exc}") from None
    conf.clear()
    conf.update(translated)


@dataclass(frozen=True)
class Subscription:
    """Which topic-partitions to read: exactly one of topics, pattern, or assignment is set."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assignment: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern={self.pattern}"
        if self.assignment:
            return f"assign={list(self.assignment)}"
        return f"subscribe={','.join(self.topics)}"

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics


def parse_subscription(options: Mapping[str, Any]) -> Subscription:
    subscribe = _get(options, "subscribe")
    pattern = _get(options, "subscribePattern")
    assign = _get(options, "assign")
    given = [
        name for name, v in (("subscribe", subscribe), ("subscribePattern", pattern), ("assign", assign)) if v
    ]
    if len(given) != 1:
        raise OptionError(
            f"exactly one of subscribe, subscribePattern, assign is required (got {given or 'none'})"
        )
    if subscribe:
        topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
        if not topics:
            raise OptionError("option subscribe names no topic")
        return Subscription(topics=topics)
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option subscribePattern is not a regular expression: {exc}") from None
        return Subscription(pattern=pattern)
    try:
        parsed = json.loads(assign or "")
        pairs = tuple(sorted((str(t), int(p)) for t, parts in parsed.items() for p in parts))
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f'option assign must be JSON like {{"topic": [0, 1]}}, got {assign!r}') from None
    if not pairs:
        raise OptionError("option assign names no partition")
    return Subscription(assignment=pairs)


@dataclass(frozen=True)
class OffsetSpecOption:
    """``earliest``, ``latest``, or explicit offsets per topic-partition (-2/-1 allowed inside)."""

    kind: str  # "earliest" | "latest" | "json"
    offsets: tuple[tuple[str, int, int], ...] = ()

    def for_partition(self, topic: str, partition: int, default: int) -> int:
        if self.kind == "earliest":
            return EARLIEST
        if self.kind == "latest":
            return LATEST
        for t, p, off in self.offsets:
            if t == topic and p == partition:
                return off
        return default


def parse_offset_spec(text: str | None, name: str, default: str) -> OffsetSpecOption:
    text = (text or default).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpecOption(kind=text.lower())
    try:
        parsed = json.loads(text)
        entries = tuple(
            sorted((str(t), int(p), int(off)) for t, parts in parsed.items() for p, off in parts.items())
        )
    except (ValueError, AttributeError, TypeError):
        raise OptionError(
            f'option {name} must be earliest, latest or JSON like {{"topic": {{"0": 23}}}}, got {text!r}'
        ) from None
    return OffsetSpecOption(kind="json", offsets=entries)


@dataclass(frozen=True)
class SourceOptions:
    """Everything the reader needs, picklable (it travels to executors inside the reader)."""

    client: dict[str, str]
    subscription: Subscription
    starting: OffsetSpecOption
    ending: OffsetSpecOption
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    isolation_level: str
    include_headers: bool
    poll_timeout_ms: int
    metadata_timeout_s: float = 30.0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == READ_COMMITTED


def parse_source_options(options: Mapping[str, Any], *, streaming: bool) -> SourceOptions:
    isolation = (_get(options, "kafka.isolation.level", READ_COMMITTED) or READ_COMMITTED).lower()
    if isolation not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise OptionError(
            f"kafka.isolation.level must be read_committed or read_uncommitted, got {isolation!r}"
        )
    starting = parse_offset_spec(
        _get(options, "startingOffsets"), "startingOffsets", "latest" if streaming else "earliest"
    )
    ending = parse_offset_spec(_get(options, "endingOffsets"), "endingOffsets", "latest")
    if not streaming and starting.kind == "latest":
        raise OptionError("startingOffsets=latest is not allowed for batch queries (as in Spark)")
    if not streaming and (ending.kind == "earliest" or any(o == EARLIEST for _, _, o in ending.offsets)):
        raise OptionError("endingOffsets=earliest is not allowed for batch queries (as in Spark)")
    max_offsets = _int(options, "maxOffsetsPerTrigger", None)
    if max_offsets is not None and max_offsets < 1:
        raise OptionError("maxOffsetsPerTrigger must be at least 1")
    return SourceOptions(
        client=client_config(options),
        subscription=parse_subscription(options),
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_offsets,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        isolation_level=isolation,
        include_headers=_bool(options, "includeHeaders", False),
        poll_timeout_ms=_int(options, "kafkaConsumer.pollTimeoutMs", 120_000) or 120_000,
    )


EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"


@dataclass(frozen=True)
class SinkOptions:
    """Writer options, picklable (the writer object is shipped to every write task)."""

    client: dict[str, str]
    topic: str | None
    guarantee: str
    transactional_id_prefix: str
    progress_topic: str
    progress_partitions: int
    transaction_timeout_ms: int
    progress_wait_s: float
    faults: Faults = field(default_factory=Faults)
    # atomicBatches: "auto" (two-phase where the broker supports KIP-939), "true" or "false"
    atomic_batches: str = "auto"

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == EXACTLY_ONCE


def parse_sink_options(options: Mapping[str, Any]) -> SinkOptions:
    guarantee = (_get(options, "deliveryGuarantee", EXACTLY_ONCE) or EXACTLY_ONCE).lower().replace("-", "_")
    if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
        raise OptionError(f"deliveryGuarantee must be exactly_once or at_least_once, got {guarantee!r}")
    client = client_config(options)
    timeout_ms = int(client.pop("transaction.timeout.ms", "60000"))
    partitions = _int(options, "progressTopicPartitions", 16) or 16
    atomic = (_get(options, "atomicBatches", "auto") or "auto").lower()
    if atomic not in ("auto", "true", "false"):
        raise OptionError(f"atomicBatches must be auto, true or false, got {atomic!r}")
    return SinkOptions(
        client=client,
        topic=_get(options, "topic"),
        guarantee=guarantee,
        transactional_id_prefix=_get(options, "transactionalIdPrefix", "exactly-spark") or "exactly-spark",
        progress_topic=_get(options, "progressTopic", "exactly-spark-progress") or "exactly-spark-progress",
        progress_partitions=partitions,
        transaction_timeout_ms=timeout_ms,
        # how long a task waits for open transactions of *other* writers on its progress partition
        progress_wait_s=float(_int(options, "progressWaitMs", timeout_ms + 30_000) or 0) / 1000.0,
        faults=parse_faults(
            {k.lower(): str(v) for k, v in options.items() if k.lower().startswith("testing.")}
        ),
        atomic_batches=atomic,
    )
