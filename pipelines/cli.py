"""The ``esa`` command: broker, simulate, the jobs (run, encode, shuffle, analyze), demo, query, privacy, plan.

Flags are spelled with underscores (``--raw_topic``), as Beam's are; the hyphen spelling (``--raw-topic``)
is accepted everywhere. ``-v``/``--verbose`` may come before or after the subcommand. Exit codes:
``pipelines.exit_codes``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines.exit_codes import EsaError, ExitCode, JobUsageError, epilog
from pipelines.logs import FORMAT_ENV, LOG_FORMATS, log_format, setup_logging
from pipelines.out_of_space import out_of_space, out_of_space_advice
from transforms.io.kafka.config import CLIENTS, DEFAULT_CLIENT

LOG = logging.getLogger("esa")
# Kept literal (no pipelines.examples import chain) so that `esa privacy` does not pay for Beam or pyarrow.
DEFAULT_SPEC = Path(__file__).resolve().parent / "example_specs" / "app_language.toml"
# Literal for the same reason; tests check them against pipelines.demo (DISTRIBUTIONS, DEMO_SPECS).
DISTRIBUTIONS = ("zipf", "uniform")
DEMO_KINDS = ("histogram", "grid", "kv_mean", "vector_mean", "range", "quantile", "heavy_hitters")
BEAM_JOBS = {
    "run": "the three jobs (encode, shuffle, analyze) one after another: raw (and reports) topic -> estimates",
    "encode": "encode job: raw topic -> reports topic",
    "shuffle": "shuffle job: reports topic -> shuffled topic",
    "analyze": "analyze job: shuffled topic -> estimates",
}
# Outputs each job stage writes (RunSummary.stage -> files), so a job prints only what it wrote.
STAGE_OUTPUTS = {"end_to_end": ("estimates", "dead_letters"), "encode": ("dead_letters",),
                 "shuffle": ("dead_letters",), "analyze": ("estimates", "dead_letters")}
VERBOSE = ("-v", "--verbose")
LOG_FORMAT_FLAGS = ("--log_format", "--log-format")


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


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    from transforms.privacy.report import ALL_PRIVACY_MECHANISMS

    parser = argparse.ArgumentParser(prog="esa", description="Privacy-preserving telemetry: Encode, Shuffle, "
                                     "Analyze on Apache Beam.", epilog=epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details (before or after the "
                        "subcommand)")
    parser.add_argument("--log_format", choices=LOG_FORMATS, default=None,
                        help=f"text (default) or json: one JSON object per log line on stderr (before or after the "
                             f"subcommand; default ${FORMAT_ENV} or text)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    broker = sub.add_parser("broker", help="run a local Apache Kafka (KRaft, one node) on loopback until SIGTERM")
    broker.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    broker.add_argument("--data_dir", type=Path, default=None, metavar="DIR",
                        help="keep topics, records and committed offsets in DIR across restarts (default: a "
                             "temporary directory, removed on stop)")

    sim = sub.add_parser("simulate", help="produce synthetic telemetry with a known truth to Kafka")
    sim.add_argument("--bootstrap", required=True, help="Kafka bootstrap host:port")
    sim.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="analysis spec (default: app_language)")
    sim.add_argument("--clients", type=_positive_int, default=50_000,
                     help="simulated devices, one event each per window (default 50000)")
    sim.add_argument("--distribution", default="zipf", choices=DISTRIBUTIONS,
                     help="how the true values are drawn (default zipf)")
    sim.add_argument("--zipf_s", type=_positive_float, default=1.1, help="skew of the zipf law (default 1.1)")
    sim.add_argument("--windows", type=_positive_int, default=1, help="consecutive windows to fill (default 1)")
    sim.add_argument("--start_time", default=None,
                     help="start of the first window (epoch ms or ISO 8601; default: the last WINDOWS complete "
                          "windows before now); give it, with --seed, to reproduce a simulation")
    sim.add_argument("--raw_topic", default="telemetry", help="topic of the raw events (default telemetry)")
    sim.add_argument("--reports_topic", default="reports",
                     help="topic of signed message sets: --devices' and the bad reports (default reports)")
    sim.add_argument("--bad_per_kind", type=_non_negative_int, default=0,
                     help="also produce N bad records of each kind, which the jobs must dead-letter (default 0)")
    sim.add_argument("--truth", type=Path, default=None,
                     help="write the true value of every item, per window and crowd, here (Parquet)")
    sim.add_argument("--devices", type=Path, default=None,
                     help="simulate devices that encode themselves with the device client library, one state "
                          "directory each under this directory; their signed message sets go straight to the "
                          "reports topic (default: raw events, which `esa encode` encodes at the edge)")
    sim.add_argument("--device_budget", type=_positive_float, default=None,
                     help="with --devices: each device's privacy budget per day, across all specs (replacement "
                          "LDP epsilon); stored in each device's state, so a later run with another value is refused")
    sim.add_argument("--keys_dir", type=Path, default=Path("out.keys"),
                     help="enrol the simulated devices in this keys directory (the jobs' --keys_dir; default "
                          "out.keys, which is what `esa run --output_dir out` uses)")
    sim.add_argument("--seed", type=int, default=None, help="seed (simulations only; default OS entropy)")
    sim.add_argument("--kafka_client", default=DEFAULT_CLIENT, choices=list(CLIENTS),
                     help=f"Kafka client library that creates the topics and produces (default {DEFAULT_CLIENT}, "
                          "as the jobs): confluent (confluent-kafka/librdkafka) or kafka-python (pure Python)")
    sim.add_argument("--kafka_config", type=Path, default=None, metavar="FILE",
                     help="file of extra Kafka client settings, one key=value per line, for the admin client and "
                          "every producer (TLS/SASL: security_protocol, ssl_cafile, sasl_mechanism, ...), read and "
                          "checked as the jobs' --kafka_config; see docs/operations.md")

    for name, what in BEAM_JOBS.items():
        sub.add_parser(name, help=f"{what} (esa {name} --help lists its flags)", add_help=False)

    demo = sub.add_parser("demo", help="embedded broker + simulated devices + the three jobs + summary + plot")
    demo.add_argument("--clients", type=_positive_int, default=50_000, help="simulated devices (default 50000)")
    demo.add_argument("--kind", default="histogram", choices=DEMO_KINDS,
                      help="which example spec: histogram (app languages, the default), grid (locations, attribute "
                           "fragmenting), kv_mean, vector_mean, range, quantile, heavy_hitters")
    demo.add_argument("--mechanism", default=None, help="override the spec's mechanism (e.g. grr, oue, olh, rappor)")
    demo.add_argument("--epsilon", type=_positive_float, default=None,
                      help="override the spec's epsilon (local, or the central target of vector_sum and the "
                           "multi-message protocols)")
    demo.add_argument("--out", default="out/demo", help="local output directory (default out/demo)")
    demo.add_argument("--spec", type=Path, default=None, help="run this spec instead of the kind's example")
    demo.add_argument("--distribution", default="zipf", choices=DISTRIBUTIONS,
                      help="how the true values are drawn (default zipf)")
    demo.add_argument("--zipf_s", type=_positive_float, default=1.1, help="skew of the zipf law (default 1.1)")
    demo.add_argument("--bad_per_kind", type=_non_negative_int, default=3,
                      help="bad records of each kind to inject (shows the dead-letter path; default 3)")
    demo.add_argument("--bootstrap", default=None, help="use this broker instead of an embedded one")
    demo.add_argument("--seed", type=int, default=None, help="seed (simulations only; default OS entropy)")
    demo.add_argument("--kafka_client", default=DEFAULT_CLIENT, choices=list(CLIENTS),
                      help=f"Kafka client library of the simulator and the three jobs (default {DEFAULT_CLIENT})")
    demo.add_argument("--kafka_config", type=Path, default=None, metavar="FILE",
                      help="file of extra Kafka client settings (TLS/SASL), one key=value per line, for every "
                           "client of the demo, checked as the jobs' --kafka_config; with --bootstrap")

    query = sub.add_parser("query", help="answer ranges, quantiles, top items, items, sums and kv keys from stored "
                                         "estimates")
    query.add_argument("--estimates", required=True,
                       help="output directory (estimates/ dataset and/or estimates.parquet), the file, or a URL")
    query.add_argument("--range", nargs=2, type=float, action="append", dest="ranges", metavar=("LO", "HI"),
                       help="clients with a value in [LO, HI) (value units; repeatable)")
    query.add_argument("--quantile", type=float, action="append", dest="quantiles", metavar="Q",
                       help="the Q-quantile, 0 < Q <= 1 (repeatable)")
    query.add_argument("--top", type=_positive_int, default=None,
                       help="histogram/heavy hitters: the K largest items (default 10 if nothing else is asked); "
                            "kv_mean: the K keys of largest share")
    query.add_argument("--item", action="append", dest="items", metavar="NAME",
                       help="this item (histogram category, heavy-hitter hash or candidate string, kv_mean key; "
                            "repeatable)")
    query.add_argument("--sum", nargs="+", action="append", dest="sums", metavar="ITEM",
                       help="the sum of these items' frequencies with its stderr under the mechanism's covariance "
                            "(repeatable)")
    query.add_argument("--candidates", default=None, metavar="FILE",
                       help="heavy hitters: strings, one a line, hashed as the encoder does to label the stored hashes")
    query.add_argument("--spec_id", default=None, help="only this analysis (spec id, or spec name: every version)")
    query.add_argument("--window", default=None, help="only this window (start, epoch ms or ISO 8601)")
    query.add_argument("--crowd", default=None, help="only this crowd id")
    query.add_argument("--confidence", type=float, default=0.95, help="of the quantile intervals (default 0.95)")
    query.add_argument("--json", action="store_true", help="machine-readable output")

    report = sub.add_parser("report", help="one self-contained HTML page per spec of an output directory: estimates "
                                           "over windows, the last window, cumulative epsilon, record accounting")
    report.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="the jobs' or the demo's --output_dir")
    report.add_argument("--out", type=Path, default=None, help="directory of the pages (default OUTPUT_DIR/report)")
    report.add_argument("--top", type=_positive_int, default=8, help="items drawn over the windows (default 8)")

    priv = sub.add_parser("privacy", help="central epsilon of shuffled reports (tight bound + closed forms)")
    priv.add_argument("--mechanism", choices=ALL_PRIVACY_MECHANISMS, required=True,
                      help="the local randomizer (generic: any epsilon-LDP randomizer, the worst case)")
    priv.add_argument("--domain", type=_positive_int, required=True, help="number of categories")
    priv.add_argument("--epsilon", type=_positive_float, required=True,
                      help="local epsilon (rappor: removal budget; rappor_fragments: backstop budget)")
    priv.add_argument("--n", type=_positive_int, required=True, help="number of shuffled reports")
    priv.add_argument("--delta", type=_positive_float, required=True, help="central delta")
    priv.add_argument("--fragments", type=_positive_int, default=None, help="rappor_fragments (required): tau")
    priv.add_argument("--epsilon_fragment", type=_positive_float, default=None,
                      help="rappor_fragments: fragment epsilon (default: docs/mathematics.md §2.8 rule)")
    priv.add_argument("--windows", type=_positive_int, default=None,
                      help="compose W windows of the same population (delta is then the total delta)")
    priv.add_argument("--crowd_claim", default=None,
                      help="with --windows: none (default: replacement, the count is free), partition, membership "
                           "or partition+membership (the count is charged, sized for a year)")
    priv.add_argument("--window_seconds", type=_positive_int, default=None,
                      help="with --crowd_claim: the window size the count is designed for (default 86400)")
    priv.add_argument("--crowd_epsilon_year", type=_positive_float, default=None,
                      help="with --crowd_claim: [crowd] epsilon_year (default 1)")
    priv.add_argument("--crowd_delta_year", type=_positive_float, default=None,
                      help="with --crowd_claim: [crowd] delta_year (default 1e-6)")
    priv.add_argument("--json", action="store_true", help="machine-readable output")
    _add_plan_parser(sub)
    for subparser in sub.choices.values():
        _underscore_flags(subparser)
    return parser


def _underscore_flags(parser: argparse.ArgumentParser) -> None:
    """Spell every long flag with underscores (help and parsing); ``_canonical_argv`` maps hyphens to them."""
    for action in parser._actions:
        renamed = [("--" + s[2:].replace("-", "_")) if s.startswith("--") else s for s in action.option_strings]
        for old, new in zip(action.option_strings, renamed, strict=True):
            if old != new:
                parser._option_string_actions.pop(old, None)
                parser._option_string_actions[new] = action
        action.option_strings = renamed


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)
    return None


def _parse_native(argv: list[str]) -> argparse.Namespace:
    """Parse an esa-native subcommand; an unknown flag names the closest known one (exit 2)."""
    from pipelines.job_cli import canonical

    parser = _parser()
    sub = _subparser(parser, argv[0]) if argv else None
    if sub is not None:
        flags = set(sub._option_string_actions)
        argv = [argv[0], *(canonical(a, flags) for a in argv[1:])]
    args, extras = parser.parse_known_args(argv)
    if extras:
        flags = sorted(s for s in (sub._option_string_actions if sub else {}) if s.startswith("--"))
        flag = extras[0].split("=", 1)[0]
        close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6) if flag.startswith("-") else []
        what = "unknown flag" if flag.startswith("-") else "unexpected argument"
        (sub or parser).error(f"{what} {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    return args


def _simulate(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from pipelines.demo.population import synthesize, truth_table
    from pipelines.demo.run import progress_printer
    from pipelines.demo.simulate import produce_population
    from pipelines.options import load_kafka_config
    from pipelines.preflight import existing_topics
    from pipelines.query.readers import parse_time_ms
    from transforms.spec import load_spec

    kafka_config = load_kafka_config(args.kafka_config, args.kafka_client) if args.kafka_config else {}
    spec = load_spec(args.spec)
    # the broker answers, or one line and exit 4 before any key or topic is made
    existing_topics(args.bootstrap, client=args.kafka_client, kafka_config=kafka_config)
    start_ms = None if args.start_time is None else parse_time_ms(args.start_time, "--start_time")
    population = synthesize(spec, args.clients, distribution=args.distribution, zipf_s=args.zipf_s,
                            windows=args.windows, start_ms=start_ms, seed=args.seed)
    from pipelines.enrolment import enrol_simulated

    enrol_simulated(args.keys_dir, population.client_ids.tolist())
    if args.devices is not None:
        from pipelines.demo.device_fleet import FleetOutcome, device_messages
        from transforms.io.kafka.bounded import ensure_topics, produce_records

        outcome, show = FleetOutcome(), progress_printer("devices reported")
        ensure_topics(args.bootstrap, [args.raw_topic, args.reports_topic], partitions=3, client_config=kafka_config,
                      client=args.kafka_client)
        produce_records(args.bootstrap, args.reports_topic, device_messages(
            spec, population, args.devices, args.keys_dir, budget_epsilon=args.device_budget, seed=args.seed,
            outcome=outcome), progress=lambda done: show(done, len(population)), progress_every=1000,
            producer_config=kafka_config, client=args.kafka_client)
        produced = {args.reports_topic: outcome.sent, "refused_by_device_budget": outcome.refused}
    else:
        produced = produce_population(args.bootstrap, spec, population, raw_topic=args.raw_topic,
                                      reports_topic=args.reports_topic, bad_per_kind=args.bad_per_kind,
                                      seed=args.seed, progress=progress_printer("produced"),
                                      client=args.kafka_client, client_config=kafka_config)
    if args.truth:
        pq.write_table(truth_table(spec, population), args.truth)
    window_ms = population.window_ms
    first = int(population.event_times_ms.min()) // window_ms * window_ms
    _print(json.dumps({"spec_id": spec.spec_id, "produced": produced, "first_window_start": first,
                       "windows": args.windows}))
    return 0


def _run_job(command: str, argv: Sequence[str]) -> int:
    import importlib

    from pipelines.job_cli import BEAM_NOTE, UsageError, help_text, parse_job_argv

    try:
        job = parse_job_argv(command, argv)
    except UsageError as err:
        print(f"esa {command}: error: {err}", file=sys.stderr)
        return int(ExitCode.USAGE)
    if job.help:
        _print(help_text(command, f"{BEAM_JOBS[command]}."))
        return 0
    LOG.debug("%s: %s", command, BEAM_NOTE)
    module = importlib.import_module("pipelines.end_to_end" if command == "run" else f"pipelines.{command}")
    service = _service_options(job.beam_argv)
    if service.follow:
        return _follow(command, module, job, service)
    if service.metrics_port:
        raise JobUsageError("--metrics_port is served by --follow jobs (a single run exits before a scrape; the "
                         "streaming shuffler, --kafka_io sdf, logs its progress but serves no metrics yet)")
    return _report_run(command, module.run_from_argv(job.beam_argv), job.max_dead_letter_fraction)


def _service_options(argv: Sequence[str]) -> Any:
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.options import EsaServiceOptions

    return PipelineOptions(list(argv)).view_as(EsaServiceOptions)


def _follow(command: str, module: Any, job: Any, service: Any) -> int:
    """``--follow``: hold the state directories for the process's life, serve metrics, report every run as it
    ends (its JSON line, and the dead-letter warning then, not at exit); the exit code is the worst run's."""
    import contextlib

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.job import config_from_options, hold_state_dirs
    from pipelines.metrics import JobMetrics
    from pipelines.service import follow

    config = config_from_options(PipelineOptions(list(job.beam_argv)))
    dirs = [config.state / s for s in ("encode", "shuffle", "analyze")] if command == "run" else [config.state]
    codes = [0]

    def run_once() -> Any:
        summary = module.run_from_argv(job.beam_argv)
        codes.append(_report_run(command, summary, job.max_dead_letter_fraction))
        return summary

    metrics = JobMetrics(command)
    with hold_state_dirs(dirs, f"esa {command} --follow"), contextlib.ExitStack() as stack:
        if service.metrics_port:
            stack.enter_context(metrics.serve(service.metrics_port, service.metrics_host))
        follow(run_once, float(service.poll_seconds), metrics=metrics)
    return max(codes)


