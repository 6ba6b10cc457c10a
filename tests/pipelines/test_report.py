"""``esa report``: one self-contained page per spec, checked as data (what each chart holds) and in a real
headless Chromium (it renders, every chart gets a layout box, the console stays silent, a screenshot)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipelines import cli
from transforms.state.estimates_store import write_release_estimates

HOUR = 3_600_000
START = 1_795_000_000_000 // HOUR * HOUR
ITEMS = ("<b>x</b>", "en-US", "de-DE", "fr-FR")  # a category name is data: it must come out escaped


def _rows(window: int, crowd: str | None, eps_cumulative: float) -> list[dict]:
    end = START + (window + 1) * HOUR
    return [{"schema_version": 1, "spec_id": "langs@abc", "analysis": "langs", "window_start": end - HOUR,
             "window_end": end, "crowd_id": crowd, "item": item, "item_index": i, "estimate": 0.4 - 0.1 * i,
             "stderr": 0.01 * (i + 1), "raw_estimate": 0.4 - 0.1 * i, "n_reports": 1000 + window,
             "n_clients": 1000 + window, "n_deleted": None, "eps_local": 2.0, "eps_central": 0.5, "delta": 1e-6,
             "mechanism": "olh", "parameters": "{}", "eps_central_cumulative": eps_cumulative,
             "windows_composed": window + 1, "delta_cumulative": 1e-6 * (window + 1), "release_id": f"r{window}"}
            for i, item in enumerate(ITEMS)]


@pytest.fixture
def output_dir(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    for window in range(3):
        for crowd in (None, "eu"):
            write_release_estimates(out, _rows(window, crowd, 0.5 + 0.3 * window), spec_name="langs",
                                    window_end_ms=START + (window + 1) * HOUR,
                                    release_id=f"r{window}{crowd or 'all'}", kind="histogram")
    return out


def test_one_page_per_spec_with_every_chart(output_dir: Path, capsys) -> None:
    assert cli.main(["report", str(output_dir), "--top", "3"]) == 0
    (page,) = capsys.readouterr().out.split()
    text = Path(page).read_text(encoding="utf-8")
    assert Path(page) == output_dir / "report" / "langs.html"
    assert "<script src" not in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert text.count("<h2>") == 3  # two crowds and the dead letters
    assert text.count('class="band"') == 2 * 3 + 2  # per crowd: 3 items, and the cumulative epsilon
    assert text.count('class="bar"') == text.count('class="errorbar"') == 2 * 3  # the last window, top 3
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text  # drawn (the top item), escaped
    assert "replacement neighbours" in text and "1.1" in text  # eps cumulative of the last window: 0.5 + 0.6
    assert len(re.findall(r"<tr><td>2026|<tr><td>\d{4}-", text)) == 2 * 3  # accounting: a row per window
    titles = re.findall(r"<title>([^<]*): ([0-9.]+) ± ([0-9.]+)</title>", text)
    assert ("en-US", "0.3", "0.039") in titles and ("de-DE", "0.2", "0.059") in titles  # estimate ± 1.96 stderr


def test_no_estimates_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    assert cli.main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{tmp_path} holds no estimates (looked under "
                                                    f"{tmp_path / 'estimates'})")


FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--enable-logging=stderr", "--v=0"]


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail("chromium is not installed: CI installs Debian's chromium package (.ci/run)", pytrace=False)
    return subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.slow
def test_the_page_renders_in_headless_chromium(output_dir: Path, tmp_path: Path) -> None:
    from pipelines.reports.html import write_reports

    (page,) = write_reports(output_dir)
    dom = chromium(page, tmp_path / "profile-dom", "--dump-dom")
    assert 'data-rendered="ok"' in dom.stdout, dom.stderr[-2000:]  # every chart has a layout box
    assert console_lines(dom.stderr) == []
    shot = tmp_path / "report.png"
    taken = chromium(page, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=800,2400")
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert console_lines(taken.stderr) == []
    # The console check sees errors: the same page with one broken script line.
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("</body>", "<script>notDefined()</script></body>"))
    seen = console_lines(chromium(broken, tmp_path / "profile-broken", "--dump-dom").stderr)
    assert any("notDefined is not defined" in line for line in seen)


def test_privacy_parameters_stand_next_to_the_charts(output_dir: Path) -> None:
    """ε_local, n and δ of the last window under each crowd's heading, before its first chart."""
    from pipelines.reports.html import write_reports

    (page,) = write_reports(output_dir)
    text = page.read_text(encoding="utf-8")
    lines = re.findall(r"<h2>[^<]*</h2>\s*<p class=\"privacy\">([^<]*)</p>\s*<h3>", text)
    assert len(lines) == 2, text[:3000]  # both crowds
    assert all("ε_local 2 (olh)" in ln and "n = 1,002 clients" in ln and "δ = 1e-06" in ln for ln in lines), lines


def test_deletions_say_why_they_are_not_shown(output_dir: Path) -> None:
    from pipelines.reports.html import NOT_PUBLISHED, write_reports

    text = write_reports(output_dir)[0].read_text(encoding="utf-8")
    cells = re.findall(r"<td>[^<]*</td><td>\d+</td><td>\d+</td><td>([^<]*)</td>", text)
    assert cells and set(cells) == {NOT_PUBLISHED} and "-" not in cells
    assert "publish_deletions" in text  # the reason, and how a spec opts in


def test_one_window_is_a_level_with_its_band_and_axes_have_ticks_and_grid(tmp_path: Path) -> None:
    from pipelines.reports.html import write_reports

    out = tmp_path / "one"
    write_release_estimates(out, _rows(0, None, 0.5), spec_name="langs", window_end_ms=START + HOUR,
                            release_id="r0", kind="histogram")
    text = write_reports(out)[0].read_text(encoding="utf-8")
    charts = text.split("<svg")[1:]
    series = charts[0]
    lines = re.findall(r'class="line" points="([^"]*)"', series)
    assert len(lines) == len(ITEMS)
    for points in lines:  # a horizontal line across the plot, not a single dot
        xs = [float(p.split(",")[0]) for p in points.split()]
        ys = {p.split(",")[1] for p in points.split()}
        assert max(xs) - min(xs) > 500 and len(ys) == 1, points
    assert "one window, ending" in series
    for chart in charts:  # every chart: at least three labelled y values, each with a grid line
        ticks = re.findall(r'class="tick"[^>]*>([^<]*)<', chart)
        assert len(ticks) >= 3 and chart.count('class="grid"') == len(ticks), ticks
        values = [float(t) for t in ticks]
        assert values == sorted(values) and len(set(values)) == len(values)
