"""The experiments' command line for series run in pieces (CPU, tiny sizes): presets, a record rewritten after
every run, runs skipped because a record already holds them, PaTH's w settings in every experiment, and runs that
stop once their accuracy has stopped rising."""
import json

import pytest
import torch

from pathedu.experiments import EXPERIMENTS, done_points, make_config, presets, run_experiment
from pathedu.experiments.__main__ import main as experiments_main
from pathedu.experiments._common import plateau


def _keys(record, *fields):
    return [tuple(r[f] for f in fields) for r in record["runs"]]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_the_paper_preset_sets_its_runs_and_keeps_them_at_tiny_sizes(name):
    """The "paper" preset puts stick-breaking among the mixers and gives PaTH the paper's w (rank 32, convolution
    of size 3); with tiny sizes the preset's runs stay (its grid settings), the sizes shrink; an unknown preset is
    refused by name."""
    full, tiny = make_config(name, preset="paper"), make_config(name, preset="paper", tiny=True)
    assert "stickbreaking" in full["mixers"] and "path" in full["mixers"] and full["seeds"] == [0, 1, 2]
    assert (full["w_conv"], full["w_rank"]) == (3, 32)
    assert tiny["mixers"] == full["mixers"] and tiny["seeds"] == full["seeds"] and tiny["tiny"]
    assert tiny["d_model"] < full["d_model"] and tiny["steps"] < full["steps"]
    assert make_config(name, preset="paper", seeds=[4])["seeds"] == [4]  # options come after the preset
    assert make_config(name)["w_conv"] == 0 and make_config(name)["w_rank"] is None
    with pytest.raises(ValueError, match="`preset`"):
        make_config(name, preset="no_such_preset")
    assert set(presets(name)) == {"paper"}


def test_paper_presets_hold_every_softmax_mixer_on_flipflop_and_the_baselines_plain_on_mqrar():
    ff = make_config("flipflop", preset="paper")
    assert ff["mixers"] == ["nope", "alibi", "fox", "rope", "path", "pathfox", "stickbreaking", "cope"]
    mq = make_config("mqrar", preset="paper")
    assert mq["short_conv"] == {} and mq["n_backs"] == [1, 2, 3, 4]
    wp = make_config("word_problem", preset="paper")
    assert (wp["groups"], wp["lengths"], wp["layers"]) == (["A5"], [20], [1, 2, 3, 4]) and wp["patience"] > 0


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_w_settings_reach_path_and_pathfox_only(name):
    """``w_conv`` and ``w_rank`` change the parameter count of PaTH's runs by exactly the convolution's ``HD K``
    and the low-rank projection's ``r (d + HD) - d HD``, and leave the other mixers' runs alone."""
    def n_params(**w):
        cfg = make_config(name, tiny=True, mixers=["path", "rope"], steps=1, **w)
        if name == "word_problem":
            cfg["layers"] = [1]
        if name == "mqrar":
            cfg["n_backs"] = [1]
        return {r["mixer"]: r["n_params"] for r in run_experiment(name, config=cfg, device="cpu", out=False,
                                                                  progress=False)["runs"]}

    cfg = make_config(name, tiny=True)
    d = HD = cfg["d_model"]
    layers = 1 if name == "word_problem" else cfg.get("n_layers", 1)
    plain, w = n_params(), n_params(w_conv=3, w_rank=8)
    assert w["path"] - plain["path"] == layers * (HD * 3 + 8 * (d + HD) - d * HD)
    assert w["rope"] == plain["rope"]


def test_the_record_is_rewritten_after_every_run(tmp_path):
    """A series that fails at its second run leaves a record of its first, with the settings narrowed to it."""
    out = tmp_path / "ff.json"
    cfg = make_config("flipflop", tiny=True, mixers=["rope", "no_such_mixer"], seeds=[0])
    with pytest.raises(ValueError, match="no_such_mixer"):
        run_experiment("flipflop", config=cfg, device="cpu", out=out, progress=False)
    rec = json.loads(out.read_text())
    assert _keys(rec, "seed", "mixer") == [(0, "rope")] and rec["config"]["mixers"] == ["rope"]
    assert set(rec["summary"]["error_percent"]) == {"rope"}
    assert not list(tmp_path.glob("*.tmp"))


