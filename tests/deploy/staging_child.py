"""One bounded job of a chain, staging under a URL, in its own process (so ``ESA_CRASH_AT`` kills a real one).

    python tests/deploy/staging_child.py STAGE CHAIN_JSON STAGING_LOCATION [BEAM FLAGS...]

The chain is ``tests.e2e.chain_harness.Chain``; the Beam flags carry the object store's endpoint and
credentials, as they would on a cluster. Prints the run's summary as one JSON line, like the harness's child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def start(stage: str, chain_json: str, staging: str, flags: list[str], crash_at: str | None = None
          ) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "ESA_CRASH_AT" and not k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if crash_at:
        env["ESA_CRASH_AT"] = crash_at
    return subprocess.Popen([sys.executable, __file__, stage, chain_json, staging, *flags], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _main(stage: str, chain_json: str, staging: str, flags: list[str]) -> None:
    import logging
    from dataclasses import replace

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines import analyze, encode, shuffle
    from tests.e2e.chain_harness import Chain

    logging.basicConfig(level=logging.WARNING)
    fields = json.loads(chain_json)
    for name in ("out", "keys"):
        fields[name] = Path(fields[name])
    config = replace(Chain(**fields).config(stage), staging_location=staging)
    module = {"encode": encode, "shuffle": shuffle, "analyze": analyze}[stage]
    summary = module.run(config, PipelineOptions(flags))
    print(json.dumps({"counters": summary.counters, "parts": summary.parts, "balanced": summary.balanced,
                      "extra": {k: v for k, v in summary.extra.items() if isinstance(v, (int, str))}}), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
