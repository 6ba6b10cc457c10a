#!/usr/bin/env bash
# Submit `esa run` to Google Cloud Dataflow from a workstation (no template). Nothing here can be run
# offline: it needs a GCP project, a bucket, the SDK harness image of the root Dockerfile pushed to Artifact
# Registry, Kafka reachable from the workers' VPC, and the job's --state_dir on this machine (the driver seals and publishes).
set -euo pipefail

: "${PROJECT:?GCP project id}"
: "${REGION:?Dataflow region, e.g. europe-west1}"
: "${BUCKET:?gs://bucket for staging and temp files}"
: "${SDK_IMAGE:?REGION-docker.pkg.dev/PROJECT/REPO/esa-telemetry-sdk:0.1.0}"
: "${SPEC:?path of the analysis spec TOML}"
: "${KAFKA_BOOTSTRAP:?host:port of Kafka, reachable from the workers}"

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
  --output_dir="${OUTPUT_DIR:-out/dataflow}"
