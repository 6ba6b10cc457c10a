"""The ``esa`` command: broker, simulate, the jobs (run, encode, shuffle, analyze), demo, query, privacy, plan.

Flags are spelled with underscores (``--raw_topic``), as Beam's are; the hyphen spelling (``--raw-topic``)
is accepted everywhere. ``-v``/``--verbose`` may come before or after the subcommand. Exit codes:
``pipelines.exit_codes``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from pipelines.cli_parser import BEAM_JOBS, parse_native
from pipelines.cli_privacy import plan_command, print_out, privacy_command
from pipelines.exit_codes import EsaError, ExitCode, JobUsageError
from pipelines.logs import log_format, setup_logging
from pipelines.out_of_space import out_of_space, out_of_space_advice

LOG = logging.getLogger("esa")
# Outputs each job stage writes (RunSummary.stage -> files), so a job prints only what it wrote.
STAGE_OUTPUTS = {"end_to_end": ("estimates", "dead_letters"), "encode": ("dead_letters",),
                 "shuffle": ("dead_letters",), "analyze": ("estimates", "dead_letters")}
VERBOSE = ("-v", "--verbose")
LOG_FORMAT_FLAGS = ("--log_format", "--log-format")


def _simulate(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from pipelines.demo.population import synthesize, truth_table
    from pipelines.demo.run import progress_printer
    from pipelines.demo.simulate import produce_population
    from pipelines.options import load_kafka_config
    from pipelines.preflight import existing_topics
    from pipelines.query.readers import parse_time_ms
    from transforms.spec import load_spec

    if args.edge and args.devices is None:
        raise ValueError("--edge posts the reports --devices encode: give --devices DIR too")
    kafka_config = load_kafka_config(args.kafka_config, args.kafka_client) if args.kafka_config else {}
    spec = load_spec(args.spec)
    # the broker answers, or one line and exit 4 before any key or topic is made
    existing_topics(args.bootstrap, client=args.kafka_client, kafka_config=kafka_config)
    start_ms = None if args.start_time is None else parse_time_ms(args.start_time, "--start_time")
    population = synthesize(spec, args.clients, distribution=args.distribution, zipf_s=args.zipf_s,
                            windows=args.windows, start_ms=start_ms, seed=args.seed)
    from pipelines.enrolment import enrol_simulated_topic

    enrol_simulated_topic(args.keys_dir, population.client_ids.tolist(), args.bootstrap, args.devices_topic,
                          kafka_config=kafka_config, client=args.kafka_client)
    if args.devices is not None:
        from pipelines.demo.device_fleet import FleetOutcome, device_messages
        from transforms.io.kafka.bounded import ensure_topics, produce_records

        outcome, show = FleetOutcome(), progress_printer("devices reported")
        ensure_topics(args.bootstrap, [args.raw_topic, args.reports_topic], partitions=3, client_config=kafka_config,
                      client=args.kafka_client)
        messages = device_messages(spec, population, args.devices, args.keys_dir, budget_epsilon=args.device_budget,
                                   seed=args.seed, outcome=outcome)
        if args.edge:  # through the ingestion edge over HTTP, as real devices report
            from pipelines.edge.client import post_reports

            answers = post_reports(args.edge, (body for _, body in messages),
                                   progress=lambda done: show(done, len(population)))
            produced = {"accepted_by_edge": answers.pop(202, 0), "refused_by_device_budget": outcome.refused,
                        **{f"edge_status_{status}": n for status, n in answers.items()}}
        else:
            produce_records(args.bootstrap, args.reports_topic, messages, producer_config=kafka_config,
                            progress=lambda done: show(done, len(population)), progress_every=1000,
                            client=args.kafka_client)
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
    print_out(json.dumps({"spec_id": spec.spec_id, "produced": produced, "first_window_start": first,
                       "windows": args.windows}))
    return 0


def _run_job(command: str, argv: Sequence[str]) -> int:
    import importlib

    from pipelines.job_cli import BEAM_NOTE, UsageError, help_text, parse_job_argv, wants_help
    from pipelines.job_preflight import check_job, check_specs

    if wants_help(argv):  # no Beam import: the help answers at once
        print_out(help_text(command, f"{BEAM_JOBS[command]}."))
        return 0
    check_specs(argv)  # a bad spec costs no Beam start-up either
    try:
        job = parse_job_argv(command, argv)
    except UsageError as err:
        print(f"esa {command}: error: {err}", file=sys.stderr)
        return int(ExitCode.USAGE)
    check_job(command, job.beam_argv)  # runner and keys, before anything is created
    LOG.debug("%s: %s", command, BEAM_NOTE)
    module = importlib.import_module("pipelines.end_to_end" if command == "run" else f"pipelines.{command}")
    service = _service_options(job.beam_argv)
    if service.follow:
        return _follow(command, module, job, service)
    if service.metrics_port and not _streams(job.beam_argv):
        raise JobUsageError("--metrics_port is served by --follow jobs and by the streaming shuffler (--kafka_io "
                            "sdf): a single bounded run exits before a scrape")
    return _report_run(command, module.run_from_argv(job.beam_argv), job.max_dead_letter_fraction)


def _streams(argv: Sequence[str]) -> bool:
    """Whether the job is the streaming shuffler (``--kafka_io sdf``), which serves its own metrics."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.options import EsaKafkaOptions

    return PipelineOptions(list(argv)).view_as(EsaKafkaOptions).kafka_io == "sdf"


