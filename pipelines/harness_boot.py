"""``esa-sdk-harness``: the boot command of a Python SDK harness in Beam's PROCESS environment.

A runner with ``--environment_type=PROCESS --environment_config='{"command": "<env>/bin/esa-sdk-harness"}'``
(a Flink TaskManager here) executes the command itself, with no shell, as ``COMMAND --id=ID
--provision_endpoint=H:P --logging_endpoint=... --control_endpoint=... --artifact_endpoint=...
--semi_persist_dir=DIR``. Beam's own boot program (Go, inside its SDK container images) is not installed by pip,
and ``python -m apache_beam.runners.worker.sdk_worker_main`` reads its settings from environment variables, not
flags: this does what the Go boot does for a harness whose code is already installed (the project and Beam in
the same environment, ``deploy/flink/env``): ask the provision service for the pipeline options and the
endpoints, put them where ``sdk_worker_main`` reads them, and replace this process with it. Staged artifacts are
not fetched: the jobs stage none (no ``--requirements_file``, ``--setup_file`` or ``--save_main_session``),
and a job that does is refused with one line naming them rather than run without them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import grpc
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc, beam_runner_api_pb2
from google.protobuf import json_format, text_format

EXIT_STAGED_ARTIFACTS = 2
# The SDK stages the submitting environment's ``pip freeze`` with every job, for the record only.
INFORMATIONAL = {"submission_environment_dependencies.txt"}


def _staged_name(artifact: beam_runner_api_pb2.ArtifactInformation) -> str:
    role = beam_runner_api_pb2.ArtifactStagingToRolePayload()
    if artifact.role_urn == common_urns.artifact_roles.STAGING_TO.urn:
        role.ParseFromString(artifact.role_payload)
    return role.staged_name or artifact.type_payload.decode(errors="replace")[:80]


def _descriptor(url: str, given: object) -> str:
    """An ``ApiServiceDescriptor`` in text format: the provisioned one, else the flag's URL."""
    text = text_format.MessageToString(given) if given is not None and getattr(given, "url", "") else ""
    return text or f'url: "{url}"'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="esa-sdk-harness", description=__doc__.split("\n\n")[0])
    for flag in ("id", "provision_endpoint", "logging_endpoint", "control_endpoint", "artifact_endpoint",
                 "semi_persist_dir"):
        parser.add_argument(f"--{flag}", default="")
    args, _ = parser.parse_known_args(argv)
    if not args.provision_endpoint:
        parser.error("--provision_endpoint is required (the runner passes it)")
    with grpc.insecure_channel(args.provision_endpoint) as channel:
        info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", args.id)], timeout=120).info
    staged = [name for name in map(_staged_name, info.dependencies) if name not in INFORMATIONAL]
    if staged:
        print(f"esa-sdk-harness: the job staged artifacts this boot does not install ({', '.join(staged)}); "
              "install them into the harness environment instead", file=sys.stderr)
        return EXIT_STAGED_ARTIFACTS
    env = dict(os.environ)
    env["WORKER_ID"] = args.id
    env["PIPELINE_OPTIONS"] = json.dumps(json_format.MessageToDict(info.pipeline_options))
    env["LOGGING_API_SERVICE_DESCRIPTOR"] = _descriptor(args.logging_endpoint, info.logging_endpoint)
    env["CONTROL_API_SERVICE_DESCRIPTOR"] = _descriptor(args.control_endpoint, info.control_endpoint)
    if info.status_endpoint.url:
        env["STATUS_API_SERVICE_DESCRIPTOR"] = text_format.MessageToString(info.status_endpoint)
    env["RUNNER_CAPABILITIES"] = " ".join(info.runner_capabilities)
    if args.semi_persist_dir:
        env["SEMI_PERSISTENT_DIRECTORY"] = args.semi_persist_dir
    os.execve(sys.executable, [sys.executable, "-m", "apache_beam.runners.worker.sdk_worker_main"], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
