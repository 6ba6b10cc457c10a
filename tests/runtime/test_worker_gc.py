"""The workers' collector tuning: once per process, off with ``--python_gc default``, and reaching the jobs.

Each check runs in a fresh interpreter: freezing and thresholds are process-wide and would leak into the
other tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.examples import example_path
from pipelines.job_config import JobConfig, config_from_options


def _in_fresh_python(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tuned_freezes_start_up_objects_and_raises_the_young_threshold_once() -> None:
    result = _in_fresh_python(
        "import gc, json\n"
        "import numpy\n"
        "from transforms.runtime.worker_gc import YOUNG_THRESHOLD, tune_worker_gc\n"
        "before = gc.get_threshold()\n"
        "first = tune_worker_gc('tuned')\n"
        "frozen = gc.get_freeze_count()\n"
        "again = tune_worker_gc('tuned')\n"
        "print(json.dumps({'before': before, 'after': gc.get_threshold(), 'frozen': frozen,\n"
        "                  'frozen_again': gc.get_freeze_count(), 'first': first, 'again': again,\n"
        "                  'young': YOUNG_THRESHOLD}))\n")
    assert result["before"][0] == 700  # CPython's default, which the tuning exists to change
    assert result["after"] == [result["young"], 50, 100]
    assert result["frozen"] > 10_000  # numpy and friends: what full collections no longer walk
    assert result["frozen_again"] == result["frozen"]  # the second call changes nothing
    assert result["first"] and result["again"]


def test_default_leaves_the_collector_alone_and_a_bad_mode_is_refused() -> None:
    result = _in_fresh_python(
        "import gc, json\n"
        "from transforms.runtime.worker_gc import tune_worker_gc\n"
        "tuned = tune_worker_gc('default')\n"
        "print(json.dumps({'tuned': tuned, 'threshold': gc.get_threshold(), 'frozen': gc.get_freeze_count()}))\n")
    assert result == {"tuned": False, "threshold": [700, 10, 10], "frozen": 0}
    from transforms.runtime.worker_gc import tune_worker_gc

    with pytest.raises(ValueError, match="python_gc must be one of"):
        tune_worker_gc("off")


def test_the_option_reaches_the_job_config_and_the_dofns() -> None:
    from transforms.analyzer.releases import OpenBatchFn
    from transforms.encoder.seal import SealSetsFn

    assert JobConfig(bootstrap="x", specs=(), out_dir=Path("out")).python_gc == "tuned"
    spec_file = str(example_path("app_language.toml"))
    config = config_from_options(PipelineOptions(["--spec", spec_file, "--kafka_bootstrap", "127.0.0.1:1",
                                                  "--python_gc", "default"]))
    assert config.python_gc == "default"
    assert OpenBatchFn([], "keys", 1, config.python_gc)._python_gc == "default"
    assert SealSetsFn([], "keys", 1, config.python_gc)._python_gc == "default"
