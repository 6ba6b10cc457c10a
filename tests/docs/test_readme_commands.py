"""Every command of README.md, extracted from the README itself and run at small sizes.

Sizes are reduced (``--clients``), paths moved under ``tmp_path`` and ``H:P`` pointed at the session
broker; otherwise each command runs as written, through the same interpreter (``esa`` is
``sys.executable -m pipelines.cli``, ``python`` is ``sys.executable``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.docs.readme_commands import (
    REPO,
    Block,
    Command,
    QuickStart,
    bash_commands,
    blocks,
    by_class,
    classify,
    commands,
    option,
    python_blocks,
    replace_option,
)

ESA = [sys.executable, "-m", "pipelines.cli"]
TIMEOUT_S = 300


def _env() -> dict[str, str]:
    """The test's environment with the repository first on the path (the commands run in a tmp cwd)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _argv(tokens: tuple[str, ...] | list[str]) -> list[str]:
    """A README argv for this interpreter: ``esa``/``.venv/bin/esa`` -> the CLI module, ``python`` -> us."""
    head, *rest = tokens
    if head in ("esa", ".venv/bin/esa"):
        return [*ESA, *rest]
    if head in ("python", "python3", ".venv/bin/python"):
        return [sys.executable, *rest]
    raise AssertionError(f"do not know how to run {head!r}")


