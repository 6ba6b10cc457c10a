"""The golden vectors of the device wire (schemas/vectors) are what the Python client produces today, and a
one-bit mutant of the seal changes them (the TypeScript SDK checks the same files: clients/web)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import transforms.trust.sealing as sealing
from pipelines import golden_vectors
from pipelines.cli import main as esa
from transforms.device.spec_export import WEB_MECHANISMS


def test_vectors_are_regenerated_byte_for_byte() -> None:
    """``python -m pipelines.golden_vectors --check``: every file equals what the Python client writes now."""
    assert golden_vectors.main(["--check"]) == 0


def test_vectors_cover_every_web_mechanism_and_every_range_oracle() -> None:
    specs = [json.loads(p.read_text())["spec"] for p in sorted(golden_vectors.VECTORS_DIR.glob("*.json"))]
    names = {s["mechanism"]["name"] for s in specs}
    assert names == set(WEB_MECHANISMS)
    assert {s["mechanism"]["oracle"] for s in specs if s["mechanism"]["name"] == "dyadic_range"} == {
        "llh", "grr", "olh", "oue"}
    assert any(s["crowd_partition"] for s in specs)


def test_every_vector_opens_as_the_analyzer_sees_it() -> None:
    """The shuffler's key opens each envelope, the analyzer's each message, and each plaintext decodes to a
    valid row of the spec's mechanism (the bytes an SDK must match are well-formed reports)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from transforms.trust.envelope import open_envelope
    from transforms.trust.message_set import decode_message_set
    from transforms.wire.avro_payload import decode_payload

    for name, spec, _ in golden_vectors.cases():
        vector = json.loads((golden_vectors.VECTORS_DIR / f"{name}.json").read_text())
        shuffler = X25519PrivateKey.from_private_bytes(bytes.fromhex(vector["keys"]["shuffler_private"]))
        for event in vector["events"]:
            encoded = open_envelope({vector["keys"]["shuffler_key_id"]: shuffler}, bytes.fromhex(event["envelope"]))
            ms = decode_message_set(encoded)
            assert ms.spec_id == spec.spec_id and ms.device_id == vector["keys"]["device_id"]
            for message in event["messages"]:
                decode_payload(spec.randomizer, bytes.fromhex(message["plaintext"]), message["channel"])


def test_a_one_bit_mutant_of_the_seal_fails_the_vectors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Flip one bit of the seal's domain tag ("esa-seal-v1" -> "esa-seal-v0"): the vectors no longer match."""
    assert [a ^ b for a, b in zip(b"esa-seal-v1", b"esa-seal-v0", strict=True)] == [0] * 10 + [1]  # one bit
    name, spec, events = golden_vectors.cases()[0]
    stored = (golden_vectors.VECTORS_DIR / f"{name}.json").read_text()
    assert golden_vectors.render(golden_vectors.build_case(name, spec, events, seed=1000)) == stored
    monkeypatch.setattr(sealing, "SEAL_TAG", b"esa-seal-v0")
    mutant = json.loads(golden_vectors.render(golden_vectors.build_case(name, spec, events, seed=1000)))
    original = json.loads(stored)
    for got, want in zip(mutant["events"], original["events"], strict=True):
        assert got["draws"] == want["draws"]  # same coins, same plaintexts: only the sealing differs
        assert [m["plaintext"] for m in got["messages"]] == [m["plaintext"] for m in want["messages"]]
        assert all(g["sealed"] != w["sealed"] for g, w in zip(got["messages"], want["messages"], strict=True))
        assert got["envelope"] != want["envelope"]
    (tmp_path / f"{name}.json").write_text(golden_vectors.render(mutant))
    for other in golden_vectors.VECTORS_DIR.glob("*.json"):
        if other.name != f"{name}.json":
            (tmp_path / other.name).write_text(other.read_text())
    monkeypatch.setattr(sealing, "SEAL_TAG", b"esa-seal-v1")
    assert golden_vectors.main(["--check", "--dir", str(tmp_path)]) == 1


def test_spec_json_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spec.json"
    assert esa(["spec-json", "examples/app_language.toml", "--out", str(out)]) == 0
    exported = json.loads(out.read_text())
    assert exported["mechanism"]["name"] == "olh" and exported["spec_id"].startswith("app_language@")
    assert esa(["spec-json", "examples/feature_usage.toml"]) == 3  # collision: no web randomizer, one line
    assert "no web randomizer" in capsys.readouterr().err
