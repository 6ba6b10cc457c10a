"""The operator's view of a running service, as the issue's script checks it: ``esa shuffle --follow
--metrics_port P`` shows a progress line on stderr and counts on its metrics endpoint within 30 s while it
runs, refuses a second copy on its state directory (the lock is held for the process's life, not per run),
does not re-read its held sets when nothing new arrived, and stops on SIGTERM."""

from __future__ import annotations

import dataclasses
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.demo.population import synthesize
from tests.e2e.chain_harness import REPO, SPEC_PATH, _env, cli_argv, new_chain, produce, recent_start, run_inline
from transforms.io.kafka.bounded import produce_records
from transforms.spec import load_spec

pytestmark = pytest.mark.slow
SPEC = load_spec(SPEC_PATH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:  # the endpoint is not up yet
            value = None
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


def test_a_follow_job_is_observable_while_it_runs(broker, tmp_path) -> None:
    start = recent_start(SPEC.window_seconds * 1000, back=2)
    chain = dataclasses.replace(new_chain(broker.bootstrap, tmp_path, "watch"), drain=False)  # windows stay open
    produce(chain, synthesize(SPEC, 200, windows=1, start_ms=start, seed=3))
    run_inline(chain, ("encode",))
    produce_records(broker.bootstrap, chain.reports, [b"not a message set"] * 4)  # dead-lettered by the shuffler
    port = _free_port()
    argv = cli_argv(chain, "shuffle", "--follow", "--poll_seconds", "0.5", "--metrics_port", str(port))
    proc = subprocess.Popen(argv, env=_env(None), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        started = time.monotonic()
        line = _wait(lambda: next((x for x in lines if "esa.service: run 1: shuffle: read 204" in x), None), 30,
                     "progress line")
        assert "held 200" in line and "dead-lettered 4 (" in line, line
        # lag in offsets: the 204 records plus the commit marker the encoder's transaction left per partition
        lag = int(re.search(r"consumer lag ([\d,]+)", line).group(1).replace(",", ""))
        assert 204 <= lag <= 204 + 3, line
        stage = (("stage", "shuffle"),)
        got = _wait(lambda: (m := _metrics(port)).get(("esa_runs_total", stage), 0) >= 3 and m, 30,
                    "three runs on the metrics endpoint")
        assert time.monotonic() - started < 60
        assert got[("esa_records_read_total", stage)] == 204  # runs 2 and 3 skipped: no held set re-read
        assert got[("esa_held_records", stage)] == 200 and 204 <= got[("esa_consumer_lag_records", stage)] <= 204 + 3
        assert sum(v for (name, _), v in got.items() if name == "esa_records_dead_lettered_total") == 4
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read().decode()
        assert '"status": "running"' in health
        second = subprocess.run(cli_argv(chain, "shuffle"), env=_env(None), cwd=REPO, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 5 and "holds" in second.stderr and "--follow" in second.stderr
        proc.send_signal(signal.SIGTERM)
        out, rest = proc.communicate(timeout=60)  # communicate reads stderr too: keep what the reader missed
        lines.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    reader.join(timeout=5)
    assert proc.returncode == 0, "".join(lines[-30:])
    assert any("stopped after" in x for x in lines)
    assert out.count('"balanced": true') >= 3