def _run(argv: list[str], cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _balanced(accounting: dict[str, dict[str, int]]) -> None:
    """read equals the sum of every other term, in every stage."""
    assert set(accounting) == {"encode", "shuffle", "analyze"}, accounting
    for stage, terms in accounting.items():
        parts = {k: v for k, v in terms.items() if k != "read"}
        assert terms["read"] == sum(parts.values()) and terms["read"] > 0, (stage, terms)


# -- extraction -------------------------------------------------------------------------------------------


def test_every_readme_command_is_run_by_a_test() -> None:
    """Strict: a bash command no test knows how to run fails here, by name; every class is present."""
    langs = {b.lang for b in blocks()}
    assert langs <= {"", "bash", "python"}, f"a README block in a language no test runs: {langs}"
    kinds = [classify(c) for c in bash_commands()]  # raises naming the unknown command
    assert set(kinds) == {"quickstart-demo", "ci", "trust-init", "service", "service-edge", "service-simulate",
                          "privacy", "plan", "range-demo", "query", "privacy-horse"}, kinds
    assert kinds.count("service") == 2 and kinds.count("service-edge") == 1 and kinds.count("service-simulate") == 1
    assert len(python_blocks()) == 1


def test_unknown_commands_are_refused() -> None:
    """The classifier refuses what it was not taught (so the strict test above can fail)."""
    for text in ("esa frobnicate --x 1", "rm -rf out", ".venv/bin/pip install x && esa simulate --clients 3"):
        with pytest.raises(ValueError, match=r"not run by any test|unknown prefix"):
            classify(commands(Block("bash", "x", text + "\n"))[0])


def test_extraction_joins_continuations_and_drops_comments() -> None:
    block = Block("bash", "s", "esa a --x 1 \\\n    --y 2   # a comment\n\n# only a comment\nesa b '#kept'\n")
    found = commands(block)
    assert [c.segments for c in found] == [(("esa", "a", "--x", "1", "--y", "2"),), (("esa", "b", "#kept"),)]


def test_readme_test_command_is_what_ci_runs() -> None:
    """The Quick start's second bash block is, character for character, the last line of .ci/run."""
    quick = [b for b in blocks() if b.lang == "bash" and b.section == "Quick start"]
    assert len(quick) == 2, quick
    (test_command,) = commands(quick[1])
    assert classify(test_command) == "ci"
    ci_lines = [ln for ln in (REPO / ".ci/run").read_text().splitlines() if ln.strip()]
    assert ci_lines[-1].strip() == quick[1].text.strip() == test_command.line


# -- the quick start, the privacy questions ---------------------------------------------------------------


@pytest.mark.slow
def test_quick_start_demo(quick_start: QuickStart) -> None:
    """The Quick start's demo (tests/docs/conftest.py: run once, as written but for --clients)."""
    summary = json.loads((quick_start.out / "summary.json").read_text())
    assert summary["accounting_balanced"] is True, summary["accounting"]
    _balanced(summary["accounting"])
    assert "balanced" in quick_start.done.stdout


def test_privacy_commands_as_written(tmp_path: Path) -> None:
    for command in by_class("privacy"):
        done = _run(_argv(command.argv), cwd=tmp_path)
        windows = option(command.argv, "--windows")
        assert "eps" in done.stdout and (windows is None or f"{windows}:" in done.stdout), done.stdout


def test_horse_row(tmp_path: Path) -> None:
    """The README's Horse example prints [ESA]'s removal epsilon 1.00177."""
    (command,) = by_class("privacy-horse")
    assert "1.00177" in _run(_argv(command.argv), cwd=tmp_path).stdout


@pytest.mark.slow
def test_plan_commands_as_written(tmp_path: Path) -> None:
    for command in by_class("plan"):
        done = _run(_argv(command.argv), cwd=tmp_path)
        assert "total epsilon" in done.stdout, done.stdout


@pytest.mark.slow
def test_range_demo_then_query(tmp_path: Path) -> None:
    """The range demo (at 3000 clients), then the query against its --out, both from the same cwd."""
    (demo,) = by_class("range-demo")
    (query,) = by_class("query")
    assert option(query.argv, "--estimates") == option(demo.argv, "--out")
    _run(_argv(replace_option(list(demo.argv), "--clients", "3000")), cwd=tmp_path)
    done = _run(_argv(query.argv), cwd=tmp_path)
    lo, hi = query.argv[query.argv.index("--range") + 1:query.argv.index("--range") + 3]
    quantile = option(query.argv, "--quantile")
    assert f"range [{lo}, {hi})" in done.stdout and f"quantile {quantile}:" in done.stdout, done.stdout


# -- the device client ------------------------------------------------------------------------------------


def test_device_client_snippet(tmp_path: Path) -> None:
    """The ```python snippet, in a cwd holding ``keys`` (made by the README's trust init) and ``examples``."""
    (snippet,) = python_blocks()
    (init,) = by_class("trust-init")
    _run(_argv([*init.argv[:-1], "keys"]), cwd=tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    done = _run([sys.executable, "-c", snippet.text], cwd=tmp_path, timeout=120)
    lines = done.stdout.splitlines()
    assert lines and lines[0].startswith("enrol: "), done.stdout
    device_id, public_hex = lines[0].split()[1:3]
    assert device_id and len(bytes.fromhex(public_hex)) == 32


# -- running it as a service ------------------------------------------------------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service_argv(command: Command, subs: dict[str, str], topics: dict[str, str]) -> list[str]:
    """The README command with the broker, the example spec's path and the metrics ports pointed at this test's,
    and the topics renamed (one broker serves every test); its relative paths (service/...) land in the test's
    working directory. Nothing else changes."""
    argv = [subs.get(t, t) for t in command.argv]
    argv = [str(REPO / a) if a.startswith("examples/") else a for a in argv]
    for flag in ("--raw_topic", "--reports_topic", "--shuffled_topic"):
        if flag in argv:
            argv = replace_option(argv, flag, topics[option(argv, flag)])
    if "--metrics_port" in argv:
        argv = replace_option(argv, "--metrics_port", str(_free_port()))
    return _argv(argv)


@pytest.mark.slow
def test_running_it_as_a_service(tmp_path: Path, broker) -> None:
    """The README's walk-through as written: trust init, ``esa edge``, ``esa simulate`` (one minute of the devices'
    reports posted to the edge over HTTP, into the topic the shuffler reads), then the ``--follow`` jobs side by
    side until the analyzer has written the minute's estimates, within the minute or so the README promises;
    SIGTERM stops each (and the edge) with exit 0."""
    from transforms.state.estimates_store import read_estimates

    (init,) = by_class("trust-init")
    (simulate,) = by_class("service-simulate")
    (edge_command,) = by_class("service-edge")
    services = by_class("service")
    subs = {"127.0.0.1:9092": broker.bootstrap}
    tag = uuid.uuid4().hex[:8]
    topics = {name: f"readme-{name}-{tag}" for name in ("telemetry", "reports", "shuffled")}
    _run(_argv(list(init.argv)), cwd=tmp_path)
    edge_port = _free_port()
    edge_argv = replace_option(_service_argv(edge_command, subs, topics), "--port", str(edge_port))
    edge_argv += ["--reports_topic", topics["reports"], "--devices_topic", f"readme-devices-{tag}"]  # defaults
    edge_log = (tmp_path / "edge.out").open("w")
    edge = subprocess.Popen(edge_argv, cwd=tmp_path, env=_env(), stdout=edge_log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while "listening on" not in (tmp_path / "edge.out").read_text():
        assert edge.poll() is None and time.monotonic() < deadline, (tmp_path / "edge.out").read_text()
        time.sleep(0.2)
    simulated = [*_service_argv(simulate, subs, topics), "--raw_topic", topics["telemetry"],
                 "--reports_topic", topics["reports"]]  # the README's simulate writes the default topics
    simulated = replace_option(simulated, "--edge", f"http://127.0.0.1:{edge_port}")
    produced = json.loads(_run(simulated, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert produced["produced"]["accepted_by_edge"] > 0, produced
    assert produced["produced"], produced
    window_ms = 60_000  # no wall-time assertion (loaded machines): without --drain, only the watermark releases it

    analyze_out, ports = None, {}
    procs = []
    logs = []
    try:
        for command in services:
            argv = _service_argv(command, subs, topics)
            ports[command.argv[1]] = int(option(argv, "--metrics_port"))
            if command.argv[1] == "analyze":
                analyze_out = tmp_path / option(argv, "--output_dir")
            log = (tmp_path / f"{command.argv[1]}.log").open("w")
            logs.append(log)
            procs.append(subprocess.Popen(argv, cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT))
        assert analyze_out is not None
        deadline = time.monotonic() + 600  # generous: a loaded 2-core machine; the README's minute is checked below
        while time.monotonic() < deadline:
            dead = [(p.args[3], p.returncode) for p in procs if p.poll() is not None]
            assert not dead, f"a follower exited early: {dead}\n{_tails(tmp_path)}"
            if (analyze_out / "estimates").exists() and read_estimates(analyze_out).num_rows > 0:
                break
            time.sleep(1)
        else:
            pytest.fail(f"no estimates under {analyze_out} after 600 s\n{_tails(tmp_path)}")
        scraped = _scrape_until(ports["analyze"], "esa_cumulative_epsilon{")  # the README gives it a port
        assert "esa_cumulative_epsilon{" in scraped, scraped[-2000:]
        # The shuffler's reads count each record once, however often a held set is read again: at most what
        # reached its topic (one set per raw event, plus the reports simulate wrote), not 5,342 for 2,000.
        shuffler = _scrape_until(ports["shuffle"], 'esa_records_read_total{stage="shuffle"}')
        counted = float(shuffler.split('esa_records_read_total{stage="shuffle"}', 1)[1].split()[0])
        assert 0 < counted <= sum(produced["produced"].values()), (counted, produced)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=120))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append("killed")
        for log in logs:
            log.close()
        edge.send_signal(signal.SIGTERM)
        codes.append(edge.wait(timeout=120))
        edge_log.close()
    assert codes == [0] * (len(services) + 1), f"{codes}\n{_tails(tmp_path)}"
    for command in services:  # each job printed one balanced JSON line per run
        stage = command.argv[1]
        runs = [json.loads(ln) for ln in (tmp_path / f"{stage}.log").read_text().splitlines() if ln.startswith("{")]
        assert runs and all(r["stage"] == stage and r["balanced"] for r in runs), (stage, runs)
    rows = read_estimates(analyze_out)
    ends = {int(v.timestamp() * 1000) if hasattr(v, "timestamp") else int(v)
            for v in rows.column("window_end").to_pylist()}
    assert ends == {produced["first_window_start"] + window_ms} and min(rows.column("n_clients").to_pylist()) > 0


def _scrape_until(port: int, needle: str, timeout_s: float = 120) -> str:
    """The analyzer's /metrics once it holds ``needle`` (its gauges are set after the run that wrote estimates
    has ended), or the last page read."""
    import urllib.request

    text, deadline = "", time.monotonic() + timeout_s
    while time.monotonic() < deadline and needle not in text:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                text = reply.read().decode()
        except OSError:
            pass
        time.sleep(1)
    return text


def _tails(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(tmp_path.glob("*.log")))