def test_skip_done_trains_only_the_missing_runs_and_the_parts_merge(tmp_path, capsys):
    """``--skip-done RECORD`` leaves out the runs the record holds; the two records merge into the whole series;
    when nothing is left the command says so and writes nothing; a record made with other settings is refused
    by the setting's name."""
    from pathedu.experiments.merge import main as merge_main

    first, rest, whole = tmp_path / "first.json", tmp_path / "rest.json", tmp_path / "whole.json"
    base = ["flipflop", "--tiny", "--no-progress", "--mixers", "rope", "nope"]
    assert experiments_main(base + ["--seeds", "0", "--out", str(first)]) == 0
    assert experiments_main(base + ["--seeds", "0", "1", "--skip-done", str(first), "--out", str(rest)]) == 0
    assert _keys(json.loads(rest.read_text()), "seed", "mixer") == [(1, "rope"), (1, "nope")]
    assert merge_main([str(whole), str(first), str(rest)]) == 0
    assert sorted(_keys(json.loads(whole.read_text()), "seed", "mixer")) == [(s, m) for s in (0, 1)
                                                                              for m in ("nope", "rope")]
    capsys.readouterr()
    none = tmp_path / "none.json"
    assert experiments_main(base + ["--seeds", "0", "1", "--skip-done", str(whole), "--out", str(none)]) == 0
    assert "nothing to run" in capsys.readouterr().out and not none.exists()
    with pytest.raises(SystemExit):
        experiments_main(base + ["--seeds", "1", "--set", "lr=0.5", "--skip-done", str(first)])
    assert "lr" in capsys.readouterr().err


def test_done_points_compare_per_mixer_settings_only_for_shared_mixers():
    rec = run_experiment("mqrar", config=make_config("mqrar", tiny=True, mixers=["rope"], n_backs=[1],
                                                     short_conv={"rope": 2}), device="cpu", out=False,
                         progress=False)
    same = make_config("mqrar", tiny=True, mixers=["rope", "fox"], n_backs=[1, 2], short_conv={"rope": 2, "fox": 3})
    assert done_points("mqrar", same, [rec]) == {(1, 0, "rope")}
    with pytest.raises(ValueError, match="short_conv"):
        done_points("mqrar", {**same, "short_conv": {}}, [rec])
    with pytest.raises(ValueError, match="experiment"):
        done_points("flipflop", make_config("flipflop", tiny=True), [rec])


def test_parallel_series_keeps_the_finished_runs_when_a_process_fails(tmp_path):
    """--jobs 2 with one process failing: the other process's finished run is in the record before the error."""
    from pathedu.experiments.parallel import run_parallel

    out = tmp_path / "ff.json"
    cfg = make_config("flipflop", tiny=True, mixers=["rope", "no_such_mixer"], seeds=[0])
    with pytest.raises(RuntimeError, match="failed"):
        run_parallel("flipflop", cfg, jobs=2, device="cpu", out=out, progress=False)
    assert _keys(json.loads(out.read_text()), "seed", "mixer") == [(0, "rope")]


def test_parallel_skip_done(tmp_path):
    from pathedu.experiments.parallel import run_parallel

    cfg = make_config("mqrar", tiny=True)
    first = run_experiment("mqrar", config={**cfg, "n_backs": [1]}, device="cpu", out=False, progress=False)
    rest = run_parallel("mqrar", cfg, jobs=2, device="cpu", out=tmp_path / "mq.json", progress=False, skip=[first])
    assert _keys(rest, "n_back", "mixer") == [(2, "rope"), (2, "path")] and rest["config"]["n_backs"] == [2]
    with pytest.raises(ValueError, match="nothing to run"):
        run_parallel("mqrar", cfg, jobs=2, device="cpu", out=False, progress=False, skip=[first, rest])


