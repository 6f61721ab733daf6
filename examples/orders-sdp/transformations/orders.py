"""The orders pipeline's dataflow for Spark Declarative Pipelines (``spark-pipelines run``).

order-completed (exactly source, read_committed) -> running totals per category and "total"
-> category-sales / total-sales (exactly sink, exactly-once; two-phase where the broker supports
it: each micro-batch all or nothing).

The transformation is the one ``exactly pipeline run`` uses (``exactly.spark.pipeline``); only the
wiring differs: the source and sink are Python data sources, registered here on the pipeline's
Spark Connect session, and the sink is an SDP sink that an append flow targets. The ``exactly``
package must be importable by the Spark Connect server's Python workers (PYTHONPATH, or installed).
"""

from pyspark import pipelines as dp

from exactly.spark.datasource import FORMAT, ExactlyDataSource
from exactly.spark.orders import Topics
from exactly.spark.pipeline import JobConfig, build_updates

spark = globals()["spark"]  # set by spark-pipelines before it runs this file
spark.dataSource.register(ExactlyDataSource)


def setting(name: str, default: str) -> str:
    return spark.conf.get(f"spark.exactly.{name}", default)


BOOTSTRAP = setting("bootstrap.servers", "127.0.0.1:9092")
TOPICS = Topics.with_prefix(setting("topic.prefix", ""))
SETTINGS = spark.conf.getAll
# spark.exactly.kafka.<name>: kafka.* client options (security, timeouts) of the source and the sink
KAFKA_OPTIONS = tuple(
    (key.removeprefix("spark.exactly."), value)
    for key, value in sorted(SETTINGS.items())
    if key.startswith("spark.exactly.kafka.")
)
# spark.exactly.sink.<option>: further sink options, e.g. spark.exactly.sink.atomicBatches=true
SINK_OPTIONS = {
    key.removeprefix("spark.exactly.sink."): value
    for key, value in SETTINGS.items()
    if key.startswith("spark.exactly.sink.")
}

print(f"exactly-orders: {TOPICS.orders} -> {TOPICS.category}, {TOPICS.total} on {BOOTSTRAP}", flush=True)

dp.create_sink(
    name="orders_sales",
    format=FORMAT,
    options={
        "kafka.bootstrap.servers": BOOTSTRAP,
        "deliveryGuarantee": "exactly_once",
        "transactionalIdPrefix": setting("transactional.id.prefix", "orders-sdp"),
        **dict(KAFKA_OPTIONS),
        **SINK_OPTIONS,
    },
)

# Built here, not inside the flow function: Spark Connect's applyInPandasWithState asks the server
# for its input's columns (an analysis), which SDP refuses inside a query function
# (ATTEMPT_ANALYSIS_IN_PIPELINE_QUERY_FUNCTION) and allows while the definitions are loaded.
UPDATES = build_updates(
    spark, JobConfig(bootstrap=BOOTSTRAP, checkpoint="", topics=TOPICS, kafka_options=KAFKA_OPTIONS)
)


@dp.append_flow(target="orders_sales")
def order_updates():
    """(topic, key, value) rows: one update per (micro-batch, key), routed by the topic column."""
    return UPDATES
