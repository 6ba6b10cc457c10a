"""Per-payload microseconds of the sealed payload plaintext codec: per row (fastavro) vs vectorized (numpy).

For each mechanism, ``--rows`` honest wire rows (presence markers included for multi-message mechanisms) of
simulated clients of its example spec, median of ``--repeat`` runs:

* ``enc row``: ``records.encode_payload`` row by row (from wire tuples, as the device wire path had them);
* ``enc vec``: ``payload_codec.encode_payloads`` on the rows' array (``rows_to_array`` included);
* ``dec row``: the former ``payload_batch.decode_payloads``: ``decode_payload(check_domain=False)`` per plaintext,
  then ``domain_problems`` once, and ``rows_to_array`` as the analyzer folds the rows;
* ``dec vec``: ``payload_batch.decode_payload_array`` (the fast path vouches for every honest plaintext).

    .venv/bin/python benchmarks/payload_codec.py [--rows 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

import numpy as np

from pipelines.demo.population import avro_value, synthesize
from pipelines.examples import example_path
from transforms.mechanisms.base import encode_messages
from transforms.mechanisms.randomness import seeded_rng
from transforms.spec import AnalysisSpec, load_spec, spec_from_dict
from transforms.wire.avro_payload import decode_payload, encode_payload
from transforms.wire.domain import domain_problems
from transforms.wire.event_values import client_inputs, event_value
from transforms.wire.payload_batch import decode_payload_array
from transforms.wire.payload_codec import encode_payloads
from transforms.wire.rows import array_to_rows, client_messages, row_channel, rows_to_array

CASES = {"olh": "app_language", "grr": "app_language", "rappor": "grid", "mm_hadamard": "app_language_multimessage"}


def _spec(name: str) -> AnalysisSpec:
    raw = tomllib.loads(example_path(CASES[name]).read_text(encoding="utf-8"))
    if raw["mechanism"]["name"] == name:
        return load_spec(example_path(CASES[name]))
    raw["mechanism"] = {"name": name, "epsilon": raw["mechanism"]["epsilon"]}
    return spec_from_dict(raw)


def _wire(spec: AnalysisSpec, rows: int) -> np.ndarray:
    """At least ``rows`` wire rows of simulated clients, cut to ``rows``."""
    mechanism, rng, clients = spec.randomizer, seeded_rng(1), rows
    while True:
        values = [event_value(spec, avro_value(spec, v)) for v in synthesize(spec, clients, seed=2).values]
        wire, _ = client_messages(mechanism, *encode_messages(mechanism, client_inputs(spec, values, rng), rng),
                                  n_clients=clients)
        if len(wire) >= rows:
            return wire[:rows]
        clients = 2 * clients * rows // max(len(wire), 1) + 1


def _per_row_decode(mechanism: Any, plaintexts: list[bytes], channels: list[int]) -> np.ndarray:
    rows = [decode_payload(mechanism, p, c, check_domain=False) for p, c in zip(plaintexts, channels, strict=True)]
    assert not any(domain_problems(mechanism, rows, channels))
    return rows_to_array(mechanism, rows)


def _median_us(fn: Callable[[], Any], n: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    columns = ("enc row", "enc vec", "x", "dec row", "dec vec", "x")
    header = f"{'mechanism':<12} {'pad B':>5} " + " ".join(f"{c:>{5 if c == 'x' else 8}}" for c in columns)
    print(f"{header}   (microseconds per payload, median of {args.repeat}, {args.rows} rows)")
    for name in CASES:
        spec = _spec(name)
        mechanism = spec.randomizer
        wire = _wire(spec, args.rows)
        tuples = array_to_rows(wire)
        plaintexts = [encode_payload(mechanism, r) for r in tuples]
        channels = [row_channel(mechanism, r) for r in tuples]
        matrix = encode_payloads(mechanism, rows_to_array(mechanism, tuples))
        assert [bytes(r) for r in matrix] == plaintexts
        decoded, _, failures = decode_payload_array(mechanism, plaintexts, channels)
        assert not failures and decoded.tobytes() == _per_row_decode(mechanism, plaintexts, channels).tobytes()
        n, r = len(wire), args.repeat
        enc_row = _median_us(lambda: [encode_payload(mechanism, t) for t in tuples], n, r)  # noqa: B023
        enc_vec = _median_us(lambda: encode_payloads(mechanism, rows_to_array(mechanism, tuples)), n, r)  # noqa: B023
        dec_row = _median_us(lambda: _per_row_decode(mechanism, plaintexts, channels), n, r)  # noqa: B023
        dec_vec = _median_us(lambda: decode_payload_array(mechanism, plaintexts, channels), n, r)  # noqa: B023
        print(f"{name:<12} {matrix.shape[1] - 2:>5} {enc_row:>8.2f} {enc_vec:>8.2f} {enc_row / enc_vec:>5.1f} "
              f"{dec_row:>8.2f} {dec_vec:>8.2f} {dec_row / dec_vec:>5.1f}")


if __name__ == "__main__":
    main()
