"""``esa privacy`` and ``esa plan``: the privacy report of a mechanism, and the planner's answer, as text or JSON.
"""

from __future__ import annotations

import argparse
import json


def privacy_command(args: argparse.Namespace) -> int:
    from transforms.privacy.report import build_privacy_report, format_privacy_report

    report = build_privacy_report(args.mechanism, args.domain, args.epsilon, args.n, args.delta,
                                  fragments=args.fragments, epsilon_fragment=args.epsilon_fragment,
                                  decomposition=_decomposition(args.mechanism, args.domain, args.epsilon))
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
    print_out(json.dumps(report, indent=2) if args.json else text)
    return 0


def _decomposition(mechanism: str, domain: int, epsilon: float) -> object:
    """The product's randomizer's blanket decomposition (``Randomizer.blanket_decomposition``) for the report;
    None where the name is no single-message oracle or its parameters do not build one (the report then
    refuses them with its own message, or uses the generic pair)."""
    if mechanism not in ("grr", "oue", "olh"):
        return None
    from transforms.mechanisms.registry import MECHANISMS

    try:
        return MECHANISMS[mechanism].load()(domain, epsilon).blanket_decomposition()
    except (ValueError, TypeError):
        return None


def plan_command(args: argparse.Namespace) -> int:
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
    print_out(json.dumps(plan.to_dict(), indent=2) if args.json else text)
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
    print_out(json.dumps(plan.to_dict(), indent=2) if args.json else text)
    return 0


def print_out(text: str) -> None:
    """Print to stdout and flush now, so that a closed pipe (``esa ... --json | head``) surfaces here."""
    print(text, flush=True)
