"""What an operator sees of a running job: log levels and formats, progress lines, Prometheus metrics, health."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines import cli
from pipelines.job_config import RunSummary
from pipelines.logs import JsonFormatter, setup_logging
from pipelines.metrics import JobMetrics
from pipelines.service import follow, progress_line


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """setup_logging reconfigures the process: put the levels and handlers back for the other tests."""
    root = logging.getLogger()
    names = ("esa", "pipelines", "transforms", "schemas", "apache_beam", "kafka")
    saved = (root.level, list(root.handlers), {n: logging.getLogger(n).level for n in names})
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def _emit_samples() -> None:
    logging.getLogger("esa.service").info("esa-info-line")
    logging.getLogger("pipelines.job").debug("esa-debug-line")
    logging.getLogger("transforms.io.kafka.bounded").info("transforms-info-line")
    logging.getLogger("apache_beam.runners.worker").info("beam-info-line")
    logging.getLogger("apache_beam.runners.worker").debug("beam-debug-line")
    logging.getLogger("apache_beam.io").warning("beam-warning-line")


@pytest.mark.parametrize("verbose", [False, True])
def test_project_lines_show_and_beam_noise_does_not(verbose: bool, restore_logging: None,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """INFO of the project by default (the old setup silenced it by quieting the logger named "root", which
    is the root logger); its DEBUG with -v; Beam's INFO/DEBUG never, Beam's warnings always."""
    setup_logging(verbose)
    _emit_samples()
    err = capsys.readouterr().err
    assert "esa-info-line" in err and "transforms-info-line" in err and "beam-warning-line" in err
    assert ("esa-debug-line" in err) is verbose
    assert "beam-info-line" not in err and "beam-debug-line" not in err


def test_cli_main_logs_at_info(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real entry point: a command's INFO lines reach stderr (they did not before)."""
    assert cli.main(["--log_format", "json", "privacy", "--mechanism", "grr", "--domain", "4", "--epsilon", "1",
                     "--n", "100", "--delta", "1e-6"]) == 0
    capsys.readouterr()
    logging.getLogger("esa.service").info("after-main")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["message"] for line in lines] == ["after-main"] and lines[0]["level"] == "INFO"


def test_json_lines_carry_the_structured_fields() -> None:
    record = logging.LogRecord("esa.service", logging.INFO, __file__, 1, "run %d: %s", (3, "text"), None)
    record.esa = {"event": "run", "stages": [{"stage": "shuffle", "read": 7}], "message": "not overwritten"}
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "run 3: text" and line["event"] == "run" and line["stages"][0]["read"] == 7
    assert line["level"] == "INFO" and line["logger"] == "esa.service" and line["ts"].endswith("+00:00")


def test_unknown_log_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--log_format", "xml", "privacy"]) == 2
    assert "--log_format" in capsys.readouterr().err


def _shuffle_summary(read: int, released: int, dead: dict[str, int]) -> RunSummary:
    parts = {"dead_lettered": sum(dead.values()), "reread": 0, "held": read - released - sum(dead.values()) - 1,
             "deleted": 1, "released": released}
    progress = {"dead_by_reason": dead, "watermark_ms": 1_700_000_000_000, "now_ms": 1_700_000_060_000,
                "consumer_lag": parts["held"]}
    return RunSummary({"kafka_records_read": read, "dead_lettered": sum(dead.values())}, Path("out"), 2.0,
                      "shuffle", parts, {"releases": 1 if released else 0, "progress": progress})


def _samples(metrics: JobMetrics) -> dict[tuple[str, tuple], float]:
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_progress_line_and_metrics_of_runs() -> None:
    first = _shuffle_summary(100, 60, {"bad signature": 5, "late": 2})
    second = _shuffle_summary(50, 0, {"late": 3})
    line = progress_line(first)
    assert "read 100" in line and "released 60" in line and "held 32" in line and "deleted 1" in line
    assert "dead-lettered 7 (bad signature 5, late 2)" in line
    assert "watermark 2023-11-14T22:13:20Z (lag 60 s)" in line and "consumer lag 32" in line
    metrics = JobMetrics("shuffle")
    metrics.observe(first)
    metrics.observe(second)
    got = _samples(metrics)
    stage = (("stage", "shuffle"),)
    assert got[("esa_records_read_total", stage)] == 150
    assert got[("esa_records_released_total", stage)] == 60
    assert got[("esa_records_deleted_total", stage)] == 2
    assert got[("esa_runs_total", stage)] == 2
    assert got[("esa_records_dead_lettered_total", (("reason", "late"), *stage))] == 5
    assert got[("esa_records_dead_lettered_total", (("reason", "bad signature"), *stage))] == 5
    assert got[("esa_held_records", stage)] == 46  # a gauge: the last run's
    assert got[("esa_consumer_lag_records", stage)] == 46
    assert got[("esa_watermark_timestamp_seconds", stage)] == 1_700_000_000


