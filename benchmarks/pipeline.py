"""End-to-end throughput and memory of the three jobs, trust on, against the raw rate of the Kafka client.

For each mechanism and population size n: the three jobs (encode -> shuffle -> analyze) run one after the other,
each in a fresh process as in production (``benchmarks/stage_process.py``), with signing, sealing, verification
and the ledgers on, every job on the Kafka client of --kafka_client. Printed per job: Kafka records/s and
messages (reports)/s over the job's whole run (planning, Beam start-up and commit included), peak RSS of its
process, the job's rate over the raw consume rate of the client it used, its CPU seconds per unit (a message set
for encode and shuffle, a message for analyze; the job process's threads and any workers it reaped), and the
share of that CPU its unavoidable cryptography takes (``benchmarks/crypto_ceiling.py``, the envelope included:
``floor / CPU``, stable under load where wall rates are not); then the chain (n over the sum of the three wall
times) and the error figures against the known truth (max |z| and the share of items within 3 standard errors).
A second table gives, per job, the raw rates of BOTH Kafka clients measured in the same run: each reads the
job's own input topic (planning included, as the job pays it), then each produces the same records into a
scratch topic of 3 partitions, like the input topics (as ``benchmarks/kafka_clients.py`` does: acks=all, the
project's producer settings). Medians over --repeats.

    python benchmarks/pipeline.py --clients 10000 100000 --mechanisms olh rappor --repeats 3
    python benchmarks/pipeline.py --clients 100000 --kafka_client kafka-python
    py-spy record --subprocesses --format raw -o prof.txt -- python benchmarks/pipeline.py --clients 100000
    python benchmarks/profile_summary.py prof.txt
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from benchmarks.crypto_ceiling import floor_seconds
from benchmarks.kafka_clients import produce_rate
from benchmarks.stage_process import run_stage
from pipelines.broker import LocalBroker
from pipelines.demo.population import synthesize, truth_table
from pipelines.demo.simulate import produce_population
from pipelines.enrolment import enrol_simulated
from pipelines.examples import example_path
from pipelines.job_config import JobConfig, default_keys_dir
from transforms.io.kafka.bounded import ensure_topics, read_topic
from transforms.io.kafka.config import CLIENTS, CONFLUENT, DEFAULT_CLIENT, KAFKA_PYTHON
from transforms.runtime.parallel import thread_count
from transforms.spec import AnalysisSpec, load_spec
from transforms.state.estimates_store import read_estimates

STAGES = ("encode", "shuffle", "analyze")
INPUT = {"encode": "raw_topic", "shuffle": "reports_topic", "analyze": "shuffled_topic"}
EPSILON = {"grr": 2.0, "olh": 2.0, "rappor": 4.0, "mm_hadamard": 1.0}


def bench_spec(mechanism: str) -> AnalysisSpec:
    """The app-language histogram (d = 64) with ``mechanism``; mm_hadamard as its example file calibrates it."""
    if mechanism == "mm_hadamard":
        return load_spec(example_path("app_language_multimessage.toml"))
    return load_spec(example_path("app_language.toml")).with_mechanism(mechanism, EPSILON[mechanism])


def raw_rates(bootstrap: str, topic: str, scratch: str) -> dict[str, float]:
    """Records/s of each client reading ``topic`` (``read_<client>``), then producing its records into a
    scratch topic ``<scratch>-<client>`` (``write_<client>``): the ceiling each client sets for the job."""
    rates: dict[str, float] = {}
    records: list[tuple[bytes | None, bytes]] = []
    for client in CLIENTS:
        started = time.perf_counter()
        read = read_topic(bootstrap, topic, client=client)
        rates[f"read_{client}"] = len(read) / (time.perf_counter() - started)
        records = records or [(r.key, r.value) for r in read]
        del read
    for client in CLIENTS:
        rates[f"write_{client}"] = produce_rate(bootstrap, f"{scratch}-{client}", records, client)
    return rates


def one_run(bootstrap: str, mechanism: str, n: int, tag: str, base: Path, beam_args: list[str],
            client: str = DEFAULT_CLIENT, raw: bool = True) -> dict[str, float]:
    spec = bench_spec(mechanism)
    window_ms = spec.window_seconds * 1000
    start = (int(time.time() * 1000) // window_ms - 3) * window_ms
    population = synthesize(spec, n, start_ms=start, seed=abs(hash(tag)) % 2**31)
    out = base / tag
    enrol_simulated(default_keys_dir(out), population.client_ids.tolist())
    topics = {"raw_topic": f"raw-{tag}", "reports_topic": f"rep-{tag}", "shuffled_topic": f"shuf-{tag}"}
    ensure_topics(bootstrap, [topics["reports_topic"], topics["shuffled_topic"]], partitions=3, client=client)
    produce_population(bootstrap, spec, population, raw_topic=topics["raw_topic"],
                       reports_topic=topics["reports_topic"], client=client)
    config = JobConfig(bootstrap=bootstrap, specs=(spec,), out_dir=out, group_id=f"bench-{tag}", drain=True,
                       kafka_client=client, **topics)
    row: dict[str, float] = {}
    for stage in STAGES:
        result = run_stage(stage, config, beam_args)
        rates = raw_rates(bootstrap, topics[INPUT[stage]], f"scratch-{stage}-{tag}") if raw else \
            {f"{way}_{c}": float("nan") for way in ("read", "write") for c in CLIENTS}
        units = result.messages if stage == "analyze" else result.records
        row |= {f"{stage}_rec": result.records_per_s, f"{stage}_msg": result.messages_per_s,
                f"{stage}_s": result.seconds, f"{stage}_rss": result.peak_rss_mb,
                f"{stage}_cpu_us": 1e6 * result.cpu_seconds / max(units, 1),
                f"{stage}_ratio": result.records_per_s / rates[f"read_{client}"]}
        row |= {f"{stage}_{name}": rate for name, rate in rates.items()}
    row["chain"] = n / sum(row[f"{s}_s"] for s in STAGES)
    per_set = row["encode_msg"] / row["encode_rec"] if row["encode_rec"] else 1.0
    floor = floor_seconds(per_set)
    for stage in STAGES:
        row[f"{stage}_floor_us"] = 1e6 * floor[stage]
        row[f"{stage}_of_floor"] = row[f"{stage}_floor_us"] / row[f"{stage}_cpu_us"]
        row[f"{stage}_ceiling"] = thread_count(0) / floor[stage]
    est = read_estimates(out).sort_by("item_index")
    truth = np.asarray(truth_table(spec, population)["frequency"])
    z = np.abs(np.asarray(est["raw_estimate"]) - truth * np.asarray(est["n_clients"]) / n) / np.asarray(est["stderr"])
    row["max_z"], row["within3"] = float(z.max()), float(np.mean(z <= 3))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mechanisms", nargs="+", default=["olh"], choices=sorted(EPSILON))
    parser.add_argument("--beam_args", default="", help="extra Beam/job flags for every job, e.g. "
                                                       "'--crypto_threads=1'")
    parser.add_argument("--kafka_client", default=DEFAULT_CLIENT, choices=list(CLIENTS),
                        help="the Kafka client of every job (both clients' raw rates are measured)")
    parser.add_argument("--no_raw_rates", action="store_true",
                        help="skip the raw Kafka client rates (wall time only: the jobs' CPU per unit is unchanged)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    beam_args = args.beam_args.split()
    print(f"jobs on {args.kafka_client}; ratio = job records/s over the raw read rate of {args.kafka_client}")
    print(f"{'mechanism':<12}{'n':>10}  {'job':<8}{'records/s':>10}{'msgs/s':>10}{'ratio':>7}"
          f"{'CPU us':>8}{'floor us':>9}{'of it':>7}{'peak MB':>9}{'wall s':>8}")
    medians: list[tuple[str, int, dict[str, float]]] = []
    with LocalBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        for mechanism in args.mechanisms:
            for n in args.clients:
                runs = [one_run(broker.bootstrap, mechanism, n, f"{mechanism}-{n}-{r}", Path(tmp), beam_args,
                                args.kafka_client, not args.no_raw_rates)
                        for r in range(args.repeats)]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                medians.append((mechanism, n, med))
                for stage in STAGES:
                    print(f"{mechanism:<12}{n:>10,}  {stage:<8}{med[f'{stage}_rec']:>10,.0f}"
                          f"{med[f'{stage}_msg']:>10,.0f}{med[f'{stage}_ratio']:>7.3f}"
                          f"{med[f'{stage}_cpu_us']:>8.0f}{med[f'{stage}_floor_us']:>9.0f}"
                          f"{med[f'{stage}_of_floor']:>7.2f}"
                          f"{med[f'{stage}_rss']:>9,.0f}{med[f'{stage}_s']:>8.1f}")
                print(f"{mechanism:<12}{n:>10,}  {'chain':<8}{med['chain']:>10,.0f} events/s   "
                      f"max|z| {max(r['max_z'] for r in runs):.2f}, within 3 se "
                      f"{min(r['within3'] for r in runs):.1%}")
    if not args.no_raw_rates:
        print_raw_table(medians)
        print_target_cores(medians, thread_count(0), args.kafka_client)


def print_target_cores(medians: list[tuple[str, int, dict[str, float]]], cores: int, client: str) -> None:
    """Cores the per-record cryptography alone needs at the issue's targets (each job at 0.5 of its client's raw
    read rate, ``esa run`` at 0.7 of the raw topic's): a lower bound, whatever the rest of the job costs.

    Crypto CPU seconds per record are ``cores / ceiling`` (``crypto_ceiling``); the analyzer's raw rate is in
    messages (its records are release batches), the chain's per event is the three jobs' per-event sum.
    """
    print(f"\ncores the per-record cryptography alone needs at the targets (this machine: {cores})")
    print(f"{'mechanism':<12}{'n':>10}  {'job':<8}{'target/s':>10}{'crypto us':>10}{'cores':>7}")
    for mechanism, n, med in medians:
        msgs_per_set = med["encode_msg"] / med["encode_rec"] if med["encode_rec"] else 1.0
        per_event = 0.0
        for stage in STAGES:
            seconds = cores / med[f"{stage}_ceiling"]
            raw = med[f"{stage}_read_{client}"]
            if stage == "analyze":  # release batches: the raw read in messages
                raw *= med["analyze_msg"] / max(med["analyze_rec"], 1e-9)
            per_event += seconds * (msgs_per_set if stage == "analyze" else 1.0)
            target = 0.5 * raw
            print(f"{mechanism:<12}{n:>10,}  {stage:<8}{target:>10,.0f}{seconds * 1e6:>10.1f}{target * seconds:>7.1f}")
        target = 0.7 * med[f"encode_read_{client}"]
        print(f"{mechanism:<12}{n:>10,}  {'run':<8}{target:>10,.0f}{per_event * 1e6:>10.1f}{target * per_event:>7.1f}")


def print_raw_table(medians: list[tuple[str, int, dict[str, float]]]) -> None:
    """Both clients' raw records/s per job, from the same runs: read = the job's input topic, write = its
    records produced into a scratch topic; the job's own records/s beside them."""
    names = {KAFKA_PYTHON: "kp", CONFLUENT: "ck"}
    columns = [f"{names[c]} {way}/s" for way in ("read", "write") for c in CLIENTS]
    print("\nraw Kafka client rates in the same runs (kp = kafka-python, ck = confluent-kafka; records/s)")
    print(f"{'mechanism':<12}{'n':>10}  {'job':<8}{'job rec/s':>10}" + "".join(f"{c:>12}" for c in columns))
    for mechanism, n, med in medians:
        for stage in STAGES:
            rates = [med[f"{stage}_{way}_{c}"] for way in ("read", "write") for c in CLIENTS]
            print(f"{mechanism:<12}{n:>10,}  {stage:<8}{med[f'{stage}_rec']:>10,.0f}"
                  + "".join(f"{r:>12,.0f}" for r in rates))

if __name__ == "__main__":
    main()
