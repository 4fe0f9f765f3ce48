r"""Tables and figures of the experiments, drawn from their records (``pathedu/data/exp_NAME.json``).

Chapter 9 of the book and its lab read the committed GPU data through these functions, so
that every number on the page comes from a file and none is typed by hand.

* :func:`load` -- the record of an experiment, or ``None`` when it has not been committed yet.
* :func:`flipflop_rows`, :func:`format_flipflop_table` -- flip-flop error (%) per mixer and
  split: the mean, every seed, and the PaTH paper's Table 1 beside them.
* :func:`eval_curves` -- error (%) at each evaluation step, per mixer, seed and split
  (from each run's ``history["eval"]``).
* :func:`plot_flipflop_sparse`, :func:`plot_flipflop_history` -- the two flip-flop figures.
* :func:`plot_word_problem`, :func:`plot_mqrar` -- the figures of the other two experiments
  (accuracy against depth and length; accuracy against N), for records of any size.
* :func:`min_layers`, :func:`plot_min_layers` -- the fewest layers reaching the threshold against the word
  length (the PaTH paper's Fig. 2); :func:`word_problem_grid` -- the committed seed-0 runs they read
  (:func:`make_word_problem_grid` writes them from the full records).
* :func:`plot_histories`, :func:`plot_grad_checks` -- training curves of runs side by side, and how far
  their gradient was from the float32 matrix form's along the way.
* :func:`describe` -- the structure of a record, as lines of text (what a run stores).
* :func:`markdown_table`, :func:`seed_cell` -- a table for the book's page (Markdown, rendered as an HTML table
  that a test measures against the text column), and every seed's value in one cell.
* :func:`flipflop_seed_table`, :func:`plot_flipflop_seeds` -- flip-flop rows taken from several records (each row
  one mixer of one record, e.g. a variant with a convolution on ``w``), every seed and the paper beside them.
* :func:`word_problem_table`, :func:`mqrar_seed_table` -- the other two tasks the same way.
* :func:`mqrar_mean_table` -- MQRAR-N with one row per mixer and N: every seed, the mean, the paper's words.
* :func:`plot_gradient_agreement` -- the kernels' gradient against the matrix form's along training runs, beside
  their accuracy.

Errors are in percent; a split with no scored position (possible in ``--tiny`` runs) has
error ``None`` and is left out of figures.  Figures are at most 7 inches wide.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import default_out, get_module

__all__ = ["LABELS", "SPLITS", "label", "load", "flipflop_rows", "format_flipflop_table", "fmt_percent",
           "eval_curves", "plot_flipflop_sparse", "plot_flipflop_history", "plot_word_problem", "min_layers",
           "plot_min_layers", "word_problem_grid", "make_word_problem_grid", "mqrar_accuracies",
           "plot_mqrar", "plot_histories", "plot_grad_checks", "describe", "markdown_table", "seed_cell",
           "flipflop_seed_table", "plot_flipflop_seeds", "word_problem_table", "mqrar_seed_table",
           "mqrar_mean_table",
           "plot_gradient_agreement"]

LABELS = {"nope": "NoPE", "alibi": "ALiBi", "fox": "FoX", "rope": "RoPE", "path": "PaTH", "pathfox": "PaTH-FoX",
          "linear": "linear", "retnet": "RetNet", "gla": "GLA", "deltanet": "DeltaNet",
          "gated_deltanet": "Gated DeltaNet", "stickbreaking": "stick-breaking", "cope": "CoPE",
          "stick_breaking": "stick-breaking"}
"""How the book names each mixer (``stick_breaking``: the paper's row in records written before stick-breaking
was a mixer)."""

SPLITS = ("in_distribution", "sparse", "dense")
_SPLIT_TITLES = {"in_distribution": "in-distribution", "sparse": "sparse", "dense": "dense"}
_COLORS = {"nope": "0.55", "alibi": "goldenrod", "fox": "tab:green", "rope": "tab:blue", "path": "tab:red",
           "pathfox": "tab:purple", "linear": "0.3", "retnet": "tab:olive", "gla": "tab:cyan",
           "deltanet": "tab:orange", "gated_deltanet": "tab:pink", "stickbreaking": "tab:brown",
           "stick_breaking": "tab:brown", "cope": "darkcyan"}
MAX_WIDTH_IN = 7.0


def label(mixer: str) -> str:
    """The book's name of ``mixer`` (``"path"`` -> ``"PaTH"``); unknown names are returned unchanged."""
    return LABELS.get(mixer, mixer)


def _color(mixer: str) -> str:
    return _COLORS.get(mixer, "k")