def test_records_read_counts_a_held_set_once() -> None:
    """The second run re-reads the 32 sets the first held (their window may have closed) and 18 new ones: the
    counter grows by 18, so dead letters over reads is a ratio of records, not of reads."""
    first = _shuffle_summary(100, 60, {"late": 7})
    first.extra["progress"]["new_records"] = 100
    second = _shuffle_summary(50, 40, {"late": 3})
    second.extra["progress"]["new_records"] = 18
    metrics = JobMetrics("shuffle")
    metrics.observe(first)
    metrics.observe(second)
    stage = (("stage", "shuffle"),)
    assert _samples(metrics)[("esa_records_read_total", stage)] == 118
    assert first.accounting["read"] + second.accounting["read"] == 150  # the runs' own accounting is unchanged


def test_metrics_and_health_endpoints_serve_over_http() -> None:
    metrics = JobMetrics("analyze")
    summary = RunSummary({"kafka_records_read": 4}, Path("out"), 1.0, "analyze",
                         {"dead_lettered": 0, "reread": 0, "duplicate": 0, "held": 0, "analyzed": 4},
                         {"releases_written": 1, "progress": {"epsilon": {("app", "", "replacement"): 1.25}}})
    with metrics.serve(0) as server:
        base = f"http://127.0.0.1:{server.port}"
        metrics.set_status("running")
        metrics.observe(summary)
        text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert 'esa_cumulative_epsilon{crowd="",notion="replacement",spec="app"} 1.25' in text
        assert 'esa_records_released_total{stage="analyze"} 4.0' in text
        health = json.loads(urllib.request.urlopen(f"{base}/healthz", timeout=5).read())
        assert health["status"] == "running" and health["runs"] == 1
        metrics.set_status("out_of_space")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/healthz", timeout=5)
        assert refused.value.code == 503


def test_follow_reports_status_and_logs_each_run(caplog: pytest.LogCaptureFixture) -> None:
    summaries = iter([_shuffle_summary(10, 5, {}), _shuffle_summary(10, 5, {})])
    metrics = JobMetrics("shuffle")
    with caplog.at_level(logging.INFO, logger="esa.service"):
        follow(lambda: next(summaries), poll_seconds=0.01, max_runs=2, metrics=metrics)
    runs = [r for r in caplog.records if r.getMessage().startswith("run ")]
    assert len(runs) == 2 and runs[0].esa["stages"][0]["released"] == 5
    assert metrics.status == "stopping" and metrics.runs_done == 2


def test_an_internal_error_exits_1_with_the_traceback_logged_and_one_line(monkeypatch, restore_logging: None,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    def broken(_args: object) -> int:
        raise RuntimeError("an invariant broke\nsecond line")

    monkeypatch.setattr(cli, "_dispatch", broken)
    assert cli.main(["--log_format", "json", "privacy", "--mechanism", "grr", "--domain", "4", "--epsilon", "1",
                     "--n", "100", "--delta", "1e-6"]) == 1
    err = capsys.readouterr().err.splitlines()
    logged = [json.loads(line) for line in err if line.startswith("{")]
    plain = [line for line in err if not line.startswith("{")]
    assert len(logged) == 1 and logged[0]["level"] == "CRITICAL" and "RuntimeError" in logged[0]["traceback"]
    assert plain == ["esa privacy: internal error: RuntimeError: an invariant broke second line (traceback in the "
                     "log above; exit 1)"]


def test_a_value_error_inside_a_job_is_internal_not_usage(monkeypatch, restore_logging: None, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The grid demo's jam ended in exit 2, the code of a bad command line: a ValueError raised while a job
    runs is a bug (exit 1, traceback logged), while a job's missing flag stays a usage error (exit 2)."""
    import pipelines.shuffle

    def broken(_argv: object) -> None:
        raise ValueError("interval must be in (0, 0.01], got 0.016")

    monkeypatch.setattr(pipelines.shuffle, "run_from_argv", broken)
    from pipelines.cli_parser import DEFAULT_SPEC
    from transforms.trust.keys import init_keys

    init_keys(tmp_path / "keys")
    assert cli.main(["shuffle", "--spec", str(DEFAULT_SPEC), "--keys_dir", str(tmp_path / "keys")]) == 1
    err = capsys.readouterr().err
    assert "internal error: ValueError: interval must be in" in err and "Traceback" in err
    monkeypatch.undo()
    assert cli.main(["shuffle"]) == 2
    assert capsys.readouterr().err.strip().endswith("error: at least one --spec FILE.toml is required")
