"""A bounded run on a Flink cluster cancels the job an earlier driver of its state directory left running
(``pipelines.flink_jobs.adopt_flink_job``), and nothing else.

The orphans here are the cluster probe job (Flink's own API, ``tests/flink/probe``) submitted under the names
the esa drivers give their Flink jobs: the same REST lookup and cancel an esa rerun does, in seconds, on a job
that cannot finish by itself while the test looks (an esa job may; ``test_beam_on_flink`` kills real drivers).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from pipelines.flink_jobs import adopt_flink_job, cancel_jobs, job_name
from tests.flink.cluster import submit, upload, wait_state
from tests.flink.kills import state_of
from transforms.state.layout import StateDir

pytestmark = pytest.mark.slow
FOREVER = [str(10**12), "50"]  # numbers to count, sleep per thousand: runs until cancelled


def _state(path: Path) -> SimpleNamespace:
    path.mkdir(parents=True)
    return SimpleNamespace(state=path, state_layout=StateDir(path))


def test_a_run_cancels_its_state_directorys_orphan_and_leaves_other_jobs(flink_cluster, probe_jar,
                                                                          tmp_path: Path) -> None:
    mine, other = _state(tmp_path / "mine"), _state(tmp_path / "other")
    orphan_name, other_name = job_name(mine, "shuffle"), job_name(other, "shuffle")
    assert orphan_name != other_name and job_name(mine, "shuffle") == orphan_name  # drawn once per directory
    jar = upload(flink_cluster, probe_jar)
    orphan = submit(flink_cluster, jar, [FOREVER[0], str(tmp_path / "o1"), FOREVER[1], orphan_name], parallelism=1)
    bystander = submit(flink_cluster, jar, [FOREVER[0], str(tmp_path / "o2"), FOREVER[1], other_name],
                       parallelism=1)
    try:
        for jid in (orphan, bystander):
            wait_state(flink_cluster, jid, {"RUNNING"})
        options = PipelineOptions(["--runner=FlinkRunner", f"--flink_master={flink_cluster.rest}"])
        assert adopt_flink_job(mine, "shuffle", options) == orphan_name
        assert options.view_as(GoogleCloudOptions).job_name == orphan_name  # the run's Flink job takes it
        assert state_of(flink_cluster, orphan) == "CANCELED"  # waited for, not only asked
        assert state_of(flink_cluster, bystander) == "RUNNING"  # another state directory's job: untouched
        # ``esa run`` shares its options among its stages: the next stage gets its own name, not a suffix
        assert adopt_flink_job(mine, "analyze", options) == orphan_name.replace("-shuffle-", "-analyze-")
        named = PipelineOptions(["--runner=FlinkRunner", f"--flink_master={flink_cluster.rest}", "--job_name=ops"])
        assert adopt_flink_job(mine, "encode", named) == "ops-encode-" + orphan_name.rsplit("-", 1)[1]
        # off a cluster nothing is named or asked
        assert adopt_flink_job(mine, "shuffle", PipelineOptions(["--runner=FlinkRunner",
                                                                 "--flink_master=[local]"])) is None
    finally:
        cancel_jobs(flink_cluster.rest, other_name, "test cleanup")
        cancel_jobs(flink_cluster.rest, orphan_name, "test cleanup")
    assert state_of(flink_cluster, bystander) == "CANCELED"