def load(name: str, path=None) -> dict | None:
    """The record of experiment ``name`` (``flipflop``, ``word_problem``, ``mqrar``): ``path`` if given,
    else ``pathedu/data/exp_NAME.json``; ``None`` when that file does not exist."""
    get_module(name)  # an unknown name raises ValueError naming `name`
    path = Path(path) if path is not None else default_out(name)
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def combine(parts, *, select=None) -> dict:
    """A record to read and plot, not to commit: the runs of several committed records of one experiment whose
    settings differ in a run constraint (e.g. ``time_limit_s``), which :func:`pathedu.experiments.merge_records`
    refuses.  ``parts``: records; ``select``: one predicate per part (a run -> bool; None keeps every run), e.g.
    the runs of one mixer from a series whose other mixers were rerun.  The summary is recomputed over the kept
    runs with the first part's other settings (threshold, metric) and the grid of the kept runs; ``sources`` says
    how many runs came from each part, with its commit and command."""
    parts = list(parts)
    if not parts:
        raise ValueError("`parts` is empty: nothing to combine")
    name = parts[0].get("experiment") if isinstance(parts[0], dict) else None
    for part in parts:
        _check_record(part, name)
    select = [None] * len(parts) if select is None else list(select)
    if len(select) != len(parts):
        raise ValueError(f"`select` must have one entry per part ({len(parts)}), got {len(select)}")
    runs, sources = [], []
    for part, keep in zip(parts, select):
        kept = [r for r in part["runs"] if keep is None or keep(r)]
        runs += kept
        sources.append({"commit": part.get("commit"), "command": part.get("command"), "runs": len(kept)})
    mod = get_module(name)
    config = dict(parts[0]["config"])
    for key, field in mod.GRID.items():  # the grid of the kept runs (seeds, mixers, ...), in their order
        config[key] = list(dict.fromkeys(r[field] for r in runs))
    return {"experiment": name, "config": config, "runs": runs, "sources": sources,
            "summary": mod.summarize(runs, config)}


GRID_FILE = "exp_word_problem_grid.json"
"""Chapter 9's seed-0 word-problem grid without the runs' training histories: what :func:`word_problem_grid` reads."""


def word_problem_grid() -> dict:
    """Chapter 9's seed-0 word-problem grid (``pathedu/data/exp_word_problem_grid.json``): A5 and S5 at lengths 10
    and 20, four mixers, one to four layers, each run with its settings and final accuracies.  The installed
    package ships this file instead of the four full records, with every run's training curve, that
    :func:`make_word_problem_grid` combines into it."""
    return json.loads((default_out("word_problem").parent / GRID_FILE).read_text())


def make_word_problem_grid(out=None) -> dict:
    """The grid :func:`word_problem_grid` reads, combined with :func:`combine` from the committed records of a clone:
    A5 at length 10 and S5 at lengths 10 and 20 (``exp_word_problem_lengths.json``), and A5 at length 20 from three
    series: RoPE from the first (``exp_word_problem.json``), PaTH with the fixed backward
    (``exp_word_problem_path_fixed.json``), FoX and DeltaNet (``exp_word_problem_fox_deltanet.json``); each run
    without its ``history``.  ``out``: a file to write it to (as the records are written)."""
    data = default_out("word_problem").parent
    parts = [load("word_problem", path=data / name) for name in (
        "exp_word_problem_lengths.json", "exp_word_problem.json", "exp_word_problem_path_fixed.json",
        "exp_word_problem_fox_deltanet.json")]
    grid = combine(parts, select=[None, lambda r: r["mixer"] == "rope" and r["seed"] == 0, lambda r: r["seed"] == 0,
                                  None])
    grid["runs"] = [{k: v for k, v in r.items() if k != "history"} for r in grid["runs"]]
    if out is not None:
        Path(out).write_text(json.dumps(grid, indent=1, allow_nan=True) + "\n")
    return grid


def _check_record(record, experiment: str) -> dict:
    if not isinstance(record, dict) or "runs" not in record or "config" not in record:
        raise ValueError("`record` must be an experiment record (a dict with 'config' and 'runs')")
    if record.get("experiment") != experiment:
        raise ValueError(f"`record` is from experiment {record.get('experiment')!r}, not {experiment!r}")
    return record


def _percent(metrics: dict, key: str = "error"):
    value = metrics.get(key) if metrics else None
    return None if value is None else 100.0 * value


