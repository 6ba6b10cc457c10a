#!/usr/bin/env bash
# Submit `esa run` to a Flink cluster through Beam's Flink job server (PortableRunner).
#
# Prerequisites (none of which this repository can provide or test offline):
#   * a Flink 1.20 cluster whose JobManager REST address is $FLINK_MASTER (host:8081);
#   * Beam's Flink job server of the SAME Beam version as the submitting Python:
#       docker run --net=host apache/beam_flink1.20_job_server:2.77.0 --flink-master="$FLINK_MASTER"
#     (it serves the Job API on localhost:8099, the artifact service on 8098, the expansion service on 8097);
#   * the SDK harness image of the root Dockerfile, pushed where the TaskManagers can pull it ($SDK_IMAGE),
#     or, for ENVIRONMENT=EXTERNAL, that image running beside every TaskManager as a worker pool:
#       docker run --net=host "$SDK_IMAGE" --worker_pool      (listens on localhost:50000)
#   * a staging location the SDK workers and this driver can both reach ($STAGING_LOCATION): s3://bucket/prefix
#     (boto3 is in the harness image; endpoint and credentials through --s3_* flags or the workers' own AWS
#     environment), gs://..., or a directory on a filesystem they share. --state_dir and --keys_dir stay on
#     this driver's local disk.
set -euo pipefail

: "${SPEC:?path of the analysis spec TOML}"
: "${KAFKA_BOOTSTRAP:?host:port of Kafka, reachable from the TaskManagers}"
JOB_ENDPOINT="${JOB_ENDPOINT:-localhost:8099}"
ENVIRONMENT="${ENVIRONMENT:-DOCKER}"           # DOCKER (TaskManagers start the image) or EXTERNAL (worker pool)
SDK_IMAGE="${SDK_IMAGE:-esa-telemetry-sdk:0.1.0}"
WORKER_POOL="${WORKER_POOL:-localhost:50000}"
OUTPUT_DIR="${OUTPUT_DIR:-out/flink}"
: "${STAGING_LOCATION:?s3://bucket/prefix (or gs://..., or a shared directory) where the workers stage each run}"

if [[ "$ENVIRONMENT" == "DOCKER" ]]; then
  ENV_CONFIG="$SDK_IMAGE"
else
  ENV_CONFIG="$WORKER_POOL"
fi

exec esa run \
  --runner=PortableRunner \
  --job_endpoint="$JOB_ENDPOINT" \
  --environment_type="$ENVIRONMENT" \
  --environment_config="$ENV_CONFIG" \
  --parallelism=2 \
  --staging_location="$STAGING_LOCATION" \
  --spec="$SPEC" \
  --kafka_bootstrap="$KAFKA_BOOTSTRAP" \
  --consumer_group="${CONSUMER_GROUP:-esa-flink}" \
  --estimates_topic="${ESTIMATES_TOPIC:-estimates}" \
  --dead_letter_topic="${DEAD_LETTER_TOPIC:-dead-letters}" \
  --output_dir="$OUTPUT_DIR"
