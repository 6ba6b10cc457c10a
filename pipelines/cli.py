"""The ``esa`` command: broker, simulate, run, demo, query, privacy, plan."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

LOG = logging.getLogger("esa")
# Kept literal so that `esa privacy` does not pay for importing Beam, pyarrow or the mechanisms.
DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "examples" / "app_language.toml"
BEAM_JOBS = {
    "run": "the whole chain in one pipeline: raw (and reports) topic -> estimates",
    "encode": "encode job: raw topic -> reports topic",
    "shuffle": "shuffle job: reports topic -> shuffled topic",
    "analyze": "analyze job: shuffled topic -> estimates",
}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    from transforms.privacy.report import ALL_PRIVACY_MECHANISMS

    parser = argparse.ArgumentParser(prog="esa", description="Privacy-preserving telemetry: Encode, Shuffle, "
                                     "Analyze on Apache Beam.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="command", required=True)

    broker = sub.add_parser("broker", help="run a local Kafka-compatible broker (tansu) on loopback")
    broker.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    broker.add_argument("--durable", type=Path, default=None, metavar="DIR",
                        help="keep topics, records and committed offsets in DIR across restarts (default: memory)")

    sim = sub.add_parser("simulate", help="produce synthetic telemetry with a known truth to Kafka")
    sim.add_argument("--bootstrap", required=True, help="Kafka bootstrap host:port")
    sim.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    sim.add_argument("--clients", type=_positive_int, default=50_000)
    sim.add_argument("--distribution", default="zipf", help="zipf or uniform")
    sim.add_argument("--zipf-s", type=_positive_float, default=1.1)
    sim.add_argument("--windows", type=_positive_int, default=1)
    sim.add_argument("--raw-topic", default="telemetry")
    sim.add_argument("--reports-topic", default="reports")
    sim.add_argument("--bad-per-kind", type=int, default=0, help="also produce N bad records of each kind")
    sim.add_argument("--truth", type=Path, default=None, help="write the true histogram here (Parquet)")
    sim.add_argument("--seed", type=int, default=None, help="seed (simulations only; default OS entropy)")

    for name, what in BEAM_JOBS.items():
        sub.add_parser(name, help=f"{what} (Beam-style flags: --spec F --kafka_bootstrap H:P --output_dir D ...)",
                       add_help=False)

    demo = sub.add_parser("demo", help="embedded broker + simulation + pipeline + summary + plot")
    demo.add_argument("--clients", type=_positive_int, default=50_000)
    demo.add_argument("--kind", default="histogram",
                      help="which demo: histogram (app languages), grid (locations, attribute fragmenting), "
                           "kv_mean, vector_mean, range, quantile, heavy_hitters")
    demo.add_argument("--mechanism", default=None, help="override the spec's mechanism (e.g. grr, oue, olh, rappor)")
    demo.add_argument("--epsilon", type=_positive_float, default=None, help="override the spec's local epsilon")
    demo.add_argument("--out", type=Path, default=Path("out/demo"))
    demo.add_argument("--spec", type=Path, default=None, help="run this spec instead of the kind's example")
    demo.add_argument("--distribution", default="zipf", help="zipf or uniform")
    demo.add_argument("--zipf-s", type=_positive_float, default=1.1)
    demo.add_argument("--bad-per-kind", type=int, default=3,
                      help="bad records of each kind to inject (shows the dead-letter path)")
    demo.add_argument("--bootstrap", default=None, help="use this broker instead of an embedded one")
    demo.add_argument("--seed", type=int, default=None, help="seed (simulations only; default OS entropy)")

    query = sub.add_parser("query", help="answer value ranges and quantiles from stored range/quantile estimates")
    query.add_argument("--estimates", type=Path, required=True, help="output directory holding estimates.parquet")
    query.add_argument("--range", nargs=2, type=float, action="append", dest="ranges", metavar=("LO", "HI"),
                       help="clients with a value in [LO, HI) (value units; repeatable)")
    query.add_argument("--quantile", type=float, action="append", dest="quantiles", metavar="Q",
                       help="the Q-quantile, 0 < Q <= 1 (repeatable)")
    query.add_argument("--spec-id", default=None, help="only this analysis (spec_id)")
    query.add_argument("--window", default=None, help="only this window (start, epoch ms or ISO 8601)")
    query.add_argument("--crowd", default=None, help="only this crowd id")
    query.add_argument("--confidence", type=float, default=0.95, help="of the quantile intervals (default 0.95)")
    query.add_argument("--json", action="store_true", help="machine-readable output")

    priv = sub.add_parser("privacy", help="central epsilon of shuffled reports (tight bound + closed forms)")
    priv.add_argument("--mechanism", choices=ALL_PRIVACY_MECHANISMS, required=True)
    priv.add_argument("--domain", type=_positive_int, required=True)
    priv.add_argument("--epsilon", type=_positive_float, required=True,
                      help="local epsilon (rappor: removal budget; rappor_fragments: backstop budget)")
    priv.add_argument("--n", type=_positive_int, required=True, help="number of shuffled reports")
    priv.add_argument("--delta", type=_positive_float, required=True)
    priv.add_argument("--fragments", type=_positive_int, default=None, help="rappor_fragments (required): tau")
    priv.add_argument("--epsilon-fragment", type=_positive_float, default=None,
                      help="rappor_fragments: fragment epsilon (default: MECHANISMS.md §7.1 rule)")
    priv.add_argument("--json", action="store_true", help="machine-readable output")
    _add_plan_parser(sub)
    return parser


def _simulate(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from pipelines.demo import progress_printer
    from pipelines.population import synthesize, truth_table
    from pipelines.simulate import produce_population
    from transforms.spec import load_spec

    spec = load_spec(args.spec)
    population = synthesize(spec, args.clients, distribution=args.distribution, zipf_s=args.zipf_s,
                            windows=args.windows, seed=args.seed)
    produced = produce_population(args.bootstrap, spec, population, raw_topic=args.raw_topic,
                                  reports_topic=args.reports_topic, bad_per_kind=args.bad_per_kind,
                                  seed=args.seed, progress=progress_printer("produced"))
    if args.truth:
        pq.write_table(truth_table(spec, population), args.truth)
    print(json.dumps({"spec_id": spec.spec_id, "produced": produced}))
    return 0


def _run_job(command: str, argv: Sequence[str]) -> int:
    import importlib

    module = importlib.import_module("pipelines.end_to_end" if command == "run" else f"pipelines.{command}")
    summary = module.run_from_argv(argv)
    print(json.dumps({"stage": summary.stage, "accounting": summary.accounting, "balanced": summary.balanced,
                      "estimates": str(summary.estimates_path), "dead_letters": str(summary.dead_letters_path)}))
    return 0 if summary.balanced else 3


def _privacy(args: argparse.Namespace) -> int:
    from transforms.privacy.report import build_privacy_report, format_privacy_report

    report = build_privacy_report(args.mechanism, args.domain, args.epsilon, args.n, args.delta,
                                  fragments=args.fragments, epsilon_fragment=args.epsilon_fragment)
    print(json.dumps(report, indent=2) if args.json else format_privacy_report(report))
    return 0


def _add_plan_parser(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser("plan", help="local parameters meeting a central (eps_c, delta) target (tight bound)")
    plan.add_argument("--kind", choices=("kv_mean", "vector_mean"), required=True)
    plan.add_argument("--mechanism", default=None, help="kv_mean: collision, coco, pckv-ue, pckv-grr or privkv")
    plan.add_argument("--d", type=_positive_int, required=True, help="keys (kv_mean) or coordinates (vector_mean)")
    plan.add_argument("--s", type=_positive_int, default=None, help="kv_mean: non-zero keys per user")
    plan.add_argument("--n", type=_positive_int, required=True, help="number of users")
    plan.add_argument("--epsilon-central", type=_positive_float, required=True)
    plan.add_argument("--delta", type=_positive_float, required=True)
    plan.add_argument("--t", type=_positive_int, default=None,
                      help="kv_mean: fix the output size of collision/coco; vector_mean: coordinates per user")
    plan.add_argument("--t-rule", default=None, help="kv_mean: joint (default), min-variance or paper")
    plan.add_argument("--k-round", type=_positive_int, default=None, help="vector_mean: precision (default: rule)")
    plan.add_argument("--accountant", default=None, help="vector_mean: 002 (the paper's rules, default) or tight")
    plan.add_argument("--json", action="store_true", help="machine-readable output")


def _plan(args: argparse.Namespace) -> int:
    from transforms.privacy.planner import format_kv_plan, format_vector_plan, plan_kv_mean, plan_vector_mean

    if args.kind == "kv_mean":
        if args.mechanism is None or args.s is None:
            raise ValueError("--kind kv_mean needs --mechanism and --s")
        if args.k_round is not None or args.accountant is not None:
            raise ValueError("--k-round and --accountant apply to --kind vector_mean only")
        plan = plan_kv_mean(args.mechanism, args.d, args.s, args.n, args.epsilon_central, args.delta, t=args.t,
                            t_rule=args.t_rule or "joint")
        text = format_kv_plan(plan)
    else:
        if args.mechanism is not None or args.s is not None or args.t_rule is not None:
            raise ValueError("--kind vector_mean takes no --mechanism, --s or --t-rule (it plans 002's mechanism)")
        plan = plan_vector_mean(args.d, args.n, args.epsilon_central, args.delta, k_round=args.k_round,
                                t=1 if args.t is None else args.t, accountant=args.accountant or "002")
        text = format_vector_plan(plan)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in BEAM_JOBS:  # Beam owns the flags of the pipeline jobs
        args = argparse.Namespace(command=argv[0], verbose="-v" in argv)
    else:
        args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("apache_beam", "kafka", "root"):
        logging.getLogger(noisy).setLevel(logging.WARNING if not args.verbose else logging.INFO)
    try:
        if args.command == "broker":
            from pipelines.broker import run_broker_forever

            return run_broker_forever(args.port, args.durable)
        if args.command == "simulate":
            return _simulate(args)
        if args.command in BEAM_JOBS:
            return _run_job(args.command, [a for a in argv[1:] if a != "-v"])
        if args.command == "privacy":
            return _privacy(args)
        if args.command == "plan":
            return _plan(args)
        if args.command == "query":
            from pipelines.query import query_command

            return query_command(args)
        from pipelines.demo import run_demo

        run_demo(clients=args.clients, mechanism=args.mechanism, epsilon=args.epsilon, out=args.out,
                 spec_path=args.spec, kind=args.kind, distribution=args.distribution, zipf_s=args.zipf_s,
                 bad_per_kind=args.bad_per_kind, seed=args.seed, bootstrap=args.bootstrap)
        return 0
    except ValueError as err:  # includes SpecError: bad spec fields, bad parameters
        print(f"esa {args.command}: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        if type(err).__module__.startswith("kafka"):  # not importing kafka here keeps `esa privacy` fast
            print(f"esa {args.command}: cannot talk to Kafka: {err}", file=sys.stderr)
            return 3
        raise


if __name__ == "__main__":
    sys.exit(main())