def fmt_percent(x) -> str:
    """A percentage for a table: ``"0"`` for exactly 0, two significant digits below 1
    (``0.0028 -> "0.0028"``, never a misleading ``"0.00"``), one decimal above; ``"-"`` for ``None``."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) < 1:
        return f"{x:.2g}"
    return f"{x:.1f}"


# ---------------------------------------------------------------------------
# Flip-flop
# ---------------------------------------------------------------------------

def flipflop_rows(record: dict, *, paper_only: bool = True) -> list[dict]:
    """One row per (mixer, split), in the record's mixer order, then (``paper_only=True``) the paper's mixers
    that were not run:
    ``{"mixer", "split", "mean", "seeds": {seed: error %}, "paper"}`` (``mean``: over the seeds with a
    scored read; ``paper``: Table 1 of the PaTH paper, ``None`` where it has no entry)."""
    record = _check_record(record, "flipflop")
    paper = record.get("summary", {}).get("paper_table1_error_percent", {})
    splits = list(record["config"]["splits"])
    rows = []
    for mixer in record["config"]["mixers"]:
        runs = [r for r in record["runs"] if r["mixer"] == mixer]
        for split in splits:
            seeds = {r["seed"]: _percent(r["final"].get(split)) for r in runs}
            vals = [v for v in seeds.values() if v is not None]
            rows.append({"mixer": mixer, "split": split, "mean": sum(vals) / len(vals) if vals else None,
                         "seeds": seeds, "paper": paper.get(mixer, {}).get(split)})
    for mixer, table in (paper.items() if paper_only else ()):
        if mixer not in record["config"]["mixers"]:
            rows += [{"mixer": mixer, "split": split, "mean": None, "seeds": {}, "paper": table.get(split)}
                     for split in splits]
    return rows


def format_flipflop_table(record: dict, *, paper_only: bool = True) -> str:
    """:func:`flipflop_rows` as a fixed-width text table (error in %), one line per mixer and split
    (``paper_only=False``: leave out the paper's mixers that the record did not run)."""
    rows = flipflop_rows(record, paper_only=paper_only)
    seeds = list(record["config"]["seeds"])
    head = f"{'mixer':15s}{'split':17s}{'mean':>7s}" + "".join(f"{'s' + str(s):>8s}" for s in seeds) + f"{'paper':>9s}"
    lines = ["flip-flop error (%): ours (mean and each seed) and the PaTH paper's Table 1", head, "-" * len(head)]
    last = None
    for row in rows:
        name = label(row["mixer"]) if row["mixer"] != last else ""
        last = row["mixer"]
        cells = "".join(f"{fmt_percent(row['seeds'].get(s)):>8s}" for s in seeds)
        lines.append(f"{name:15s}{_SPLIT_TITLES.get(row['split'], row['split']):17s}{fmt_percent(row['mean']):>7s}"
                     f"{cells}{fmt_percent(row['paper']):>9s}")
    return "\n".join(lines)


def eval_curves(record: dict, split: str = "sparse") -> dict:
    """``{mixer: {seed: ([step, ...], [error %, ...])}}`` from each run's ``history["eval"]`` (every evaluation
    during training and the final one), for the flip-flop ``split``; points without a scored read are dropped."""
    record = _check_record(record, "flipflop")
    if split not in record["config"]["splits"]:
        raise ValueError(f"`split` must be one of {', '.join(record['config']['splits'])}; got {split!r}")
    out: dict = {}
    for r in record["runs"]:
        steps, errs = [], []
        for point in r["history"]["eval"]:
            e = _percent(point.get(split))
            if e is not None:
                steps.append(point["step"])
                errs.append(e)
        out.setdefault(r["mixer"], {})[r["seed"]] = (steps, errs)
    return out


def _finish_error_plot(fig, ax, split: str):
    """The y axis (error in % on ``split``, from 0), grid and legend of a per-mixer error plot; returns ``fig``."""
    ax.set_ylabel(f"{_SPLIT_TITLES.get(split, split)} error (%)")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def plot_flipflop_sparse(record: dict, split: str = "sparse", ax=None):
    """Final error (%) on ``split`` per mixer: one dot per seed, a bar at the mean, and the paper's Table 1
    value as a cross where it has one.  Returns the figure."""
    import matplotlib.pyplot as plt

    rows = [r for r in flipflop_rows(record) if r["split"] == split and r["seeds"]]
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.0, 3.0))
    else:
        fig = ax.figure
    for x, row in enumerate(rows):
        c = _color(row["mixer"])
        vals = [v for v in row["seeds"].values() if v is not None]
        if row["mean"] is not None:
            ax.bar(x, row["mean"], width=0.6, color=c, alpha=0.35)
        ax.scatter([x + d for d in _jitter(len(vals))], vals, color=c, s=22, zorder=3,
                   label="our seeds" if x == 0 else None)
        if row["paper"] is not None:
            ax.scatter([x], [row["paper"]], marker="x", color="k", s=40, zorder=4,
                       label="paper (Table 1)" if not any(r["paper"] is not None for r in rows[:x]) else None)
    ax.set_xticks(range(len(rows)), [label(r["mixer"]) for r in rows])
    return _finish_error_plot(fig, ax, split)


def _jitter(n: int, width: float = 0.2) -> list[float]:
    if n <= 1:
        return [0.0] * n
    return [-width / 2 + width * i / (n - 1) for i in range(n)]


