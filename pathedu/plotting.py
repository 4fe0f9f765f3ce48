"""Figures shared by the chapters (benchmark plots, attention heat maps)."""
from __future__ import annotations


def plot_benchmark(chapter_or_data, ax=None, *, ops=None, ratio: bool = False):
    """Plot committed GPU benchmark data: time (or ratio to SDPA) against T.

    ``chapter_or_data``: a chapter name (loads ``pathedu/data/bench_<chapter>.json``)
    or an already loaded dict.  The title records the device, the date of the run, dtype and sizes, so
    the figure always says where its numbers come from.
    """
    import matplotlib.pyplot as plt

    from .bench import load

    data = load(chapter_or_data) if isinstance(chapter_or_data, str) else chapter_or_data
    meta, rows = data["meta"], data["rows"]
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.0))
    names = ops or list(dict.fromkeys(r["op"] for r in rows))
    key = "ratio_to_sdpa" if ratio else "ms"
    for name in names:
        pts = sorted((r["T"], r[key]) for r in rows if r["op"] == name and key in r)
        if pts:
            ax.plot(*zip(*pts), marker="o", linestyle="--" if any(r["peer"] for r in rows if r["op"] == name) else "-",
                    label=name)
    ax.set_xscale("log", base=2)
    if not ratio:
        ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    which = meta.get("pass_", "forward")  # "forward" or "forward+backward"
    ax.set_ylabel(f"{which} time / SDPA's" if ratio else f"{which} time (ms, median)")
    s = meta["sizes"]
    ax.set_title(f"{meta['device']}, {run_date(meta)}\n{meta['dtype']}, B={s['B']} H={s['H']} D={s['D']}, {which}",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def run_date(meta: dict) -> str:
    """The day a committed GPU run was made (``meta["date"]``, ISO 8601), as ``YYYY-MM-DD``: figures name the
    device and the date of their data."""
    date = meta.get("date")
    if not date:
        raise ValueError("the data file's `meta` has no `date`: a figure must say when its data was measured")
    return str(date)[:10]