@pytest.mark.parametrize("values, start, stop", [
    ([0.10, 0.20, 0.30, 0.40], 0, False),  # rising by 10 points an evaluation
    ([0.50, 0.502, 0.503, 0.504], 0, True),  # 0.4 points over three evaluations
    ([0.50, 0.502, 0.504, 0.506], 0, False),  # 0.6 points at the third: the best moves there
    ([0.50, 0.504, 0.508, 0.512], 0, False),  # +0.8 at the second: the best moves there
    ([0.50, 0.50, 0.50, 0.80], 0, False),  # a late jump resets the count
    ([0.10, 0.10, 0.10, 0.10], 2, False),  # only evaluations from step 2 count: two, not three
    ([0.10, None, 0.10, 0.10, 0.10], 0, True),  # an evaluation without the metric is not counted
])
def test_plateau_stops_after_patience_evaluations_without_min_delta(values, start, stop):
    evals = [{"step": i, "accuracy": v} for i, v in enumerate(values)]
    assert plateau("accuracy", min_delta=0.005, patience=3, start=start)(evals) is stop
    assert plateau("accuracy", min_delta=0.005, patience=0)(evals) is False
    with pytest.raises(ValueError, match="`patience`"):
        plateau("accuracy", min_delta=0.005, patience=-1)


def test_train_stops_at_the_evaluation_that_says_so_and_evaluates_once():
    from pathedu.models import build_model
    from pathedu.tasks import mqrar
    from pathedu.train import train

    torch.manual_seed(0)
    model = build_model("rope", vocab=16, d_model=16, n_layers=1, n_heads=2, form="matrix")
    x, y = mqrar(2, 16, n_keys=4, n_back=1, vocab=16, seed=0)
    calls = []
    hist = train(model, lambda step: (x, y), steps=20, eval_every=2, progress=False,
                 evaluate_fn=lambda m: calls.append(1) or {"accuracy": 0.0},
                 stop_when=lambda evals: evals[-1]["step"] >= 6)
    assert [e["step"] for e in hist["eval"]] == [2, 4, 6] and len(calls) == 3 and hist["stopped_at"] == 6


def test_word_problem_runs_stop_once_accuracy_is_flat_at_full_length():
    """With a learning rate too small to change anything the accuracy is flat: each run stops ``patience``
    evaluations after the first one at full length (step 4 here: lengths 2, 3, ... one step each), not before."""
    from pathedu.experiments.word_problem import full_length_step

    cfg = make_config("word_problem", tiny=True, mixers=["rope"], layers=[1], steps=40, lr=1e-12, patience=2,
                      eval_every=2)
    assert full_length_step(6, cfg) == 4
    (run,) = run_experiment("word_problem", config=cfg, device="cpu", out=False, progress=False)["runs"]
    assert run["history"]["stopped_at"] == 8 and [e["step"] for e in run["history"]["eval"]] == [2, 4, 6, 8]
    assert run["final"]["step"] == 8 and run["plateaued"] is True


def test_stick_breaking_runs_sit_beside_the_papers_stick_breaking_row():
    """Table 1's stick-breaking row is keyed by the mixer's name, so a run of it gets the paper's numbers and no
    paper-only row is added."""
    from pathedu.experiments import plots

    cfg = make_config("flipflop", tiny=True, mixers=["stickbreaking"], steps=1)
    rows = plots.flipflop_rows(run_experiment("flipflop", config=cfg, device="cpu", out=False, progress=False))
    sb = {r["split"]: r["paper"] for r in rows if r["mixer"] == "stickbreaking"}
    assert sb == {"in_distribution": 9.6, "sparse": 38.9, "dense": 0.0}
    assert {r["mixer"] for r in rows} == {"stickbreaking", "rope", "fox", "path"}
    assert plots.LABELS["stickbreaking"] == "stick-breaking" and plots.LABELS["cope"] == "CoPE"


def test_processes_spread_over_the_gpus_only_when_asked_for_cuda_and_there_are_several(monkeypatch):
    from pathedu.experiments.parallel import process_devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert process_devices("cuda", 3) == ["cuda:0", "cuda:1", "cuda:0"] and process_devices(None, 2) == ["cuda:0",
                                                                                                          "cuda:1"]
    assert process_devices("cuda:1", 2) == ["cuda:1", "cuda:1"] and process_devices("cpu", 1) == ["cpu"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert process_devices("cuda", 2) == ["cuda", "cuda"] and process_devices(None, 2) == [None, None]
