"""The privacy blanket wired in (issue 26, item 9): the spec's m, the shuffler's dummies in a release file, the
analyzer's reading of them.

Releases come from real signed, sealed message sets of enrolled simulated devices run through ``IngressFn`` +
``Shuffle`` on the FnApiRunner (tests/transforms/release_inputs.py), written by the driver's
``write_release`` to real files and read back by the analyzer's own DoFns.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import chi2

from tests.transforms.release_inputs import KEY, WIN_A, WINDOW_MS, Devices, shuffle_run, split_outputs
from transforms.analyzer.estimates import estimate_rows
from transforms.io.kafka.bounded import KafkaRecord
from transforms.shuffler.blanket import ReleaseBlanket, key_id_counts
from transforms.shuffler.packed import PackedMessages
from transforms.shuffler.release_files import iter_batches, write_release
from transforms.spec import AnalysisSpec, SpecError, spec_from_dict
from transforms.state.prior_runs import PriorRuns
from transforms.trust.keys import (
    KeyFileError,
    generate_analyzer_key,
    load_analyzer_publics,
    load_shuffler_signer,
)
from transforms.trust.release import decode_release_batch, encode_release_batch, sign_release_batch
from transforms.trust.sealing import key_id_of

N = 60
END = WIN_A + WINDOW_MS


def blanket_spec(mechanism: str = "grr", *, quota: int = 1, params: dict | None = None, **crowd: Any
                 ) -> AnalysisSpec:
    table = {"epsilon": 30.0, "delta": 0.5, "subkeys": 4, "min_clients": 10, "blanket_epsilon": 1.0, **crowd}
    table = {k: v for k, v in table.items() if v is not None}  # None: the key left out
    return spec_from_dict({"analysis": {"name": "blanket_test"}, "domain": {"size": 4},
                           "mechanism": {"name": mechanism, "epsilon": 2.0, **(params or {})},
                           "window": {"size_seconds": WINDOW_MS // 1000, "allowed_lateness_seconds": 0},
                           "crowd": table, "clients": {"max_reports_per_window": quota}}, source="test.toml")


SPEC = blanket_spec()
M = SPEC.crowd.blanket_dummies


# --- the spec ----------------------------------------------------------------------------------------------

def test_the_spec_computes_m_and_hashes_it() -> None:
    assert M == 56  # the smallest m for eps 1 at delta 1e-6, d = 4, eps0 = 2 (docs/mathematics.md §1.7)
    plain = dataclasses.replace(SPEC, crowd=dataclasses.replace(SPEC.crowd, blanket_epsilon=None, blanket_dummies=0))
    assert plain.spec_id != SPEC.spec_id  # the dummies change what a release is: another spec
    direct = blanket_spec(blanket_epsilon=None, blanket_dummies=M)
    assert direct.crowd.blanket_dummies == M
    assert SPEC.with_mechanism(epsilon=1.0).crowd.blanket_dummies != M  # recomputed for the new budget


@pytest.mark.parametrize(("mechanism", "quota", "crowd", "message"), [
    ("olh", 1, {}, "mechanism 'olh' has no accounted blanket"),
    ("rappor", 1, {}, "mechanism 'rappor' has no accounted blanket"),
    ("mm_hadamard", 1, {"params": {"n_expected": 10_000}}, "mechanism 'mm_hadamard' has no accounted blanket"),
    ("grr", 2, {}, "a blanket needs max_reports_per_window = 1"),
    ("grr", 1, {"blanket_dummies": 5}, "blanket_dummies and blanket_epsilon exclude each other"),
    ("grr", 1, {"blanket_epsilon": 0}, "blanket_epsilon must be in (0, 30]"),
])
def test_a_blanket_the_spec_cannot_have_fails_at_load_in_one_line(mechanism: str, quota: int, crowd: dict,
                                                                  message: str) -> None:
    with pytest.raises(SpecError) as err:
        blanket_spec(mechanism, quota=quota, **crowd)
    text = str(err.value)
    assert message in text and text.startswith("test.toml: [crowd] blanket_") and "\n" not in text


# --- the dummies' slots ------------------------------------------------------------------------------------

def slot_statistic(positions: list[np.ndarray], slots: int) -> float:
    """Pearson's chi-square of the slots the dummies took over many releases, against uniform."""
    counts = np.bincount(np.concatenate(positions), minlength=slots)
    expected = counts.sum() / slots
    return float(((counts - expected) ** 2 / expected).sum())


