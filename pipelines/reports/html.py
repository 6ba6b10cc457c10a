"""``esa report OUTPUT_DIR``: one self-contained HTML page per spec, for an analyst to open.

Each page holds, per crowd: the estimate of the leading items over the windows with a 95% band
(± 1.96 stderr), the last window's estimates with 95% error bars, the cumulative central epsilon over the
windows (with its neighbouring notion), and the record accounting per window (clients, reports, deleted by
the crowd threshold) with the dead-letter counts by reason class. Why plain inline SVG and no library: the
page must open anywhere (no network, no CDN, nothing to install) and stay readable for years. A few lines
of inline script only mark the page as rendered once every chart has a layout box (what the browser test
checks); the page reads the same without it.
"""

from __future__ import annotations

import html
import math
import re
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from transforms.state.dead_letters import read_counts
from transforms.state.estimate_columns import neighbouring_notion
from transforms.state.estimates_store import read_estimates

Z95 = 1.96
WIDTH, HEIGHT, PAD = 720, 260, 48
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
COLUMNS = ["spec_id", "analysis", "window_end", "crowd_id", "item", "item_index", "estimate", "stderr", "n_reports",
           "n_clients", "n_deleted", "eps_local", "eps_central", "delta", "eps_central_cumulative",
           "delta_cumulative", "mechanism", "unit", "statistic"]
Y_TICKS = 5  # about this many labelled y values, each with a grid line
# Why n_deleted is null unless the spec opts in (transforms.analyzer.estimates): said where it would show.
NOT_PUBLISHED = "not published"
DELETIONS_NOTE = ("Deleted by threshold: \u201cnot published\u201d means the shuffler kept the count to itself, "
                  "because next to the reports it would reveal the exact crowd size the randomized deletion hides "
                  "(a spec may publish it with [crowd] publish_deletions = true).")
MAX_CROWDS = 6
STYLE = """body{font:14px system-ui,sans-serif;margin:2em auto;max-width:760px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}h3{font-size:1em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
th{background:#f3f3f3}svg{display:block;margin:.5em 0}.note{color:#555}"""
MARK_RENDERED = ("document.addEventListener('DOMContentLoaded',function(){var s=document.querySelectorAll('svg'),"
                 "ok=s.length>0;s.forEach(function(e){var b=e.getBBox();if(!(b.width>0&&b.height>0))ok=false});"
                 "document.body.setAttribute('data-rendered',ok?'ok':'empty')});")


