"""``esa demo``: embedded broker + synthetic telemetry + the three jobs (encode, shuffle, analyze) + a report.

Writes to the output directory the analyst's outputs (``estimates/``, a Parquet dataset of one part per
release, and ``dead_letters/``, reasons only), ``truth.parquet`` (the simulated ground truth),
``summary.json`` and the kind's plot (``grid_reconstruction.png`` for a grid, else ``estimates_vs_truth.png``);
each job's state goes to ``OUT.state/<stage>`` and the keys to ``OUT.keys``, beside it.
"""

from __future__ import annotations

import json
import logging
import math
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
from pipelines.demo.checks import kind_checks
from pipelines.demo.plots import plot, plot_file_name
from pipelines.demo.population import synthesize, truth_table
from pipelines.demo.simulate import produce_population
from pipelines.demo.value_laws import l2_shrink
from pipelines.demo.via_edge import produce_through_edge
from pipelines.end_to_end import ChainSummary, run
from pipelines.enrolment import enrol_simulated
from pipelines.examples import EXAMPLES_DIR
from pipelines.exit_codes import ConfigError
from pipelines.job_config import JobConfig, default_keys_dir, default_state_dir
from pipelines.paths import OutputLocation, output_location
from pipelines.preflight import existing_topics
from transforms.io.kafka.config import DEFAULT_CLIENT
from transforms.mechanisms.base import Mechanism
from transforms.spec import AnalysisSpec, SpecError, load_spec
from transforms.state.estimates_store import read_estimates
from transforms.state.layout import StateDir

LOG = logging.getLogger(__name__)
# The example spec each ``esa demo --kind`` runs by default (``--spec`` runs any other); shipped in the wheel.
DEMO_SPECS: dict[str, Path] = {kind: EXAMPLES_DIR / name for kind, name in {
    "histogram": "app_language.toml", "grid": "grid.toml", "kv_mean": "feature_usage.toml",
    "vector_mean": "sensor_vector.toml", "range": "latency_range.toml", "quantile": "latency_quantiles.toml",
    "heavy_hitters": "url_heavy_hitters.toml"}.items()}
NO_LOCAL_GUARANTEE = "no local guarantee: multi-message protocol, central only"
# Heavy hitters are reported by rank: their estimates meet the truth by item name (the hash), not by index.
# Range trees by node name ("level/index"): a structure may store only some nodes ([MultiMsg]'s left children).
JOIN_ON: dict[str, str] = {"heavy_hitters": "item", "range": "item", "quantile": "item"}


@dataclass(frozen=True)
class DemoOutcome:
    """What a demo run produced and how good it was."""

    summary: ChainSummary
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


