"""Durable job state for exactly-once release across crashes, reruns and overlapping jobs.

A pure library (stdlib, pyarrow, fastavro; no Beam, no Kafka). Every write is crash-safe: a kill -9 at any
instant leaves either the old or the new complete file, never a partial one under the final name. Every
*decision* (sealing a release, publishing an estimates part) is create-if-absent, so of two racing
processes exactly one wins and the other reads the winner's decision.

- ``files``: atomic writes, exclusive creation, the per-state-dir ``StateLock``.
- ``ledger``: the release ledger (which crowd/window was released, with what digest).
- ``run_state``: where the next run resumes, and the event-time watermark with idle partitions.
- ``dead_letters``: dead letters kept in their trust domain; identifier-free reason counts for analysts.
- ``estimates_store``: append-only, idempotent Parquet parts of released estimates.
"""
