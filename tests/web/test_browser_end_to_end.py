"""The web SDK from a real browser, end to end: headless Chromium (Debian's, driven by playwright-core from
clients/web) runs 500 devices of the TypeScript SDK on a page served on loopback; they enrol and post to
``esa edge`` (``--enrolment open``) on a real Kafka broker; the shuffler and the analyzer then run on what the edge
wrote, and the estimates must lie within 3 standard errors of the truth, with every record accounted for.

Randomness: the 500 statistical devices draw their keys and coins from a fixed seed (SeededRandomness, one seed
per device), so the statistical check is reproducible; one more device keeps its key and budget in IndexedDB and
draws everything from crypto.getRandomValues (production), reloads the page and reports again (same device id,
ledger carried over); its two reports go to an older window, whose crowd of one the shuffler never releases.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from pipelines import analyze, shuffle
from pipelines.job_config import JobConfig
from tests.edge.harness import EdgeProcess, topic_records, wait_for
from transforms.device.spec_export import spec_json
from transforms.io.kafka.bounded import ensure_topics
from transforms.spec import spec_from_dict
from transforms.state.estimates_store import read_estimates
from transforms.trust.keys import init_keys

REPO = Path(__file__).resolve().parents[2]
WEB = REPO / "clients" / "web"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
DEVICES = 500
CATEGORIES = ["en", "de", "fr", "es", "it", "ja", "ko", "zh"]
HOUR_MS = 3_600_000


def _node_modules() -> None:
    """The SDK's pinned dev dependencies (esbuild, playwright-core), installed from package-lock.json if missing."""
    if not (WEB / "node_modules" / "playwright-core").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=WEB, check=True, timeout=900)


def _truth(n: int) -> list[str]:
    """A fixed Zipf-like population of n values over the categories (every category present)."""
    w = 1.0 / np.arange(1, len(CATEGORIES) + 1) ** 1.1
    counts = np.floor(n * w / w.sum()).astype(int)
    counts[0] += n - counts.sum()
    return [c for c, k in zip(CATEGORIES, counts, strict=True) for _ in range(k)]


def test_500_browser_devices_report_through_the_edge_and_the_chain_estimates_them(broker, topic_name, tmp_path):
    for tool in ("node", "npm"):
        assert shutil.which(tool), f"{tool} is needed for the web SDK's browser test (.ci/run installs it)"
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is needed (.ci/run installs Debian's chromium)"
    _node_modules()
    spec = spec_from_dict({"analysis": {"name": "web_language", "metric": "web_language"},
                           "domain": {"categories": CATEGORIES}, "mechanism": {"name": "olh", "epsilon": 2.0},
                           "window": {"size_seconds": 3600}, "crowd": {"epsilon": 1.0, "delta": 1e-6},
                           "privacy": {"delta": 1e-6}}, source="test")
    keys = tmp_path / "keys"
    init_keys(keys)
    reports, devices, shuffled = (f"{topic_name}-{t}" for t in ("reports", "devices", "shuffled"))
    ensure_topics(broker.bootstrap, [reports, devices, shuffled], partitions=2)
    now_ms = int(time.time() * 1000)
    window = (now_ms // HOUR_MS - 1) * HOUR_MS  # the last complete window
    values = _truth(DEVICES)
    config_file = tmp_path / "drive.json"
    with EdgeProcess(broker.bootstrap, keys, tmp_path / "spool", tmp_path / "edge.log", "--enrolment", "open",
                     "--reports_topic", reports, "--devices_topic", devices) as edge:
        config_file.write_text(json.dumps({
            "edge": edge.url, "spec": spec_json(spec), "budget": {"epsilonPerEpoch": 8.0, "epochSeconds": 86400},
            "runs": [{"n": DEVICES, "values": values, "eventTimeMs": window + 1_000, "seedBase": 7_000}],
            "persistent": {"value": "ko", "eventTimeMs": window - 2 * HOUR_MS + 5_000}, "bench": None}))
        done = subprocess.run(["node", "test/browser/drive.mjs", str(config_file)], cwd=WEB, capture_output=True,
                              text=True, timeout=1800, env={**os.environ, "CHROMIUM": CHROMIUM})
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        wait_for(lambda: len(topic_records(broker.bootstrap, reports)) >= DEVICES + 2, what="reports in Kafka")
    (browser_devices,) = result["runs"]
    assert [d["sent"] for d in browser_devices] == [1] * DEVICES  # every report got its 202
    assert len({d["deviceId"] for d in browser_devices}) == DEVICES
    first, again = result["persistent"]
    assert first["deviceId"] == again["deviceId"]  # the key came back from IndexedDB after the reload
    assert (first["reports"], again["reports"]) == (1, 2) and again["spent"] == pytest.approx(2 * first["spent"])
    assert "HeadlessChrome" in result["userAgent"]

    records = topic_records(broker.bootstrap, reports)
    assert len(records) == DEVICES + 2
    enrolled = topic_records(broker.bootstrap, devices)  # the shuffler reads its device store from this topic
    assert len({r.key for r in enrolled}) == DEVICES + 1

    def config(stage: str) -> JobConfig:  # one trust domain per stage: its own state and consumer group
        return JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=tmp_path / "out", keys_dir=keys,
                         state_dir=tmp_path / "state" / stage, reports_topic=reports, shuffled_topic=shuffled,
                         devices_topic=devices,
                         group_id=f"g-{topic_name}-{stage}", seed=5, drain=True, create_topics=True)

    shuffled_run, analyzed = shuffle.run(config("shuffle")), analyze.run(config("analyze"))
    assert shuffled_run.balanced and analyzed.balanced, (shuffled_run.accounting, analyzed.accounting)
    # every set read is accounted for: the persistent device's second report in its window is a duplicate
    # (dead-lettered), its crowd of one is suppressed (deleted), the browser window's crowd released less its
    # random deletions; the analyzer opens every released message
    parts = shuffled_run.accounting
    assert parts["read"] == DEVICES + 2 and parts["dead_lettered"] == 1
    assert parts["released"] + parts["deleted"] == DEVICES + 1
    assert analyzed.count("dead_lettered") == 0

    est = read_estimates(tmp_path / "out").to_pydict()
    rows = [i for i, end in enumerate(est["window_end"]) if int(end) == window + HOUR_MS]
    assert len(rows) == len(CATEGORIES), est["window_end"]
    truth = {c: values.count(c) / DEVICES for c in CATEGORIES}
    z = [abs(est["estimate"][i] - truth[est["item"][i]]) / est["stderr"][i] for i in rows]
    print(f"browser e2e: {parts}, max z {max(z):.2f} over {len(z)} items")
    assert max(z) < 3.0, dict(zip([est["item"][i] for i in rows], z, strict=True))
    assert {est["n_clients"][i] for i in rows} == {parts["released"]}
    assert all(int(end) == window + HOUR_MS for end in est["window_end"])  # the crowd of one is never released
