#!/usr/bin/env bash
# Run `esa run` on Google Cloud Dataflow, as a service. This process is the driver: it plans each bounded
# run from its --state_dir, submits it to Dataflow as a batch job, waits for it, then seals, publishes and
# saves state, and (--follow) starts the next run. Dataflow's workers read Kafka and write their results
# under --staging_location (gs://); the driver reads them back and deletes them. The ledger, the run state
# and the keys never leave this machine: run it where --state_dir and --keys_dir are on a persistent disk
# (a VM with a persistent disk, a Kubernetes StatefulSet with a PersistentVolume), one driver per state dir.
#
# Needs (none of it can be run offline): a GCP project and bucket, the harness image of the root Dockerfile
# pushed to Artifact Registry, Kafka reachable from the workers' VPC, and on this machine
# `pip install 'esa-telemetry[gcp]'` (DataflowRunner, gs://) plus application-default credentials.
set -euo pipefail

: "${PROJECT:?GCP project id}"
: "${REGION:?Dataflow region, e.g. europe-west1}"
: "${BUCKET:?gs://bucket for staging and temp files}"
: "${SDK_IMAGE:?REGION-docker.pkg.dev/PROJECT/REPO/esa-telemetry-sdk:0.1.0}"
: "${SPEC:?path of the analysis spec TOML}"
: "${KAFKA_BOOTSTRAP:?host:port of Kafka, reachable from the workers}"
STATE_DIR="${STATE_DIR:-/var/lib/esa/state}"   # persistent local disk: ledger, run state, lock
KEYS_DIR="${KEYS_DIR:-/var/lib/esa/keys}"      # persistent local disk: keys and the device registry

exec esa run \
  --runner=DataflowRunner \
  --project="$PROJECT" \
  --region="$REGION" \
  --temp_location="$BUCKET/tmp" \
  --staging_location="$BUCKET/staging" \
  --sdk_container_image="$SDK_IMAGE" \
  --sdk_location=container \
  --job_name="esa-run-$(date +%Y%m%d-%H%M%S)" \
  --spec="$SPEC" \
  --kafka_bootstrap="$KAFKA_BOOTSTRAP" \
  --consumer_group="${CONSUMER_GROUP:-esa-dataflow}" \
  --estimates_topic="${ESTIMATES_TOPIC:-estimates}" \
  --dead_letter_topic="${DEAD_LETTER_TOPIC:-dead-letters}" \
  --state_dir="$STATE_DIR" \
  --keys_dir="$KEYS_DIR" \
  --output_dir="${OUTPUT_DIR:-/var/lib/esa/estimates}" \
  --poll_seconds="${POLL_SECONDS:-60}" \
  --follow
