"""Where estimates and dead letters go: Parquet / Avro files and Kafka topics.

Files are written as a single shard at exactly the given path (``DIR/estimates.parquet``), after
re-windowing into the global window: the rows already carry their window bounds as columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import apache_beam as beam
from apache_beam.transforms import window

from schemas import avro_file_schema, encode_record
from schemas.arrow import ESTIMATE_ARROW_SCHEMA, arrow_schema_of
from transforms.kafka_config import DEFAULT_CLIENT
from transforms.kafkaio import WriteToKafka

__all__ = ["ESTIMATE_ARROW_SCHEMA", "WriteAvroFile", "WriteEstimatesParquet", "WriteRecordsToKafka", "arrow_schema_of"]


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

    def __init__(self, bootstrap: str, topic: str, schema_name: str, *, client: str = DEFAULT_CLIENT,
                 producer_config: Mapping[str, Any] | None = None):
        super().__init__()
        self._bootstrap, self._topic, self._schema_name = bootstrap, topic, schema_name
        self._client, self._config = client, dict(producer_config or {})

    def expand(self, rows: beam.PCollection) -> beam.PDone:
        name = self._schema_name
        return (
            rows
            | "Serialize" >> beam.Map(lambda r: encode_record(name, r, check=False))
            | "Kafka" >> WriteToKafka(self._bootstrap, self._topic, producer_config=self._config, client=self._client)
        )