def test_dummies_take_uniformly_random_slots(tmp_path: Path) -> None:
    """Over 2,000 releases of 30 reals and 5 dummies (the spec's m lowered to keep it fast), each slot of 35
    holds a dummy equally often: chi-square (34 dof) below its 1e-4 quantile. The statistic is powerful: the
    same test on dummies appended after the reals (the mutant an analyzer could undo by position) is
    hundreds of times over it."""
    devices = Devices.enrol(tmp_path / "keys", 1)
    spec = dataclasses.replace(SPEC, crowd=dataclasses.replace(SPEC.crowd, blanket_dummies=5))
    blanket = ReleaseBlanket(spec, KEY, load_analyzer_publics(devices.keys_dir))
    n, m, releases = 30, 5, 2000
    drawn = [blanket.dummies(None, END + i * WINDOW_MS, n, {devices.analyzer_id: n}).positions
             for i in range(releases)]
    assert all(len(set(p.tolist())) == m and p.min() >= 0 and p.max() < n + m for p in drawn)
    limit = chi2.ppf(1 - 1e-4, n + m - 1)
    assert slot_statistic(drawn, n + m) < limit
    appended = [np.arange(n, n + m) for _ in range(releases)]
    assert slot_statistic(appended, n + m) > 500 * limit


@pytest.mark.parametrize("mechanism", ["grr", "oue"])
def test_a_dummy_opens_and_decodes_like_a_device_report(mechanism: str, tmp_path: Path) -> None:
    """Each dummy is a valid report of the spec's mechanism sealed to the analyzer (channel 0, the release's
    associated data), as long as a device's; their values follow the blanket law (GRR uniform: 400 dummies,
    each value 100 +- 45, a false alarm below 1e-6; OUE: every bit set w.p. q, 1,600 bits at q = 0.119, the
    count within 6 sd of its mean)."""
    from transforms.trust.keys import load_analyzer_private
    from transforms.trust.sealing import associated_data, open_sealed
    from transforms.wire.avro_payload import decode_payload

    spec = blanket_spec(mechanism)
    spec = dataclasses.replace(spec, crowd=dataclasses.replace(spec.crowd, blanket_dummies=400))
    devices = Devices.enrol(tmp_path / "keys", 1)
    device = devices.sealed_messages(spec, [tuple(spec.randomizer.encode(np.array([1]), np.random.default_rng(1))
                                                   .tolist()[0])], None, WIN_A)[0].sealed
    dummies = ReleaseBlanket(spec, KEY, load_analyzer_publics(devices.keys_dir)).dummies(
        None, END, 10, {devices.analyzer_id: 10})
    private = load_analyzer_private(devices.keys_dir)
    rows = [decode_payload(spec.randomizer, open_sealed(private, blob, associated_data(spec.spec_id, None, END, 0)),
                           channel) for channel, blob in dummies.messages]
    assert {len(b) for _, b in dummies.messages} == {len(device)}
    if mechanism == "grr":
        counts = np.bincount([r[0] for r in rows], minlength=4)
        assert all(abs(c - 100) < 45 for c in counts), counts
    else:
        bits = np.unpackbits(np.frombuffer(b"".join(r[0] for r in rows), np.uint8).reshape(400, -1), axis=1)[:, :4]
        q = spec.randomizer.q
        assert abs(bits.sum() - 1600 * q) < 6 * np.sqrt(1600 * q * (1 - q)), bits.sum()


# --- a release file with its dummies -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """N devices of one window through the real shuffle graph, twice (a rerun from scratch: the crash before
    sealing), each written to its release file with the spec's blanket."""
    base = tmp_path_factory.mktemp("blanket_release")
    devices = Devices.enrol(base / "keys", N)
    records = devices.crowd(SPEC, devices.clients, WIN_A)
    blanket = ReleaseBlanket(SPEC, KEY, load_analyzer_publics(devices.keys_dir))
    signer = load_shuffler_signer(devices.keys_dir)
    files = []
    for attempt in range(2):
        (base / f"run{attempt}").mkdir()
        run = shuffle_run(base / f"run{attempt}", [SPEC], devices, records)
        parts = sorted(run.values("released"), key=lambda p: p.subkey)
        files.append(write_release(base / f"releases{attempt}", parts, *signer, blanket=blanket))
    return {"devices": devices, "parts": parts, "files": files, "blanket": blanket, "signer": signer}


def batches_of(path: Path) -> list[Any]:
    return [decode_release_batch(b) for b in iter_batches(path)]


