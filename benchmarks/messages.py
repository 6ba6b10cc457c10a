"""Messages and bytes per client of every protocol: single-message oracles, fragmenting, multi-message, trees.

For each protocol (histograms over d = ``--d`` values; ranges over 2^``--bits`` leaves; heavy hitters over
32-bit item hashes; multi-message protocols calibrated for n = ``--n`` clients at delta = 1e-6) and each
epsilon, prints:

* ``msgs/cl``: expected messages per client (protocol messages; multi-message mechanisms also send one
  presence marker per client, counted in the Avro column only), and ``meas``: the mean over a simulated sample;
* ``bits``: ``message_bits`` (information content of one message) and ``B/cl pk``: msgs/cl * bits / 8;
* ``B/cl pay``: Avro content bytes per client: the channel varint, the payload's union branch and record
  (what varies between messages; a "mark" message is all channel), measured on real messages;
* ``B/cl avro``: bytes per client on the wire, each message a single-object Avro ``Report``
  (``schemas.encode_record("Report", transforms.wire.avro_payload.report_record(...))``) with a 36-character client
  id, an 18-character spec id and no crowd, presence marker included. The fixed envelope of one message is
  printed first: it dominates whenever a client sends many small messages.

Avro sizes are means over at most ``--sample`` encoded messages (clients drawn from a Zipf(1.1) histogram,
uniform leaves, Zipf items), scaled by the expected message count.

    .venv/bin/python benchmarks/messages.py --quick   # eps 1 and 4, smaller samples (~30 s)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from schemas import encode_record
from transforms.mechanisms.base import is_single_message
from transforms.mechanisms.frequency.count_mean_sketch import CountMeanSketch
from transforms.mechanisms.frequency.hadamard import HadamardResponse
from transforms.mechanisms.frequency.olh import OLH
from transforms.mechanisms.frequency.oracles import GRR, OUE
from transforms.mechanisms.frequency.unary import AttributeFragmentedRappor, ReportFragmentedRappor
from transforms.mechanisms.heavy_hitters.prefix_tree import PrefixHeavyHitters, item_hash
from transforms.mechanisms.multimessage.protocols import CountMinMultiRR, MultiMessageHadamard
from transforms.mechanisms.randomness import seeded_rng
from transforms.mechanisms.ranges.dyadic import DyadicRange
from transforms.wire.avro_payload import report_record
from transforms.wire.elements import ReportElement
from transforms.wire.rows import PRESENCE, array_to_rows, client_messages, presence_row

DELTA = 1e-6
SPEC_ID = "bench@0123456789ab"  # name@ + 12 hex digits, as transforms.spec makes them
CLIENT_ID = "0b7d2a4e-5f3c-4d1a-9e8b-6c2f1a0d3e5b"
EVENT_TIME_MS = 1_750_000_000_000


def protocols(d: int, bits: int, n: int) -> list[tuple[str, str, Callable[[float], Any]]]:
    """(group, label, eps -> mechanism); the group says what a client's value is (histogram/range/items)."""
    return [
        ("hist", "grr", lambda e: GRR(d, e)),
        ("hist", "oue", lambda e: OUE(d, e)),
        ("hist", "olh", lambda e: OLH(d, e)),
        ("hist", "hadamard", lambda e: HadamardResponse(d, e)),
        ("hist", "cms", lambda e: CountMeanSketch(d, e)),
        ("hist", "rappor (attr. frag.)", lambda e: AttributeFragmentedRappor(d, e)),
        ("hist", "rappor_fragments t=4", lambda e: ReportFragmentedRappor(d, e)),
        ("hist", "mm_hadamard", lambda e: MultiMessageHadamard(d, e, DELTA, n_expected=n)),
        ("hist", "mm_countmin", lambda e: CountMinMultiRR(d, e, DELTA, n_expected=n)),
        ("range", "dyadic sample", lambda e: DyadicRange(bits, e, levels="sample")),
        ("range", "dyadic all", lambda e: DyadicRange(bits, e, levels="all")),
        ("items", "prefix_hh sample", lambda e: PrefixHeavyHitters(e)),
        ("items", "prefix_hh all", lambda e: PrefixHeavyHitters(e, levels="all")),
    ]


def expected_messages(mech: Any, n: int) -> float:
    """Protocol messages per client in expectation (presence marker excluded)."""
    if is_single_message(mech):
        return 1.0
    ledger = mech.ledger(n)
    if ledger is not None:
        return float(ledger["messages_per_client_expected"])
    if mech.expected_messages is not None:
        return float(mech.expected_messages)
    return float(mech.channels if mech.levels == "all" else 1)


