"""The tables and figures that chapter 9 draws from the experiment records (``pathedu.experiments.plots``), and
the chapter's exercise checks (``pathedu.exercises.ch09``)."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from pathedu import tasks  # noqa: E402
from pathedu.exercises import ch09  # noqa: E402
from pathedu.experiments import make_config, plots, run_experiment  # noqa: E402

MAX_WIDTH_IN = 7.0


@pytest.fixture(scope="module")
def flipflop():
    record = plots.load("flipflop")
    assert record is not None, "pathedu/data/exp_flipflop.json is committed"
    return record


@pytest.fixture(scope="module")
def tiny():
    """A --tiny record of each experiment (CPU, seconds; its numbers mean nothing)."""
    return {name: run_experiment(name, config=make_config(name, tiny=True), device="cpu", out=False, progress=False)
            for name in ("flipflop", "word_problem", "mqrar")}


def test_load_returns_none_for_a_missing_file_and_names_a_bad_experiment(tmp_path):
    assert plots.load("mqrar", tmp_path / "absent.json") is None
    with pytest.raises(ValueError, match="`name`"):
        plots.load("flip_flop")


def test_rows_hold_every_seed_their_mean_and_the_paper(flipflop):
    rows = plots.flipflop_rows(flipflop)
    cfg = flipflop["config"]
    ran = [r for r in rows if r["seeds"]]
    assert len(ran) == len(cfg["mixers"]) * len(cfg["splits"])
    for row in ran:
        runs = [r for r in flipflop["runs"] if r["mixer"] == row["mixer"]]
        assert sorted(row["seeds"]) == sorted(cfg["seeds"])
        for r in runs:  # every seed, straight from the run, in percent
            assert row["seeds"][r["seed"]] == pytest.approx(100 * r["final"][row["split"]]["error"])
        summary = flipflop["summary"]["error_percent"][row["mixer"]][row["split"]]
        assert row["mean"] == pytest.approx(summary["mean"])
        assert row["paper"] == flipflop["summary"]["paper_table1_error_percent"].get(row["mixer"], {}).get(row["split"])
    paper_only = {r["mixer"] for r in rows if not r["seeds"]}
    assert paper_only == set(flipflop["summary"]["paper_table1_error_percent"]) - set(cfg["mixers"])
    assert not any(not r["seeds"] for r in plots.flipflop_rows(flipflop, paper_only=False))


def test_table_shows_small_errors_without_rounding_them_to_zero(flipflop):
    text = plots.format_flipflop_table(flipflop)
    assert plots.fmt_percent(0.0028) == "0.0028" and plots.fmt_percent(0) == "0" and plots.fmt_percent(None) == "-"
    assert plots.fmt_percent(6.875) == "6.9" and plots.fmt_percent(0.0001) == "0.0001"
    assert "0.00 " not in text and max(len(line) for line in text.splitlines()) <= 80
    assert sum(line.startswith(plots.label(m)) for line in text.splitlines() for m in flipflop["config"]["mixers"]) \
        == len(flipflop["config"]["mixers"])


def test_eval_curves_follow_the_history(flipflop):
    curves = plots.eval_curves(flipflop, "sparse")
    for r in flipflop["runs"]:
        steps, errs = curves[r["mixer"]][r["seed"]]
        assert steps == [p["step"] for p in r["history"]["eval"]]
        assert errs[-1] == pytest.approx(100 * r["final"]["sparse"]["error"])
    with pytest.raises(ValueError, match="`split`"):
        plots.eval_curves(flipflop, "long")


def _width_ok(fig):
    w = fig.get_size_inches()[0]
    plt.close(fig)
    return w <= MAX_WIDTH_IN


def test_flipflop_figures_draw_one_point_per_seed_and_fit_the_column(flipflop):
    fig = plots.plot_flipflop_sparse(flipflop)
    n_points = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
    papers = sum(1 for r in plots.flipflop_rows(flipflop)
                 if r["split"] == "sparse" and r["seeds"] and r["paper"] is not None)
    assert n_points == len(flipflop["runs"]) + papers
    assert _width_ok(fig)
    fig = plots.plot_flipflop_history(flipflop)
    assert len(fig.axes) == len(flipflop["config"]["splits"])
    assert len(fig.axes[1].lines) == len(flipflop["runs"])
    assert _width_ok(fig)


def test_the_paper_preset_figure_gives_each_mixer_its_own_colour():
    """Chapter 9 draws every mixer of ``--preset paper`` side by side (pathedu/data/exp_flipflop_paper.json): one dot
    per run and a cross per Table 1 entry, and no two mixers in one colour (stick-breaking and CoPE included)."""
    from pathlib import Path

    from pathedu.experiments import presets

    record = plots.load("flipflop", Path(plots.__file__).parents[1] / "data" / "exp_flipflop_paper.json")
    mixers = presets("flipflop")["paper"]["mixers"]
    assert sorted(record["config"]["mixers"]) == sorted(mixers)
    fig = plots.plot_flipflop_seeds([(plots.label(m), record, m) for m in mixers], "in_distribution")
    seeds = len(record["config"]["seeds"])
    dots = [c for c in fig.axes[0].collections if len(c.get_offsets()) == seeds]   # a cross is a single point
    crosses = [c for c in fig.axes[0].collections if len(c.get_offsets()) == 1]
    assert len(dots) == len(mixers) and sum(len(c.get_offsets()) for c in dots) == len(record["runs"])
    assert len(crosses) == sum(1 for m in mixers if m in record["summary"]["paper_table1_error_percent"])
    colours = {tuple(c.get_facecolor()[0]) for c in dots}
    assert len(colours) == len(mixers), "two mixers share a colour"
    assert _width_ok(fig)


def test_tiny_records_draw_and_describe(tiny):
    assert _width_ok(plots.plot_flipflop_history(tiny["flipflop"]))
    assert _width_ok(plots.plot_word_problem(tiny["word_problem"]))
    assert _width_ok(plots.plot_mqrar(tiny["mqrar"]))
    for name, record in tiny.items():
        lines = plots.describe(record)
        assert lines[0].startswith(f"experiment {name!r}") and "--tiny" in lines[0]
        assert f"{len(record['runs'])} runs" in lines[2]
    with pytest.raises(ValueError, match="`record` is from experiment"):
        plots.plot_mqrar(tiny["word_problem"])


def test_min_layers_reads_the_fewest_depth_per_seed_and_draws_none_above_the_deepest(tiny):
    """A record whose accuracies are set by hand: at length 6 rope needs 2 layers and path 1; at length 12
    rope reaches the threshold at no depth (drawn as an open marker on the "none" row), path needs 2."""
    from pathedu.experiments import word_problem

    rec = tiny["word_problem"]
    acc = {("rope", 6, 1): 0.5, ("rope", 6, 2): 0.95, ("path", 6, 1): 0.91, ("path", 6, 2): 0.99,
           ("rope", 12, 1): 0.2, ("rope", 12, 2): 0.89, ("path", 12, 1): 0.3, ("path", 12, 2): 0.9}
    runs = []
    for r in rec["runs"]:
        for length in (6, 12):
            runs.append({**r, "length": length,
                         "final": {**r["final"], "accuracy": acc[r["mixer"], length, r["n_layers"]]}})
    config = {**rec["config"], "lengths": [6, 12]}
    made = {**rec, "config": config, "runs": runs, "summary": word_problem.summarize(runs, config)}
    table = plots.min_layers(made)
    assert {k: v["seeds"] for k, v in table.items()} == {
        ("S3", "rope", 6): {0: 2}, ("S3", "rope", 12): {0: None}, ("S3", "path", 6): {0: 1},
        ("S3", "path", 12): {0: 2}}
    assert all(v["tried"] == [1, 2] and v["max_tried"] == 2 for v in table.values())
    fig = plots.plot_min_layers(made)
    ax = fig.axes[0]
    open_markers = [line for line in ax.lines if line.get_marker() == "o" and line.get_markerfacecolor() == "none"
                    and len(line.get_ydata())]
    assert len(open_markers) == 1 and list(open_markers[0].get_ydata()) == [3]  # rope at 12: none of 1-2
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "none"]
    assert _width_ok(fig)
    with pytest.raises(ValueError, match="`record` is from experiment"):
        plots.min_layers(tiny["mqrar"])
    # The last position alone: path at length 6 reaches the threshold there with 2 layers only.
    last = {("path", 6, 1): 0.5, ("path", 6, 2): 0.95}
    for r in runs:
        r["final"]["last_accuracy"] = last.get((r["mixer"], r["length"], r["n_layers"]), 0.1)
    by_last = plots.min_layers(made, metric="last_accuracy")
    assert by_last["S3", "path", 6]["seeds"] == {0: 2} and by_last["S3", "rope", 6]["seeds"] == {0: None}
    assert "last accuracy" in plots.plot_min_layers(made, metric="last_accuracy").axes[0].get_ylabel()
    plt.close("all")
    with pytest.raises(ValueError, match="`metric`"):
        plots.min_layers(made, metric="loss")


def test_the_committed_word_problem_grid_has_every_seed0_run_once():
    """plots.word_problem_grid: A5 and S5 at lengths 10 and 20, four mixers, depths 1-4, seed 0: one run each."""
    grid = plots.word_problem_grid()
    keys = [(r["group"], r["length"], r["mixer"], r["n_layers"]) for r in grid["runs"]]
    assert sorted(keys) == sorted((g, n, m, d) for g in ("A5", "S5") for n in (10, 20)
                                  for m in ("rope", "fox", "path", "deltanet") for d in (1, 2, 3, 4))
    assert {r["seed"] for r in grid["runs"]} == {0} and [s["runs"] for s in grid["sources"]] == [48, 4, 4, 8]


def test_mqrar_accuracies_list_every_run_by_mixer_and_n(tiny):
    rec = tiny["mqrar"]
    acc = plots.mqrar_accuracies(rec)
    cfg = rec["config"]
    assert set(acc) == {(m, n) for m in cfg["mixers"] for n in cfg["n_backs"]}
    assert all(len(v) == len(cfg["seeds"]) for v in acc.values())
    assert sorted(a for v in acc.values() for a in v) == sorted(r["final"]["accuracy"] for r in rec["runs"])
    with pytest.raises(ValueError, match="`record` is from experiment"):
        plots.mqrar_accuracies(tiny["word_problem"])


def test_two_mqrar_records_share_one_axis(tiny):
    """Chapter 9 draws the unaffected mixers of one series and the rerun ones of another on one axis: each call
    draws only the mixers asked for, tagged in the legend; a mixer the record did not run is refused."""
    rec = tiny["mqrar"]
    first, second = rec["config"]["mixers"][:1], rec["config"]["mixers"][1:]
    fig = plots.plot_mqrar(rec, mixers=first)
    plots.plot_mqrar(rec, ax=fig.axes[0], mixers=second, tag=", again")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == [f"{plots.label(m)} (mean)" for m in first] + [f"{plots.label(m)}, again (mean)" for m in second]
    plt.close(fig)
    open_before = plt.get_fignums()
    with pytest.raises(ValueError, match="`mixers`"):
        plots.plot_mqrar(rec, mixers=["stickbreaking"])
    assert plt.get_fignums() == open_before, "a refused call draws nothing"


def test_mqrar_mean_table_has_a_row_per_mixer_and_n_with_every_seed_and_the_mean(tiny):
    """Chapter 9's table at the paper's settings (pathedu/data/exp_mqrar_paper.json): one row per mixer and N, each
    seed's accuracy straight from its run, the mean as the record's summary has it, the paper's words on a mixer's
    first row; a seed that did not run is a dash and the mean is over the seeds that ran."""
    import copy
    from pathlib import Path

    record = plots.load("mqrar", Path(plots.__file__).parents[1] / "data" / "exp_mqrar_paper.json")
    mixers, ns, seeds = (record["config"][k] for k in ("mixers", "n_backs", "seeds"))
    text = plots.mqrar_mean_table([(plots.label(m), record, m) for m in mixers], paper={"path": "no loss"})
    lines = text.splitlines()
    assert lines[0] == "| mixer | N | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | paper |"
    body = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert len(body) == len(mixers) * len(ns)
    for i, (m, n) in enumerate((m, n) for m in mixers for n in ns):
        row = body[i]
        assert row[0] == (plots.label(m) if n == ns[0] else "") and row[1] == str(n)
        by_seed = {r["seed"]: r["final"]["accuracy"] for r in record["runs"] if r["mixer"] == m and r["n_back"] == n}
        assert row[2:2 + len(seeds)] == [f"{by_seed[s]:.3f}" for s in seeds]
        assert row[2 + len(seeds)] == f"{record['summary']['accuracy'][m][str(n)]['mean']:.3f}"
        assert row[-1] == ("no loss" if (m, n) == ("path", ns[0]) else "-" if n == ns[0] else "")
    assert "| paper |" not in plots.mqrar_mean_table([("x", record, mixers[0])])

    rec = copy.deepcopy(tiny["mqrar"])
    mixer, n, seed = rec["runs"][0]["mixer"], rec["runs"][0]["n_back"], rec["runs"][0]["seed"]
    rec["runs"] = [r for r in rec["runs"] if (r["mixer"], r["n_back"], r["seed"]) != (mixer, n, seed)]
    rest = [r["final"]["accuracy"] for r in rec["runs"] if (r["mixer"], r["n_back"]) == (mixer, n)]
    table = plots.mqrar_mean_table([("m", rec, mixer)], n_backs=[n], fmt="{:.6f}".format)
    cells = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    order = sorted({r["seed"] for r in tiny["mqrar"]["runs"]})
    assert cells[2 + order.index(seed)] == "-"
    assert cells[-1] == (f"{sum(rest) / len(rest):.6f}" if rest else "-")
    with pytest.raises(ValueError, match="`parts`"):
        plots.mqrar_mean_table([])
    with pytest.raises(TypeError, match="`paper`"):
        plots.mqrar_mean_table([("m", rec, mixer)], paper=["no loss"])
    with pytest.raises(ValueError, match="no run of 'cope'"):
        plots.mqrar_mean_table([("m", rec, "cope")])
    with pytest.raises(ValueError, match="`record` is from experiment"):
        plots.mqrar_mean_table([("m", tiny["word_problem"], mixer)])


def test_combine_keeps_the_selected_runs_and_recomputes_the_summary(tiny):
    """Chapter 9 reads runs of several series side by side: ``combine`` keeps exactly the selected runs, says how
    many came from each part, and summarises them as the experiment does; mixed experiments are refused."""
    from pathedu.experiments import word_problem

    rec = tiny["word_problem"]
    first = rec["config"]["mixers"][0]
    view = plots.combine([rec, rec], select=[lambda r: r["mixer"] == first, lambda r: r["mixer"] != first])
    assert sorted(map(json.dumps, view["runs"])) == sorted(map(json.dumps, rec["runs"]))
    assert [s["runs"] for s in view["sources"]] == [sum(r["mixer"] == first for r in rec["runs"]),
                                                    sum(r["mixer"] != first for r in rec["runs"])]
    assert view["summary"] == word_problem.summarize(view["runs"], view["config"]) == rec["summary"]
    only = plots.combine([rec], select=[lambda r: r["mixer"] == first])
    assert set(only["summary"]["groups"][rec["config"]["groups"][0]]) == {first}
    with pytest.raises(ValueError, match="`record` is from experiment"):
        plots.combine([rec, tiny["mqrar"]])
    with pytest.raises(ValueError, match="`select`"):
        plots.combine([rec], select=[None, None])
    with pytest.raises(ValueError, match="`parts`"):
        plots.combine([])


def test_a_record_round_trips_through_json(tmp_path, tiny):
    path = tmp_path / "exp_mqrar.json"
    path.write_text(json.dumps(tiny["mqrar"]))
    assert plots.load("mqrar", path)["summary"] == json.loads(json.dumps(tiny["mqrar"]["summary"]))


# ---------------------------------------------------------------------------
# The exercises of lab 9
# ---------------------------------------------------------------------------

def _answers(tokens):
    out = torch.full_like(tokens, tasks.IGNORE)
    last = torch.full((tokens.shape[0],), tasks.IGNORE, dtype=torch.long)
    for t in range(0, tokens.shape[1] - 1, 2):
        out[:, t + 1] = torch.where(tokens[:, t] == tasks.R, last, out[:, t + 1])
        last = torch.where(tokens[:, t] == tasks.W, tokens[:, t + 1], last)
    return out


def _prefix(table, tokens):
    cur, labels = torch.zeros(tokens.shape[0], dtype=torch.long), torch.empty_like(tokens)
    for t in range(tokens.shape[1]):
        cur = table[tokens[:, t], cur]
        labels[:, t] = cur
    return labels


def _fewest(acc, threshold):
    out = torch.zeros(acc.shape[0], dtype=torch.long)
    for row in range(acc.shape[0]):
        reached = [j + 1 for j in range(acc.shape[1]) if acc[row, j] >= threshold]
        out[row] = reached[0] if reached else 0
    return out


@pytest.mark.parametrize("check, right, wrongs", [
    (ch09.check_flipflop_answers, _answers, ch09._FLIPFLOP_WRONG),
    (ch09.check_prefix_products, _prefix, ch09._WORD_WRONG),
    (ch09.check_fewest_layers, _fewest, ch09._LAYERS_WRONG),
], ids=["flipflop", "prefix", "fewest"])
def test_checks_accept_the_solution_and_name_each_known_mistake(check, right, wrongs, capsys):
    assert check(right)
    for fn, message in wrongs:
        verdict = check(fn)
        assert not verdict and message in verdict.message
    capsys.readouterr()