def test_a_release_holds_n_plus_m_messages_indistinguishable_but_by_slot(released: dict[str, Any]) -> None:
    written, parts = released["files"][0], released["parts"]
    batches = batches_of(written.temp)
    messages = [m for b in batches for m in b.messages]
    reals = [s for p in parts for _, s in p.messages]
    n = len(reals)
    assert (written.n_sets, written.n_messages, written.dummies) == (sum(p.n_sets for p in parts), n, M)
    assert all((b.n_sets, b.n_messages) == (n + M, n + M) for b in batches)  # the signed totals count them
    assert len(messages) == n + M and len({len(m.sealed) for m in messages}) == 1
    assert {m.channel for m in messages} == {0}
    assert {key_id_of(m.sealed) for m in messages} == {released["devices"].analyzer_id}
    # The reals keep their order; the dummies sit exactly at the slots the blanket drew.
    real_set = set(reals)
    assert [m.sealed for m in messages if m.sealed in real_set] == reals
    slots = [i for i, m in enumerate(messages) if m.sealed not in real_set]
    expected = released["blanket"].dummies(None, END, n, {released["devices"].analyzer_id: n}).positions
    assert slots == expected.tolist()


def test_a_rerun_writes_the_same_bytes(released: dict[str, Any]) -> None:
    first, second = released["files"]
    assert first.digest == second.digest and first.temp.read_bytes() == second.temp.read_bytes()


def analyze(devices: Devices, batches: list[bytes], expect_dead: bool = False) -> tuple[list, dict[str, list]]:
    from tests.transforms.release_inputs import open_and_assemble
    from transforms.analyzer.releases import DecodeReleaseFn

    fn = DecodeReleaseFn([SPEC], str(devices.keys_dir), PriorRuns())
    fn.setup()
    offsets = itertools.count()
    main, tagged = split_outputs(fn.process([KafkaRecord("shuffled", 0, next(offsets), 0, None, v)
                                             for v in batches]))
    assert not tagged, tagged
    main, tagged = open_and_assemble([SPEC], devices.keys_dir, main)
    assert expect_dead or not tagged, tagged
    return main, tagged


def test_the_analyzer_counts_clients_net_of_the_dummies(released: dict[str, Any]) -> None:
    written = released["files"][0]
    (opened,), tagged = analyze(released["devices"], list(iter_batches(written.temp)))
    assert tagged == {}
    n = written.n_sets
    assert opened.n_sets == n and opened.accumulator.n == n + M  # every dummy opens and counts, then is removed
    rows = estimate_rows(SPEC, None, opened.accumulator, WIN_A, END)
    assert {(r["n_clients"], r["n_reports"]) for r in rows} == {(n, n)}


def test_a_release_below_min_clients_plus_m_is_refused(released: dict[str, Any]) -> None:
    """The header counts the dummies: a (signed) release claiming min_clients + m - 1 sets holds fewer than
    min_clients real ones and is refused; min_clients + m is the smallest accepted."""
    devices, written = released["devices"], released["files"][0]
    key_id, signer = released["signer"]
    floor = SPEC.crowd.min_clients + M

    def claiming(n_sets: int) -> list[bytes]:
        return [encode_release_batch(sign_release_batch(dataclasses.replace(b, n_sets=n_sets), key_id, signer))
                for b in batches_of(written.temp)]

    main, tagged = analyze(devices, claiming(floor - 1), expect_dead=True)
    assert main == [] and tagged["dead_letters"]
    assert all(f"release of {floor - 1} sets, below the spec's minimum crowd ({SPEC.crowd.min_clients} + {M} "
               "dummies)" in d["reason"] for d in tagged["dead_letters"])
    (opened,), _ = analyze(devices, claiming(floor))
    assert opened.n_sets == SPEC.crowd.min_clients


# --- key rotation ------------------------------------------------------------------------------------------

def test_dummies_follow_the_reals_key_ids_and_need_their_public_keys(tmp_path: Path) -> None:
    """Reals sealed to two analyzer keys (a rotation): each dummy takes the key id of a uniformly random
    real, so both ids appear in proportion; a real's key without its public file stops the release."""
    devices = Devices.enrol(tmp_path / "keys", 1)
    old = devices.analyzer_id
    new = generate_analyzer_key(devices.keys_dir)
    counts = {old: 30, new: 90}
    publics = load_analyzer_publics(devices.keys_dir)
    big = dataclasses.replace(SPEC, crowd=dataclasses.replace(SPEC.crowd, blanket_dummies=400))
    dummies = ReleaseBlanket(big, KEY, publics).dummies(None, END, 120, counts)
    seen = key_id_counts(dummies.messages, ReleaseBlanket(big, KEY, publics).plaintext_bytes)
    # Binomial(400, 1/4): mean 100, sd 8.7; 100 +- 45 fails with probability < 1e-6.
    assert set(seen) == {old, new} and abs(seen[old] - 100) < 45
    assert len({len(b) for _, b in dummies.messages}) == 1
    with pytest.raises(KeyFileError, match=f"no analyzer public key {new}"):
        ReleaseBlanket(big, KEY, {old: publics[old]}).dummies(None, END, 120, counts)