def plot_flipflop_history(record: dict, splits=SPLITS, fig=None):
    """Error (%) against training steps, one panel per split, one colour per mixer, one line per seed
    (the points are the evaluations in ``history["eval"]``).  Returns the figure."""
    import matplotlib.pyplot as plt

    splits = [s for s in splits if s in record["config"]["splits"]]
    if fig is None:
        fig = plt.figure(figsize=(MAX_WIDTH_IN, 2.7))
    axes = fig.subplots(1, len(splits), sharey=True, squeeze=False)[0]
    for ax, split in zip(axes, splits):
        for mixer, by_seed in eval_curves(record, split).items():
            for i, (steps, errs) in enumerate(by_seed.values()):
                ax.plot(steps, errs, "o-", color=_color(mixer), lw=1, ms=3, alpha=0.8,
                        label=label(mixer) if i == 0 else None)
        ax.set_title(_SPLIT_TITLES.get(split, split), fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0].set_ylabel("error (%)")
    axes[0].set_ylim(bottom=0)
    handles, labels_ = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels_, loc="upper center", ncol=len(labels_), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    return fig


# ---------------------------------------------------------------------------
# Word problems and MQRAR-N
# ---------------------------------------------------------------------------

def plot_word_problem(record: dict, fig=None):
    """Word problems: for each group, the accuracy (%) against the number of layers: every run a dot, the mean
    over the seeds that ran a line, one colour per mixer and line style per length.  Returns the figure."""
    import matplotlib.pyplot as plt

    record = _check_record(record, "word_problem")
    groups = record["summary"]["groups"]
    metric = record["summary"].get("metric", "accuracy")
    if fig is None:
        fig = plt.figure(figsize=(MAX_WIDTH_IN, 2.8))
    axes = fig.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    styles = ["-", "--", ":", "-."]
    for ax, (group, by_mixer) in zip(axes, groups.items()):
        for mixer, by_length in by_mixer.items():
            for li, (length, entry) in enumerate(by_length.items()):
                depth = sorted(entry["accuracy_by_layers"], key=int)
                acc = [entry["accuracy_by_layers"][d]["mean"] for d in depth]
                pts = [(int(d), 100 * a) for d, a in zip(depth, acc) if a is not None]
                if pts:
                    ax.plot(*zip(*pts), styles[li % len(styles)], color=_color(mixer), lw=1.2,
                            label=f"{label(mixer)}, length {length} (mean)")
                runs = [r for r in record["runs"] if r["group"] == group and r["mixer"] == mixer
                        and str(r["length"]) == str(length) and r["final"].get(metric) is not None]
                if runs:
                    ax.plot([r["n_layers"] for r in runs], [100 * r["final"][metric] for r in runs], "o", ms=3.5,
                            color=_color(mixer), alpha=0.7)
        ax.axhline(100 * record["summary"]["threshold"], color="k", lw=0.8, alpha=0.5)
        ax.set_xticks(sorted({r["n_layers"] for r in record["runs"] if r["group"] == group}))
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("layers")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{metric.replace('_', ' ')} (%)")
    axes[-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def _word_summary(record: dict, metric=None) -> dict:
    """The record's summary, recomputed when ``metric`` (``accuracy`` or ``last_accuracy``) is not its own."""
    record = _check_record(record, "word_problem")
    if metric is None or metric == record["summary"].get("metric"):
        return record["summary"]
    if metric not in ("accuracy", "last_accuracy"):
        raise ValueError(f"`metric` must be 'accuracy' or 'last_accuracy', got {metric!r}")
    return get_module("word_problem").summarize(record["runs"], {**record["config"], "metric": metric})


def min_layers(record: dict, metric=None) -> dict:
    """The fewest layers reaching the record's threshold, per ``(group, mixer, length)``: a dict with ``seeds``
    (seed -> the depth, or ``None`` when no depth that ran reached it), ``tried`` (the depths that ran, for
    every seed) and ``max_tried``.  Lengths are ints, in increasing order.  ``metric``: ``accuracy`` (every
    position) or ``last_accuracy`` (the last one); default the record's."""
    summary = _word_summary(record, metric)
    out = {}
    for group, by_mixer in summary["groups"].items():
        for mixer, by_length in by_mixer.items():
            for length in sorted(by_length, key=int):
                sel = [r for r in record["runs"]
                       if r["group"] == group and r["mixer"] == mixer and str(r["length"]) == str(length)]
                if not sel:
                    continue
                seeds = by_length[length]["min_layers_by_seed"]
                tried = sorted({r["n_layers"] for r in sel})
                out[group, mixer, int(length)] = {"seeds": {int(s): d for s, d in seeds.items()}, "tried": tried,
                                                  "max_tried": max(tried)}
    return out


def plot_min_layers(record: dict, fig=None, *, metric=None):
    """The PaTH paper's Fig. 2 read of the word problem: for each group, the fewest layers reaching the threshold
    against the word length, one colour per mixer; every seed a dot (jittered), the mean over seeds a line.  A
    seed for which no depth that ran reached the threshold is drawn one above the deepest model tried, as an
    open marker on the row labelled "none".  ``metric`` as in :func:`min_layers`.  Returns the figure."""
    import matplotlib.pyplot as plt

    table = min_layers(record, metric)
    groups = list(dict.fromkeys(g for g, _, _ in table))
    top = max((e["max_tried"] for e in table.values()), default=1) + 1
    if fig is None:
        fig = plt.figure(figsize=(MAX_WIDTH_IN, 2.8))
    axes = fig.subplots(1, max(1, len(groups)), sharey=True, squeeze=False)[0]
    for ax, group in zip(axes, groups):
        mixers = list(dict.fromkeys(m for g, m, _ in table if g == group))
        shifts = dict(zip(mixers, _jitter(len(mixers), 0.6)))
        lengths = sorted({n for g, _, n in table if g == group})
        for mixer in mixers:
            xs, means = [], []
            for n in lengths:
                entry = table.get((group, mixer, n))
                if entry is None:
                    continue
                vals = [top if d is None else d for d in entry["seeds"].values()]
                x = n + shifts[mixer]
                solved = [v for v in vals if v != top]
                ax.plot([x] * len(solved), solved, "o", ms=5, color=_color(mixer), alpha=0.8)
                ax.plot([x] * (len(vals) - len(solved)), [top] * (len(vals) - len(solved)), "o", ms=5,
                        mfc="none", color=_color(mixer), alpha=0.8)
                xs.append(x)
                means.append(sum(vals) / len(vals))
            ax.plot(xs, means, "-", color=_color(mixer), lw=1.2, label=label(mixer))
        ax.set_xticks(lengths)
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("word length")
        ax.grid(alpha=0.3)
    axes[0].set_yticks(range(1, top + 1))
    axes[0].set_yticklabels([str(d) for d in range(1, top)] + ["none"])
    axes[0].set_ylim(0.5, top + 0.5)
    name = (metric or record["summary"].get("metric", "accuracy")).replace("_", " ")
    axes[0].set_ylabel(f"fewest layers, {name} >= {100 * record['summary']['threshold']:.0f}%", fontsize=8)
    axes[-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def mqrar_accuracies(record: dict) -> dict:
    """``{(mixer, N): [final accuracy of each run, in the record's order]}`` of an MQRAR record."""
    record = _check_record(record, "mqrar")
    out = {}
    for r in record["runs"]:
        out.setdefault((r["mixer"], r["n_back"]), []).append(r["final"]["accuracy"])
    return out


def plot_mqrar(record: dict, ax=None, *, mixers=None, tag: str = ""):
    """MQRAR-N: accuracy (%) against N: every run a dot, the mean over seeds a line, one colour per mixer
    (the dots are spread a little sideways so that mixers do not hide each other).  ``mixers``: draw only
    these (default: all the record ran); ``tag``: appended to each legend entry, to tell two records drawn
    on one ``ax`` apart.  Returns the figure."""
    import matplotlib.pyplot as plt

    record = _check_record(record, "mqrar")
    summary = record["summary"]["accuracy"]
    if mixers is not None and not set(mixers) <= set(summary):
        raise ValueError(f"`mixers` must be among the record's {list(summary)}, got {list(mixers)}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.0, 3.0))
    else:
        fig = ax.figure
    shown = list(summary) if mixers is None else list(mixers)
    for i, mixer in enumerate(shown):
        by_n = summary[mixer]
        dx = 0.06 * (i - (len(shown) - 1) / 2)
        pts = [(int(n) + dx, 100 * s["mean"]) for n, s in by_n.items() if s["mean"] is not None]
        if pts:
            ax.plot(*zip(*sorted(pts)), "-", color=_color(mixer), label=f"{label(mixer)}{tag} (mean)")
        runs = [r for r in record["runs"] if r["mixer"] == mixer and r["final"].get("accuracy") is not None]
        ax.plot([r["n_back"] + dx for r in runs], [100 * r["final"]["accuracy"] for r in runs], "o", ms=3.5,
                color=_color(mixer), alpha=0.7)
    ax.set_xticks(sorted({int(n) for m in shown for n in summary[m]}))
    ax.set_xlabel("N (the N-th most recent assignment)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_histories(runs: list, keys=("loss", "grad_norm"), fig=None, smooth: int = 10):
    """Training curves of several runs side by side: one panel per history key (``loss``, ``grad_norm``,
    ``lr``), one line per ``(label, run)`` in ``runs``; a running mean over ``smooth`` logged points (the
    history is logged every ``log_every`` steps).  Returns the figure."""
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("`runs` is empty: nothing to plot")
    if fig is None:
        fig = plt.figure(figsize=(MAX_WIDTH_IN, 2.8))
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    for ax, key in zip(axes, keys):
        for lab, run in runs:
            h = run["history"]
            if key not in h:
                raise ValueError(f"a run's history has no {key!r}; it has {', '.join(h)}")
            y, w = [float(v) for v in h[key]], max(1, min(smooth, len(h[key])))
            csum = [0.0]
            for v in y:
                csum.append(csum[-1] + v)
            mean = [(csum[i + w] - csum[i]) / w for i in range(len(y) - w + 1)]
            ax.plot(h["step"][w - 1:], mean, lw=1, label=lab)
        ax.set_xlabel("step")
        ax.set_ylabel(key.replace("_", " ") + (" (log scale)" if key == "grad_norm" else ""))
        if key == "grad_norm":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_grad_checks(runs: list, fig=None):
    """How far the gradient a run trained with was from the float32 matrix form's, along the run: for each
    ``(label, run)`` whose history has ``"grad_checks"`` (:func:`pathedu.train.gradient_agreement`), the
    relative error of the run's own gradient (solid) and of the matrix form under the same autocast (dashed),
    log scale, beside the reference loss.  Returns the figure."""
    import matplotlib.pyplot as plt

    runs = [(lab, r) for lab, r in runs if r["history"].get("grad_checks")]
    if not runs:
        raise ValueError("no run has gradient checks (train with grad_check_every > 0)")
    if fig is None:
        fig = plt.figure(figsize=(MAX_WIDTH_IN, 2.8))
    ax_err, ax_loss = fig.subplots(1, 2)
    for i, (lab, run) in enumerate(runs):
        checks = run["history"]["grad_checks"]
        steps = [c["step"] for c in checks]
        color = f"C{i}"
        ax_err.plot(steps, [c["rel_err_run"] for c in checks], color=color, lw=1.2, label=f"{lab}: kernels")
        ax_err.plot(steps, [c["rel_err_matrix_amp"] for c in checks], color=color, lw=1, ls="--",
                    label=f"{lab}: matrix form")
        ax_loss.plot(steps, [c["loss_ref"] for c in checks], color=color, lw=1, label=lab)
    ax_err.set_yscale("log")
    ax_err.set_ylabel("|g - g_ref| / |g_ref|")
    ax_loss.set_ylabel("loss (fp32 matrix form)")
    for ax in (ax_err, ax_loss):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax_err.legend(fontsize=6)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------
# What a record holds
# ---------------------------------------------------------------------------

def describe(record: dict) -> list[str]:
    """The structure of an experiment record, as lines: the experiment, its device, the settings that
    vary between runs, how many runs, what one run stores (its keys and the history's), and the summary's
    keys.  Numbers that change from machine to machine (times, errors) are not shown."""
    if not isinstance(record, dict) or "runs" not in record:
        raise ValueError("`record` must be an experiment record (a dict with 'runs')")
    cfg = record["config"]
    varying = {k: cfg[k] for k in ("groups", "lengths", "layers", "n_backs", "mixers", "seeds") if k in cfg}
    run = record["runs"][0] if record["runs"] else {}
    lines = [f"experiment {record['experiment']!r} on {record.get('device_type', '?')}"
             f"{' (--tiny: sizes shrunk, numbers meaningless)' if cfg.get('tiny') else ''}",
             "varies: " + "; ".join(f"{k} {v}" for k, v in varying.items()),
             f"{len(record['runs'])} runs of {cfg['steps']} steps each",
             "a run holds: " + ", ".join(run),
             "  final: " + ", ".join(run.get("final", {})),
             "  history: " + ", ".join(run.get("history", {})),
             "summary: " + ", ".join(record.get("summary", {}))]
    return lines


# ---------------------------------------------------------------------------
# Tables and figures of every seed, across records (the book's results pages)
# ---------------------------------------------------------------------------

def seed_cell(values, fmt=fmt_percent, sep: str = " · ") -> str:
    """Every seed's value in one table cell, in the order given, ``"-"`` for a missing one (``None``):
    ``seed_cell([0.1, None, 0.25], "{:.2f}".format) == "0.10 · - · 0.25"``."""
    return sep.join("-" if v is None else fmt(v) for v in values)


def markdown_table(header, rows, align=None) -> str:
    """A Markdown (GitHub) table: ``header`` a list of column titles, ``rows`` lists of cells (converted with
    ``str``), ``align`` one of ``"l"``, ``"r"``, ``"c"`` per column (default: the first left, the rest right).
    A ``|`` inside a cell is escaped.  Display it with ``IPython.display.Markdown``."""
    header = [str(h) for h in header]
    if align is None:
        align = ["l"] + ["r"] * (len(header) - 1)
    if len(align) != len(header) or any(a not in "lrc" for a in align):
        raise ValueError(f"`align` must give 'l', 'r' or 'c' for each of the {len(header)} columns, got {align!r}")
    rule = {"l": ":--", "r": "--:", "c": ":-:"}

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    out = [line(header), "|" + "|".join(rule[a] for a in align) + "|"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row has {len(row)} cells, the header {len(header)}: {row!r}")
        out.append(line(row))
    return "\n".join(out)


def _flipflop_parts(parts):
    out = []
    for part in parts:
        name, record, mixer = part[:3]
        paper_key = part[3] if len(part) > 3 else mixer
        record = _check_record(record, "flipflop")
        if mixer not in record["config"]["mixers"]:
            raise ValueError(f"the record ran {record['config']['mixers']}, not {mixer!r}")
        paper = record.get("summary", {}).get("paper_table1_error_percent", {}).get(paper_key) if paper_key else None
        runs = sorted((r for r in record["runs"] if r["mixer"] == mixer), key=lambda r: r["seed"])
        out.append((name, record, runs, paper or {}))
    return out


def flipflop_seed_table(parts, splits=SPLITS) -> str:
    """Flip-flop error (%) as a Markdown table, one row per part and split, every seed in its own column and the
    PaTH paper's Table 1 beside it.  ``parts``: ``(row name, record, mixer)`` or ``(row name, record, mixer,
    paper_key)`` (``paper_key``: the paper's row to show, default ``mixer``; ``None`` for none), so that rows can
    come from several records (the same mixer with and without a setting).  Seeds are the union over the parts."""
    parts = _flipflop_parts(parts)
    seeds = sorted({r["seed"] for _, _, runs, _ in parts for r in runs})
    rows = []
    for name, _, runs, paper in parts:
        by_seed = {r["seed"]: r for r in runs}
        for i, split in enumerate(splits):
            cells = [fmt_percent(_percent(by_seed[s]["final"].get(split))) if s in by_seed else "-" for s in seeds]
            rows.append([name if i == 0 else "", _SPLIT_TITLES.get(split, split), *cells,
                         fmt_percent(paper.get(split))])
    return markdown_table(["mixer", "split", *[f"seed {s}" for s in seeds], "paper"], rows,
                          ["l", "l"] + ["r"] * (len(seeds) + 1))


def plot_flipflop_seeds(parts, split: str = "sparse", ax=None):
    """Final flip-flop error (%) on ``split``, one column per part of :func:`flipflop_seed_table`: a dot per
    seed, a bar at the mean, the paper's Table 1 as a cross where it has an entry.  Returns the figure."""
    import matplotlib.pyplot as plt

    parts = _flipflop_parts(parts)
    if ax is None:
        fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 3.0))
    else:
        fig = ax.figure
    crossed = False
    for x, (name, _, runs, paper) in enumerate(parts):
        c = _color(runs[0]["mixer"]) if runs else "k"
        vals = [v for v in (_percent(r["final"].get(split)) for r in runs) if v is not None]
        if vals:
            ax.bar(x, sum(vals) / len(vals), width=0.6, color=c, alpha=0.35)
        ax.scatter([x + d for d in _jitter(len(vals))], vals, color=c, s=22, zorder=3,
                   label="each seed" if x == 0 else None)
        if paper.get(split) is not None:
            ax.scatter([x], [paper[split]], marker="x", color="k", s=40, zorder=4,
                       label=None if crossed else "paper (Table 1)")
            crossed = True
    ax.set_xticks(range(len(parts)), [name for name, *_ in parts], fontsize=8)
    return _finish_error_plot(fig, ax, split)


def word_problem_table(record, *, mixers=None, layers=None, paper=None) -> str:
    """Word problems as a Markdown table: one row per (group, length, mixer, seed), one column per depth, each
    cell ``"all/last"``, the accuracy over all positions and at the last position (``"-"`` where that depth did
    not run), and a last column ``paper``: ``paper[(group, length, mixer)]`` (e.g. the fewest layers the paper
    reports) or ``"-"``.  ``record``: a word-problem record, e.g. :func:`combine` of several."""
    record = _check_record(record, "word_problem")
    runs = record["runs"]
    order = list(mixers) if mixers is not None else list(dict.fromkeys(r["mixer"] for r in runs))
    depths = sorted(layers if layers is not None else {r["n_layers"] for r in runs})
    cases = sorted({(r["group"], int(r["length"]), r["mixer"], r["seed"]) for r in runs if r["mixer"] in order},
                   key=lambda c: (c[0], c[1], order.index(c[2]), c[3]))
    final = {(r["group"], int(r["length"]), r["mixer"], r["seed"], r["n_layers"]): r["final"] for r in runs}
    rows, last_task = [], None
    for group, length, mixer, seed in cases:
        cells = []
        for d in depths:
            f = final.get((group, length, mixer, seed, d))
            cells.append("-" if f is None else f"{f['accuracy']:.2f}/{f['last_accuracy']:.2f}")
        task = f"{group}, {length}"
        rows.append([task if task != last_task else "", label(mixer), seed, *cells,
                     (paper or {}).get((group, length, mixer), "-")])
        last_task = task
    return markdown_table(["task", "mixer", "seed", *[str(d) for d in depths], "paper"],
                          rows, ["l", "l", "r"] + ["r"] * len(depths) + ["r"])


def _mqrar_finals(record: dict, mixer: str) -> dict:
    """``{(seed, N): final accuracy}`` of ``mixer``'s runs in an MQRAR record; ``ValueError`` if it ran none."""
    record = _check_record(record, "mqrar")
    final = {(r["seed"], r["n_back"]): r["final"]["accuracy"] for r in record["runs"] if r["mixer"] == mixer}
    if not final:
        raise ValueError(f"the record has no run of {mixer!r}")
    return final


def mqrar_seed_table(parts, n_backs=(1, 2, 3, 4), fmt="{:.2f}".format) -> str:
    """MQRAR-N accuracy as a Markdown table: for each part ``(row name, setting, record, mixer)`` one row per seed
    that ran, one column per N (``"-"`` where N was not run).  ``setting`` fills the second column (e.g. the width
    of the convolution on q, k, v); the name and the setting are written on a part's first row only."""
    rows = []
    for name, setting, record, mixer in parts:
        final = _mqrar_finals(record, mixer)
        for i, seed in enumerate(sorted({s for s, _ in final})):
            cells = [fmt(final[seed, n]) if (seed, n) in final else "-" for n in n_backs]
            rows.append([name if i == 0 else "", setting if i == 0 else "", seed, *cells])
    return markdown_table(["mixer", "conv.", "seed", *[f"N = {n}" for n in n_backs]], rows,
                          ["l", "l", "r"] + ["r"] * len(n_backs))


def mqrar_mean_table(parts, n_backs=(1, 2, 3, 4), fmt="{:.3f}".format, paper=None) -> str:
    """MQRAR-N accuracy as a Markdown table with one row per mixer and N: every seed in its own column (``"-"``
    where that seed did not run), then the mean over the seeds that ran.  ``parts``: ``(row name, record, mixer)``;
    seeds are the union over the parts; the name is written on a part's first row only.  ``paper``: an optional
    ``{mixer: text}``, what the paper says of that mixer, written in a last column on its first row (``"-"`` for
    a mixer it does not name); without it the table has no such column."""
    parts = list(parts)
    if not parts:
        raise ValueError("`parts` is empty: nothing to tabulate")
    if paper is not None and not isinstance(paper, dict):
        raise TypeError(f"`paper` must be a dict {{mixer: text}} or None, got {type(paper).__name__}")
    finals = [(name, mixer, _mqrar_finals(record, mixer)) for name, record, mixer in parts]
    seeds = sorted({s for _, _, final in finals for s, _ in final})
    rows = []
    for name, mixer, final in finals:
        for i, n in enumerate(n_backs):
            vals = [final.get((s, n)) for s in seeds]
            ran = [v for v in vals if v is not None]
            row = [name if i == 0 else "", n, *("-" if v is None else fmt(v) for v in vals),
                   fmt(sum(ran) / len(ran)) if ran else "-"]
            if paper is not None:
                row.append(paper.get(mixer, "-") if i == 0 else "")
            rows.append(row)
    header = ["mixer", "N", *[f"seed {s}" for s in seeds], "mean"] + (["paper"] if paper is not None else [])
    return markdown_table(header, rows, ["l", "r"] + ["r"] * (len(seeds) + 1) + (["l"] if paper is not None else []))


def plot_gradient_agreement(groups, fig=None):
    """Left: along each run, the error of the gradient it trained with relative to the error of the matrix form
    under the same autocast (both against the float32 matrix form, :func:`pathedu.train.gradient_agreement`;
    1 means the kernels cost no more than the autocast itself), log scale.  Right: the runs' evaluated accuracy.
    ``groups``: ``(label, colour, runs)``, each run with ``history["grad_checks"]``.  Returns the figure."""
    import matplotlib.pyplot as plt

    if not groups:
        raise ValueError("`groups` is empty: nothing to plot")
    if fig is None:
        fig = plt.figure(figsize=(MAX_WIDTH_IN, 2.8))
    ax_ratio, ax_acc = fig.subplots(1, 2)
    for lab, color, runs in groups:
        for i, run in enumerate(runs):
            checks = run["history"].get("grad_checks")
            if not checks:
                raise ValueError("a run has no gradient checks (train with grad_check_every > 0)")
            ax_ratio.plot([c["step"] for c in checks], [c["rel_err_run"] / c["rel_err_matrix_amp"] for c in checks],
                          color=color, lw=1, alpha=0.85, label=lab if i == 0 else None)
            ev = run["history"]["eval"]
            ax_acc.plot([e["step"] for e in ev], [100 * e["accuracy"] for e in ev], "o-", color=color, lw=1, ms=3,
                        alpha=0.85, label=lab if i == 0 else None)
    ax_ratio.axhline(1.0, color="k", lw=0.8, alpha=0.5)
    ax_ratio.set_yscale("log")
    ax_ratio.set_ylabel("kernels' gradient error /\nmatrix form's (same autocast)", fontsize=8)
    ax_acc.set_ylabel("accuracy (%)")
    ax_acc.set_ylim(0, 100)
    for ax in (ax_ratio, ax_acc):
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    ax_ratio.legend(fontsize=7)
    fig.tight_layout()
    return fig
