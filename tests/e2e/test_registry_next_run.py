"""When an enrolment counts, end to end with the real shuffle job: from the next run the shuffler starts.

The shuffler catches its device store up from the devices topic at the start of each run, and nothing writes
the store while that run's pipeline runs. A device enrolled *during* a run (here: produced from inside the
run, after its catch-up) is unknown to that run (its set is dead-lettered "unknown device" and the window
the run releases is unchanged) and known to the next run, which reads only that one new enrolment.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipelines import shuffle
from pipelines.enrolment import enrol_keys
from tests.e2e.adversary import HOUR_MS, Stage, dead_letters, forged_set, histogram_spec
from transforms.io.kafka.bounded import ensure_topics, produce_records
from transforms.state.ledger import ReleaseLedger
from transforms.trust.devices import device_id_of
from transforms.trust.keys import init_keys

pytestmark = pytest.mark.slow
N = 12


def test_an_enrolment_made_during_a_run_counts_from_the_next_run(broker, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    spec = histogram_spec("registry-next-run", min_clients=2)
    now = (int(time.time() * 1000) // HOUR_MS) * HOUR_MS
    tag = f"regnext-{tmp_path.name}"
    topics = {"reports_topic": f"{tag}-rep", "shuffled_topic": f"{tag}-shuf", "devices_topic": f"{tag}-dev"}
    stage = Stage(tmp_path, broker.bootstrap, spec, now, topics)
    init_keys(stage.keys)
    ensure_topics(broker.bootstrap, [topics["reports_topic"], topics["shuffled_topic"]], partitions=2)
    rng = np.random.default_rng(3)
    fleet = [Ed25519PrivateKey.generate() for _ in range(N)]
    late = Ed25519PrivateKey.generate()  # enrolled during run 1
    publics = [k.public_key().public_bytes_raw() for k in fleet]
    assert enrol_keys(broker.bootstrap, topics["devices_topic"], publics) == N

    def sets(keys: list[Ed25519PrivateKey], event_ms: int) -> list[tuple[bytes, bytes]]:
        out = []
        for key in keys:
            device = device_id_of(key.public_key().public_bytes_raw())
            out.append((device.encode(), forged_set(spec, stage.keys, device_id=device, signer=key,
                                                    event_time_ms=event_ms, category=int(rng.integers(spec.d)),
                                                    rng=rng)))
        return out

    produce_records(broker.bootstrap, topics["reports_topic"], sets([*fleet, late], now - 3 * HOUR_MS + 1000))
    real_run_pipeline = shuffle.run_pipeline

    def enrol_mid_run(*args, **kwargs):  # the run has caught its store up already: this enrolment is "mid-window"
        enrol_keys(broker.bootstrap, topics["devices_topic"], [late.public_key().public_bytes_raw()])
        return real_run_pipeline(*args, **kwargs)

    monkeypatch.setattr(shuffle, "run_pipeline", enrol_mid_run)
    first = shuffle.run(stage.config("shuffle"))
    monkeypatch.setattr(shuffle, "run_pipeline", real_run_pipeline)
    assert first.balanced, first.accounting
    assert first.extra["registry"]["read"] == N and first.extra["registry"]["devices"] == N
    assert first.count("sets_authenticated") == N and first.count("dead_lettered") == 1
    letters = dead_letters(stage.config("shuffle").state_layout.dead_letters)
    assert [letter["reason"] for letter in letters] == ["unauthenticated: unknown device (not enrolled)"]
    ledger = ReleaseLedger(stage.config("shuffle").state_layout.ledger)
    assert len(list(ledger.entries(spec.spec_id))) == 1  # the window run 1 closed (released, or withheld)

    produce_records(broker.bootstrap, topics["reports_topic"], sets([*fleet, late], now - 2 * HOUR_MS + 1000))
    second = shuffle.run(stage.config("shuffle"))  # a new run: the store reopened from disk, caught up from its offsets
    assert second.balanced, second.accounting
    assert second.extra["registry"]["read"] == 1 and second.extra["registry"]["devices"] == N + 1
    assert second.count("sets_authenticated") == N + 1 and second.count("dead_lettered") == 0
    assert len(list(ledger.entries(spec.spec_id))) == 2
