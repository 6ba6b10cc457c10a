#!/usr/bin/env bash
# Build the Flex Template spec from the image of deploy/dataflow/Dockerfile and metadata.json, then launch it.
#
# A Flex Template launch is ONE bounded run (a backfill): the launcher VM is the driver, and its disk --
# with the run's ledger and state -- is gone when it exits. A second launch on the same consumer group is
# refused (its fresh state directory finds offsets another job committed); for a service, run the driver
# as a long-running process instead (run_dataflow.sh, docs/deployment.md).
set -euo pipefail

: "${PROJECT:?GCP project id}"
: "${REGION:?Dataflow region}"
: "${BUCKET:?gs://bucket for the template spec, staging and temp files}"
: "${FLEX_IMAGE:?REGION-docker.pkg.dev/PROJECT/REPO/esa-telemetry-flex:0.1.0}"

gcloud dataflow flex-template build "$BUCKET/templates/esa-run.json" \
  --image="$FLEX_IMAGE" \
  --sdk-language=PYTHON \
  --metadata-file="$(dirname "$0")/metadata.json"

if [[ -n "${LAUNCH:-}" ]]; then
  : "${SPEC:?spec path inside the image, e.g. /opt/esa-telemetry/examples/app_language.toml}"
  : "${KAFKA_BOOTSTRAP:?host:port of Kafka}"
  gcloud dataflow flex-template run "esa-run-$(date +%Y%m%d-%H%M%S)" \
    --project="$PROJECT" --region="$REGION" \
    --template-file-gcs-location="$BUCKET/templates/esa-run.json" \
    --temp-location="$BUCKET/tmp" \
    --staging-location="$BUCKET/staging" \
    --additional-experiments=use_runner_v2 \
    --parameters=sdk_container_image="$FLEX_IMAGE" \
    --parameters=spec="$SPEC" \
    --parameters=kafka_bootstrap="$KAFKA_BOOTSTRAP" \
    --parameters=kafka_io=python \
    --parameters=consumer_group="esa-backfill-$(date +%Y%m%d-%H%M%S)"
fi