def _service_options(argv: Sequence[str]) -> Any:
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.options import EsaServiceOptions

    return PipelineOptions(list(argv)).view_as(EsaServiceOptions)


def _follow(command: str, module: Any, job: Any, service: Any) -> int:
    """``--follow``: hold the state directories for the process's life, serve metrics, report every run as it
    ends (its JSON line, and the dead-letter warning then, not at exit); the exit code is the worst run's."""
    import contextlib

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.job import hold_state_dirs
    from pipelines.job_config import config_from_options
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
    # the streaming shuffler suspended into a Flink savepoint: where the next run resumes (--savepoint_path)
    savepoint = {"savepoint": summary.extra["savepoint"]} if getattr(summary, "extra", {}).get("savepoint") else {}
    print_out(json.dumps({"stage": summary.stage, "accounting": summary.accounting, "balanced": summary.balanced,
                       "dead_letter_fraction": round(fraction, 6), **outputs, **skipped, **savepoint}))
    if not summary.balanced:
        print(f"esa {command}: error: the record accounting does not balance: {summary.accounting}", file=sys.stderr)
        return int(ExitCode.UNEXPECTED)
    if warning:
        print(f"\n{'!' * 100}\nesa {command}: {warning}\n{'!' * 100}\n", file=sys.stderr)
        return int(ExitCode.DEAD_LETTERS)
    return 0


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
    if args.command == "spec-json":
        from pipelines.spec_json import spec_json_command

        return spec_json_command(args.spec, args.out)
    if args.command == "privacy":
        return privacy_command(args)
    if args.command == "plan":
        return plan_command(args)
    if args.command == "report":
        from pipelines.reports.html import write_reports

        for path in write_reports(args.output_dir, args.out, args.top):
            print_out(str(path))
        return 0
    if args.command in ("edge", "edge-token"):
        from pipelines.edge.cli import edge_command

        return edge_command(args)
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
             kafka_client=args.kafka_client, kafka_config=kafka_config, direct=args.direct)
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
    classes = {c.__name__ for c in type(err).__mro__}  # by name: no transforms import for `esa privacy`
    if "ShufflerFencedError" in classes:  # a second shuffler took the stream over: expected, not a bug
        print(f"esa {command}: error: {_one_line(err)}", file=sys.stderr)
        return int(ExitCode.FENCED)
    if "KafkaCallError" in classes:  # transforms.io.kafka.retry: refused, or retriable past its deadline
        print(f"esa {command}: error: {_one_line(err)}", file=sys.stderr)
        return int(ExitCode.KAFKA_UNREACHABLE)
    if any(c.__name__ == "StateError" for c in type(err).__mro__):  # damaged state: never guessed around
        print(f"esa {command}: error: unusable state: {err}", file=sys.stderr)
        return int(ExitCode.STATE_UNUSABLE)
    if type(err).__name__ == "SpecError" or "KeyFileError" in classes:  # a bad spec; a key file missing or bad
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
    from pipelines.interrupts import stop_signals

    with stop_signals() as stop:
        try:
            if command in BEAM_JOBS:  # Beam owns the flags of the pipeline jobs; job_cli checks them first
                return _run_job(command, argv[1:])
            return _dispatch(parse_native(argv))
        except BrokenPipeError:
            # The reader went away (``esa query --json | head``): stop quietly, without a traceback at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0
        except KeyboardInterrupt:
            return _interrupted(command, stop)
        except Exception as err:
            if stop.received is not None:  # Beam re-raises a KeyboardInterrupt wrapped: the signal decides
                return _interrupted(command, stop)
            code = _error_code(command, err)
            if code is None:  # a bug: the traceback goes to the log, one line to the operator
                LOG.critical("esa %s: internal error", command, exc_info=True)
                print(f"esa {command}: internal error: {type(err).__name__}: {_one_line(err)} (traceback in the "
                      f"log above; exit {int(ExitCode.UNEXPECTED)})", file=sys.stderr)
                return int(ExitCode.UNEXPECTED)
            return code


def _interrupted(command: str, stop: Any) -> int:
    """One line; ``128 + signal`` (130 SIGINT, 143 SIGTERM). What a run had committed stays committed."""
    print(f"esa {command}: interrupted by {stop.name()}; stopped (exit {stop.exit_code()})", file=sys.stderr)
    return stop.exit_code()


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


if __name__ == "__main__":
    sys.exit(main())
