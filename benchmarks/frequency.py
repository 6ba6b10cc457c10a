"""Throughput, accuracy and accumulator memory of the frequency oracles, next to pure-ldp's equivalents.

Mechanisms: GRR, OUE, OLH, Hadamard response ("hadamard"), count-mean sketch ("cms", ``--cms-k`` x ``--cms-m``)
and attribute-fragmented k-RAPPOR ("rappor", several messages per client; OUE stands in for the unary family
if ``transforms.mechanisms.frequency.unary`` is missing). pure-ldp equivalents: DE, UE(OUE), LH(OLH),
HadamardResponse (for eps > 1 pure-ldp switches to its blocked "general" HR, a different randomizer), CMS
(Apple, same k and m, its own xxhash family), and UE(SUE) at 2 eps, whose per-bit law is exactly k-RAPPOR's
keep probability e^eps/(1+e^eps) (sent as one message instead of fragments).

Single thread (BLAS/OpenMP pools pinned to 1 before numpy loads), so every rate is per core. Rates are per
*client* (one report, or one client's message set). Our encode runs in batches of ``--batch`` clients, as the
Beam encode stage feeds it, capped so that one batch draws at most 2^23 uniforms (CMS draws m per client);
"keyed" includes deriving the per-element SipHash keys (what a retry-safe DoFn does). Aggregate+estimate folds
all n clients into one accumulator and decodes it. pure-ldp's clients and servers are per-report Python
objects, so they are timed on a subsample (``--pure-n``) and the per-report rate is extrapolated.

Errors: max |err| / stderr over the d items (stderr = closed form; pure-ldp: our closed form for the same
mechanism at its subsample size) and RMSE of the frequencies, next to the closed-form RMSE
sqrt(mean_v Var_v)/n at the same n. Memory: bytes of the accumulator state after all reports (ours: count
arrays; pure-ldp: numpy arrays and lists held by the server object, after the subsample).

    .venv/bin/python benchmarks/frequency.py            # n = 1e6, d = 64, eps = 2
    .venv/bin/python benchmarks/frequency.py --quick    # n = 1e5, smaller pure-ldp subsample
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from transforms.mechanisms.base import encode_messages, is_single_message  # noqa: E402
from transforms.mechanisms.frequency.count_mean_sketch import CountMeanSketch  # noqa: E402
from transforms.mechanisms.frequency.hadamard import HadamardResponse  # noqa: E402
from transforms.mechanisms.frequency.oracles import GRR, OLH, OUE, make_frequency_mechanism  # noqa: E402
from transforms.mechanisms.randomness import KeyedRandom, job_key_from_entropy  # noqa: E402

try:  # being written alongside this benchmark; OUE represents the unary family without it
    from transforms.mechanisms.frequency.unary import AttributeFragmentedRappor
except ImportError:  # pragma: no cover - depends on the checkout
    AttributeFragmentedRappor = None  # type: ignore[assignment,misc]

Mech = Any
DRAW_BUDGET = 1 << 23  # uniforms per encode batch (64 MiB of float64): caps the batch of wide encoders


@dataclass
class Row:
    name: str
    encode: float = float("nan")
    encode_keyed: float = float("nan")
    aggregate: float = float("nan")
    pure_encode: float = float("nan")
    pure_aggregate: float = float("nan")
    err_ours: float = float("nan")
    err_pure: float = float("nan")
    rmse_ours: float = float("nan")
    rmse_theory: float = float("nan")
    rmse_pure: float = float("nan")
    rmse_theory_pure: float = float("nan")
    mem_ours: int = 0
    mem_pure: int | None = None
    bits: int = 0
    batch: int = 0
    note: str = ""


def build(name: str, d: int, eps: float, cms_k: int, cms_m: int) -> Mech:
    """Our mechanism of that name (the benchmark's own table: registration is the spec layer's business)."""
    if name == "hadamard":
        return HadamardResponse(d, eps)
    if name == "cms":
        return CountMeanSketch(d, eps, k=cms_k, m=cms_m)
    if name in ("rappor", "unary"):
        return OUE(d, eps) if AttributeFragmentedRappor is None else AttributeFragmentedRappor(d, eps)
    return make_frequency_mechanism(name, d, eps)


def draws_per_client(mech: Mech) -> int:
    """Uniforms one client draws (upper bound), to size encode batches."""
    if isinstance(mech, CountMeanSketch):
        return mech.m + 1
    if isinstance(mech, OUE):
        return mech.d
    return int(getattr(mech, "cap", 0)) + 3


def state_bytes(obj: Any, depth: int = 0) -> int:
    """Bytes of the numpy arrays and Python lists/dicts of numbers an accumulator or server object holds."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, int | float | np.generic):
        return sys.getsizeof(obj)
    if depth > 3:
        return 0
    if isinstance(obj, list | tuple):
        return sys.getsizeof(obj) + sum(state_bytes(x, depth + 1) for x in obj)
    if isinstance(obj, dict):
        return sum(state_bytes(v, depth + 1) for v in obj.values())
    if hasattr(obj, "__dict__") and depth == 0:
        return sum(state_bytes(v, depth + 1) for k, v in vars(obj).items() if k != "mechanism")
    return 0


