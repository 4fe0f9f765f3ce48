"""pathedu.train and the experiments' command line (CPU, tiny sizes)."""
import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from pathedu import tasks
from pathedu.experiments import EXPERIMENTS, make_config
from pathedu.experiments.__main__ import main as experiments_main
from pathedu.models import build_model
from pathedu.train import IGNORE, evaluate, lm_targets, lr_at, masked_loss, train


def test_lr_schedule():
    kw = dict(lr=1.0, steps=100, warmup=10, min_lr_ratio=0.1)
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(55, **kw) == pytest.approx(0.55)  # halfway through the cosine
    assert lr_at(100, **kw) == pytest.approx(0.1)
    decay = [lr_at(s, **kw) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))


def test_masked_loss_and_lm_targets():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 4, generator=g)
    targets = torch.tensor([[1, IGNORE, 2, IGNORE, 0], [IGNORE, IGNORE, 3, IGNORE, IGNORE]])
    keep = targets != IGNORE
    want = F.cross_entropy(logits[keep], targets[keep])
    assert masked_loss(logits, targets).item() == pytest.approx(want.item())
    assert masked_loss(logits, torch.full_like(targets, IGNORE)).item() == 0.0
    tokens, mask = tasks.flipflop(3, 10, p_ignore=0.2, seed=0)
    x, y = lm_targets(tokens, mask)
    assert torch.equal(x, tokens[:, :-1])
    assert torch.equal(y != IGNORE, mask[:, 1:])
    assert torch.equal(y[y != IGNORE], tokens[:, 1:][mask[:, 1:]])


def _flipflop_run(steps=40, seed=0):
    torch.manual_seed(seed)
    model = build_model("rope", vocab=5, d_model=32, n_layers=1, n_heads=2)
    ev = lm_targets(*tasks.flipflop(32, 32, p_ignore=0.5, seed=10 ** 6))

    def sample(step):
        return lm_targets(*tasks.flipflop(16, 32, p_ignore=0.5, seed=seed * 1000 + step))

    hist = train(model, sample, steps=steps, lr=3e-3, warmup=4, progress=False, seed=seed,
                 evaluate_fn=lambda m: evaluate(m, *ev), eval_every=20)
    return hist


def test_rope_learns_tiny_flipflop_and_is_reproducible():
    hist = _flipflop_run()
    assert set(hist) >= {"step", "loss", "lr", "grad_norm", "eval", "wall_time_s", "train_time_s", "steps"}
    assert len(hist["loss"]) == 40 and all(math.isfinite(v) for v in hist["loss"])
    first, last = sum(hist["loss"][:8]) / 8, sum(hist["loss"][-8:]) / 8
    assert first > 1.0  # 5 classes at the start: about log 5
    assert last < 0.8 * first, (first, last)
    assert [e["step"] for e in hist["eval"]] == [20, 40]
    assert hist["eval"][-1]["accuracy"] > 0.5  # better than guessing the bit
    again = _flipflop_run()
    assert again["loss"] == hist["loss"]


def test_train_errors():
    model = build_model("nope", vocab=5, d_model=16, n_layers=1, n_heads=1)
    with pytest.raises(ValueError, match="`steps`"):
        train(model, lambda s: None, steps=0, progress=False)
    with pytest.raises(ValueError, match="`lr`"):
        train(model, lambda s: None, steps=1, lr=0.0, progress=False)


REQUIRED = {"experiment", "command", "commit", "device", "versions", "config", "wall_time_s", "runs", "summary"}


def test_experiment_flipflop_tiny_writes_json(tmp_path, capsys):
    out = tmp_path / "ff.json"
    assert experiments_main(["flipflop", "--tiny", "--no-progress", "--out", str(out),
                             "--mixers", "rope", "path", "fox", "--seeds", "0", "1"]) == 0
    data = json.loads(out.read_text())
    assert REQUIRED <= set(data)
    assert {"torch", "triton"} <= set(data["versions"])
    assert data["config"]["tiny"] and data["config"]["n_layers"] == 1 and data["config"]["n_heads"] == 2
    assert data["config"]["splits"] == {"in_distribution": 0.8, "sparse": 0.98, "dense": 0.1}
    runs = data["runs"]
    assert [(r["seed"], r["mixer"]) for r in runs] == [(s, m) for s in (0, 1) for m in ("rope", "path", "fox")]
    for r in runs:
        assert set(r["final"]) >= {"step", "in_distribution", "sparse", "dense"}
        assert len(r["history"]["loss"]) == data["config"]["steps"]
    assert set(data["summary"]["error_percent"]) == {"rope", "path", "fox"}
    assert "pathedu.experiments flipflop --tiny" in data["command"]


