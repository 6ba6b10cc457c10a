"""The ``esa`` command's argument parser: every subcommand that is not a Beam job, and its flags.

The Beam jobs (``run``, ``encode``, ``shuffle``, ``analyze``) take Beam's own flags (``job_cli``); this parser
takes the rest, with both ``--flag_name`` and ``--flag-name`` spellings.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

from pipelines.exit_codes import epilog
from pipelines.logs import FORMAT_ENV, LOG_FORMATS
from transforms.io.kafka.config import CLIENTS, DEFAULT_CLIENT

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


def build_parser() -> argparse.ArgumentParser:
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
    sim.add_argument("--edge", default=None, metavar="URL",
                     help="with --devices: post the devices' reports to this ingestion edge (esa edge) over HTTP, "
                          "as real devices do, instead of producing them to Kafka")
    sim.add_argument("--device_budget", type=_positive_float, default=None,
                     help="with --devices: each device's privacy budget per day, across all specs (replacement "
                          "LDP epsilon); stored in each device's state, so a later run with another value is refused")
    sim.add_argument("--keys_dir", type=Path, default=Path("out.keys"),
                     help="the keys directory whose fleet secret derives the simulated devices' keys (the jobs' "
                          "--keys_dir; default out.keys, which is what `esa run --output_dir out` uses)")
    sim.add_argument("--devices_topic", default="devices",
                     help="enrol the simulated devices through this compacted topic (the shuffler's "
                          "--devices_topic; created if missing)")
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
    demo.add_argument("--direct", action="store_true",
                      help="produce the devices' raw events straight to Kafka for the encoder job to randomize and "
                           "seal (the older shortcut); default: the devices seal their own reports and post them "
                           "to an esa edge on loopback HTTP, the production path")
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

    spec_json = sub.add_parser("spec-json", help="a spec as JSON for device SDKs (clients/web): resolved randomizer "
                                                 "probabilities, wire facts, budget charge")
    spec_json.add_argument("spec", type=Path, metavar="SPEC", help="analysis spec (TOML)")
    spec_json.add_argument("--out", type=Path, default=None, help="write to this file (default: stdout)")

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
    from pipelines.edge.cli import add_edge_parsers

    add_edge_parsers(sub)
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


def parse_native(argv: list[str]) -> argparse.Namespace:
    """Parse an esa-native subcommand; an unknown flag names the closest known one (exit 2)."""
    from pipelines.job_cli import canonical

    parser = build_parser()
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