def client_values(group: str, mech: Any, clients: int, rng: np.random.Generator) -> np.ndarray:
    if group == "range":
        return rng.integers(0, mech.d, clients)
    w = np.arange(1, (1 << 16 if group == "items" else mech.d) + 1, dtype=np.float64) ** -1.1
    ranks = np.minimum(np.searchsorted(np.cumsum(w) / w.sum(), rng.random(clients), "right"), w.size - 1)
    return item_hash(ranks + 1, 32) if group == "items" else ranks.astype(np.int64)


def envelope_bytes() -> int:
    """Single-object Report with an empty (MarkPayload) payload on channel 0: the per-message overhead."""
    record = {"schema_version": 1, "spec_id": SPEC_ID, "crowd_id": None, "channel": 0, "client_id": CLIENT_ID,
              "event_time": EVENT_TIME_MS, "payload": ("esa.telemetry.MarkPayload", {})}
    return len(encode_record("Report", record))


def measure(group: str, mech: Any, n: int, sample: int, rng: np.random.Generator) -> dict[str, float]:
    per = expected_messages(mech, n)
    clients = int(max(2, min(2000, sample // max(1.0, per))))
    values = client_values(group, mech, clients, rng)
    if is_single_message(mech):
        reports, owner = mech.encode(values, rng), np.arange(clients)
    else:
        reports, owner = mech.encode_messages(values, rng)
    measured = len(reports) / clients
    wire, _ = client_messages(mech, reports, owner, n_clients=clients)
    rows = array_to_rows(wire)
    pick = rng.choice(len(rows), size=min(len(rows), sample), replace=False) if len(rows) > sample else None
    chosen = rows if pick is None else [rows[i] for i in np.sort(pick)]
    base = envelope_bytes() - 2  # envelope without its channel varint and its (empty) payload branch
    full = msgs = 0
    for row in chosen:
        rec = report_record(mech, ReportElement(SPEC_ID, 0, CLIENT_ID, EVENT_TIME_MS, row))
        if rec["channel"] != PRESENCE:
            full += len(encode_record("Report", rec, check=False))
            msgs += 1
    payload = full - msgs * base
    marker = 0 if is_single_message(mech) else len(encode_record(
        "Report", report_record(mech, ReportElement(SPEC_ID, PRESENCE, CLIENT_ID, EVENT_TIME_MS, presence_row(mech)))))
    return {"expected": per, "measured": measured, "bits": float(mech.message_bits),
            "packed": per * mech.message_bits / 8.0, "payload": per * payload / max(1, msgs),
            "avro": per * full / max(1, msgs) + marker}


def params(mech: Any) -> str:
    if isinstance(mech, MultiMessageHadamard):
        return f"rho={mech.rho_} tau={mech.tau_}"
    if isinstance(mech, CountMinMultiRR):
        return f"t={mech.rows_} s={mech.buckets_} g={mech.gamma_:.1e}"
    if isinstance(mech, ReportFragmentedRappor):
        return f"eps_f={mech.eps_f:.2f} eps(tau)={mech.epsilon_local:.2f}"
    if isinstance(mech, DyadicRange | PrefixHeavyHitters):
        return f"L={mech.channels} eps/msg={mech.epsilon_message:.3g}"
    if isinstance(mech, CountMeanSketch):
        return f"k={mech.k} m={mech.m}"
    return ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sample at most 2000 messages per protocol")
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--eps", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--sample", type=int, default=20_000, help="messages Avro-encoded per protocol")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sample = 2000 if args.quick else args.sample
    rng = seeded_rng(args.seed)  # a simulation: seeded on purpose
    print(f"histograms d={args.d}, ranges 2^{args.bits} leaves, items 32-bit hashes; multi-message calibrated "
          f"for n={args.n:,}, delta={DELTA:g}; Avro envelope of one message = {envelope_bytes()} bytes")
    header = (f"{'protocol':<21} {'eps':>3} {'params':<28} {'msgs/cl':>9} {'meas':>9} {'bits':>5} "
              f"{'B/cl pk':>9} {'B/cl pay':>9} {'B/cl avro':>10} {'s':>5}")
    print(header)
    print("-" * len(header))
    for eps in args.eps:
        for group, label, build in protocols(args.d, args.bits, args.n):
            t0 = time.perf_counter()
            mech = build(eps)
            m = measure(group, mech, args.n, sample, rng)
            print(f"{label:<21} {eps:>3g} {params(mech):<28} {m['expected']:>9.1f} {m['measured']:>9.1f} "
                  f"{m['bits']:>5.0f} {m['packed']:>9.1f} {m['payload']:>9.1f} {m['avro']:>10.0f} "
                  f"{time.perf_counter() - t0:>5.1f}", flush=True)
        print()
    print("msgs/cl: expected protocol messages per client (meas: simulated mean); bits: message_bits; B/cl pk: "
          "packed bytes; B/cl pay: Avro channel + payload bytes; B/cl avro: whole Report messages incl. the "
          "presence marker of multi-message protocols; s: seconds for this row (calibration, simulation, encoding).")


if __name__ == "__main__":
    main()
