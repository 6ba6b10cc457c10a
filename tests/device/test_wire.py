"""What leaves the device: a signed MessageSet the trust library verifies, whose sealed payloads open with the
analyzer key to the randomizer's output, and whose law is exactly the mechanism's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.device.helpers import KEY_ID, T0, client_kwargs, histogram_spec, open_report, peel
from transforms.device import Client
from transforms.mechanisms.base import is_single_message
from transforms.mechanisms.frequency.oracles import GRR
from transforms.spec import load_spec
from transforms.trust.devices import DeviceRegistry, device_id_of
from transforms.trust.message_set import AuthError, decode_message_set, verify_message_set
from transforms.trust.sealing import SealError, associated_data, open_sealed
from transforms.wire.rows import PRESENCE

ROOT = Path(__file__).resolve().parents[2]


def test_import_pulls_in_neither_beam_nor_kafka():
    code = "import transforms.device, sys; assert 'apache_beam' not in sys.modules and 'kafka' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_device_key_is_private_persistent_and_enrolable(tmp_path):
    spec = histogram_spec("grr", 1.0)
    client = Client(spec, tmp_path, **client_kwargs())
    assert stat.S_IMODE((tmp_path / "device.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "device.key").stat().st_mode) == 0o600
    fresh = Client(spec, tmp_path / "new" / "state", **client_kwargs())
    assert stat.S_IMODE(fresh.state_dir.stat().st_mode) == 0o700 and fresh.device_id != client.device_id
    again = Client(spec, tmp_path, **client_kwargs())
    assert (again.public_key, again.device_id) == (client.public_key, client.device_id)
    assert client.device_id == device_id_of(client.public_key)
    registry = DeviceRegistry()
    registry.enroll([client.public_key])
    verify_message_set(decode_message_set(peel(again.encode(2))), registry)
    stranger = DeviceRegistry()
    stranger.enroll([Ed25519PrivateKey.generate().public_key().public_bytes_raw()])
    with pytest.raises(AuthError):
        verify_message_set(decode_message_set(peel(client.encode(2))), stranger)


@pytest.mark.parametrize(("spec_path", "value"), [
    ("examples/app_language.toml", "fr"), ("examples/grid.toml", 77), ("examples/feature_usage.toml", {"search": 0.5}),
    ("examples/latency_range.toml", 123.0), ("examples/sensor_vector.toml", [0.25] * 16),
    ("examples/url_heavy_hitters.toml", "https://example.org/"), ("examples/app_language_multimessage.toml", "de")])
def test_sealed_payloads_open_to_valid_rows_bound_to_their_routing(tmp_path, spec_path, value):
    spec = load_spec(ROOT / spec_path)
    client = Client(spec, tmp_path, rng=np.random.default_rng(5), **client_kwargs())
    data = client.encode(value, event_time_ms=int(T0 * 1000))
    registry = DeviceRegistry()
    registry.enroll([client.public_key])
    ms, rows = open_report(spec, data)
    verify_message_set(ms, registry)
    assert (ms.spec_id, ms.device_id, ms.key_id, ms.event_time_ms) == (spec.spec_id, client.device_id, KEY_ID,
                                                                      int(T0 * 1000))
    channels = [m.channel for m in ms.messages]
    assert len({len(m.sealed) for m in ms.messages}) == 1  # padded: a blob's length says nothing about its message
    if is_single_message(spec.randomizer):
        assert len(rows) == 1 and channels == [0]
    else:
        assert channels[0] == PRESENCE and PRESENCE not in channels[1:] and len(rows) == len(channels)
    # moved to another window, the first blob no longer opens (the routing fields are bound)
    window_ms = spec.window_seconds * 1000
    wrong_end = (ms.event_time_ms // window_ms + 2) * window_ms
    with pytest.raises(SealError):
        open_sealed({}, ms.messages[0].sealed, b"")
    from tests.device.helpers import ANALYZER
    with pytest.raises(SealError):
        open_sealed({KEY_ID: ANALYZER}, ms.messages[0].sealed,
                    associated_data(ms.spec_id, ms.crowd_id, wrong_end, ms.messages[0].channel))


def test_seeded_output_is_reproducible_and_default_output_is_not(tmp_path):
    spec = histogram_spec("grr", 1.0)
    key = Ed25519PrivateKey.from_private_bytes(bytes(32))
    one = Client(spec, tmp_path / "a", signing_key=key, rng=np.random.default_rng(1), **client_kwargs())
    two = Client(spec, tmp_path / "b", signing_key=key, rng=np.random.default_rng(1), **client_kwargs())
    assert one.encode(0, event_time_ms=5) == two.encode(0, event_time_ms=5)
    three = Client(spec, tmp_path / "c", signing_key=key, **client_kwargs())
    assert decode_message_set(peel(three.encode(0, event_time_ms=5))).nonce != decode_message_set(
        peel(three.encode(0, event_time_ms=5))).nonce


def test_client_output_follows_the_exact_grr_law(tmp_path):
    """Reports opened by the analyzer, counted per outcome, against GRR's enumerated law (5 sigma per cell,
    Bonferroni over 9 cells: false alarm < 1e-5; fixed seed)."""
    from tests.mechanisms.ldp_helpers import assert_counts_follow_law, assert_exact_ldp

    spec = histogram_spec("grr", 1.0, d=3)
    mech = spec.randomizer
    assert isinstance(mech, GRR)
    table = np.stack([mech.exact_output_distribution(x) for x in range(3)])
    assert_exact_ldp(table, 1.0)
    client = Client(spec, tmp_path, rng=np.random.default_rng(20261124), **client_kwargs())
    draws = 1500
    for x in range(3):
        outcomes = [open_report(spec, client.encode(x, event_time_ms=0))[1][0][0] for _ in range(draws)]
        assert_counts_follow_law(np.bincount(outcomes, minlength=3), table[x], draws, x)


def test_crowd_ids_and_event_times_are_checked_and_bound(tmp_path):
    from transforms.spec import spec_from_dict

    spec = spec_from_dict({"analysis": {"name": "v", "kind": "histogram"}, "domain": {"size": 4},
                           "mechanism": {"name": "grr", "epsilon": 1.0}, "crowd": {"partition": "app_version"}})
    client = Client(spec, tmp_path, **client_kwargs())
    for bad in (None, "", "x" * 65):
        with pytest.raises(ValueError, match="crowd"):
            client.encode(1, crowd_id=bad)
    for bad in (-1, 2**53, 1.5, "now"):
        with pytest.raises(ValueError, match="event_time_ms"):
            client.encode(1, crowd_id="1.2", event_time_ms=bad)
    ms, rows = open_report(spec, client.encode(1, crowd_id="1.2", event_time_ms=7_200_001))
    assert ms.crowd_id == "1.2" and ms.event_time_ms == 7_200_001 and len(rows) == 1
    with pytest.raises(ValueError, match="no crowd partition"):
        Client(histogram_spec("grr", 1.0), tmp_path, **client_kwargs()).encode(1, crowd_id="1.2")
