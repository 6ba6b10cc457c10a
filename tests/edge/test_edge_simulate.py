"""``esa simulate --devices D --edge URL``: simulated devices encode with the device client and post over HTTP to the
edge, as real devices do; the shuffler's ingress admits every report the edge forwarded."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from apache_beam.pvalue import TaggedOutput

from pipelines.registry import catch_up, store_path
from tests.edge.harness import REPO, EdgeProcess, topic_records
from transforms.io.kafka.bounded import ensure_topics
from transforms.shuffler.elements import TimePolicy
from transforms.shuffler.ingress import IngressFn
from transforms.spec import load_spec
from transforms.state.prior_runs import PriorRuns
from transforms.trust.keys import init_keys
from transforms.trust.layout import KeysDir

pytestmark = pytest.mark.slow
CLIENTS = 200


def test_simulated_devices_report_through_the_edge(broker, topic_name: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    init_keys(keys)
    ensure_topics(broker.bootstrap, [topic_name, f"{topic_name}-devices"], partitions=2)
    spec_path = REPO / "examples" / "service_minute.toml"
    with EdgeProcess(broker.bootstrap, keys, tmp_path / "spool", tmp_path / "edge.log", "--reports_topic",
                     topic_name, "--devices_topic", f"{topic_name}-devices") as edge:
        done = subprocess.run([sys.executable, "-m", "pipelines.cli", "simulate", "--bootstrap", broker.bootstrap,
                               "--spec", str(spec_path), "--clients", str(CLIENTS), "--keys_dir", str(keys),
                               "--devices", str(tmp_path / "devices"), "--edge", edge.url, "--seed", "5",
                               "--devices_topic", f"{topic_name}-devices"],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    produced = json.loads(done.stdout.strip().splitlines()[-1])["produced"]
    assert produced == {"accepted_by_edge": CLIENTS, "refused_by_device_budget": 0}
    records = topic_records(broker.bootstrap, topic_name)
    assert len(records) == CLIENTS
    now_ms = max(r.timestamp_ms for r in records) + 120_000
    # the shuffler's device store, caught up from the devices topic the edge wrote the enrolments to
    catch_up(tmp_path / "shuffle", bootstrap=broker.bootstrap, topic=f"{topic_name}-devices",
             legacy_registry=KeysDir(keys).device_registry)
    ingress = IngressFn([load_spec(spec_path)], str(store_path(tmp_path / "shuffle")), PriorRuns(),
                        TimePolicy(now_ms, 86_400_000, 3_600_000), keys_dir=str(keys))
    ingress.setup()
    out = list(ingress.process(records))
    dead = [o.value for o in out if isinstance(o, TaggedOutput) and o.tag == "dead_letters"]
    assert not dead, {d["reason"] for d in dead}
    assert sum(len(pickle.loads(o[1])) for o in out if not isinstance(o, TaggedOutput)) == CLIENTS


def test_edge_without_devices_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "simulate", "--bootstrap", "127.0.0.1:1",
                           "--edge", "http://127.0.0.1:1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--devices" in done.stderr


def test_bulk_posting_of_batch_sealed_reports(broker, topic_name: str, tmp_path: Path) -> None:
    """What ``esa demo`` does: reports sealed in numpy batches (``device_batch``), posted on pipelined keep-alive
    connections (``bulk_client``). A device's second report inside its rate gets 429 and is posted again after
    the Retry-After (then 202); a body that is no sealed set gets its 400 once; every 202 is in the topic."""
    from pipelines.demo.device_batch import sealed_reports
    from pipelines.demo.population import synthesize
    from pipelines.edge.bulk_client import post_pipelined

    keys = tmp_path / "keys"
    init_keys(keys)
    ensure_topics(broker.bootstrap, [topic_name, f"{topic_name}-devices"], partitions=2)
    spec = load_spec(REPO / "examples" / "service_minute.toml")
    population = synthesize(spec, 40, seed=3)
    chunks = list(sealed_reports(spec, population, keys, seed=3, chunk=16))
    assert [len(c) for c in chunks] == [16, 16, 8]
    chunks.append([chunks[0][0], b"\x01not a sealed set"])  # device 0 again at once, and garbage
    with EdgeProcess(broker.bootstrap, keys, tmp_path / "spool", tmp_path / "edge.log", "--reports_topic",
                     topic_name, "--devices_topic", f"{topic_name}-devices", "--rate_per_device", "1",
                     "--burst_per_device", "1") as edge:
        answers = post_pipelined(edge.url, chunks, connections=4, depth=4, max_chunks=2)
    assert answers == {202: 41, 400: 1}
    assert len(topic_records(broker.bootstrap, topic_name)) == 41
