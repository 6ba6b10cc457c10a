"""Where estimates and dead letters go: Parquet / Avro files, staged Avro shards and Kafka topics.

Files are written as a single shard at exactly the given path (``DIR/estimates.parquet``), after
re-windowing into the global window: the rows already carry their window bounds as columns. What a run
hands to its driver (its dead letters) is staged with ``StageAvroRecords`` instead, under the run's
staging location, which may be an object store (see ``transforms.io.staging``).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
import fastavro
from apache_beam.transforms import window

from schemas import avro_file_schema, encode_record
from schemas.arrow import ESTIMATE_ARROW_SCHEMA, arrow_schema_of
from transforms.io.kafka.bounded import WriteToKafka
from transforms.io.kafka.config import DEFAULT_CLIENT
from transforms.io.staging import Location, StagingDoFn, join, read_listed, staged_files, write_staged

__all__ = ["ESTIMATE_ARROW_SCHEMA", "StageAvroRecords", "WriteAvroFile", "WriteEstimatesParquet",
           "WriteRecordsToKafka", "arrow_schema_of", "avro_bytes", "load_staged_avro"]


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


def _canonical(record: dict[str, Any]) -> str:
    return repr(sorted(record.items()))


def avro_bytes(schema_name: str, records: Iterable[dict[str, Any]], sync_seed: bytes = b"") -> bytes:
    """An Avro container file of ``records``; the same records and seed give the same bytes (fixed sync marker)."""
    buffer = io.BytesIO()
    marker = hashlib.sha256(b"esa-avro-sync:" + sync_seed).digest()[:16]
    fastavro.writer(buffer, avro_file_schema(schema_name), list(records), sync_marker=marker)
    return buffer.getvalue()


class _StageAvroShardFn(StagingDoFn):
    def __init__(self, directory: Location, prefix: str, schema_name: str):
        super().__init__(directory)
        self._prefix, self._schema_name = prefix, schema_name

    def process(self, element: tuple[int, Iterable[dict[str, Any]]]) -> Iterator[None]:
        shard, records = element
        name = f"{self._prefix}-{shard:05d}.avro"
        ordered = sorted(records, key=_canonical)
        write_staged(join(self._directory, name), avro_bytes(self._schema_name, ordered, name.encode()))
        return iter(())


class StageAvroRecords(beam.PTransform):
    """Records -> Avro files ``directory/<prefix>-<shard>.avro`` in a run's staging location.

    A record's shard is a hash of its content, and a shard's file is written whole from the grouped,
    sorted records: a retried bundle rewrites the same file with the same bytes, so no record is staged
    twice. (Beam's file sinks would also do, but their workers take the object store's options from the
    harness only; a staging DoFn carries them, see ``transforms.io.staging``.)
    """

    def __init__(self, directory: Location, prefix: str, schema_name: str, shards: int = 8):
        super().__init__()
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self._directory, self._prefix, self._schema_name, self._shards = str(directory), prefix, schema_name, shards

    def expand(self, rows: beam.PCollection) -> beam.PDone:
        shards = self._shards
        return (
            rows
            | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
            | "Shard" >> beam.Map(lambda r: (int(hashlib.sha256(_canonical(r).encode()).hexdigest()[:8], 16) % shards,
                                             r))
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_StageAvroShardFn(self._directory, self._prefix, self._schema_name))
        )


def load_staged_avro(directory: Location, prefix: str) -> list[dict[str, Any]]:
    """Every record ``StageAvroRecords`` staged under ``prefix``, shard by shard (deterministic order)."""
    out: list[dict[str, Any]] = []
    for path in staged_files(directory, f"{prefix}-*.avro"):
        out.extend(fastavro.reader(io.BytesIO(read_listed(path))))
    return out
