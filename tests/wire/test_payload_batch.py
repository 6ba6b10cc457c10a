"""``decode_payloads`` (one domain check per batch) gives each payload the verdict ``decode_payload`` gives it
alone: the same rows, the same refusals with the same reasons, on every example mechanism, under attack."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from pipelines.demo.population import avro_value, synthesize
from pipelines.examples import example_path
from tests.transforms.payload_helpers import one_by_one
from transforms.mechanisms.base import encode_messages
from transforms.spec import load_spec
from transforms.wire.avro_payload import encode_payload
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.payload_batch import decode_payload_array, decode_payloads
from transforms.wire.rows import PRESENCE, array_to_rows, client_messages, row_channel, rows_to_array, wire_dtype

SPECS = ["app_language.toml", "app_language_multimessage.toml", "feature_usage.toml", "grid.toml",
         "latency_range.toml", "latency_range_multimessage.toml", "sensor_vector.toml", "url_heavy_hitters.toml"]


def _hostile(mechanism, rows, rng):
    """Valid payloads, then each kind of bad one: bytes that do not decode, out-of-domain values (rows shifted
    past their range, which the batch check must catch), a value too large for its field's integer type (which
    makes the batch fail to stack and forces the row-by-row path) and a channel that does not exist."""
    names = wire_dtype(mechanism).names
    payloads = [(encode_payload(mechanism, r), row_channel(mechanism, r)) for r in rows]
    payloads.append((b"\x00\x05garbage" + bytes(40), 0))
    payloads.append((b"\xff\xff", 0))
    messages = [r for r in rows if row_channel(mechanism, r) != PRESENCE]  # not presence markers
    for r in messages[:6]:
        channel = row_channel(mechanism, r)
        bent = list(r)
        for k, name in enumerate(names):
            if name != "channel" and isinstance(bent[k], int | np.integer):
                bent[k] = int(bent[k]) + 10**6 * (1 + int(rng.integers(3)))
        with contextlib.suppress(ValueError, OverflowError):
            payloads.append((encode_payload(mechanism, tuple(bent)), channel))
    for r in messages[:2]:
        huge = [2**62 if isinstance(v, int | np.integer) and n != "channel" else v
                for v, n in zip(r, names, strict=True)]
        with contextlib.suppress(ValueError, OverflowError):
            payloads.append((encode_payload(mechanism, tuple(huge)), row_channel(mechanism, r)))
    if rows:
        payloads.append((encode_payload(mechanism, rows[0]), 10**6))
    for r in messages[:3]:  # well-formed for fastavro but not canonical, or damaged at full width
        payloads += [(text, row_channel(mechanism, r)) for text in _noncanonical(encode_payload(mechanism, r), rng)]
    order = rng.permutation(len(payloads))
    return [payloads[i][0] for i in order], [payloads[i][1] for i in order]


def _noncanonical(data: bytes, rng) -> list[bytes]:
    """Variants of a canonical plaintext of the same width: an overlong union index (0x80|b 0x00, which fastavro
    reads), another union branch, a non-zero padding byte, a length prefix one off either way, random bytes."""
    size = int.from_bytes(data[:2], "big")
    out = [(size + 1).to_bytes(2, "big") + bytes([data[2] | 0x80, 0]) + data[3:-1],
           data[:2] + bytes([(data[2] + 2) % 18]) + data[3:]]
    if size < len(data) - 2:
        out.append(data[:-1] + b"\x01")
    out += [(size + 1).to_bytes(2, "big") + data[2:], (size - 1).to_bytes(2, "big") + data[2:]]
    out.append(rng.integers(0, 256, len(data), dtype=np.uint8).tobytes())
    return out


def _device_rows(spec, n: int, rng) -> list:
    """Wire rows of n simulated clients, encoded the way the encoder does (presence markers included)."""
    population = synthesize(spec, n, seed=11)
    mechanism = spec.randomizer
    values = [event_value(spec, avro_value(spec, v)) for v in population.values]
    wire, _ = client_messages(mechanism, *encode_messages(mechanism, client_inputs(spec, values, rng), rng),
                              n_clients=n)
    return array_to_rows(wire)


@pytest.mark.parametrize("spec_file", SPECS)
def test_batch_verdicts_equal_single_verdicts(spec_file: str) -> None:
    spec = load_spec(example_path(spec_file))
    mechanism = spec.randomizer
    rng = np.random.default_rng(7)
    rows = _device_rows(spec, 40, rng)
    plaintexts, channels = _hostile(mechanism, rows, rng)
    want = one_by_one(mechanism, plaintexts, channels)
    got_rows, kept, failures = decode_payloads(mechanism, plaintexts, channels)
    verdicts: list = [None] * len(plaintexts)
    for i, row in zip(kept, got_rows, strict=True):
        verdicts[i] = row
    for i, reason in failures:
        assert verdicts[i] is None
        verdicts[i] = reason
    assert verdicts == want
    assert sum(isinstance(v, tuple) for v in want) >= len(rows)  # every honest payload decodes
    array, kept_too, failures_too = decode_payload_array(mechanism, plaintexts, channels)
    assert (kept_too, failures_too) == (kept, failures)
    assert array.dtype == wire_dtype(mechanism) and array.tobytes() == rows_to_array(mechanism, got_rows).tobytes()
    assert len(failures) >= 3  # the two undecodable payloads and the unknown channel at least