def _when(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


class _Axes:
    """Maps data to the SVG's pixels; ``frame`` draws the axes with min/max labels."""
    def __init__(self, xs: list[float], lows: list[float], highs: list[float]) -> None:
        self.x0, self.x1 = min(xs), max(xs)
        self.y0, self.y1 = min([*lows, 0.0]), max([*highs, 0.0])
        self.single = self.x1 == self.x0
        if self.single:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1
        if self.y1 == self.y0:
            self.y1 = self.y0 + 1

    def x(self, value: float) -> float:
        return PAD + (value - self.x0) / (self.x1 - self.x0) * (WIDTH - 2 * PAD)

    def y(self, value: float) -> float:
        return HEIGHT - PAD + (value - self.y0) / (self.y1 - self.y0) * -(HEIGHT - 2 * PAD)

    def ticks(self) -> list[float]:
        """Round values (1, 2 or 5 times a power of ten apart) spanning the y range, about ``Y_TICKS``."""
        span = self.y1 - self.y0
        raw = span / Y_TICKS
        power = 10 ** math.floor(math.log10(raw))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
        first = math.ceil(self.y0 / step) * step
        return [first + i * step for i in range(int((self.y1 - first) / step + 1e-9) + 1)]

    def frame(self, x_labels: tuple[str, str], y_label: str) -> str:
        left, bottom = PAD, HEIGHT - PAD
        grid = "".join(f'<line class="grid" x1="{left}" y1="{self.y(v):.1f}" x2="{WIDTH - PAD}" y2="{self.y(v):.1f}" '
                       f'stroke="#e4e4e4"/><text class="tick" x="{left - 4}" y="{self.y(v) + 4:.1f}" font-size="11" '
                       f'text-anchor="end">{v:.3g}</text>' for v in self.ticks())
        return (grid + f'<line x1="{left}" y1="{bottom}" x2="{WIDTH - PAD}" y2="{bottom}" stroke="#888"/>'
                f'<line x1="{left}" y1="{PAD}" x2="{left}" y2="{bottom}" stroke="#888"/>'
                f'<line x1="{left}" y1="{self.y(0):.1f}" x2="{WIDTH - PAD}" y2="{self.y(0):.1f}" stroke="#bbb"/>'
                f'<text x="{left}" y="{bottom + 16}" font-size="11">{html.escape(x_labels[0])}</text>'
                f'<text x="{WIDTH - PAD}" y="{bottom + 16}" font-size="11" text-anchor="end">'
                f'{html.escape(x_labels[1])}</text>'
                f'<text x="4" y="{PAD - 8}" font-size="11">{html.escape(y_label)}</text>')


def _svg(body: str, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}"><title>{html.escape(title)}</title>{body}</svg>')


def series_chart(series: dict[str, list[tuple[int, float, float]]], unit: str, title: str) -> str:
    """Lines of estimate over window end, each with its 95% band (a polygon of ± 1.96 stderr)."""
    points = [p for values in series.values() for p in values]
    axes = _Axes([p[0] for p in points], [p[1] - Z95 * p[2] for p in points], [p[1] + Z95 * p[2] for p in points])
    labels = (f"one window, ending {_when(points[0][0])} UTC", "") if axes.single else (_when(axes.x0), _when(axes.x1))
    parts = [axes.frame(labels, unit)]
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        real = values
        if len(values) == 1:  # one window: a level across the chart with its band, not a lone dot
            (t, e, s), = values
            values = [(axes.x0, e, s), (t, e, s), (axes.x1, e, s)]
        upper = [f"{axes.x(t):.1f},{axes.y(e + Z95 * s):.1f}" for t, e, s in values]
        lower = [f"{axes.x(t):.1f},{axes.y(e - Z95 * s):.1f}" for t, e, s in reversed(values)]
        line = " ".join(f"{axes.x(t):.1f},{axes.y(e):.1f}" for t, e, _ in values)
        parts.append(f'<polygon class="band" points="{" ".join(upper + lower)}" fill="{colour}" fill-opacity="0.15"/>')
        parts.append(f'<polyline class="line" points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        parts.extend(f'<circle cx="{axes.x(t):.1f}" cy="{axes.y(e):.1f}" r="2.5" fill="{colour}"/>'
                     for t, e, _ in real)
        parts.append(f'<text x="{WIDTH - PAD + 4}" y="{PAD + 14 * i}" font-size="11" fill="{colour}">'
                     f'{html.escape(name[:12])}</text>')
    return _svg("".join(parts), title)


def bar_chart(bars: list[tuple[str, float, float]], unit: str, title: str) -> str:
    """One bar per item with its 95% error bar."""
    axes = _Axes([0.0, float(len(bars))], [e - Z95 * s for _, e, s in bars], [e + Z95 * s for _, e, s in bars])
    step = (WIDTH - 2 * PAD) / max(len(bars), 1)
    parts = [axes.frame(("", ""), unit)]
    for i, (name, estimate, stderr) in enumerate(bars):
        left, top, base = PAD + i * step + step * 0.15, axes.y(max(estimate, 0.0)), axes.y(min(estimate, 0.0))
        centre = PAD + (i + 0.5) * step
        parts.append(f'<rect class="bar" x="{left:.1f}" y="{top:.1f}" width="{step * 0.7:.1f}" '
                     f'height="{max(base - top, 0.5):.1f}" fill="#1f77b4"><title>{html.escape(name)}: '
                     f'{estimate:.4g} ± {Z95 * stderr:.2g}</title></rect>')
        low, high = axes.y(estimate - Z95 * stderr), axes.y(estimate + Z95 * stderr)
        parts.append(f'<line class="errorbar" x1="{centre:.1f}" x2="{centre:.1f}" y1="{low:.1f}" y2="{high:.1f}" '
                     'stroke="#222"/>')
        parts.append(f'<text x="{centre:.1f}" y="{HEIGHT - PAD + 14}" font-size="9" text-anchor="end" '
                     f'transform="rotate(-45 {centre:.1f} {HEIGHT - PAD + 14})">{html.escape(name[:14])}</text>')
    return _svg("".join(parts), title)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _crowd_section(crowd: str | None, rows: list[dict[str, Any]], top: int) -> str:
    windows = sorted({r["window_end"] for r in rows})
    unit = next((r["unit"] for r in rows if r.get("unit")), "estimate")
    by_item: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("statistic") in (None, "frequency", "mean", "quantile", "conditional_mean"):
            by_item[r["item"]].append(r)
    ranked = sorted(by_item, key=lambda k: -sum(r["estimate"] for r in by_item[k]) / len(by_item[k]))[:top]
    series = {k: sorted((r["window_end"], r["estimate"], r["stderr"]) for r in by_item[k]) for k in ranked}
    last = [(k, r["estimate"], r["stderr"]) for k in ranked[:30] for r in by_item[k] if r["window_end"] == windows[-1]]
    title = "all clients" if crowd is None else f"crowd {crowd}"
    latest = next(r for r in rows if r["window_end"] == windows[-1])
    out = [f"<h2>{html.escape(title)}</h2>", _privacy_line(latest),
           f"<h3>Estimates over {len(windows)} window(s): the {len(ranked)} leading items, 95% bands</h3>",
           series_chart(series, unit, f"estimates over windows, {title}"),
           f"<h3>Last window ({_when(windows[-1])} UTC): estimates with 95% error bars</h3>",
           bar_chart(last, unit, f"last window, {title}")]
    first = {w: next(r for r in rows if r["window_end"] == w) for w in windows}
    eps = [(w, float(first[w]["eps_central_cumulative"]), 0.0) for w in windows
           if first[w].get("eps_central_cumulative") is not None and math.isfinite(first[w]["eps_central_cumulative"])]
    notion = neighbouring_notion(first[windows[-1]])
    if eps:
        out += [f"<h3>Cumulative central ε over the windows ({notion} neighbours, at the δ in the table)</h3>",
                series_chart({"ε": eps}, "ε cumulative", f"cumulative epsilon, {title}")]
    out.append("<h3>Record accounting per window</h3>")
    out.append(_table(["window end (UTC)", "clients analysed", "reports", "deleted by threshold", "ε window",
                       "ε cumulative", "δ cumulative"],
                      [[_when(w), first[w]["n_clients"], first[w]["n_reports"], _deleted(first[w].get("n_deleted")),
                        f"{first[w]['eps_central']:.4g}", _fmt(first[w].get("eps_central_cumulative")),
                        _fmt(first[w].get("delta_cumulative"))] for w in windows]))
    if any(first[w].get("n_deleted") is None for w in windows):
        out.append(f'<p class="note">{html.escape(DELETIONS_NOTE)}</p>')
    return "\n".join(out)


def _privacy_line(row: dict[str, Any]) -> str:
    """What every chart below is under: ε_local, n and δ of the last window (the table has each window's)."""
    local = row.get("eps_local")
    local_text = "none (multi-message protocol)" if local is None or not math.isfinite(float(local)) \
        else f"{float(local):.4g}"
    return (f'<p class="privacy">ε_local {html.escape(local_text)} ({html.escape(str(row.get("mechanism")))}), '
            f'n = {int(row["n_clients"]):,} clients analysed, ε_central {float(row["eps_central"]):.4g} at '
            f'δ = {float(row["delta"]):.3g} (last window)</p>')


def _deleted(value: Any) -> str:
    return NOT_PUBLISHED if value is None else f"{int(value):,}"


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{float(value):.4g}"


def spec_page(spec: str, rows: list[dict[str, Any]], dead: list[dict[str, Any]], top: int) -> str:
    by_crowd: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_crowd[r["crowd_id"]].append(r)
    crowds = sorted(by_crowd, key=lambda c: -sum(r["n_clients"] for r in by_crowd[c]))
    sections = [_crowd_section(c, by_crowd[c], top) for c in crowds[:MAX_CROWDS]]
    note = (f'<p class="note">{len(crowds) - MAX_CROWDS} more crowd(s) not shown; query them with esa query '
            '--crowd.</p>') if len(crowds) > MAX_CROWDS else ""
    dead_html = _table(["stage", "reason", "count"], [[d["stage"], d["reason"], d["count"]] for d in dead]) \
        if dead else "<p>No dead letters in this output directory.</p>"
    ids = sorted({r["spec_id"] for r in rows})
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>esa report: {html.escape(spec)}'
            f'</title><style>{STYLE}</style></head><body><h1>esa report: {html.escape(spec)}</h1>'
            f'<p class="note">Spec id(s) {html.escape(", ".join(ids))}; mechanism {html.escape(rows[0]["mechanism"])};'
            f' generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Bands and bars are ± 1.96 standard errors.</p>'
            + "\n".join(sections) + note
            + f"<h2>Dead letters (analyst domain, by reason class)</h2>{dead_html}"
            + f"<script>{MARK_RENDERED}</script></body></html>")


def write_reports(output_dir: Path, target: Path | None = None, top: int = 8) -> list[Path]:
    """One ``<spec name>.html`` per spec of ``output_dir`` in ``target`` (default ``output_dir/report``)."""
    output_dir = Path(output_dir)
    table = read_estimates(output_dir, columns=COLUMNS)
    if table.num_rows == 0:
        raise ValueError(f"{output_dir} holds no estimates (looked under {output_dir / 'estimates'})")
    counts = output_dir / "dead_letters" / "counts"
    dead = read_counts(counts).to_rows() if counts.is_dir() else []
    by_spec: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in table.to_pylist():
        by_spec[row["analysis"]].append(row)
    target = Path(target) if target is not None else output_dir / "report"
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for spec, rows in sorted(by_spec.items()):
        path = target / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', spec)}.html"
        path.write_text(spec_page(spec, rows, dead, top), encoding="utf-8")
        written.append(path)
    return written