def test_malformed_reals_lend_no_key_id_and_no_length(tmp_path: Path) -> None:
    """An enrolled device's message with a foreign length or a garbled header is its own: counted out of the
    key ids a dummy may copy, never an error that would let it stop the window."""
    devices = Devices.enrol(tmp_path / "keys", 3)
    blanket = ReleaseBlanket(SPEC, KEY, load_analyzer_publics(devices.keys_dir))
    good = devices.sealed_messages(SPEC, [(1,)], None, WIN_A)[0].sealed
    messages = PackedMessages.of([(0, good), (0, good + b"x"), (0, b"\x07garbage" + bytes(len(good) - 8))])
    assert key_id_counts(messages, blanket.plaintext_bytes) == {devices.analyzer_id: 1}


# --- the streaming shuffler's release agent ----------------------------------------------------------------

def staged_agent(bootstrap: str, released: dict[str, Any], tmp_path: Path, keys: Path) -> tuple[Any, Any]:
    """A release agent (``transforms.shuffler.release_agent``) with the fixture's parts staged as its workers
    stage them."""
    import pickle

    from pipelines.job_config import JobConfig
    from pipelines.targets import release_target
    from transforms.io.kafka.bounded import ensure_topics
    from transforms.io.staging import write_batch
    from transforms.shuffler.release_agent import ReleaseAgent
    from transforms.shuffler.streaming import MARKER, PART, StagedRelease, release_dir
    from transforms.state.ledger import ReleaseLedger

    parts = released["parts"]
    topic = f"blanket-agent-{tmp_path.name}"
    ensure_topics(bootstrap, [topic], partitions=1)
    # the shuffler's PRF key is job_key_from_seed(seed + 0x5EED) = KEY = job_key_from_seed(7)
    config = JobConfig(bootstrap=bootstrap, specs=(SPEC,), out_dir=tmp_path / "out", state_dir=tmp_path / "state",
                       keys_dir=keys, shuffled_topic=topic, seed=7 - 0x5EED)
    agent = ReleaseAgent(release_target(config), config.specs, ReleaseLedger(config.state / "ledger"),
                         str(tmp_path / "staging"), "stream")
    directory = release_dir(agent._root, parts[0])
    Path(directory).mkdir(parents=True)
    for part in parts:
        write_batch(directory, PART, [(f"{part.subkey:05d}", pickle.dumps(part))])
    marker = StagedRelease((SPEC.spec_id, None, END), tuple(p.subkey for p in parts), {"reports/0": N})
    write_batch(directory, MARKER, [(MARKER, pickle.dumps(marker))])
    return agent, config


def test_the_release_agent_writes_the_same_blanket_release(broker, released: dict[str, Any], tmp_path: Path
                                                           ) -> None:
    """The streaming path adds the dummies by the same rule: the parts staged as its workers stage them become
    the bounded path's very release file, published to a real topic."""
    from transforms.io.kafka.bounded import read_topic

    bounded = released["files"][0]
    agent, config = staged_agent(broker.bootstrap, released, tmp_path, released["devices"].keys_dir)
    assert agent.step() == 1
    assert (agent.totals.released, agent.totals.dummies) == (1, M)
    (path,) = (config.state / "releases").glob("*.bin")
    assert path.read_bytes() == bounded.temp.read_bytes()
    published = [decode_release_batch(r.value) for r in read_topic(broker.bootstrap, config.shuffled_topic)]
    assert sum(len(b.messages) for b in published) == bounded.n_messages + M


def test_a_missing_analyzer_public_key_is_a_one_line_config_error(broker, released: dict[str, Any],
                                                                  tmp_path: Path, capsys: pytest.CaptureFixture
                                                                  ) -> None:
    """A shuffler whose public/ lacks the analyzer key the reals were sealed to writes nothing (exit 3)."""
    import shutil

    from pipelines.cli import _error_code
    from transforms.shuffler.release_step import BlanketKeyError

    keys = tmp_path / "keys"
    shutil.copytree(released["devices"].keys_dir, keys)
    key_id = released["devices"].analyzer_id
    generate_analyzer_key(keys)  # another key is there: only the one the reals need is missing
    (keys / "public" / f"analyzer-{key_id}.x25519.pub").unlink()
    agent, config = staged_agent(broker.bootstrap, released, tmp_path, keys)
    with pytest.raises(BlanketKeyError, match=f"no analyzer public key {key_id}") as err:
        agent.step()
    capsys.readouterr()
    assert _error_code("shuffle", err.value) == 3  # what `esa shuffle` exits with, in one line
    assert capsys.readouterr().err.count("\n") == 1
    assert not list((config.state / "releases").glob("*.bin"))
