"""Adversarial suite (part 1): an attacker with write access to the reports or shuffled topic, no keys.

One honest deployment (encode -> shuffle -> analyze on a real broker) gives the baseline; the attacked
deployments share its keys and read a copy of its topics with the attacker's records mixed in. Every attack
must leave zero forged records in what the analyzer counts: the estimates' n_clients and every estimate
equal the honest run's, the analyzer's counters equal, every job returns with balanced accounting.
OUTPUT_DIR (the analyst's) is kept apart from STATE and KEYS so that part 8 can scan it for identities.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipelines import analyze, encode, shuffle
from pipelines.demo.population import synthesize
from pipelines.demo.simulate import produce_population
from pipelines.enrolment import enrol_simulated
from tests.e2e.adversary import (
    HOUR_MS,
    Stage,
    attacker_key,
    copy_topic,
    dead_letters,
    estimates,
    forged_release,
    forged_set,
    histogram_spec,
    opened,
    reasons,
    to_shuffler,
    with_long,
)
from transforms.io.kafka.bounded import ensure_topics, produce_records, read_topic
from transforms.trust.keys import load_shuffler_signer
from transforms.trust.message_set import SealedMessage, encode_message_set
from transforms.trust.release import BATCH_HEADER_BYTES, decode_release_batch, encode_release_batch

pytestmark = pytest.mark.slow
N = 2000
SYBILS = 2000
VICTIMS = 500
REPLAYS = 50


def topics_for(tag: str) -> dict[str, str]:
    return {"raw_topic": f"{tag}-raw", "reports_topic": f"{tag}-rep", "shuffled_topic": f"{tag}-shuf"}


@pytest.fixture(scope="module")
def world(broker, tmp_path_factory: pytest.TempPathFactory):
    """The honest baseline: N enrolled devices, one closed hourly window, the three real jobs."""
    spec = histogram_spec("adversary")
    now = (int(time.time() * 1000) // HOUR_MS) * HOUR_MS
    population = synthesize(spec, N, windows=1, start_ms=now - 2 * HOUR_MS, seed=5)
    base = tmp_path_factory.mktemp("honest")
    stage = Stage(base, broker.bootstrap, spec, now, topics_for(f"adv-{base.name}"))
    enrol_simulated(stage.keys, population.client_ids)
    produce_population(broker.bootstrap, spec, population, raw_topic=stage.topics["raw_topic"],
                       reports_topic=stage.topics["reports_topic"])
    ensure_topics(broker.bootstrap, [stage.topics["shuffled_topic"]], partitions=2)
    runs = {name: job.run(stage.config(name)) for name, job in
            (("encode", encode), ("shuffle", shuffle), ("analyze", analyze))}
    assert all(r.balanced for r in runs.values()), {k: r.accounting for k, r in runs.items()}
    assert runs["shuffle"].extra["releases"] == 1
    return stage, population, runs


def attacked_stage(world, tmp_path_factory: pytest.TempPathFactory, tag: str) -> Stage:
    stage, _, _ = world
    base = tmp_path_factory.mktemp(tag)
    attacked = Stage(base, stage.bootstrap, stage.spec, stage.now_ms, topics_for(f"{tag}-{base.name}"), stage.keys)
    ensure_topics(stage.bootstrap, [attacked.topics["reports_topic"], attacked.topics["shuffled_topic"]],
                  partitions=2)
    return attacked


def overlong(keys: Path, value: bytes) -> bytes:
    """The same message set (same fields, same valid signature) in different bytes, sealed to the shuffler
    again: what a sender holding the set's plaintext (the device, or the edge) can make of it."""
    ms = opened(keys, value)
    t = ms.event_time_ms
    encoded = encode_message_set(ms)
    copy = to_shuffler(keys, with_long(encoded, t, t + 2**64))
    assert copy != value and opened(keys, copy) == ms
    return copy


