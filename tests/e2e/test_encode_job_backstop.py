"""``esa encode`` on a real broker keeps one permanent backstop per device across windows and runs (issue 23,
item 6): 40 hourly events of one device, encoded by two separate runs of the job with the production key
path (no seed: sub-keys of ``KEYS/encoder/prf.key``), all show the same backstop. With eps_f = 15 a fragment
copies its backstop bit except with probability 3e-7, and a message's channel (fragment i, bit j on channel
i d + j) travels in the clear, so the backstop can be read off the reports topic without opening anything.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from pipelines import encode
from pipelines.enrolment import enrol_simulated
from pipelines.job_config import JobConfig
from schemas import SCHEMA_VERSION, encode_record
from tests.e2e.adversary import opened
from tests.e2e.chain_harness import recent_start
from transforms.io.kafka.bounded import ensure_topics, produce_records, read_topic
from transforms.spec import spec_from_dict
from transforms.wire.rows import PRESENCE

D, TAU, HOUR_MS = 8, 2, 3_600_000
SPEC = spec_from_dict({"analysis": {"name": "frag_job", "metric": "frag_job"}, "domain": {"size": D},
                       "mechanism": {"name": "rappor_fragments", "epsilon": 1.0, "fragments": TAU,
                                     "epsilon_fragment": 15.0}})
DEVICES = ["phone-a", "phone-b", "phone-c"]

pytestmark = pytest.mark.slow


def _events(start_ms: int, hours: range) -> list[tuple[bytes, bytes]]:
    out = []
    for h in hours:
        for device in DEVICES:
            record = {"schema_version": SCHEMA_VERSION, "client_id": device, "event_time": start_ms + h * HOUR_MS,
                      "metric": SPEC.metric, "value": 3, "crowd_id": None}
            out.append((device.encode(), encode_record("TelemetryEvent", record)))
    return out


def test_two_runs_of_the_encode_job_over_40_windows_show_one_backstop_per_device(broker, tmp_path):
    raw, reports = f"raw-bs-{tmp_path.name}", f"rep-bs-{tmp_path.name}"
    ensure_topics(broker.bootstrap, [raw, reports], partitions=3)
    enrol_simulated(tmp_path / "keys", DEVICES)
    config = JobConfig(bootstrap=broker.bootstrap, specs=(SPEC,), out_dir=tmp_path / "out",
                       state_dir=tmp_path / "state", keys_dir=tmp_path / "keys", raw_topic=raw, reports_topic=reports,
                       shuffled_topic=f"shuf-bs-{tmp_path.name}", group_id=f"g-bs-{tmp_path.name}", seed=None)
    start = recent_start(HOUR_MS, back=41)
    for hours in (range(0, 20), range(20, 40)):  # two runs: the second starts with no memory of the first
        produce_records(broker.bootstrap, raw, _events(start, hours))
        summary = encode.run(config)
        assert summary.parts == {"dead_lettered": 0, "encoded": 20 * len(DEVICES)}
    seen: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    sets = [opened(tmp_path / "keys", record.value) for record in read_topic(broker.bootstrap, reports)]
    assert len(sets) == 40 * len(DEVICES)
    for ms in sets:
        channels = np.array([m.channel for m in ms.messages if m.channel != PRESENCE])
        fragments = [tuple(sorted((channels[channels // D == i] % D).tolist())) for i in range(TAU)]
        assert fragments[0] == fragments[1]
        seen[ms.device_id].add(fragments[0])
    assert len(seen) == len(DEVICES)
    assert all(len(backstops) == 1 for backstops in seen.values()), {k: len(v) for k, v in seen.items()}
