"""Beam 2.62's portable runners (``PortableRunner.run_portable_pipeline``: Flink, Prism, a job endpoint) set
``--runner`` to None on the very options object they were given (newer Beams hand runners a copy). ``esa run``
runs its three pipelines with one options object, and ``--follow`` one run after another: unless
``run_pipeline`` puts the runner back, everything after the first pipeline silently runs in process (found on
Flink: one job on the cluster instead of three). Run in the Beam 2.62.0 environment, where the fault lives."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = """
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from pipelines.job import run_pipeline

USED = []


class ResettingRunner(FnApiRunner):
    '''Does to the options what Beam 2.62's PortableRunner does, then runs in process.'''

    def run_pipeline(self, pipeline, options):
        USED.append(str(options.view_as(StandardOptions).runner))
        options.view_as(StandardOptions).runner = None
        return super().run_pipeline(pipeline, options)


import __main__
__main__.ResettingRunner = ResettingRunner
options = PipelineOptions(["--runner=__main__.ResettingRunner"])
for _ in range(3):
    run_pipeline(lambda p: p | beam.Create([1, 2]) | beam.Map(lambda x: x), options)
print(len(USED), options.view_as(StandardOptions).runner)
"""


def test_every_pipeline_of_a_process_runs_on_the_runner_asked_for(flink_env: Path) -> None:
    done = subprocess.run([str(flink_env / "bin" / "python"), "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["3", "__main__.ResettingRunner"]
