"""``esa query``: ranges and quantiles answered from stored range-tree estimates (no pipeline, no broker).

A range or quantile analysis stores every node of its tree as an Estimate row (item ``"level/index"``,
``raw_estimate`` = the unbiased count) and, in the ``parameters`` JSON under ``"readout"``, the per-level
variance constants and the bucketing (bits, value_range). That is exactly what ``RangeTree.from_rows`` needs
(``LeftChildrenTree.from_rows`` for [MultiMsg]'s multi-message range counting, which stores the root and left children),
so a stored tree answers any range [LO, HI) or quantile with the same numbers and standard errors as the live
accumulator. Ranges are asked in value units; the tree only knows whole buckets, so a range is answered over
the smallest run of buckets covering it, and the output says which value range that is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.paths import OutputLocation, output_location
from pipelines.query.items import format_item_answers, item_answers, read_candidates
from pipelines.query.readers import filter_estimates, load_estimates, parse_time_ms
from transforms.mechanisms.ranges.left_children_tree import LeftChildrenTree
from transforms.mechanisms.ranges.range_tree import RangeTree

Z_95 = 1.96
# How each tree structure (``readout["structure"]``, the estimate's ``structure``) is rebuilt from its rows:
# dyadic_range stores every node of its tree, mm_range ([MultiMsg]'s matrix mechanism) only the root and left children.
STRUCTURES: dict[str, type[RangeTree] | type[LeftChildrenTree]] = {"dyadic": RangeTree,
                                                                   "left_children": LeftChildrenTree}


@dataclass(frozen=True)
class StoredTree:
    """One (spec, window, crowd)'s range tree rebuilt from its Estimate rows, with its bucketing and ledger."""

    spec_id: str
    window_start: int
    window_end: int
    crowd_id: str | None
    tree: RangeTree | LeftChildrenTree
    value_range: tuple[float, float] | None
    eps_local: float
    eps_central: float
    delta: float

    @property
    def bits(self) -> int:
        return self.tree.bits

    @property
    def size(self) -> int:
        return 1 << self.bits

    def edge(self, leaf: int | float) -> float:
        """Lower edge of bucket ``leaf`` in value units (leaf = 2^bits: the top of the range)."""
        if self.value_range is None:
            return float(leaf)
        lo, hi = self.value_range
        return lo + (hi - lo) * float(leaf) / self.size

    def leaves(self, lo: float, hi: float) -> tuple[int, int]:
        """The smallest run of buckets [a, b) covering the values [lo, hi) (at least one bucket)."""
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"range bounds must be finite numbers, got [{lo!r}, {hi!r})")
        if lo >= hi:
            raise ValueError(f"range [{lo:g}, {hi:g}) is empty: LO must be below HI")
        top = self.edge(self.size)
        if hi <= self.edge(0) or lo > top:
            raise ValueError(f"range [{lo:g}, {hi:g}) lies outside the value range [{self.edge(0):g}, {top:g}] "
                             f"of {self.spec_id}")
        scale = self.size / (top - self.edge(0))
        a = int(np.floor((lo - self.edge(0)) * scale + 1e-9))
        b = int(np.ceil((hi - self.edge(0)) * scale - 1e-9))
        a = min(max(a, 0), self.size - 1)
        return a, min(max(b, a + 1), self.size)

    def label(self) -> str:
        when = datetime.fromtimestamp(self.window_start / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        crowd = f"  crowd {self.crowd_id}" if self.crowd_id is not None else ""
        return (f"{self.spec_id}  window {when} ({self.window_start}){crowd}  n={self.tree.n:,}  "
                f"eps_local={self.eps_local:g}  eps_central={self.eps_central:.4f}  delta={self.delta:g}")


@dataclass(frozen=True)
class RangeAnswer:
    """Clients with a value in [lo, hi), answered over buckets [leaf_lo, leaf_hi) = values [value_lo, value_hi)."""

    lo: float
    hi: float
    leaf_lo: int
    leaf_hi: int
    value_lo: float
    value_hi: float
    estimate: float
    stderr: float
    fraction: float
    fraction_stderr: float


@dataclass(frozen=True)
class QuantileAnswer:
    """q-quantile as the upper edge of its bucket (value units) with an interval [ci_low, ci_high] (z sigma)."""

    q: float
    value: float
    ci_low: float
    ci_high: float
    bucket_low: float
    leaf: int
    rank: float
    rank_stderr: float


def _parse_level_index(items: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    parts = [item.split("/", 1) for item in items]
    return (np.fromiter((int(p[0]) for p in parts), dtype=np.int64, count=len(parts)),
            np.fromiter((int(p[1]) for p in parts), dtype=np.int64, count=len(parts)))


def tree_of(rows: pa.Table, readout: dict[str, Any]) -> RangeTree | LeftChildrenTree:
    """Rebuild one crowd's tree from its node rows (``raw_estimate`` per ``"level/index"``) and the per-level
    constants [clients, var_intercept, var_slope, cov_beta] of the ``readout`` parameters, as the structure
    the analyzer stored (``readout["structure"]``: a full dyadic tree or [MultiMsg]'s left-children nodes)."""
    structure = readout.get("structure", "dyadic")
    if structure not in STRUCTURES:
        raise ValueError(f"unknown range-tree structure {structure!r} in the readout parameters "
                         f"(known: {', '.join(STRUCTURES)})")
    names = rows["item"].to_pylist()
    node = np.fromiter((not name.startswith("quantile:") for name in names), dtype=bool, count=len(names))
    level, index = _parse_level_index([n for n, keep in zip(names, node.tolist(), strict=True) if keep])
    constants = readout.get("levels") or {}
    missing = sorted(set(np.unique(level).tolist()) - {int(k) for k in constants})
    if missing:
        raise ValueError(f"the readout parameters lack the constants of tree levels {missing}")
    table = np.array([constants[str(x)] for x in level.tolist()], dtype=np.float64).reshape(-1, 4)
    return STRUCTURES[structure].from_rows({
        "level": level, "index": index,
        "estimate": np.asarray(rows["raw_estimate"], dtype=np.float64)[node],
        "stderr": np.asarray(rows["stderr"], dtype=np.float64)[node],
        "clients": table[:, 0].astype(np.int64), "var_intercept": table[:, 1], "var_slope": table[:, 2],
        "cov_beta": table[:, 3]})


def trees_of(table: pa.Table, spec_id: str | None = None, window: str | int | None = None,
             crowd: str | None = None) -> list[StoredTree]:
    """Every (spec, window, crowd) of an estimates table whose rows form a range tree, after the filters."""
    if table.num_rows == 0:
        return []
    keys = table.select(["spec_id", "window_start", "crowd_id"]).group_by(
        ["spec_id", "window_start", "crowd_id"]).aggregate([]).to_pylist()
    start = None if window is None else parse_time_ms(str(window))
    out = []
    for key in sorted(keys, key=lambda k: (k["spec_id"], k["window_start"], k["crowd_id"] or "")):
        if (spec_id is not None and key["spec_id"] != spec_id) or (start is not None and key["window_start"] != start) \
                or (crowd is not None and key["crowd_id"] != crowd):
            continue
        mask = pc.and_(pc.equal(table["spec_id"], key["spec_id"]), pc.equal(table["window_start"], key["window_start"]))
        mask = pc.and_(mask, pc.is_null(table["crowd_id"]) if key["crowd_id"] is None
                       else pc.equal(table["crowd_id"], key["crowd_id"]))
        rows = table.filter(mask)
        first = rows.slice(0, 1).to_pylist()[0]
        readout = json.loads(first["parameters"]).get("readout")
        if not readout or "levels" not in readout:
            continue  # not a range-tree analysis
        value_range = readout.get("value_range")
        out.append(StoredTree(spec_id=key["spec_id"], window_start=int(key["window_start"]),
                              window_end=int(first["window_end"]), crowd_id=key["crowd_id"],
                              tree=tree_of(rows, readout),
                              value_range=tuple(float(v) for v in value_range) if value_range else None,
                              eps_local=float(first["eps_local"]), eps_central=float(first["eps_central"]),
                              delta=float(first["delta"])))
    return out


def estimates_file(estimates: str | Path | OutputLocation) -> Path | str:
    """DIR/estimates.parquet of a local directory or a URL (``gs://bucket/esa``), or the file given itself."""
    location = output_location(estimates)
    if location.local is not None:
        path = location.local
        path = path / "estimates.parquet" if path.is_dir() else path
        if not path.is_file():
            raise ValueError(f"no estimates at {path} (give the output directory of esa run/demo/analyze)")
        return path
    url = str(location)
    return url if url.endswith(".parquet") else location.join("estimates.parquet")


def read_table(estimates: str | Path | OutputLocation) -> tuple[pa.Table, str]:
    """Every stored estimate row and where they came from: a local output directory's dataset parts and
    legacy ``estimates.parquet`` (``read_estimates``), that file given directly, or a URL's file."""
    location = output_location(estimates)
    if location.local is not None:

        return load_estimates(location.local), str(location.local)
    path = estimates_file(estimates)
    try:
        return pq.read_table(str(path)), str(path)
    except (OSError, pa.ArrowException) as err:
        raise ValueError(f"cannot read estimates at {path}: {err}") from None


def read_trees(estimates: str | Path | OutputLocation, spec_id: str | None = None, window: str | int | None = None,
               crowd: str | None = None) -> list[StoredTree]:
    """The range trees stored under an output directory (dataset parts and a legacy estimates.parquet), that
    file, or a URL, filtered (``spec_id``: an id or a spec name); ValueError if there are none."""

    table, path = read_table(estimates)
    trees = trees_of(filter_estimates(table, spec_id, window, crowd))
    if not trees:
        analyses = sorted(set(table["spec_id"].to_pylist())) if table.num_rows else []
        filters = {k: v for k, v in (("spec-id", spec_id), ("window", window), ("crowd", crowd)) if v is not None}
        raise ValueError(f"{path} holds no range or quantile analysis"
                         + (f" matching {filters}" if filters else "")
                         + (f" (it holds: {', '.join(analyses)})" if analyses else " (it is empty)"))
    return trees


def answer_range(stored: StoredTree, lo: float, hi: float) -> RangeAnswer:
    """Clients with a value in [lo, hi) (value units), over the buckets covering it, with the exact stderr."""
    a, b = stored.leaves(float(lo), float(hi))
    estimate, stderr = stored.tree.answer(a, b)
    n = float(stored.tree.n)
    return RangeAnswer(lo=float(lo), hi=float(hi), leaf_lo=a, leaf_hi=b, value_lo=stored.edge(a),
                       value_hi=stored.edge(b), estimate=estimate, stderr=stderr, fraction=estimate / n,
                       fraction_stderr=stderr / n)


def check_quantile_level(q: float) -> float:
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise ValueError(f"a quantile level must lie in (0, 1], got {q!r}")
    return float(q)


def answer_quantile(stored: StoredTree, q: float, z: float = Z_95) -> QuantileAnswer:
    """The q-quantile: upper edge of the bucket where the monotone CDF reaches q n, with the interval from
    inverting the CDF band +/- z stderr (``RangeTree.quantile``), as ``readout.quantile_items`` reports it."""
    answer = stored.tree.quantile(check_quantile_level(q), z=z)
    return QuantileAnswer(q=float(q), value=stored.edge(answer.leaf + 1), ci_low=stored.edge(answer.lower),
                          ci_high=stored.edge(answer.upper + 1), bucket_low=stored.edge(answer.leaf),
                          leaf=answer.leaf, rank=answer.rank, rank_stderr=answer.rank_stderr)


def z_of(confidence: float) -> float:
    """Two-sided normal quantile of a confidence level in (0, 1), e.g. 0.95 -> 1.96."""
    from scipy.stats import norm

    if not (math.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise ValueError(f"--confidence must lie in (0, 1), got {confidence!r}")
    return float(norm.ppf(0.5 + confidence / 2))


def query(estimates: str | Path | OutputLocation, ranges: Sequence[tuple[float, float]], quantiles: Sequence[float], *,
          spec_id: str | None = None, window: str | None = None, crowd: str | None = None,
          confidence: float = 0.95) -> list[dict[str, Any]]:
    """Answer every range and quantile on every matching stored tree (checks the questions first)."""
    z = z_of(confidence)
    if not ranges and not quantiles:
        raise ValueError("ask something: --range LO HI and/or --quantile Q")
    for lo, hi in ranges:
        if not lo < hi:
            raise ValueError(f"range [{lo:g}, {hi:g}) is empty: LO must be below HI")
    for q in quantiles:
        check_quantile_level(q)
    out = []
    for stored in read_trees(estimates, spec_id, window, crowd):
        out.append({"spec_id": stored.spec_id, "window_start": stored.window_start, "window_end": stored.window_end,
                    "crowd_id": stored.crowd_id, "n_clients": stored.tree.n, "bits": stored.bits,
                    "value_range": list(stored.value_range) if stored.value_range else None,
                    "eps_local": stored.eps_local, "eps_central": stored.eps_central, "delta": stored.delta,
                    "label": stored.label(), "confidence": confidence,
                    "ranges": [asdict(answer_range(stored, lo, hi)) for lo, hi in ranges],
                    "quantiles": [asdict(answer_quantile(stored, q, z)) for q in quantiles]})
    return out


def format_answers(results: list[dict[str, Any]]) -> str:
    """Human-readable answers: one block per tree."""
    lines = []
    for result in results:
        lines.append(result["label"])
        for r in result["ranges"]:
            lines.append(f"  range [{r['lo']:g}, {r['hi']:g}): {r['estimate']:,.1f} ± {r['stderr']:,.1f} clients "
                         f"({100 * r['fraction']:.3f}% ± {100 * r['fraction_stderr']:.3f}%)  answered over buckets "
                         f"[{r['leaf_lo']}, {r['leaf_hi']}) = values [{r['value_lo']:.6g}, {r['value_hi']:.6g})")
        for a in result["quantiles"]:
            lines.append(f"  quantile {a['q']:g}: {a['value']:.6g}  ({100 * result['confidence']:g}% CI "
                         f"[{a['ci_low']:.6g}, {a['ci_high']:.6g}]; "
                         f"bucket [{a['bucket_low']:.6g}, {a['value']:.6g}), rank {a['rank']:,.1f} ± "
                         f"{a['rank_stderr']:,.1f})")
    return "\n".join(lines)


def item_questions(args: Any) -> bool:
    return bool(getattr(args, "top", None) or getattr(args, "items", None) or getattr(args, "sums", None)
                or getattr(args, "candidates", None))


def query_command(args: Any) -> int:
    """``esa query`` (wired in ``pipelines.cli``): ranges/quantiles on range trees, and top items, named items,
    sums and kv_mean keys on item analyses (``pipelines.query.items``); prints text or JSON; ValueError -> 2."""

    ranges, quantiles = [tuple(r) for r in args.ranges or ()], list(args.quantiles or ())
    results: list[dict[str, Any]] = []
    text = []
    if ranges or quantiles:
        results = query(args.estimates, ranges, quantiles, spec_id=args.spec_id, window=args.window,
                        crowd=args.crowd, confidence=getattr(args, "confidence", 0.95))
        text.append(format_answers(results))
    if item_questions(args) or not (ranges or quantiles):
        table, path = read_table(args.estimates)
        candidates = read_candidates(args.candidates) if getattr(args, "candidates", None) else None
        answers = item_answers(filter_estimates(table, args.spec_id, args.window, args.crowd),
                               top=getattr(args, "top", None), items=list(getattr(args, "items", None) or ()),
                               sums=[list(g) for g in getattr(args, "sums", None) or ()], candidates=candidates)
        if not answers:
            held = sorted(set(table["spec_id"].to_pylist())) if table.num_rows else []
            raise ValueError("ask something: --range LO HI and/or --quantile Q of a range/quantile analysis, or "
                             f"--top/--item/--sum of a histogram, heavy-hitter or kv_mean analysis; {path} holds no "
                             "item analysis" + (" matching the filters" if any((args.spec_id, args.window,
                                                                                  args.crowd)) else "")
                             + (f" (it holds: {', '.join(held)})" if held else " (it is empty)"))
        results += answers
        text.append(format_item_answers(answers))
    print(json.dumps(results, indent=2) if args.json else "\n".join(text), flush=True)
    return 0