def assert_same_estimates(honest: Path, attacked: Path) -> None:
    """No forged record reached the analyzer: the same clients, the same estimates, item by item."""
    base, seen = estimates(honest), estimates(attacked)
    assert base and seen.keys() == base.keys()
    for key, row in base.items():
        assert seen[key]["n_clients"] == row["n_clients"], key
        assert abs(seen[key]["estimate"] - row["estimate"]) <= row["stderr"], key
        assert seen[key]["estimate"] == pytest.approx(row["estimate"], abs=1e-12), key  # same sets -> same release


@pytest.fixture(scope="module")
def reports_attack(world, tmp_path_factory: pytest.TempPathFactory):
    """Sybils, impersonations and replays on the reports topic, then the real shuffle and analyze jobs."""
    stage, population, _ = world
    attacked = attacked_stage(world, tmp_path_factory, "reports-attack")
    spec, rng = stage.spec, np.random.default_rng(11)
    counts = np.bincount(np.asarray(population.values), minlength=spec.d)
    rarest = int(np.argmin(counts))
    honest = read_topic(stage.bootstrap, stage.topics["reports_topic"])
    sets = [opened(stage.keys, r.value) for r in honest]
    forged: list[tuple[bytes, bytes]] = []
    for _ in range(SYBILS):
        device, key = attacker_key()
        t = int(rng.integers(stage.now_ms - 2 * HOUR_MS, stage.now_ms - HOUR_MS))
        forged.append((device.encode(), forged_set(spec, stage.keys, device_id=device, signer=key, event_time_ms=t,
                                                   category=rarest, rng=rng)))
    for victim in sets[:VICTIMS]:  # earlier than the victim's real set: it would be the one kept
        forged.append((victim.device_id.encode(), forged_set(
            spec, stage.keys, device_id=victim.device_id, signer=attacker_key()[1],
            event_time_ms=victim.event_time_ms - 1, category=rarest, rng=rng)))
    topic = attacked.topics["reports_topic"]
    produce_records(stage.bootstrap, topic, forged)
    produce_records(stage.bootstrap, topic, [(r.key, r.value) for r in honest])
    produce_records(stage.bootstrap, topic, [(r.key, r.value) for r in honest[-REPLAYS:]])  # before release
    # Re-encodings: the same signed fields, other bytes (an overlong event-time varint the decoder wraps).
    produce_records(stage.bootstrap, topic, [(r.key, overlong(stage.keys, r.value))
                                             for r in honest[-2 * REPLAYS:-REPLAYS]])
    first = {"shuffle": shuffle.run(attacked.config("shuffle")), "analyze": analyze.run(attacked.config("analyze"))}
    produce_records(stage.bootstrap, topic, [(r.key, r.value) for r in honest[:REPLAYS]])  # after release
    produce_records(stage.bootstrap, topic, [(r.key, overlong(stage.keys, r.value))
                                             for r in honest[REPLAYS:2 * REPLAYS]])
    second = {"shuffle": shuffle.run(attacked.config("shuffle")), "analyze": analyze.run(attacked.config("analyze"))}
    return attacked, first, second, rarest


def test_sybils_are_unauthenticated_and_change_nothing(world, reports_attack) -> None:
    stage, _, honest = world
    attacked, first, _, rarest = reports_attack
    shuf, ana = first["shuffle"], first["analyze"]
    assert shuf.balanced and ana.balanced, (shuf.accounting, ana.accounting)
    why = reasons(dead_letters(attacked.base / "state" / "shuffle" / "dead_letters"))
    assert why["unauthenticated: unknown device (not enrolled)"] == SYBILS
    assert shuf.count("sets_authenticated") == honest["shuffle"].count("sets_authenticated") + 2 * REPLAYS
    assert shuf.accounting["released"] == honest["shuffle"].accounting["released"]
    for name in ("batches_analyzed", "messages_analyzed"):
        assert ana.count(name) == honest["analyze"].count(name), name
    assert_same_estimates(stage.out, attacked.out)
    row = next(r for k, r in estimates(attacked.out).items() if k[2] == rarest)
    base = next(r for k, r in estimates(stage.out).items() if k[2] == rarest)
    print(f"rarest category {rarest}: honest {base['estimate']:.4f} ± {base['stderr']:.4f}, "
          f"attacked {row['estimate']:.4f}, n_clients {row['n_clients']}")


