"""``ExactlyDataSource``: the PySpark Python data source registered as format ``"exactly"``.

    from exactly.spark import register
    register(spark)
    spark.readStream.format("exactly").option("kafka.bootstrap.servers", "host:9092")
        .option("subscribe", "orders").load()
    df.writeStream.format("exactly").option("kafka.bootstrap.servers", "host:9092")
        .option("topic", "out").option("checkpointLocation", "/ckpt").start()

Reading: ``source.py``; writing: ``sink.py``; option names: ``options.py`` (Spark Kafka's).
The class and everything it creates must be importable by Spark's Python workers (install the
package on the workers or ship it with ``--py-files``; ``session.py`` does that for you).
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from exactly.spark.options import parse_sink_options, parse_source_options
from exactly.spark.sink import ExactlyBatchWriter, ExactlyStreamWriter
from exactly.spark.source import ExactlyBatchReader, ExactlyStreamReader, source_schema

FORMAT = "exactly"


class ExactlyDataSource(DataSource):
    """Kafka(-compatible) source and exactly-once sink; options as Spark's Kafka connector."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        include = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return source_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return ExactlyBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ExactlyStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return ExactlyBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return ExactlyStreamWriter(parse_sink_options(self.options), schema)