def _report_run(command: str, summary: object, max_dead_fraction: float) -> int:
    """Print one run's JSON line; the exit code says whether it balanced and stayed under the dead-letter bar."""
    from pipelines.job_cli import dead_letter_verdict

    read, dead = summary.records_read_and_dead()
    fraction, warning = dead_letter_verdict({"read": read, "dead_lettered": dead}, max_dead_fraction)
    paths = {"estimates": summary.estimates_path, "dead_letters": summary.dead_letters_path}
    outputs = {name: str(paths[name]) for name in STAGE_OUTPUTS.get(summary.stage, ("dead_letters",))}
    stages = getattr(summary, "stages", None) or {summary.stage: summary}
    # Runs with nothing new to read (and, for the shuffler, no window that may have closed) are skipped.
    names = [n for n, s in stages.items() if getattr(s, "extra", {}).get("skipped")]
    skipped = {"skipped": names} if names else {}
    _print(json.dumps({"stage": summary.stage, "accounting": summary.accounting, "balanced": summary.balanced,
                       "dead_letter_fraction": round(fraction, 6), **outputs, **skipped}))
    if not summary.balanced:
        print(f"esa {command}: error: the record accounting does not balance: {summary.accounting}", file=sys.stderr)
        return int(ExitCode.UNEXPECTED)
    if warning:
        print(f"\n{'!' * 100}\nesa {command}: {warning}\n{'!' * 100}\n", file=sys.stderr)
        return int(ExitCode.DEAD_LETTERS)
    return 0


