"""Adversarial suite (part 2): crowd-threshold bypass, poison pills in every field, a window flood.

Real broker, real jobs (the encode job through the ``esa`` CLI, to check its exit code). The attacker
writes to the raw, reports and shuffled topics; every job must return with balanced accounting, every
poison record must be dead-lettered with its topic, partition and offset, and the valid records behind
them must be processed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipelines import analyze, encode, shuffle
from pipelines.demo.population import Population, avro_value
from pipelines.demo.simulate import telemetry_messages
from pipelines.enrolment import enrol_simulated
from schemas import SCHEMA_VERSION, encode_record
from tests.e2e.adversary import (
    HOUR_MS,
    Stage,
    attacker_key,
    dead_letters,
    estimates,
    forged_release,
    forged_set,
    histogram_spec,
    reasons,
    to_shuffler,
    with_long,
)
from transforms.io.kafka.bounded import ensure_topics, produce_records, read_topic
from transforms.spec import load_spec
from transforms.state.dead_letters import MAX_ORIGINAL_BYTES, MAX_REASON_CHARS
from transforms.trust.devices import SimulatedFleet
from transforms.trust.message_set import MessageSet, SealedMessage, encode_message_set, sign_message_set

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
VICTIMS = 30
FORGED_PER_CROWD = 200
VALID = 300
FLOOD = 20_000


def deployment(broker, base: Path, spec, now: int) -> Stage:
    tag = f"{spec.name}-{base.name}"
    stage = Stage(base, broker.bootstrap, spec, now,
                  {"raw_topic": f"{tag}-raw", "reports_topic": f"{tag}-rep", "shuffled_topic": f"{tag}-shuf"})
    ensure_topics(broker.bootstrap, list(stage.topics.values()), partitions=2)
    return stage


def hour_now() -> int:
    return (int(time.time() * 1000) // HOUR_MS) * HOUR_MS


def test_crowd_threshold_cannot_be_bypassed_with_forged_reports(broker, tmp_path: Path) -> None:
    """30 victims alone in their crowds + 200 forged sets per crowd -> those crowds release nothing."""
    spec = histogram_spec("crowds", crowd="version")
    now = hour_now()
    stage = deployment(broker, tmp_path, spec, now)
    crowds = [f"v{i:02d}" for i in range(VICTIMS)]
    big = 500  # an honest crowd that must still be released (above the count's threshold, ~195 +- 31)
    n = VICTIMS + big
    rng = np.random.default_rng(3)
    population = Population(np.array([f"victim-{i:04d}" for i in range(n)], dtype=object),
                            rng.integers(0, spec.d, size=n), now - 2 * HOUR_MS + rng.integers(0, HOUR_MS, size=n),
                            HOUR_MS, np.array(crowds + ["big"] * big, dtype=object))
    enrol_simulated(stage.keys, population.client_ids)
    fleet = SimulatedFleet.from_keys_dir(stage.keys)
    produce_records(broker.bootstrap, stage.topics["raw_topic"], telemetry_messages(spec, population))
    forged = []
    for i, crowd in enumerate(crowds):
        victim = fleet.device_id(population.client_ids[i])
        for j in range(FORGED_PER_CROWD):
            device, key = attacker_key()
            device = victim if j % 4 == 0 else device  # a quarter impersonate the victim, the rest are sybils
            forged.append((device.encode(), forged_set(spec, stage.keys, device_id=device, signer=key, crowd_id=crowd,
                                                       event_time_ms=int(population.event_times_ms[i]),
                                                       category=0, rng=rng)))
    produce_records(broker.bootstrap, stage.topics["reports_topic"], forged)
    runs = {"encode": encode.run(stage.config("encode")), "shuffle": shuffle.run(stage.config("shuffle")),
            "analyze": analyze.run(stage.config("analyze"))}
    assert all(r.balanced for r in runs.values()), {k: r.accounting for k, r in runs.items()}
    shuf = runs["shuffle"]
    why = reasons(dead_letters(stage.base / "state" / "shuffle" / "dead_letters"))
    assert why["unauthenticated: unknown device (not enrolled)"] == VICTIMS * FORGED_PER_CROWD * 3 // 4
    assert why["unauthenticated: bad signature"] == VICTIMS * FORGED_PER_CROWD // 4
    assert shuf.accounting["dead_lettered"] == VICTIMS * FORGED_PER_CROWD
    assert shuf.count("sets_authenticated") == n
    assert shuf.extra["releases"] == 1 and shuf.count("crowds_suppressed") >= VICTIMS
    released = {k[1] for k in estimates(stage.out)}
    assert released == {"big"}  # no victim's crowd, no forged crowd
    assert {r["n_clients"] for r in estimates(stage.out).values()} <= set(range(10, big + 1))


def release_poison_fingerprint(spec, messages, key_id: str, signer) -> bytes:
    """A release batch whose schema fingerprint is wrong."""
    batch = forged_release(spec, messages, window_end=HOUR_MS * 10, n_sets=20, key_id=key_id, signer=signer)[0]
    return batch[:2] + bytes(8) + batch[10:]


def raw_event(spec, client: str, t: int, *, metric: str | None = None, value: str | None = None) -> bytes:
    value = avro_value(spec, 3) if value is None else value
    return encode_record("TelemetryEvent", {"schema_version": SCHEMA_VERSION, "client_id": client, "event_time": t,
                                            "metric": metric or spec.metric, "value": value, "crowd_id": None},
                         check=False)


def spec_toml(path: Path) -> Path:
    path.write_text('[analysis]\nname = "poison"\nmetric = "poison"\n[domain]\nsize = 8\n'
                    '[mechanism]\nname = "grr"\nepsilon = 2.0\n[window]\nsize_seconds = 3600\n'
                    '[crowd]\nepsilon = 1.0\ndelta = 1e-6\n')
    return path


def test_poison_pills_are_dead_lettered_and_the_valid_records_processed(broker, tmp_path: Path) -> None:
    spec = load_spec(spec_toml(tmp_path / "poison.toml"))
    now = hour_now()
    stage = deployment(broker, tmp_path, spec, now)
    t0 = now - 2 * HOUR_MS + 1000
    clients = [f"valid-{i:04d}" for i in range(VALID)]
    enrol_simulated(stage.keys, [*clients, "poisoner"])
    sentinel = 1_234_567_890_123
    template = raw_event(spec, "poisoner", sentinel)
    huge = 600 * 1024
    raw_poison = [
        raw_event(spec, "poisoner", 253_402_300_800_000),  # 9999-12-31: encoded, then refused as from the future
        raw_event(spec, "poisoner", 2**63 - 1), raw_event(spec, "poisoner", -(2**63)),
        with_long(template, sentinel, 2**63), with_long(template, sentinel, -(2**63) - 1),
        b"", os.urandom(300), os.urandom(huge), template[:2] + bytes(8) + template[10:],  # wrong fingerprint
        raw_event(spec, "poisoner", t0, metric="m" * huge), raw_event(spec, "poisoner", t0, value="x" * huge),
    ]
    produce_records(broker.bootstrap, stage.topics["raw_topic"], [(b"p", v) for v in raw_poison])
    produce_records(broker.bootstrap, stage.topics["raw_topic"],
                    [(c.encode(), raw_event(spec, c, t0 + i)) for i, c in enumerate(clients)])
    # Message sets straight onto the reports topic, every field out of range in turn.
    device, key = attacker_key()
    base = MessageSet(spec.spec_id, None, device, t0, bytes(16), "20260101-00000000", (SealedMessage(0, b"x" * 60),))
    signed = sign_message_set(base, key)
    good = encode_message_set(signed)

    def set_with(**fields) -> bytes:
        record = {"schema_version": SCHEMA_VERSION, "spec_id": spec.spec_id, "crowd_id": None, "device_id": device,
                  "event_time": t0, "nonce": bytes(16), "key_id": signed.key_id,
                  "messages": [{"channel": 0, "sealed": b"x" * 60}], "signature": signed.signature, **fields}
        return encode_record("MessageSet", record, check=False)

    set_poison = [to_shuffler(stage.keys, v) for v in (
        set_with(event_time=253_402_300_800_000), set_with(event_time=2**63 - 1), set_with(event_time=-(2**63)),
        with_long(set_with(event_time=sentinel), sentinel, 2**63),
        set_with(messages=[{"channel": 2**31 - 1, "sealed": b"x" * 60}]),
        set_with(messages=[{"channel": -1, "sealed": b"x" * 60}]),
        set_with(messages=[{"channel": 2**62, "sealed": b"x" * 60}]),
        b"", os.urandom(500), good[:2] + bytes(8) + good[10:],
    )] + [b"", os.urandom(500), os.urandom(huge), good]  # the last four not sealed to the shuffler
    produce_records(broker.bootstrap, stage.topics["reports_topic"], [(b"p", v) for v in set_poison])
    cli = [sys.executable, "-m", "pipelines.cli", "encode", "--spec", str(tmp_path / "poison.toml"),
           "--kafka_bootstrap", broker.bootstrap, "--raw_topic", stage.topics["raw_topic"],
           "--reports_topic", stage.topics["reports_topic"], "--output_dir", str(stage.out),
           "--state_dir", str(stage.base / "state" / "encode"), "--keys_dir", str(stage.keys),
           "--consumer_group", f"g-{stage.base.name}", "--seed", "7", "--max_dead_letter_fraction", "0.5"]
    done = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    shuf = shuffle.run(stage.config("shuffle"))
    rogue_id, rogue = "20260101-0badc0de", attacker_key()[1]
    junk = [SealedMessage(0, b"x" * 60)] * 20
    placeholder = 1000 * HOUR_MS  # its varint is patched to a window end near 2**62 no honest writer can encode
    release_poison = [b"", os.urandom(400), release_poison_fingerprint(spec, junk, rogue_id, rogue),
                      *forged_release(spec, junk, window_end=(2**53 // HOUR_MS - 1) * HOUR_MS, n_sets=20,
                                      key_id=rogue_id, signer=rogue),
                      with_long(forged_release(spec, junk, window_end=placeholder, n_sets=20, key_id=rogue_id,
                                               signer=rogue)[0], placeholder, (2**62 // HOUR_MS) * HOUR_MS)]
    produce_records(broker.bootstrap, stage.topics["shuffled_topic"], [(None, v) for v in release_poison])
    ana = analyze.run(stage.config("analyze"))

    enc_letters = dead_letters(stage.base / "state" / "encode" / "dead_letters")
    shuf_letters = dead_letters(stage.base / "state" / "shuffle" / "dead_letters")
    ana_letters = dead_letters(stage.base / "state" / "analyze" / "dead_letters")
    encoded_poison = len(raw_poison) - len(enc_letters)
    # Encoded and refused by the shuffler: the 9999-12-31 event (from the future) and the event time 2**63,
    # whose overlong varint the Avro decoder wraps modulo 2**64 to 0 (stale).
    assert encoded_poison == 2
    assert len(shuf_letters) == len(set_poison) + encoded_poison
    assert len(ana_letters) == len(release_poison)
    for letter in enc_letters + shuf_letters + ana_letters:
        assert letter["topic"] and letter["partition"] is not None and letter["offset"] is not None, letter
        assert len(letter["reason"]) <= MAX_REASON_CHARS, letter["reason"][:200]
        if letter["original"] is not None:
            assert len(letter["original"]) <= MAX_ORIGINAL_BYTES
    cut = [d for d in enc_letters + shuf_letters if (d["original_length"] or 0) > MAX_ORIGINAL_BYTES]
    assert len(cut) >= 4 and all(d["original_digest"].startswith("sha256:") for d in cut)
    assert all(len(d["original"]) == 64 * 1024 for d in cut)
    assert all(d["original"] is None for d in ana_letters)
    assert shuf.balanced and ana.balanced, (shuf.accounting, ana.accounting)
    assert shuf.count("sets_authenticated") == VALID
    assert ana.count("batches_analyzed") == 1
    # The analyst's directory after this bad input: no client or device id, none of the raw bytes.
    fleet = SimulatedFleet.from_keys_dir(stage.keys)
    needles = [b"valid-", b"poisoner", *(fleet.device_id(c).encode() for c in clients)]
    needles += [v[:32] for v in raw_poison + set_poison if len(v) >= 32]
    blob = b"".join(p.read_bytes() for p in stage.out.rglob("*") if p.is_file())
    assert blob and not [n for n in needles if n in blob]
    rows = estimates(stage.out)
    assert len(rows) == spec.d and {r["n_clients"] for r in rows.values()} <= set(range(VALID - 100, VALID + 1))


def test_window_flood_is_cheap_and_releases_nothing(broker, tmp_path: Path) -> None:
    """20,000 authenticated sets, one per hourly window: every 1-device crowd is withheld, quickly."""
    spec = histogram_spec("flood")
    now = hour_now()
    stage = deployment(broker, tmp_path, spec, now)
    clients = [f"flooder-{i:03d}" for i in range(100)]
    enrol_simulated(stage.keys, clients)
    fleet = SimulatedFleet.from_keys_dir(stage.keys)
    records = []
    for w in range(FLOOD):
        client = clients[w % len(clients)]
        device = fleet.device_id(client)
        ms = MessageSet(spec.spec_id, None, device, now - (w + 2) * HOUR_MS + 17, os.urandom(16),
                        "20260101-00000000", (SealedMessage(0, os.urandom(60)),))
        records.append((device.encode(), to_shuffler(stage.keys, encode_message_set(
            sign_message_set(ms, fleet.signing_key(client))))))
    produce_records(broker.bootstrap, stage.topics["reports_topic"], records)
    config = stage.config("shuffle", max_age_seconds=(FLOOD + 10) * 3600)
    started = time.perf_counter()
    summary = shuffle.run(config)
    seconds = time.perf_counter() - started
    print(f"window flood: {FLOOD} windows shuffled in {seconds:.1f} s; {summary.counters}")
    assert summary.balanced, summary.accounting
    assert summary.count("sets_authenticated") == FLOOD
    assert summary.accounting["released"] == 0 and summary.extra["releases"] == 0
    assert summary.accounting["deleted"] == FLOOD
    assert not read_topic(broker.bootstrap, stage.topics["shuffled_topic"])
    assert seconds < 120
