"""An image-like location density for the grid demo ([ESA] Tables III-IX reconstruct pictures like it).

Rendered, not shipped: the letters "ESA" inside a ring on a faint background, drawn with matplotlib's Agg
canvas into a ``height x width`` array and normalised to a probability density over the cells (row-major:
cell ``(x, y)`` is item ``y * width + x``). Deterministic, so a demo's truth can always be recomputed.
"""

from __future__ import annotations

from functools import cache

import numpy as np

BACKGROUND = 0.03  # share of the brightest cell's weight every cell keeps: the density is nowhere zero


@cache
def _rendered(width: int, height: int) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle

    fig = Figure(figsize=(width / 100, height / 100), dpi=100, facecolor="black")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_axis_off()
    ax.set_facecolor("black")
    ax.add_patch(Circle((0.5, 0.5), 0.44, fill=False, edgecolor="white", linewidth=max(1.0, width / 40)))
    ax.text(0.5, 0.5, "ESA", color="white", ha="center", va="center", fontsize=height * 0.26, fontweight="bold")
    canvas.draw()
    gray = np.asarray(canvas.buffer_rgba())[:, :, 0].astype(np.float64) / 255.0
    return gray[:height, :width]


def grid_density(width: int, height: int) -> np.ndarray:
    """Probability of each cell, shape ``(height, width)``, summing to 1."""
    if width < 8 or height < 8:
        raise ValueError(f"the grid picture needs at least 8 x 8 cells, got {width} x {height}")
    weights = BACKGROUND + _rendered(int(width), int(height))
    return weights / weights.sum()
