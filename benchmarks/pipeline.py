"""End-to-end throughput: Kafka raw topic -> encode -> shuffle -> analyze -> Parquet, on the FnApiRunner.

Prints records/s for producing and for the pipeline (median of --repeats runs), per mechanism, and the
error figures of each run. The FnApiRunner here runs one SDK worker, so "per core" is the figure itself.

    python benchmarks/pipeline.py --clients 50000 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipelines.broker import LocalBroker
from pipelines.end_to_end import run
from pipelines.job import JobConfig
from pipelines.population import synthesize, truth_table
from pipelines.simulate import produce_population
from transforms.spec import DEFAULT_SPEC, load_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mechanisms", nargs="+", default=["grr", "oue", "olh"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"{'mechanism':<10}{'produce rec/s':>15}{'pipeline rec/s':>16}{'pipeline s':>12}{'max|z|':>8}"
          f"{'within 3se':>12}")
    with LocalBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        for mechanism in args.mechanisms:
            spec = load_spec(DEFAULT_SPEC).with_mechanism(mechanism, 2.0)
            produce_rates, run_rates, seconds, zs = [], [], [], []
            for r in range(args.repeats):
                population = synthesize(spec, args.clients, seed=r)
                topics = {"raw_topic": f"raw-{mechanism}-{r}", "reports_topic": f"rep-{mechanism}-{r}"}
                t0 = time.perf_counter()
                produce_population(broker.bootstrap, spec, population, **topics)
                produce_rates.append(args.clients / (time.perf_counter() - t0))
                out = Path(tmp) / f"{mechanism}-{r}"
                summary = run(JobConfig(bootstrap=broker.bootstrap, specs=(spec,), out_dir=out,
                                             group_id=f"bench-{mechanism}-{r}", **topics))
                run_rates.append(args.clients / summary.seconds)
                seconds.append(summary.seconds)
                est = pq.read_table(summary.estimates_path).sort_by("item_index")
                truth = np.asarray(truth_table(spec, population)["frequency"])
                zs.append(np.abs(np.asarray(est["estimate"]) - truth) / np.asarray(est["stderr"]))
            z = np.concatenate(zs)
            print(f"{mechanism:<10}{statistics.median(produce_rates):>15,.0f}{statistics.median(run_rates):>16,.0f}"
                  f"{statistics.median(seconds):>12.1f}{z.max():>8.2f}{np.mean(z <= 3):>12.1%}")


if __name__ == "__main__":
    main()