def test_impersonation_is_refused_and_the_victims_sets_kept(world, reports_attack) -> None:
    _, _, honest = world
    attacked, first, _, _ = reports_attack
    why = reasons(dead_letters(attacked.base / "state" / "shuffle" / "dead_letters"))
    assert why["unauthenticated: bad signature"] == VICTIMS
    # Every victim's own set was kept: the same number of distinct devices and released sets as honestly.
    assert first["shuffle"].count("distinct_devices") == honest["shuffle"].count("distinct_devices")
    assert first["shuffle"].accounting["deleted"] == honest["shuffle"].accounting["deleted"]


def test_replays_are_duplicates_before_and_late_after_release(world, reports_attack) -> None:
    stage, _, _ = world
    attacked, first, second, _ = reports_attack
    letters = dead_letters(attacked.base / "state" / "shuffle" / "dead_letters")
    why = reasons(letters)
    dupes = [r for r in why.elements() if r.startswith("duplicate")]
    late = [r for r in why.elements() if r.startswith("late:")]
    # Before the release, byte-identical replays and re-encodings alike are copies of a kept set: counted as
    # duplicates (the digest covers what was signed), never a second set and never a dead letter.
    assert not dupes and len(late) == 2 * REPLAYS
    assert first["shuffle"].accounting["duplicate"] == 2 * REPLAYS
    assert first["shuffle"].accounting["dead_lettered"] == SYBILS + VICTIMS
    shuf, ana = second["shuffle"], second["analyze"]
    assert shuf.balanced and ana.balanced
    assert shuf.accounting["dead_lettered"] == 2 * REPLAYS and shuf.accounting["released"] == 0
    assert shuf.extra["releases"] == 0 and ana.count("batches_analyzed") == 0
    assert_same_estimates(stage.out, attacked.out)  # never a second client


@pytest.fixture(scope="module")
def shuffled_attack(world, tmp_path_factory: pytest.TempPathFactory):
    """Forged, replayed, truncated and tampered release batches on a copy of the shuffled topic."""
    stage, _, _ = world
    attacked = attacked_stage(world, tmp_path_factory, "shuffled-attack")
    spec, topic, bootstrap = stage.spec, attacked.topics["shuffled_topic"], stage.bootstrap
    real = copy_topic(bootstrap, stage.topics["shuffled_topic"], topic)
    batch = decode_release_batch(real[0].value)
    messages = list(batch.messages)
    real_key_id, real_signer = load_shuffler_signer(stage.keys)
    rogue_id, rogue = "20260101-0badc0de", attacker_key()[1]
    older = batch.window_end_ms - HOUR_MS
    attack: dict[str, list[bytes]] = {
        # (a) a random key, under the real key id and under its own; (e) a small release by the attacker key
        "random_key": [*forged_release(spec, messages, window_end=older, n_sets=batch.n_sets, key_id=real_key_id,
                                       signer=rogue),
                       *forged_release(spec, messages, window_end=older, n_sets=batch.n_sets, key_id=rogue_id,
                                       signer=rogue)],
        "attacker_five": forged_release(spec, messages[:5], window_end=older - HOUR_MS, n_sets=5, key_id=rogue_id,
                                        signer=rogue),
    }
    # (c) and (d): multi-batch releases as the shuffler signs them (small batches), then damaged in transit.
    small = BATCH_HEADER_BYTES + 1024
    truncated = forged_release(spec, messages, window_end=older - 2 * HOUR_MS, n_sets=batch.n_sets,
                               key_id=real_key_id, signer=real_signer, max_bytes=small)
    tampered = forged_release(spec, messages, window_end=older - 3 * HOUR_MS, n_sets=batch.n_sets,
                              key_id=real_key_id, signer=real_signer, max_bytes=small)
    assert len(truncated) >= 3
    attack["truncated"] = truncated[:1] + truncated[2:]
    victim = decode_release_batch(tampered[1])
    flipped = bytearray(victim.messages[0].sealed)
    flipped[-1] ^= 1
    tampered[1] = encode_release_batch(replace(victim, messages=(SealedMessage(victim.messages[0].channel,
                                                                              bytes(flipped)),
                                                                *victim.messages[1:])))
    attack["tampered"] = tampered
    for records in attack.values():
        produce_records(bootstrap, topic, [(None, r) for r in records])
    first = analyze.run(attacked.config("analyze"))
    produce_records(bootstrap, topic, [(r.key, r.value) for r in real])  # (b) replays after analysis
    second = analyze.run(attacked.config("analyze"))
    return attacked, attack, real, first, second


