"""``esa demo``: embedded broker + synthetic telemetry + the end-to-end pipeline + a report and a plot.

Writes to the output directory: ``estimates.parquet`` (the pipeline's output), ``truth.parquet`` (the
simulated ground truth), ``dead_letters.avro``, ``estimates_vs_truth.png`` and ``summary.json``.
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.broker import LocalBroker
from pipelines.end_to_end import run
from pipelines.job import JobConfig, RunSummary
from pipelines.population import synthesize, truth_table
from pipelines.simulate import produce_population
from transforms.spec import DEFAULT_SPEC, AnalysisSpec, load_spec

LOG = logging.getLogger(__name__)
PLOT_FILE = "estimates_vs_truth.png"


@dataclass(frozen=True)
class DemoOutcome:
    """What a demo run produced and how good it was."""

    summary: RunSummary
    comparison: pa.Table
    facts: dict[str, Any]


def progress_printer(label: str):
    """A callback printing ``label: done/total (pct%)`` at most every 10 % (long steps show progress)."""
    shown = {"pct": -10}

    def show(done: int, total: int) -> None:
        pct = int(100 * done / max(total, 1))
        if pct >= shown["pct"] + 10 or done == total:
            shown["pct"] = pct
            print(f"  {label}: {done:,}/{total:,} ({pct}%)", file=sys.stderr, flush=True)

    return show


@contextmanager
def heartbeat(label: str, every_s: float = 10.0) -> Iterator[None]:
    """Print ``label ... Ns`` every few seconds while a step with no progress of its own runs."""
    done = threading.Event()
    start = time.perf_counter()

    def beat() -> None:
        while not done.wait(every_s):
            print(f"  {label} ... {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def compare(estimates: pa.Table, truth: pa.Table) -> pa.Table:
    """Join estimates with the truth on (window, item) and add error and error/stderr columns."""
    est = {(w, i): (e, s) for w, i, e, s in zip(estimates["window_start"].to_pylist(),
                                                 estimates["item_index"].to_pylist(),
                                                 estimates["estimate"].to_pylist(),
                                                 estimates["stderr"].to_pylist(), strict=True)}
    rows: dict[str, list] = {k: [] for k in ("window_start", "item", "item_index", "truth", "estimate", "stderr")}
    for w, item, idx, f in zip(truth["window_start"].to_pylist(), truth["item"].to_pylist(),
                               truth["item_index"].to_pylist(), truth["frequency"].to_pylist(), strict=True):
        if (w, idx) not in est:
            continue  # a window the shuffler withheld: nothing to compare
        e, s = est[(w, idx)]
        for key, value in zip(rows, (w, item, idx, f, e, s), strict=True):
            rows[key].append(value)
    table = pa.table(rows)
    error = np.asarray(table["estimate"]) - np.asarray(table["truth"])
    z = np.abs(error) / np.asarray(table["stderr"])
    return table.append_column("error", pa.array(error)).append_column("abs_error_over_stderr", pa.array(z))


def plot(comparison: pa.Table, facts: dict[str, Any], path: Path) -> None:
    """Estimate +/- 2 stderr against the truth, items ordered by true frequency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    truth = np.asarray(comparison["truth"])
    order = np.argsort(-truth, kind="stable")
    est, se = np.asarray(comparison["estimate"])[order], np.asarray(comparison["stderr"])[order]
    items = np.asarray(comparison["item"].to_pylist(), dtype=object)[order]
    x = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(max(8, len(order) * 0.18), 4.8), dpi=110)
    ax.errorbar(x, est, yerr=2 * se, fmt="o", ms=3, color="tab:blue", ecolor="tab:blue", elinewidth=0.8,
                capsize=1.5, label="private estimate ± 2 stderr")
    ax.plot(x, truth[order], "_", ms=9, mew=2, color="black", label="truth")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xticks(x, items, rotation=90, fontsize=7)
    ax.set_ylabel("frequency")
    ax.set_title(f"{facts['mechanism'].upper()}  n={facts['n_reports']:,}  ε_local={facts['eps_local']:g}  "
                 f"ε_central={facts['eps_central']:.4f}  δ={facts['delta']:g}  "
                 f"{100 * facts['fraction_within_3_stderr']:.1f}% within 3 stderr", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summarize(spec: AnalysisSpec, summary: RunSummary, comparison: pa.Table, estimates: pa.Table) -> dict[str, Any]:
    z = np.asarray(comparison["abs_error_over_stderr"])
    first = estimates.slice(0, 1).to_pylist()[0] if estimates.num_rows else {}
    return {
        "spec_id": spec.spec_id,
        "mechanism": spec.mechanism,
        "items": int(comparison.num_rows),
        "max_abs_error_over_stderr": float(z.max()) if z.size else float("nan"),
        "fraction_within_3_stderr": float(np.mean(z <= 3)) if z.size else float("nan"),
        "eps_local": first.get("eps_local", spec.epsilon),
        "eps_central": first.get("eps_central", float("nan")),
        "delta": spec.delta,
        "n_reports": int(first.get("n_reports", 0)),
        "messages_per_client": 1,
        "deleted": summary.count("reports_deleted"),
        "accounting": summary.accounting,
        "accounting_balanced": summary.balanced,
        "pipeline_seconds": round(summary.seconds, 2),
    }


def print_summary(facts: dict[str, Any], out: Path) -> None:
    a = facts["accounting"]
    balance = "balanced" if facts["accounting_balanced"] else "NOT BALANCED"
    expanded = f" + {a['expanded']:,} extra messages" if a.get("expanded") else ""
    lines = [
        f"esa demo — {facts['spec_id']}",
        ("items", facts["items"]),
        ("max |error| / stderr", f"{facts['max_abs_error_over_stderr']:.2f}"),
        ("items within 3 stderr", f"{100 * facts['fraction_within_3_stderr']:.1f}%"),
        ("eps_local", f"{facts['eps_local']:g} ({facts['mechanism']}, {facts['messages_per_client']} message/client)"),
        ("eps_central (tight, shuffled)", f"{facts['eps_central']:.5f}"),
        ("delta", f"{facts['delta']:g}"),
        ("n (reports analyzed)", f"{facts['n_reports']:,}"),
        ("deleted by crowd threshold", f"{facts['deleted']:,}"),
        ("records", f"read {a['read']:,}{expanded} = dead-lettered {a['dead_lettered']:,} + deleted {a['deleted']:,} "
                    f"+ analyzed {a['analyzed']:,} (valid {a['valid']:,}): {balance}"),
        ("pipeline time", f"{facts['pipeline_seconds']} s"),
        ("outputs", f"{out}/estimates.parquet, truth.parquet, dead_letters.avro, {PLOT_FILE}"),
    ]
    print("\n" + "\n".join(x if isinstance(x, str) else f"  {x[0]:<30}{x[1]}" for x in lines) + "\n")


def run_demo(*, clients: int, mechanism: str | None, epsilon: float | None, out: Path,
             spec_path: Path = DEFAULT_SPEC, distribution: str = "zipf", zipf_s: float = 1.1,
             bad_per_kind: int = 3, seed: int | None = None, bootstrap: str | None = None) -> DemoOutcome:
    """Run the whole demo; uses an embedded broker unless ``bootstrap`` names one."""
    spec = load_spec(spec_path).with_mechanism(mechanism, epsilon)
    out.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(4)
    raw_topic, reports_topic = f"telemetry-{run_id}", f"reports-{run_id}"
    population = synthesize(spec, clients, distribution=distribution, zipf_s=zipf_s, seed=seed)
    with LocalBroker() if bootstrap is None else _External(bootstrap) as broker:
        print(f"broker on {broker.bootstrap}; producing {clients:,} clients of {spec.spec_id}", file=sys.stderr)
        t0 = time.perf_counter()
        produce_population(broker.bootstrap, spec, population, raw_topic=raw_topic, reports_topic=reports_topic,
                           bad_per_kind=bad_per_kind, seed=seed, progress=progress_printer("produced"))
        print(f"  produced in {time.perf_counter() - t0:.1f} s; running encode ▸ shuffle ▸ analyze",
              file=sys.stderr, flush=True)
        config = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=out, raw_topic=raw_topic,
                                reports_topic=reports_topic, group_id=f"esa-demo-{run_id}", seed=seed)
        with heartbeat("pipeline running"):
            summary = run(config)
    estimates = pq.read_table(summary.estimates_path)
    truth = truth_table(spec, population)
    pq.write_table(truth, out / "truth.parquet")
    comparison = compare(estimates, truth)
    facts = summarize(spec, summary, comparison, estimates)
    (out / "summary.json").write_text(json.dumps(facts, indent=2))
    if comparison.num_rows:
        plot(comparison, facts, out / PLOT_FILE)
    print_summary(facts, out)
    return DemoOutcome(summary, comparison, facts)


class _External:
    """Stands in for LocalBroker when the user points the demo at a running broker."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap

    def __enter__(self) -> _External:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