def zipf_values(n: int, d: int, rng: np.random.Generator, s: float = 1.1) -> np.ndarray:
    w = 1.0 / np.arange(1, d + 1) ** s
    return rng.choice(d, size=n, p=w / w.sum())


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def rmse(estimate: np.ndarray, truth: np.ndarray, n: int) -> float:
    return float(np.sqrt(np.mean((np.asarray(estimate) - truth) ** 2)) / n)


def bench_ours(mech: Mech, values: np.ndarray, batch: int, repeats: int, seed: int) -> Row:
    n = values.size
    batch = max(256, min(batch, DRAW_BUDGET // draws_per_client(mech)))
    spans = [slice(a, min(a + batch, n)) for a in range(0, n, batch)]
    rng = np.random.default_rng(seed)  # a simulation: seeded on purpose
    ids = np.arange(n, dtype=np.uint64)
    key = job_key_from_entropy()

    def encode() -> np.ndarray:
        return np.concatenate([encode_messages(mech, values[s], rng)[0] for s in spans])

    def encode_keyed() -> np.ndarray:
        return np.concatenate([
            encode_messages(mech, values[s], KeyedRandom.for_elements(key, ids[s]))[0] for s in spans
        ])

    t_enc, reports = median_time(encode, repeats)
    t_keyed, _ = median_time(encode_keyed, repeats)

    def aggregate() -> Any:
        acc = mech.new_accumulator()
        acc.add(reports, clients=n)
        return acc, acc.estimate()

    t_agg, (acc, est) = median_time(aggregate, repeats)
    truth = np.bincount(values, minlength=mech.d)
    iterations = est.extras.get("solver_iterations")
    messages = "" if is_single_message(mech) else f"{len(reports) / n:.2f} messages/client"
    return Row(mech.name, encode=n / t_enc, encode_keyed=n / t_keyed, aggregate=n / t_agg,
               err_ours=float(np.max(np.abs(est.count - truth) / (est.stderr * n))),
               rmse_ours=rmse(est.count, truth, n),
               rmse_theory=float(np.sqrt(np.mean(mech.variance(truth, n))) / n),
               mem_ours=state_bytes(acc), bits=mech.message_bits, batch=batch,
               note=messages if iterations is None else f"{iterations} CG iterations")


class _NumpyNoneShape:
    """numpy as pure-ldp's base server expects it: numpy 1 accepted ``np.zeros(None)`` (sketch servers pass
    d=None), numpy 2 refuses it. Installed only into pure-ldp's server module, only by this benchmark."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def zeros(shape: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        return np.zeros(() if shape is None else shape, *args, **kwargs)


def pure_ldp_pair(mech: Mech) -> tuple[Any, Any, str]:
    """pure-ldp's (client, server) closest to ``mech``, and a note on how close."""
    import pure_ldp.core._freq_oracle_server as pure_server
    from pure_ldp.frequency_oracles import (
        CMSClient,
        CMSServer,
        DEClient,
        DEServer,
        HadamardResponseClient,
        HadamardResponseServer,
        LHClient,
        LHServer,
        UEClient,
        UEServer,
    )

    pure_server.np = _NumpyNoneShape()  # type: ignore[assignment]
    d, eps, ident = mech.d, mech.epsilon, (lambda x: x)
    if isinstance(mech, GRR):
        return DEClient(eps, d, index_mapper=ident), DEServer(eps, d, index_mapper=ident), "DE"
    if isinstance(mech, OUE):
        return (UEClient(eps, d, use_oue=True, index_mapper=ident),
                UEServer(eps, d, use_oue=True, index_mapper=ident), "UE(oue)")
    if isinstance(mech, OLH):
        client = LHClient(eps, d, use_olh=True, index_mapper=ident)
        assert client.g == mech.buckets, (client.g, mech.buckets)
        return client, LHServer(eps, d, use_olh=True, index_mapper=ident), "LH(olh)"
    if isinstance(mech, HadamardResponse):
        server = HadamardResponseServer(eps, d, index_mapper=ident)
        client = HadamardResponseClient(eps, d, server.get_hash_funcs(), index_mapper=ident)
        return client, server, "HR" + (" (blocked general HR: eps > 1)" if eps > 1 else "")
    if isinstance(mech, CountMeanSketch):
        server = CMSServer(eps, mech.k, mech.m)
        return CMSClient(eps, server.get_hash_funcs(), mech.m), server, "CMS"
    # attribute-fragmented k-RAPPOR: per-bit RR keep e^eps/(1+e^eps) = SUE at 2 eps
    return (UEClient(2 * eps, d, use_oue=False, index_mapper=ident),
            UEServer(2 * eps, d, use_oue=False, index_mapper=ident), "UE(sue) at 2 eps")


def bench_pure_ldp(mech: Mech, values: np.ndarray, row: Row) -> str | None:
    """Time pure-ldp's equivalent oracle on ``values`` (a subsample); None if pure-ldp is missing."""
    try:
        client, server, label = pure_ldp_pair(mech)
    except ImportError as exc:
        return f"pure-ldp not importable ({exc}); install with: .venv/bin/pip install -e '.[bench]'"
    row.note = f"{row.note}; pure-ldp {label}" if row.note else f"pure-ldp {label}"
    np.random.seed(0)  # pure-ldp draws from the legacy global generators
    m = values.size
    py_values = values.tolist()
    t0 = time.perf_counter()
    reports = [client.privatise(x) for x in py_values]
    t1 = time.perf_counter()
    for r in reports:
        server.aggregate(r)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = np.asarray(server.estimate_all(range(mech.d), suppress_warnings=True), dtype=float)
    t2 = time.perf_counter()
    truth = np.bincount(values, minlength=mech.d)
    var = mech.variance(truth, m)  # our closed form at the truth of the subsample
    row.pure_encode, row.pure_aggregate = m / (t1 - t0), m / (t2 - t1)
    row.err_pure = float(np.max(np.abs(est - truth) / np.sqrt(var)))
    row.rmse_pure = rmse(est, truth, m)
    row.rmse_theory_pure = float(np.sqrt(np.mean(var)) / m)
    row.mem_pure = state_bytes(server)
    return None


def _fmt(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:,.0f}"


def _ratio(a: float, b: float) -> str:
    return "n/a" if not (np.isfinite(a) and np.isfinite(b)) else f"{a / b:,.0f}x"


def _sci(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.2e}"


def _bytes(x: int | None) -> str:
    return "n/a" if x is None else f"{x:,}"


def print_tables(rows: list[Row], n: int, pure_n: int) -> None:
    head = ["mechanism", "bits/message", "encode batch", "ours encode clients/s", "ours encode keyed clients/s",
            "ours aggregate+estimate clients/s", f"pure-ldp encode rep/s (on {pure_n:,}, extrap.)",
            f"pure-ldp aggregate+estimate rep/s (on {pure_n:,}, extrap.)", "ratio encode", "ratio aggregate"]
    body = [[r.name, str(r.bits), f"{r.batch:,}", _fmt(r.encode), _fmt(r.encode_keyed), _fmt(r.aggregate),
             _fmt(r.pure_encode), _fmt(r.pure_aggregate), _ratio(r.encode, r.pure_encode),
             _ratio(r.aggregate, r.pure_aggregate)] for r in rows]
    _table(head, body)
    print()
    head = ["mechanism", f"ours max|err|/stderr (n={n:,})", "ours RMSE(freq)", "closed-form RMSE",
            f"pure-ldp max|err|/sd (n={pure_n:,})", "pure-ldp RMSE(freq)", "closed-form RMSE at pure n",
            "ours accumulator bytes", "pure-ldp server state bytes", "notes"]
    _table(head, [[r.name, f"{r.err_ours:.2f}", _sci(r.rmse_ours), _sci(r.rmse_theory),
                   "n/a" if not np.isfinite(r.err_pure) else f"{r.err_pure:.2f}", _sci(r.rmse_pure),
                   _sci(r.rmse_theory_pure), _bytes(r.mem_ours), _bytes(r.mem_pure), r.note] for r in rows])


def _table(head: list[str], body: list[list[str]]) -> None:
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=None, help="clients per mechanism (default 1e6, quick 1e5)")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=1 << 16, help="encode batch size (a Beam bundle)")
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats, median taken (default 5)")
    ap.add_argument("--pure-n", type=int, default=None, help="pure-ldp subsample (default 20,000)")
    ap.add_argument("--quick", action="store_true", help="n = 1e5, 3 repeats, pure-ldp on 2,000 reports")
    ap.add_argument("--mechanisms", default="grr,oue,olh,hadamard,cms,rappor")
    ap.add_argument("--cms-k", type=int, default=CountMeanSketch.k, help="count-mean sketch rows")
    ap.add_argument("--cms-m", type=int, default=CountMeanSketch.m, help="count-mean sketch width")
    args = ap.parse_args(argv)
    n = args.n or (100_000 if args.quick else 1_000_000)
    repeats = args.repeats or (3 if args.quick else 5)
    pure_n = min(n, args.pure_n or (2_000 if args.quick else 20_000))

    rng = np.random.default_rng(2024)
    values = zipf_values(n, args.d, rng)
    sub = values[:pure_n]
    print(f"# frequency oracles: n={n:,}, d={args.d}, eps={args.epsilon}, single thread, "
          f"median of {repeats}; numpy {np.__version__}, python {sys.version.split()[0]}")
    rows, notes = [], set()
    for name in args.mechanisms.split(","):
        mech = build(name.strip(), args.d, args.epsilon, args.cms_k, args.cms_m)
        print(f"#   {mech!r}: {mech.message_bits} bits/message", flush=True)
        row = bench_ours(mech, values, args.batch, repeats, seed=7)
        note = bench_pure_ldp(mech, sub, row)
        if note:
            notes.add(note)
        rows.append(row)
    print()
    print_tables(rows, n, pure_n)
    for note in sorted(notes):
        print(f"\n{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
