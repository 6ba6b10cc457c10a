"""Where estimates and dead letters go: Parquet / Avro files and Kafka topics.

Files are written as a single shard at exactly the given path (``DIR/estimates.parquet``), after
re-windowing into the global window: the rows already carry their window bounds as columns.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms import window

from schemas import avro_file_schema, encode_record
from transforms.kafkaio import WriteToKafka

ESTIMATE_ARROW_SCHEMA = pa.schema([
    ("schema_version", pa.int32()),
    ("spec_id", pa.string()),
    ("analysis", pa.string()),
    ("window_start", pa.int64()),
    ("window_end", pa.int64()),
    ("channel", pa.int32()),
    ("item", pa.string()),
    ("item_index", pa.int64()),
    ("estimate", pa.float64()),
    ("stderr", pa.float64()),
    ("n_reports", pa.int64()),
    ("n_deleted", pa.int64()),
    ("eps_local", pa.float64()),
    ("eps_central", pa.float64()),
    ("delta", pa.float64()),
    ("mechanism", pa.string()),
    ("parameters", pa.string()),
])


class WriteEstimatesParquet(beam.PTransform):
    """Estimate records -> one Parquet file with the Estimate columns."""

    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def expand(self, rows: beam.PCollection) -> beam.PDone:
        return (
            rows
            | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
            | "Parquet" >> beam.io.WriteToParquet(self._path, schema=ESTIMATE_ARROW_SCHEMA, num_shards=1,
                                                  shard_name_template="")
        )


class WriteAvroFile(beam.PTransform):
    """Records of one of our schemas -> one Avro container file (e.g. dead_letters.avro)."""

    def __init__(self, path: str, schema_name: str):
        super().__init__()
        self._path, self._schema_name = path, schema_name

    def expand(self, rows: beam.PCollection) -> beam.PDone:
        return (
            rows
            | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
            | "Avro" >> beam.io.WriteToAvro(self._path, schema=avro_file_schema(self._schema_name), num_shards=1,
                                            shard_name_template="")
        )


class WriteRecordsToKafka(beam.PTransform):
    """Records of one of our schemas -> Avro single-object messages on a Kafka topic."""

    def __init__(self, bootstrap: str, topic: str, schema_name: str):
        super().__init__()
        self._bootstrap, self._topic, self._schema_name = bootstrap, topic, schema_name

    def expand(self, rows: beam.PCollection) -> beam.PDone:
        name = self._schema_name
        return (
            rows
            | "Serialize" >> beam.Map(lambda r: encode_record(name, r, check=False))
            | "Kafka" >> WriteToKafka(self._bootstrap, self._topic)
        )