def test_experiments_module_runs_as_a_command(tmp_path):
    out = tmp_path / "mq.json"
    proc = subprocess.run([sys.executable, "-m", "pathedu.experiments", "mqrar", "--tiny", "--no-progress",
                           "--out", str(out), "--set", "n_backs=[2]", "--mixers", "path"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert REQUIRED <= set(data)
    assert [(r["mixer"], r["n_back"]) for r in data["runs"]] == [("path", 2)]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_defaults_are_the_papers_settings(name):
    c = make_config(name)
    if name == "flipflop":
        assert (c["n_layers"], c["n_heads"], c["d_model"], c["length"], c["p_ignore"]) == (1, 2, 64, 512, 0.8)
    elif name == "word_problem":
        # The defaults are the committed slice: the paper's claim (A5 at length 20), depths 1-4.
        assert c["groups"] == ["A5"] and c["lengths"] == [20] and c["layers"] == [1, 2, 3, 4]
        assert {"rope", "path"} <= set(c["mixers"]) and c["beta_max"]["deltanet"] == 2.0
        assert c["curriculum_start"] + (c["steps"] - 1) // c["curriculum_steps"] >= 20  # full length is reached
    else:
        assert (c["n_layers"], c["d_model"], c["n_heads"], c["n_keys"], c["length"], c["n_backs"]) == \
            (2, 256, 2, 32, 768, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="unknown setting"):
        make_config(name, no_such_setting=1)


def test_word_problem_tiny(tmp_path):
    out = tmp_path / "wp.json"
    assert experiments_main(["word_problem", "--tiny", "--no-progress", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert len(runs) == 4 and {r["n_layers"] for r in runs} == {1, 2}
    assert all(len(r["final"]["position_accuracy"]) == data["config"]["lengths"][0] for r in runs)
    summary = data["summary"]["groups"]["S3"]["path"]["6"]
    assert set(summary) == {"accuracy_by_layers", "min_layers_by_seed"}


def test_parts_of_a_series_merge_into_one_record(tmp_path):
    """Two parts (different seeds) merge into one record holding every run and both commands; parts that
    differ in another setting refuse to merge."""
    from pathedu.experiments import make_config, merge_records, run_experiment

    parts = [run_experiment("flipflop", config=make_config("flipflop", tiny=True, seeds=[s], mixers=["rope", "nope"]),
                            device="cpu", out=False, progress=False, command=f"part {s}") for s in (0, 1)]
    merged = merge_records(parts)
    assert [(r["seed"], r["mixer"]) for r in merged["runs"]] == [(0, "rope"), (0, "nope"), (1, "rope"), (1, "nope")]
    assert merged["config"]["seeds"] == [0, 1] and merged["command"] == "part 0 && part 1"
    assert merged["summary"]["error_percent"]["rope"]["in_distribution"]["n"] == 2
    other = run_experiment("flipflop", config=make_config("flipflop", tiny=True, seeds=[2], mixers=["rope"], lr=0.5),
                           device="cpu", out=False, progress=False)
    with pytest.raises(ValueError, match="lr"):
        merge_records([parts[0], other])


def test_per_mixer_settings_merge_where_the_parts_ran_the_same():
    """A per-mixer setting (``short_conv``) is compared only for the mixers the parts ran: a part whose dict also
    names a mixer it did not run merges, and the merged dict covers both parts; the same mixer with two values,
    or with a value in one part and none (the default) in the other, refuses."""
    from pathedu.experiments import make_config, merge_records, run_experiment

    def part(mixers, short_conv, n_backs=(1,)):
        cfg = make_config("mqrar", tiny=True, mixers=list(mixers), n_backs=list(n_backs), short_conv=short_conv)
        return run_experiment("mqrar", config=cfg, device="cpu", out=False, progress=False)

    a = part(["rope"], {"rope": 2})
    b = part(["fox"], {"rope": 3, "fox": 2})  # names rope, which it did not run
    merged = merge_records([a, b])
    assert merged["config"]["short_conv"] == {"rope": 2, "fox": 2} and merged["config"]["mixers"] == ["rope", "fox"]
    with pytest.raises(ValueError, match="short_conv"):
        merge_records([a, part(["rope"], {"rope": 3}, n_backs=(2,))])
    with pytest.raises(ValueError, match="short_conv"):
        merge_records([a, part(["rope"], {}, n_backs=(2,))])


def test_parts_with_different_time_limits_merge_only_when_no_run_was_stopped():
    """A time limit that stopped no run changed no result: parts that differ only in it merge (the merged record
    keeps the largest limit); once a part has a run the limit cut short, they refuse."""
    from pathedu.experiments import make_config, merge_records, run_experiment

    def part(seed, limit):
        cfg = make_config("flipflop", tiny=True, seeds=[seed], mixers=["rope"], time_limit_s=limit)
        return run_experiment("flipflop", config=cfg, device="cpu", out=False, progress=False)

    a, b = part(0, 450), part(1, 470)
    assert all(r["history"]["stopped_at"] == r["history"]["steps"] for p_ in (a, b) for r in p_["runs"])
    merged = merge_records([a, b])
    assert merged["config"]["time_limit_s"] == 470 and merged["config"]["seeds"] == [0, 1]
    assert merge_records([a, part(2, None)])["config"]["time_limit_s"] is None
    b["runs"][0]["history"]["stopped_at"] -= 1  # as if the limit had cut it
    with pytest.raises(ValueError, match="time_limit_s"):
        merge_records([a, b])


@pytest.mark.parametrize("name", ["flipflop", "word_problem", "mqrar"])
def test_every_experiment_passes_its_short_convolution_to_the_model(name):
    """``short_conv`` (a filter size per mixer) reaches the models of every experiment: the named mixer's run has
    3 HD K more parameters than the same run without it, the other mixer's run none."""
    from pathedu.experiments import make_config, run_experiment

    def n_params(sc):
        cfg = make_config(name, tiny=True, short_conv=sc, steps=1)
        return {r["mixer"]: r["n_params"] for r in run_experiment(name, config=cfg, device="cpu", out=False,
                                                                  progress=False)["runs"]}

    cfg = make_config(name, tiny=True)
    first, second = cfg["mixers"][:2]
    plain, conv = n_params({}), n_params({first: 2})
    layers = max(cfg.get("layers", [cfg.get("n_layers", 1)]))
    assert conv[first] - plain[first] == layers * 3 * cfg["d_model"] * 2 and conv[second] == plain[second]


def test_word_problem_curriculum_length():
    from pathedu.experiments.word_problem import curriculum_length
    c = {"curriculum_start": 2, "curriculum_steps": 10}
    assert [curriculum_length(s, 5, c) for s in (0, 9, 10, 25, 30, 1000)] == [2, 2, 3, 4, 5, 5]
    assert curriculum_length(0, 5, {"curriculum_steps": 0}) == 5


def test_flipflop_runs_record_what_the_gates_learnt():
    from pathedu.experiments import make_config, run_experiment

    rec = run_experiment("flipflop", config=make_config("flipflop", tiny=True, mixers=["path", "rope"]),
                         device="cpu", out=False, progress=False)
    path_run, rope_run = rec["runs"]
    assert len(path_run["probe"]) == 1 and set(path_run["probe"][0]["beta"]) == {"mean", "above_1", "above_1.9"}
    assert 0 < path_run["probe"][0]["beta"]["mean"] < 2 and rope_run["probe"] == [{}]


def test_mqrar_runs_probe_beta_and_amp_is_a_setting():
    """MQRAR records what PaTH's beta does (as flip-flop does); ``amp`` is a setting, validated by name."""
    from pathedu.experiments import make_config, run_experiment

    cfg = make_config("mqrar", tiny=True, mixers=["path"], n_backs=[2], amp=False)
    (run,) = run_experiment("mqrar", config=cfg, device="cpu", out=False, progress=False)["runs"]
    assert set(run["probe"][0]["beta"]) == {"mean", "above_1", "above_1.9"} and len(run["probe"]) == cfg["n_layers"]
    with pytest.raises(ValueError, match="`amp`"):
        run_experiment("mqrar", config={**cfg, "amp": "yes"}, device="cpu", out=False, progress=False)


def test_parallel_runs_match_one_process_and_keep_its_order(tmp_path):
    """--jobs 3 on the CPU: the same runs, in the single process's order, with the same results (every run
    seeds itself); the record says how many processes ran and keeps each one's command."""
    from pathedu.experiments import make_config, run_experiment
    from pathedu.experiments.parallel import grid_points, run_parallel

    config = make_config("word_problem", tiny=True)
    points = grid_points("word_problem", config)
    assert len(points) == 4 and points[0] == {"groups": "S3", "lengths": 6, "seeds": 0, "mixers": "rope", "layers": 1}
    serial = run_experiment("word_problem", config=config, device="cpu", out=False, progress=False)
    par = run_parallel("word_problem", config, jobs=3, device="cpu", out=tmp_path / "wp.json", progress=False,
                       command="python -m pathedu.experiments word_problem --tiny --jobs 3")
    key = lambda r: (r["group"], r["length"], r["seed"], r["mixer"], r["n_layers"])  # noqa: E731
    assert [key(r) for r in par["runs"]] == [key(r) for r in serial["runs"]]
    for a, b in zip(par["runs"], serial["runs"]):
        assert a["history"]["loss"] == pytest.approx(b["history"]["loss"], rel=1e-5)
    assert par["config"] == config and par["summary"] == serial["summary"]
    assert par["parallel"]["jobs"] == 3 and len(par["parts"]) == 3 and par["parallel"]["elapsed_s"] > 0
    assert all("process" in p["command"] for p in par["parts"])
    assert json.loads((tmp_path / "wp.json").read_text())["runs"][0]["mixer"] == "rope"
    with pytest.raises(ValueError, match="`jobs`"):
        run_parallel("word_problem", config, jobs=0, device="cpu", out=False)


def test_parallel_parts_stay_in_a_workdir_and_merge(tmp_path):
    """With ``--workdir`` each process's part (rewritten after every run) stays on disk, and the parts merge
    into the same runs as the record; a folder that already holds parts is refused."""
    from pathedu.experiments.merge import main as merge_main

    work, out = tmp_path / "parts", tmp_path / "mq.json"
    assert experiments_main(["mqrar", "--tiny", "--no-progress", "--jobs", "2", "--workdir", str(work),
                             "--out", str(out)]) == 0
    parts = sorted(work.glob("part*.json"))
    assert len(parts) == 2 and all(len(json.loads(p.read_text())["runs"]) == 2 for p in parts)
    assert merge_main([str(tmp_path / "merged.json"), *map(str, parts)]) == 0
    merged, whole = (json.loads((tmp_path / n).read_text()) for n in ("merged.json", "mq.json"))
    key = lambda r: (r["n_back"], r["mixer"])  # noqa: E731
    assert sorted(map(key, merged["runs"])) == sorted(map(key, whole["runs"]))
    with pytest.raises(ValueError, match="`workdir`"):
        from pathedu.experiments import make_config
        from pathedu.experiments.parallel import run_parallel
        run_parallel("mqrar", make_config("mqrar", tiny=True), jobs=2, device="cpu", out=False, workdir=work)
    with pytest.raises(SystemExit):
        experiments_main(["mqrar", "--tiny", "--workdir", str(tmp_path / "w")])


def test_parallel_reports_a_failing_process():
    from pathedu.experiments import make_config
    from pathedu.experiments.parallel import run_parallel

    config = make_config("flipflop", tiny=True, mixers=["rope", "no_such_mixer"])
    with pytest.raises(RuntimeError, match="failed"):
        run_parallel("flipflop", config, jobs=2, device="cpu", out=False, progress=False)


def test_jobs_on_the_command_line(tmp_path, capsys):
    """``--jobs 2`` writes the record a single process would (same runs, same order) plus ``parallel``;
    ``--jobs 0`` is refused by name."""
    out = tmp_path / "mq.json"
    assert experiments_main(["mqrar", "--tiny", "--no-progress", "--jobs", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert REQUIRED <= set(data) and data["parallel"]["jobs"] == 2
    assert [(r["n_back"], r["mixer"]) for r in data["runs"]] == [(n, m) for n in (1, 2) for m in ("rope", "path")]
    assert "--jobs 2" in data["command"]
    with pytest.raises(SystemExit):
        experiments_main(["mqrar", "--tiny", "--jobs", "0"])
    assert "--jobs" in capsys.readouterr().err


def test_word_problem_generators_per_group():
    """By default A5 words use the paper's three 3-cycles (and inverses), S5 words a transposition and a 5-cycle;
    a list applies to every group, None (or a group the dict lacks) means tokens uniform over the group."""
    from pathedu.experiments.word_problem import generators_for

    config = make_config("word_problem")
    assert generators_for(config, "A5") == list(tasks.A5_PAPER_GENERATORS)
    assert generators_for(config, "S5") == ["(1 2)", "(1 2 3 4 5)"] and generators_for(config, "S3") is None
    for group in ("A5", "S5"):  # the generators (and inverses) generate the whole group: every element appears
        tokens, labels = tasks.word_problem(group, 256, 24, seed=0, generators=generators_for(config, group))
        assert len(set(labels.flatten().tolist())) == len(tasks.group_elements(group))
    assert len(set(tasks.word_problem("A5", 64, 8, generators=generators_for(config, "A5"))[0].flatten().tolist())) == 6
    assert generators_for({"generators": None}, "A5") is None
    assert generators_for({"generators": ["(1 2 3)"]}, "S5") == ["(1 2 3)"]
    with pytest.raises(ValueError, match="`generators`"):
        generators_for({"generators": "(1 2 3)"}, "A5")


def test_gradient_agreement_kernels_against_the_matrix_form_and_time_limit():
    """The diagnosis of a training run: the Triton kernels' gradient (interpreter) agrees with the fp32
    matrix form's on a batch; a run stopped by its time limit says where and is still evaluated."""
    from pathedu.experiments import make_config, run_experiment
    from pathedu.models import build_model
    from pathedu.tasks import mqrar
    from pathedu.train import gradient_agreement

    torch.manual_seed(0)
    model = build_model("path", vocab=16, d_model=32, n_layers=2, n_heads=2, form="triton")
    x, y = mqrar(4, 32, n_keys=4, n_back=1, vocab=16, seed=0)
    g = gradient_agreement(model, x, y, amp=False)
    assert g["rel_err_run"] < 1e-4 and g["cos_run"] > 1 - 1e-6 and g["grad_norm_ref"] > 0
    assert g["rel_err_matrix_amp"] == 0.0 and abs(g["loss_run"] - g["loss_ref"]) < 1e-5
    assert all(p.grad is None for p in model.parameters()) and model.blocks[0].mixer.form == "triton"

    cfg = make_config("mqrar", tiny=True, mixers=["path"], n_backs=[1], steps=4, grad_check_every=2, time_limit_s=1e-9)
    (run,) = run_experiment("mqrar", config=cfg, device="cpu", out=False, progress=False)["runs"]
    hist = run["history"]
    assert hist["stopped_at"] == 1 and hist["steps"] == 4 and hist["eval"][-1]["step"] == 1
    assert [c["step"] for c in hist["grad_checks"]] == [0] and hist["grad_checks"][0]["rel_err_run"] < 1e-4
    with pytest.raises(ValueError, match="time_limit_s"):
        run_experiment("mqrar", config={**cfg, "time_limit_s": 0}, device="cpu", out=False, progress=False)


def test_gradient_probe_compares_each_input_of_each_layer(tmp_path):
    """The per-input probe (CPU, interpreter): after a couple of steps, the Triton form's gradient of every
    input of every layer matches float64 autograd through the matrix form; the command writes its record."""
    from pathedu.experiments import gradient_probe

    out = tmp_path / "probe.json"
    assert gradient_probe.main(["--tiny", "--at", "2", "--set", "steps=3", "--out", str(out), "--no-progress"]) == 0
    rec = json.loads(out.read_text())
    assert rec["at"] == 2 and rec["history"]["stopped_at"] == 2 and len(rec["layers"]) == rec["config"]["n_layers"]
    for layer in rec["layers"]:
        assert set(layer["errors"]) == {"q", "k", "v", "w", "beta"}
        for e in layer["errors"].values():
            assert e["rel_rms_triton"] < 1e-4 and e["rel_rms_matrix_fp32"] < 1e-4 and e["ref_rms"] > 0
            assert e["rel_rms_triton_x_fp32"] < 1e-4  # fp32 inputs: fp32 meeting points, the default's
            assert 0 < e["rel_rms_triton_x_bf16"] < 3e-2  # rounded to bf16: close, not exact
    with pytest.raises(ValueError, match="`mixer`"):
        gradient_probe.input_gradient_errors("rope", {"args": [], "kwargs": {}, "do": None})


def test_path_stages_compare_a_run_with_itself(tmp_path):
    """The stage-by-stage diagnostic of PaTH's kernels (CPU, interpreter): stages of a small case compared with
    themselves are 0 apart, chained and isolated, for every stage."""
    from pathedu.experiments import path_stages

    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 40, 16) for _ in range(4))
    w = F.normalize(torch.randn(1, 2, 40, 16), dim=-1)
    beta = 2 * torch.rand(1, 2, 40)
    args = [q, k, v, w, beta]
    mine = path_stages.stages(args, do, "cpu")
    assert set(mine) == {k for group in path_stages._GROUPS for k in group}
    lines = path_stages.compare(args, do, mine)
    numbers = [float(tok) for line in lines for tok in line.split() if tok[:1].isdigit()]
    assert len(numbers) == 18 + 13 and max(numbers) == 0.0


def test_stopping_on_an_evaluation_step_evaluates_once():
    """``stop_after`` landing on an evaluation step: that step is logged and evaluated once, after the loop."""
    from pathedu.models import build_model
    from pathedu.tasks import mqrar
    from pathedu.train import train

    torch.manual_seed(0)
    model = build_model("rope", vocab=16, d_model=16, n_layers=1, n_heads=2, form="matrix")
    x, y = mqrar(2, 16, n_keys=4, n_back=1, vocab=16, seed=0)
    calls = []
    hist = train(model, lambda step: (x, y), steps=6, eval_every=2, stop_after=4, progress=False,
                 evaluate_fn=lambda m: calls.append(1) or {"accuracy": 0.0})
    assert [e["step"] for e in hist["eval"]] == [2, 4] and len(calls) == 2
    assert hist["stopped_at"] == 4 and hist["step"][-1] == 3


def test_autocast_only_where_the_gpu_has_native_bf16(monkeypatch):
    """amp=None: bf16 autocast on a CUDA device whose bf16 is native (compute capability 8.0+), fp32 on the CPU
    and on GPUs such as Colab's T4 (bf16 emulated); True / False are kept; anything else names `amp`."""
    from pathedu.train import _autocast_on

    cuda = torch.device("cuda")
    for native in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, n=native: n)
        assert _autocast_on(None, cuda) is native
        assert _autocast_on(True, cuda) is True and _autocast_on(False, cuda) is False
    assert _autocast_on(None, torch.device("cpu")) is False
    with pytest.raises(ValueError, match="`amp`"):
        _autocast_on("bf16", cuda)


def test_accuracy_per_position_adds_up_to_the_totals():
    """evaluate(per_position=True): one accuracy per position over its scored entries (None where none is
    scored); weighted by the scored counts they give the overall accuracy, and the last one is last_accuracy."""
    torch.manual_seed(0)
    model = build_model("rope", vocab=5, d_model=16, n_layers=1, n_heads=2)
    x, y = lm_targets(*tasks.flipflop(24, 12, p_ignore=0.5, seed=3))
    y[:, 0] = IGNORE  # a position with nothing scored
    y[:, -1] = torch.randint(0, 5, (24,), generator=torch.Generator().manual_seed(1))
    m = evaluate(model, x, y, batch_size=10, per_position=True)
    pos = m["position_accuracy"]
    assert len(pos) == x.shape[1] and pos[0] is None
    counts = (y != IGNORE).sum(0).tolist()
    assert sum(a * n for a, n in zip(pos, counts) if a is not None) == pytest.approx(m["correct"])
    assert pos[-1] == pytest.approx(m["last_accuracy"])
    assert "position_accuracy" not in evaluate(model, x, y)
