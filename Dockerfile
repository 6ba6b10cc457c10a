# SDK harness image ("custom container") for Dataflow and Flink workers: Beam's own Python 3.11 SDK image
# plus this package and its dependencies, so workers never pip-install at start-up.
#
#   docker build -t REGISTRY/esa-telemetry-sdk:0.1.0 .
#   --sdk_container_image REGISTRY/esa-telemetry-sdk:0.1.0          (Dataflow)
#   --environment_type DOCKER --environment_config REGISTRY/...     (Flink, PortableRunner)
#
# The tag must equal the apache-beam version that submits the job (tests/deploy/test_deploy_files.py checks
# it against the installed version): a harness of another version refuses the job or fails in obscure ways.
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /opt/esa-telemetry
COPY pyproject.toml README.md LICENSE ./
COPY schemas ./schemas
COPY transforms ./transforms
COPY pipelines ./pipelines
COPY examples ./examples

# Pin the image's own apache-beam so installing the package can never replace the harness's Beam.
# [aws]: boto3, for --staging_location s3://... (gs:// is served by the gcp extras the Beam image ships with).
RUN pip freeze | grep -i '^apache-beam' > /tmp/beam-constraint.txt \
    && pip install --no-cache-dir --constraint /tmp/beam-constraint.txt '.[aws]' \
    && python -c "import pipelines.end_to_end, transforms.mechanisms.registry" \
    && rm /tmp/beam-constraint.txt

# The entrypoint stays the SDK image's /opt/apache/beam/boot (the harness the runner starts).
