"""Drawing pieces for the book's schematics: figures that explain an idea rather than report data.

Every schematic of the book is drawn by a code cell in its page (tagged ``schematic``), so that it is executed,
tested and kept in step with the notation. The pieces here keep the schematics of different chapters alike: one
palette for the two sides of every duality, boxes and arrows with the same weight, and a grid for the
$T \\times T$ matrices (masks, gates, scores) that most chapters draw.

All functions draw on a matplotlib ``Axes`` in data coordinates and return what they drew.
"""
from __future__ import annotations

from typing import Callable, Sequence

import matplotlib.pyplot as plt
from matplotlib import patches

# One colour per role, in every schematic of the book.
SOFTMAX = "#1f77b4"   # the softmax side (attention, a KV cache)
LINEAR = "#d62728"    # the linear side (an RNN, its state)
GATE = "#2ca02c"      # gates and their products
NEUTRAL = "#7f7f7f"   # masks, hidden entries, guides
LIGHT = "#f2f2f2"


def canvas(width: float = 6.8, height: float = 3.0, xlim: tuple[float, float] = (0, 10),
           ylim: tuple[float, float] = (0, 4)):
    """A figure with one frameless ``Axes`` whose data units are the drawing's units (equal aspect)."""
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    ax.set(xlim=xlim, ylim=ylim, aspect="equal")
    ax.axis("off")
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", color: str = NEUTRAL,
        fill: str | None = None, fontsize: float = 10, **kwargs):
    """A rounded box with its lower-left corner at ``(x, y)`` and ``text`` centred in it."""
    patch = patches.FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                   edgecolor=color, facecolor=fill or "white", linewidth=1.4, **kwargs)
    ax.add_patch(patch)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color="black")
    return patch


def arrow(ax, start: tuple[float, float], end: tuple[float, float], text: str = "", color: str = NEUTRAL,
          offset: tuple[float, float] = (0.0, 0.18), fontsize: float = 9, **kwargs):
    """An arrow from ``start`` to ``end``, labelled at its middle (moved by ``offset``)."""
    kwargs.setdefault("arrowprops", {})
    props = {"arrowstyle": "-|>", "color": color, "lw": 1.4, "shrinkA": 2, "shrinkB": 2} | kwargs.pop("arrowprops")
    drawn = ax.annotate("", xy=end, xytext=start, arrowprops=props, **kwargs)
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text,
                ha="center", va="center", fontsize=fontsize, color=color)
    return drawn


def grid(ax, n: int, colour: Callable[[int, int], str | None], x: float = 0.0, y: float = 0.0,
         size: float = 1.0, label: Callable[[int, int], str] | None = None, fontsize: float = 7):
    """An ``n x n`` matrix of cells (row ``i`` from the top, column ``j`` from the left), the cell ``(i, j)``
    filled with ``colour(i, j)`` (``None``: left blank) and labelled with ``label(i, j)``; ``(x, y)`` is the
    lower-left corner and ``size`` a cell's side."""
    drawn = []
    for i in range(n):
        for j in range(n):
            fill = colour(i, j)
            cx, cy = x + j * size, y + (n - 1 - i) * size
            drawn.append(ax.add_patch(patches.Rectangle((cx, cy), size, size, facecolor=fill or "white",
                                                         edgecolor="white" if fill else LIGHT, linewidth=1)))
            if label is not None and (text := label(i, j)):
                ax.text(cx + size / 2, cy + size / 2, text, ha="center", va="center", fontsize=fontsize)
    return drawn


def tokens(ax, labels: Sequence[str], y: float, x0: float = 0.5, step: float = 1.0, color: str = NEUTRAL,
           w: float = 0.8, h: float = 0.6, fontsize: float = 9):
    """A row of small boxes, one per token, centred at ``x0 + t * step``; returns their centres."""
    centres = []
    for t, text in enumerate(labels):
        cx = x0 + t * step
        box(ax, cx - w / 2, y - h / 2, w, h, text, color=color, fontsize=fontsize)
        centres.append((cx, y))
    return centres