def _privacy(args: argparse.Namespace) -> int:
    from transforms.privacy.report import build_privacy_report, format_privacy_report

    report = build_privacy_report(args.mechanism, args.domain, args.epsilon, args.n, args.delta,
                                  fragments=args.fragments, epsilon_fragment=args.epsilon_fragment)
    text = format_privacy_report(report)
    if args.windows is not None:
        from transforms.privacy.windows_report import format_windows_report, windows_report

        count = {k: v for k, v in (("window_seconds", args.window_seconds), ("epsilon_year", args.crowd_epsilon_year),
                                   ("delta_year", args.crowd_delta_year)) if v is not None}
        report["windows"] = windows_report(report, args.windows, args.crowd_claim or "none", **count)
        text += "\n" + format_windows_report(report["windows"])
    elif any(v is not None for v in (args.crowd_claim, args.window_seconds, args.crowd_epsilon_year,
                                     args.crowd_delta_year)):
        raise ValueError("--crowd_claim, --window_seconds, --crowd_epsilon_year, --crowd_delta_year apply with "
                         "--windows only")
    _print(json.dumps(report, indent=2) if args.json else text)
    return 0


def _add_plan_parser(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser("plan", help="local parameters meeting a central (eps_c, delta) target (tight bound)")
    plan.add_argument("--kind", choices=("histogram", "kv_mean", "vector_mean"), required=True)
    plan.add_argument("--mechanism", default=None,
                      help="kv_mean: collision, coco, pckv-ue, pckv-grr or privkv; histogram: plan only this oracle "
                           "(default: grr, oue, olh, hadamard, cms, rappor and recommend one)")
    plan.add_argument("--d", type=_positive_int, required=True,
                      help="categories (histogram), keys (kv_mean) or coordinates (vector_mean)")
    plan.add_argument("--target_stderr", type=_positive_float, default=None,
                      help="histogram: per-item stderr to reach (a frequency), instead of a central target")
    plan.add_argument("--s", type=_positive_int, default=None, help="kv_mean: non-zero keys per user")
    plan.add_argument("--n", type=_positive_int, required=True, help="number of users")
    plan.add_argument("--epsilon_central", type=_positive_float, default=None, help="per-window target")
    plan.add_argument("--delta", type=_positive_float, required=True, help="central delta")
    plan.add_argument("--t", type=_positive_int, default=None,
                      help="kv_mean: fix the output size of collision/coco; vector_mean: coordinates per user")
    plan.add_argument("--t_rule", default=None, help="kv_mean: joint (default), min-variance or paper")
    plan.add_argument("--k_round", type=_positive_int, default=None, help="vector_mean: precision (default: rule)")
    plan.add_argument("--accountant", default=None,
                      help="vector_mean: \"002\" (the parameter rules of Scott, Cormode and Maple's vector "
                           "summation, default) or tight (the largest budget the tight shuffle bound allows)")
    plan.add_argument("--windows", type=_positive_int, default=None,
                      help="plan for W windows of the same population (with --epsilon_central_total)")
    plan.add_argument("--epsilon_central_total", type=_positive_float, default=None,
                      help="with --windows: budget for all W windows together (PLD composition)")
    plan.add_argument("--json", action="store_true", help="machine-readable output")


def _plan(args: argparse.Namespace) -> int:
    from transforms.planning.planner import format_kv_plan, format_vector_plan, plan_kv_mean, plan_vector_mean

    if args.kind == "histogram":
        return _plan_histogram(args)
    if args.target_stderr is not None:
        raise ValueError("--target_stderr applies to --kind histogram only")
    if (args.windows is None) != (args.epsilon_central_total is None):
        raise ValueError("--windows and --epsilon_central_total go together")
    if (args.windows is None) == (args.epsilon_central is None):
        raise ValueError("give --epsilon_central (one window) or --windows with --epsilon_central_total")
    if args.kind == "kv_mean":
        if args.mechanism is None or args.s is None:
            raise ValueError("--kind kv_mean needs --mechanism and --s")
        if args.k_round is not None or args.accountant is not None:
            raise ValueError("--k_round and --accountant apply to --kind vector_mean only")

        def make(eps_c: float, delta: float) -> object:
            return plan_kv_mean(args.mechanism, args.d, args.s, args.n, eps_c, delta, t=args.t,
                                t_rule=args.t_rule or "joint")
        formatter = format_kv_plan
    else:
        if args.mechanism is not None or args.s is not None or args.t_rule is not None:
            raise ValueError("--kind vector_mean takes no --mechanism, --s or --t_rule (it plans [VecSum]'s mechanism)")

        def make(eps_c: float, delta: float) -> object:
            return plan_vector_mean(args.d, args.n, eps_c, delta, k_round=args.k_round,
                                    t=1 if args.t is None else args.t, accountant=args.accountant or "002")
        formatter = format_vector_plan
    if args.windows is None:
        plan = make(args.epsilon_central, args.delta)
        text = formatter(plan)
    else:
        from transforms.planning.windows import format_windows_plan, plan_for_windows

        plan = plan_for_windows(make, args.n, args.windows, args.epsilon_central_total, args.delta)
        text = format_windows_plan(plan, formatter(plan.plan))
    _print(json.dumps(plan.to_dict(), indent=2) if args.json else text)
    return 0


def _plan_histogram(args: argparse.Namespace) -> int:
    from transforms.planning import histogram as ph

    for flag, value in (("--s", args.s), ("--t", args.t), ("--t_rule", args.t_rule), ("--k_round", args.k_round),
                        ("--accountant", args.accountant)):
        if value is not None:
            raise ValueError(f"{flag} does not apply to --kind histogram")
    mechanisms = ph.HISTOGRAM_MECHANISMS if args.mechanism is None else (args.mechanism,)
    if args.windows is None:
        if args.epsilon_central_total is not None:
            raise ValueError("--epsilon_central_total goes with --windows")
        plan = ph.plan_histogram(args.d, args.n, args.delta, epsilon_central=args.epsilon_central,
                                 target_stderr=args.target_stderr, mechanisms=mechanisms)
        text = ph.format_histogram_plan(plan)
    else:
        if args.epsilon_central is not None:
            raise ValueError("with --windows give --epsilon_central_total (or --target_stderr), not --epsilon_central")
        if args.mechanism is None:  # RAPPOR's PLD ledger is too slow to recompose at every bisection step
            mechanisms = tuple(m for m in mechanisms if m != "rappor")
        plan = ph.plan_histogram_windows(args.d, args.n, args.windows, args.delta,
                                         epsilon_central_total=args.epsilon_central_total,
                                         target_stderr=args.target_stderr, mechanisms=mechanisms)
        text = ph.format_histogram_windows_plan(plan)
    _print(json.dumps(plan.to_dict(), indent=2) if args.json else text)
    return 0


def _print(text: str) -> None:
    """Print to stdout and flush now, so that a closed pipe (``esa ... --json | head``) surfaces here."""
    print(text, flush=True)


def _announce_seed(seed: int | None, command: str) -> None:
    if seed is not None:
        LOG.warning("--seed %d: %s's simulated clients, injected bad records, encoder job key and shuffler "
                    "randomness are all seeded and reproducible: for tests and simulations ONLY", seed, command)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "broker":
        from pipelines.broker import run_broker_forever

        return run_broker_forever(args.port, args.data_dir)
    if args.command == "simulate":
        _announce_seed(args.seed, "simulate")
        return _simulate(args)
    if args.command == "privacy":
        return _privacy(args)
    if args.command == "plan":
        return _plan(args)
    if args.command == "report":
        from pipelines.reports.html import write_reports

        for path in write_reports(args.output_dir, args.out, args.top):
            _print(str(path))
        return 0
    if args.command == "query":
        from pipelines.query.ranges import query_command

        return query_command(args)
    from pipelines.demo.run import run_demo
    from pipelines.options import load_kafka_config

    kafka_config = load_kafka_config(args.kafka_config, args.kafka_client) if args.kafka_config else {}
    _announce_seed(args.seed, "demo")
    run_demo(clients=args.clients, mechanism=args.mechanism, epsilon=args.epsilon, out=args.out,
             spec_path=args.spec, kind=args.kind, distribution=args.distribution, zipf_s=args.zipf_s,
             bad_per_kind=args.bad_per_kind, seed=args.seed, bootstrap=args.bootstrap,
             kafka_client=args.kafka_client, kafka_config=kafka_config)
    return 0


def _error_code(command: str, err: BaseException) -> int | None:
    """One line on stderr and the exit code for an error the user can act on; None: a bug (traceback)."""
    if isinstance(err, EsaError):
        print(f"esa {command}: error: {err}", file=sys.stderr)
        return int(err.exit_code)
    if any(c.__name__ == "StateLocked" for c in type(err).__mro__):
        print(f"esa {command}: error: {err}", file=sys.stderr)
        return int(ExitCode.STATE_LOCKED)
    words = out_of_space(err)
    if words is not None:  # Beam may wrap a worker's OSError in anything; so may state code
        print(f"esa {command}: error: {out_of_space_advice(words)}", file=sys.stderr)
        return int(ExitCode.OUT_OF_SPACE)
    if any(c.__name__ == "StateError" for c in type(err).__mro__):  # damaged state: never guessed around
        print(f"esa {command}: error: unusable state: {err}", file=sys.stderr)
        return int(ExitCode.STATE_UNUSABLE)
    if type(err).__name__ == "SpecError":
        print(f"esa {command}: error: {err}", file=sys.stderr)
        return int(ExitCode.CONFIG)
    if isinstance(err, ValueError) and command not in BEAM_JOBS:  # bad arguments, bad parameters
        print(f"esa {command}: error: {err}", file=sys.stderr)
        return int(ExitCode.USAGE)
    # A job's bad flags and settings are EsaErrors (above); any other ValueError inside a run is a bug.
    if type(err).__module__.startswith(("kafka", "confluent_kafka", "cimpl")):  # no kafka import: fast `esa privacy`
        print(f"esa {command}: cannot talk to Kafka: {err}", file=sys.stderr)
        return int(ExitCode.KAFKA_UNREACHABLE)
    return None


def _split_global_flags(argv: list[str]) -> tuple[list[str], bool, str | None]:
    """Take ``-v`` and ``--log_format F`` out of ``argv`` wherever they are: (the rest, verbose, format)."""
    rest, verbose, fmt = [], False, None
    tokens = iter(argv)
    for token in tokens:
        name, sep, value = token.partition("=")
        if token in VERBOSE:
            verbose = True
        elif name in LOG_FORMAT_FLAGS:
            fmt = value if sep else next(tokens, "")
        else:
            rest.append(token)
    return rest, verbose, fmt


def main(argv: Sequence[str] | None = None) -> int:
    argv, verbose, requested_format = _split_global_flags(list(sys.argv[1:] if argv is None else argv))
    command = argv[0] if argv else "esa"
    try:
        fmt = log_format(requested_format)
    except ValueError as err:
        print(f"esa {command}: error: --log_format: {err}", file=sys.stderr)
        return int(ExitCode.USAGE)
    setup_logging(verbose, fmt)
    from pipelines.layout import layout_error

    if (shadowed := layout_error()) is not None:
        print(f"esa {command}: error: {shadowed}", file=sys.stderr)
        return int(ExitCode.CONFIG)
    try:
        if command in BEAM_JOBS:  # Beam owns the flags of the pipeline jobs; job_cli checks them first
            return _run_job(command, argv[1:])
        return _dispatch(_parse_native(argv))
    except BrokenPipeError:
        # The reader went away (``esa query --json | head``): stop quietly, without a traceback at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"esa {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        code = _error_code(command, err)
        if code is None:  # a bug: the traceback goes to the log, one line to the operator
            LOG.critical("esa %s: internal error", command, exc_info=True)
            print(f"esa {command}: internal error: {type(err).__name__}: {_one_line(err)} (traceback in the log "
                  f"above; exit {int(ExitCode.UNEXPECTED)})", file=sys.stderr)
            return int(ExitCode.UNEXPECTED)
        return code


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


if __name__ == "__main__":
    sys.exit(main())