def compare(estimates: pa.Table, truth: pa.Table, on: str = "item_index") -> pa.Table:
    """Join estimates with the truth on (window, crowd, ``on``); errors and z-scores use the raw (unbiased)
    estimate, which is what the stderr describes.

    ``on="item_index"``: one row per true item the analyzer estimated. ``on="item"``: one row per REPORTED
    item (heavy hitters; tree nodes, of which a structure may store a subset), with truth 0 for an item no
    client holds. True counts marked ``scales_with_n``
    (range trees) are rescaled to the clients the shuffler released: it deletes uniformly random clients.
    """
    est = {}
    for row in estimates.select(["window_start", "crowd_id", "item", "item_index", "estimate", "raw_estimate",
                                 "stderr", "n_clients"]).to_pylist():
        est[(row["window_start"], row["crowd_id"], row[on])] = row
    extra = [c for c in ("population", "scales_with_n") if c in truth.column_names]
    truth_rows = truth.select(["window_start", "crowd_id", "item", "item_index", "truth", *extra]).to_pylist()
    pairs = []
    if on == "item":
        known = {(t["window_start"], t["crowd_id"], t["item"]): t for t in truth_rows}
        crowds = {(t["window_start"], t["crowd_id"]) for t in truth_rows}
        for key, e in est.items():
            if key[:2] in crowds:
                pairs.append(({"truth": 0.0, **known.get(key, {}), "item": e["item"], "item_index": e["item_index"]},
                              e))
    else:
        for t in truth_rows:
            e = est.get((t["window_start"], t["crowd_id"], t["item_index"]))
            if e is not None:  # else a window or crowd the shuffler withheld: nothing to compare
                pairs.append((t, e))
    names = ("window_start", "crowd_id", "item", "item_index", "truth", "estimate", "raw_estimate", "stderr")
    rows: dict[str, list] = {k: [] for k in names}
    for t, e in pairs:
        if t.get("scales_with_n"):
            t = {**t, "truth": t["truth"] * e["n_clients"] / t["population"]}
        for key in names:
            rows[key].append(t[key] if key in t else e[key])
    table = pa.table(rows)
    error = np.asarray(table["raw_estimate"], dtype=float) - np.asarray(table["truth"], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(error) / np.asarray(table["stderr"], dtype=float)
    return table.append_column("error", pa.array(error)).append_column("abs_error_over_stderr", pa.array(z))


def summarize(spec: AnalysisSpec, summary: ChainSummary, comparison: pa.Table, estimates: pa.Table,
              kind_facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Generic facts (per-item z-statistics, RMSE, ledger, accounting), overridden by the kind's own checks
    (``pipelines.demo.checks``: e.g. random ranges instead of 131k tree nodes)."""
    z = np.asarray(comparison["abs_error_over_stderr"], dtype=float)
    z = z[np.isfinite(z)]
    ledger = ["window_start", "crowd_id", "n_clients", "n_reports", "eps_local", "eps_central"]
    crowds = ({(r["window_start"], r["crowd_id"]): r for r in estimates.select(ledger).to_pylist()}
              if estimates.num_rows else {})
    n_clients = sum(r["n_clients"] for r in crowds.values())
    n_reports = sum(r["n_reports"] for r in crowds.values())
    truth = np.asarray(comparison["truth"], dtype=float)
    first = next(iter(crowds.values()), {})
    facts = {
        "spec_id": spec.spec_id,
        "kind": spec.kind,
        "mechanism": spec.mechanism,
        "items": int(comparison.num_rows),
        "crowds": len(crowds),
        "max_abs_error_over_stderr": float(z.max()) if z.size else float("nan"),
        "fraction_within_3_stderr": float(np.mean(z <= 3)) if z.size else float("nan"),
        "rmse_raw": _rmse(np.asarray(comparison["raw_estimate"], dtype=float), truth),
        "rmse": _rmse(np.asarray(comparison["estimate"], dtype=float), truth),
        "postprocess": spec.postprocess,
        "eps_local": first.get("eps_local", spec.epsilon),
        "epsilon_spec": spec.epsilon,
        "epsilon_role": "central target" if epsilon_is_central_target(spec.randomizer) else "local",
        "eps_central": max((r["eps_central"] for r in crowds.values()), default=float("nan")),
        "eps_central_cumulative": max((r["eps_central_cumulative"] for r in estimates.select(
            ["eps_central_cumulative"]).to_pylist() if r["eps_central_cumulative"] is not None), default=float("nan"))
        if estimates.num_rows and "eps_central_cumulative" in estimates.column_names else float("nan"),
        "delta": spec.delta,
        "n_reports": int(n_reports),
        "n_clients": int(n_clients),
        "messages_per_client": round(n_reports / n_clients, 3) if n_clients else float("nan"),
        "deleted": summary.count("sets_deleted"),
        "accounting": summary.accounting,
        "accounting_balanced": summary.balanced,
        "pipeline_seconds": round(summary.seconds, 2),
    }
    return {**facts, **(kind_facts or {})}


def accounting_line(parts: dict[str, int]) -> str:
    """``read N = a + b + ...`` of one stage, naming only the non-zero terms."""
    terms = " + ".join(f"{k.replace('_', '-')} {v:,}" for k, v in parts.items() if k != "read" and v)
    return f"read {parts.get('read', 0):,} = {terms or '0'}"


def epsilon_is_central_target(mechanism: Mechanism) -> bool:
    """True when ``[mechanism] epsilon`` is a central (shuffled) target the mechanism calibrates its noise to
    ([VecSum]'s vector summation; [MultiMsg]'s multi-message protocols, which have no local guarantee at all),
    False when it is the local epsilon of each report."""
    return not math.isfinite(float(mechanism.epsilon_local)) or mechanism.calibrated_to_central


def ledger_lines(facts: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's privacy lines: what ``[mechanism] epsilon`` meant (local, or a central target) and the
    local guarantee that results (none for a multi-message protocol)."""
    per_client = f"{facts['mechanism']}, {facts['messages_per_client']} messages/client"
    eps_local = float(facts["eps_local"])
    if facts.get("epsilon_role") != "central target":
        return [("eps_local", f"{eps_local:g} ({per_client})")]
    lines = [("target eps_central (spec epsilon)", f"{facts['epsilon_spec']:g}")]
    if math.isfinite(eps_local):
        lines.append(("eps_local (implied by the target)", f"{eps_local:.4g} ({per_client})"))
    else:
        lines.append(("eps_local", f"inf: {NO_LOCAL_GUARANTEE} ({per_client})"))
    return lines


def _rmse(estimate: np.ndarray, truth: np.ndarray) -> float:
    ok = np.isfinite(estimate)
    return float(np.sqrt(np.mean((estimate[ok] - truth[ok]) ** 2))) if ok.any() else float("nan")


def print_summary(facts: dict[str, Any], out: Path, plot_file: str) -> None:
    balance = "balanced" if facts["accounting_balanced"] else "NOT BALANCED"
    processed = f"  (after {facts['postprocess']}: {facts['rmse']:.3g})" if facts["postprocess"] != "none" else ""
    if facts["kind"] in ("range", "quantile"):
        processed = f"  (consistent tree: {facts['rmse']:.3g})"
    basis = facts.get("z_basis", "items")
    lines = [
        f"esa demo — {facts['spec_id']} ({facts['kind']}, {facts['crowds']} crowd(s))",
        ("items", facts["items"]),
        (f"max |error| / stderr ({basis})", f"{facts['max_abs_error_over_stderr']:.2f}"),
        (f"{basis} within 3 stderr", f"{100 * facts['fraction_within_3_stderr']:.1f}%" + (
            f" of {facts['random_ranges']:,}" if "random_ranges" in facts else "")),
        (f"RMSE ({facts.get('rmse_label', 'raw')}, unbiased)", f"{facts['rmse_raw']:.3g}{processed}"),
        *[tuple(line) for line in facts.get("details", ())],
        *ledger_lines(facts),
        ("eps_central (shuffled)", f"{facts['eps_central']:.5f}"),
        ("delta", f"{facts['delta']:g}"),
        ("clients analyzed", f"{facts['n_clients']:,} ({facts['n_reports']:,} messages)"),
        ("eps_central over all windows so far", f"{facts.get('eps_central_cumulative', float('nan')):.5f} "
                                                "(odometer, incl. the crowd count)"),
        ("deleted by crowd threshold", f"{facts['deleted']:,} devices"),
        *[(f"records, {stage}", accounting_line(parts)) for stage, parts in facts["accounting"].items()],
        ("accounting", balance),
        ("pipeline time", f"{facts['pipeline_seconds']} s"),
        ("outputs", f"{out}/estimates/ (Parquet dataset), truth.parquet, {plot_file}; raw dead letters stay in "
                    f"{out}.state/encode and {out}.state/shuffle (keys in {out}.keys)"),
    ]
    print("\n" + "\n".join(x if isinstance(x, str) else f"  {x[0]:<40}{x[1]}" for x in lines) + "\n")


def refuse_used_out(out: Path) -> None:
    """A ConfigError (exit 3, before anything is produced) if ``out`` holds an earlier run's outputs or sealed
    windows.

    Why refuse: that run's windows are sealed in ``OUT.state``, so this run's reports for the same windows
    would all be dead-lettered as late while the summary compared the old estimates with the new truth; and
    a summary of ``OUT/estimates`` would mix the two runs' specs. Nothing is deleted for the user. A run that
    was interrupted before any window was sealed (Ctrl-C during the encoder, say) leaves only resume offsets
    of its own topics, which no later demo reads (each run makes new ones): its ``--out`` is used again."""
    state = default_state_dir(out)
    sealed = [p for stage in sorted(state.glob("*")) for p in (StateDir(stage).ledger, StateDir(stage).releases)]
    used = [p for p in (out / "estimates", out / "summary.json", *sealed) if p.exists() and (
        not p.is_dir() or any(p.iterdir()))]
    if used:
        raise ConfigError(f"--out {out} already holds an earlier run's outputs ({', '.join(str(p) for p in used)}): "
                          f"its windows are sealed there, so this run's reports would be refused as late. Give "
                          f"another --out, or delete the old run first: rm -rf {out} {state}")


def run_demo(*, clients: int, mechanism: str | None, epsilon: float | None, out: str | Path | OutputLocation,
             spec_path: Path | None = None, kind: str = "histogram", distribution: str = "zipf",
             zipf_s: float = 1.1, bad_per_kind: int = 3, seed: int | None = None,
             bootstrap: str | None = None, kafka_client: str = DEFAULT_CLIENT,
             kafka_config: dict[str, Any] | None = None, direct: bool = False) -> DemoOutcome:
    """Run the whole demo of one kind (``DEMO_SPECS``); uses an embedded broker unless ``bootstrap`` names one.
    ``kafka_client`` and ``kafka_config`` (TLS/SASL settings, already checked) serve every Kafka client of the
    demo: the simulator's producers, the edge's and the three jobs'.

    By default the simulated devices encode and seal their reports themselves and post them to an ``esa edge``
    over loopback HTTP (``pipelines.demo.via_edge``), the production path. ``direct``: the older shortcut, raw
    events produced straight to Kafka and randomized and sealed by the encoder job."""
    kafka_config = dict(kafka_config or {})
    if kind not in DEMO_SPECS:
        raise ValueError(f"demo kind must be one of {', '.join(DEMO_SPECS)} (got {kind!r})")
    spec = load_spec(spec_path or DEMO_SPECS[kind])
    try:
        spec = spec.with_mechanism(mechanism, epsilon)
    except SpecError as err:  # a bad --mechanism/--epsilon flag, not a bad file
        raise ValueError(str(err)) from None
    location = output_location(out)
    if location.is_url:
        raise ConfigError(f"esa demo writes its outputs and plot locally; give a local --out directory, not {out} "
                          "(the jobs too write to a local or mounted directory; esa query reads URLs)")
    out = location.prepare().local
    assert out is not None
    refuse_used_out(out)
    shrink = l2_shrink(spec)
    if shrink is not None:
        print(f"note: {spec.mechanism} clips vectors to L2 norm <= {spec.randomizer.clip:g}; the demo draws its "
              f"vectors inside that ball (shrunk by {shrink[1]:.3g} toward the value range's point nearest 0), "
              "so none is clipped", file=sys.stderr)
    run_id = secrets.token_hex(4)
    raw_topic, reports_topic = f"telemetry-{run_id}", f"reports-{run_id}"
    population = synthesize(spec, clients, distribution=distribution, zipf_s=zipf_s, seed=seed)
    if bootstrap is not None:  # the broker answers, or one line and exit 4 before keys or topics are made
        existing_topics(bootstrap, client=kafka_client, kafka_config=kafka_config)
    with LocalBroker() if bootstrap is None else _External(bootstrap) as broker:
        how = "producing their raw events to Kafka" if direct else "reporting through the edge over HTTP"
        print(f"broker on {broker.bootstrap}; {clients:,} clients of {spec.spec_id} {how}", file=sys.stderr)
        t0 = time.perf_counter()
        enrol_simulated(default_keys_dir(out), population.client_ids.tolist())
        if direct:
            produced = produce_population(broker.bootstrap, spec, population, raw_topic=raw_topic,
                                          reports_topic=reports_topic, bad_per_kind=bad_per_kind, seed=seed,
                                          progress=progress_printer("produced"), client=kafka_client,
                                          client_config=kafka_config)
        else:
            produced = produce_through_edge(broker.bootstrap, spec, population, default_keys_dir(out),
                                            default_state_dir(out) / "edge" / run_id, raw_topic=raw_topic,
                                            reports_topic=reports_topic, bad_per_kind=bad_per_kind, seed=seed,
                                            progress=progress_printer("reports accepted by the edge"),
                                            client=kafka_client, client_config=kafka_config)
        print(f"  produced in {time.perf_counter() - t0:.1f} s; running encode ▸ shuffle ▸ analyze",
              file=sys.stderr, flush=True)
        # A demo is a backfill of past windows: drain releases every window at the end of the run.
        config = JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=out, raw_topic=raw_topic,
                           reports_topic=reports_topic, shuffled_topic=f"shuffled-{run_id}",
                           group_id=f"esa-demo-{run_id}", seed=seed, drain=True, kafka_client=kafka_client,
                           kafka_config=kafka_config)
        with heartbeat("pipeline running"):
            summary = run(config)
    estimates = read_estimates(out)
    truth = truth_table(spec, population)
    pq.write_table(truth, out / "truth.parquet")
    comparison = compare(estimates, truth, on=JOIN_ON.get(spec.kind, "item_index"))
    kind_facts, evidence = kind_checks(spec, estimates, comparison, truth, seed)
    facts = summarize(spec, summary, comparison, estimates, kind_facts)
    facts["produced"] = {"path": "direct" if direct else "edge",
                         **{k.replace(run_id, "RUN"): v for k, v in produced.items()}}
    (out / "summary.json").write_text(json.dumps(facts, indent=2))
    plot_file = plot_file_name(spec)
    if comparison.num_rows:
        plot(spec, comparison, facts, out / plot_file, evidence)
    print_summary(facts, out, plot_file)
    return DemoOutcome(summary, comparison, facts)


class _External:
    """Stands in for LocalBroker when the user points the demo at a running broker."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap

    def __enter__(self) -> _External:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