def test_forged_shuffled_batches_are_refused_or_held(world, shuffled_attack) -> None:
    stage, _, honest = world
    attacked, attack, real, first, second = shuffled_attack
    assert first.balanced and second.balanced, (first.accounting, second.accounting)
    why = reasons(dead_letters(attacked.base / "state" / "analyze" / "dead_letters"))
    forged = len(attack["random_key"]) + len(attack["attacker_five"])
    assert why["unauthenticated release batch: bad shuffler signature"] == len(attack["random_key"]) // 2 + 1
    assert why["unauthenticated release batch: unknown shuffler key id"] == forged - len(attack["random_key"]) // 2
    assert first.count("batches_analyzed") == honest["analyze"].count("batches_analyzed") == len(real)
    held = len(attack["truncated"]) + len(attack["tampered"]) - 1
    assert first.accounting["held"] == held
    assert first.accounting["dead_lettered"] == forged + 1
    assert why["replayed release: this window was already analyzed"] == len(real)
    assert second.count("batches_analyzed") == 0
    assert {k[0] for k in estimates(attacked.out)} == {k[0] for k in estimates(stage.out)}  # one window only
    assert_same_estimates(stage.out, attacked.out)


def test_analyst_directory_holds_no_identity_and_no_raw_bytes(world, reports_attack) -> None:
    stage, population, _ = world
    attacked, _, _, _ = reports_attack
    needles = [c.encode() for c in population.client_ids]
    needles += [opened(stage.keys, r.value).device_id.encode() for r in read_topic(
        stage.bootstrap, stage.topics["reports_topic"])]
    raw = read_topic(stage.bootstrap, stage.topics["raw_topic"])
    for out in (stage.out, attacked.out):
        assert not (out / "state").exists() and not (out / "keys").exists()
        files = [p for p in out.rglob("*") if p.is_file()]
        assert files
        blob = b"".join(p.read_bytes() for p in files)
        assert not [n for n in needles if n in blob]
        assert not [r for r in raw[:500] if r.value[10:40] in blob]
    letters = (dead_letters(attacked.base / "state" / "analyze" / "dead_letters")
               + dead_letters(stage.base / "state" / "analyze" / "dead_letters"))
    assert all(d["original"] is None for d in letters)


def test_shuffle_runs_without_the_analyzer_private_key(world, tmp_path: Path) -> None:
    stage, _, honest = world
    keys = tmp_path / "shuffler-keys"
    shutil.copytree(stage.keys, keys, ignore=shutil.ignore_patterns("analyzer"))
    assert not (keys / "analyzer").exists() and (keys / "registry" / "devices.parquet").exists()
    attacked = Stage(tmp_path, stage.bootstrap, stage.spec, stage.now_ms,
                     {**stage.topics, "shuffled_topic": f"noanalyzer-{tmp_path.name}"}, keys)
    summary = shuffle.run(attacked.config("shuffle"))
    assert summary.balanced and summary.extra["releases"] == 1
    assert summary.accounting["released"] == honest["shuffle"].accounting["released"]
