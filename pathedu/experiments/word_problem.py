r"""Word problems of A5 and S5: accuracy against sequence length and depth (the PaTH paper's Fig. 2).

Each run trains a model of ``n_layers`` layers on words of one length to output, at every position,
the prefix product (:func:`pathedu.tasks.word_problem`): sequence labelling with ``|G|`` classes.
The words are drawn from ``generators`` and their inverses: by default, per group, the PaTH paper's
A5 3-cycles ``(1 2 3), (1 2 4), (1 2 5)`` and, for S5, the transposition ``(1 2)`` and the 5-cycle
``(1 2 3 4 5)`` (a dict ``{group: [...]}``; a list applies to every group; ``None``, or a group missing
from the dict, draws tokens uniform over the whole group, as in Merrill et al.).  ``accuracy`` is over
every position of fresh words of the same length, ``last_accuracy`` over the last position alone, and
``position_accuracy`` position by position (recorded since the length series; the earlier records lack it).
The summary gives, for each group, mixer, seed and length, the smallest depth whose ``metric``
reaches ``threshold`` (``None``: no depth tried did).

Our sizes (the paper's Fig. 2 does not give them all): d_model 128, 2 heads, batch 128, lr 1e-3,
10000 steps; deltanet with ``beta`` in (0, 2) (``beta_max``).  The defaults are the slice committed in
``pathedu/data/exp_word_problem.json``: A5 at length 20 (the length of the paper's claim), rope and path,
1-4 layers, one seed: 8 runs.  The whole grid (A5 and S5, lengths 10 and 20, rope, fox, path and
deltanet, several seeds) is ``--set 'groups=["A5","S5"]' --set 'lengths=[10,20]' --mixers rope fox path
deltanet --seeds 0 1 2``: 96 runs, about twelve times the default slice's time.

**Curriculum over lengths** (``curriculum_steps``; 0 switches it off): training step ``s`` uses words
of length ``min(length, curriculum_start + s // curriculum_steps)``; evaluation is always at
``length``.  Without it the model does not learn: a 500-step check at A5 length 20 (rope, path,
deltanet; 1 and 2 layers) stayed at 6.6% accuracy, loss 3.88 -- exactly the score of copying the
token at position 0 (whose label is the token itself) and guessing at the 19 others (1/20 + 19/20 *
1/60; loss 19/20 * log 60).  CPU probes (``d_model`` 128, batch 128, lr 1e-3, 1 layer, rope): the
product table (length 2) is learnt to 98% in about 900 steps on its own, but only to 54% in 1500 steps
inside words of length 5 and not at all at length 20: the positions the model cannot yet predict
drown the signal of the ones it can.  Learning is stage by stage: a product of three (2 layers)
took about 2000 more steps at length 3; with lengths growing by one every 800 steps (2 layers,
path, length 5, 4000 steps) positions 0-2 reached 98% but position 3 stayed at 9% (those probes drew
tokens uniform over the group).

Uniform tokens make the model learn the whole ``|G| x |G|`` product table; the paper's generators only
the action of six elements.  CPU probes (A5, length 6, 1500 steps, lengths growing by one every 150 steps
from 2, d_model 128, batch 128, one seed, ``--jobs 2``), accuracy over all positions after 1500 steps
(1 / 2 layers, all still rising): with the paper's generators rope 0.64 / 0.80, path 0.64 / 0.84; with
uniform tokens rope 0.27 / 0.32, path 0.29 / 0.33.  So the generators are the default.  Either way the
curriculum and many steps are needed.  The defaults (lengths grow by one every 400 steps, so words reach
length 20 at step 7200 of 10000) were chosen so that the slice trains in under ten minutes on one GPU, not tuned.

**Stopping once the accuracy has stopped rising** (``patience``; 0, the default, switches it off): a run ends when
``metric`` has not risen by ``min_delta`` over ``patience`` evaluations in a row, counting the evaluations from the
step at which the curriculum reaches full length (before it, the growing length moves the accuracy by itself);
``steps`` is then a ceiling, and the cosine schedule runs over it.  Each run records ``plateaued``: whether its
evaluations end flat by that rule (a run that reached ``steps`` without it was still improving).

Time on one H100 (measured): alone, a step takes 6-9 ms at 1 layer and 19-29 ms at 4 layers
(launch-bound, about the same at lengths 10 to 40; ``python -m pathedu.experiments.timing word_problem``); eight
4-layer PaTH models trained at once in eight processes took 43-51 ms a step each, about five times the
throughput of one.  The defaults with ``--jobs 8`` (one run per process) took 9 minutes (the slowest run, path
at 4 layers, 515 s).  So: ``python -m pathedu.experiments word_problem --jobs
8``.  On Colab's T4 (not measured): the runs train in fp32 there
(no native bf16, :func:`pathedu.train.train`), and two CPU cores allow no parallel processes, so expect at least
the sum of the runs' single-process times, which ``python -m pathedu.experiments.timing NAME`` estimates on the
machine at hand.

What the committed runs show (chapter 9): A5 at length 20, seed 0, the fewest layers reaching 90% are 3 for PaTH
(with the fixed backward; 4 with seed 1) and for DeltaNet with ``beta`` in (0, 2), none of 1-4 for RoPE and FoX
(``exp_word_problem.json``, ``exp_word_problem_path_fixed.json``, ``exp_word_problem_fox_deltanet.json``).  Most
runs were still improving at the last evaluation, so the depths are a statement about this budget, not about
the mechanisms' limits.  At length 10 as well (``exp_word_problem_lengths.json``, seed 0): A5 needs 2 layers with
PaTH and 3 with RoPE, FoX and DeltaNet; S5 (words over (1 2) and (1 2 3 4 5)) 2 with every mixer at length 10 and,
at length 20, 3 with RoPE, PaTH and DeltaNet and none of 1-4 with FoX.  Runs of one seed: seeds 1-2 not run.
"""
from __future__ import annotations

from .. import tasks
from ._common import EVAL_SEED, RUN_DEFAULTS, data_seed, eval_split, plateau, short_conv, stats, train_run, w_settings

# The runs: the product of these settings, in run()'s loop order (setting -> field of a run's record).
GRID = {"groups": "group", "lengths": "length", "seeds": "seed", "mixers": "mixer", "layers": "n_layers"}

DEFAULTS = {
    "groups": ["A5"],
    "lengths": [20],
    "layers": [1, 2, 3, 4],
    "mixers": ["rope", "path"],
    "beta_max": {"deltanet": 2.0, "gated_deltanet": 2.0},
    "short_conv": {},  # mixer -> filter size of the short convolution on q, k, v (none by default)
    "w_conv": 0,  # PaTH's short convolution on w (filter size; 0: none), for path and pathfox only
    "w_rank": None,  # rank of PaTH's projection to w (None: full rank), for path and pathfox only
    "generators": {"A5": list(tasks.A5_PAPER_GENERATORS), "S5": ["(1 2)", "(1 2 3 4 5)"]},
    "seeds": [0],
    "d_model": 128, "n_heads": 2, "mlp_ratio": 4,
    "batch_size": 128, "steps": 10000, "lr": 1e-3, "weight_decay": 0.1, "warmup": 50, "clip": 1.0,
    "curriculum_start": 2, "curriculum_steps": 400,
    "eval_n": 512, "eval_batch_size": 512, "eval_every": 1000, "log_every": 10,
    "threshold": 0.9, "metric": "accuracy",
    # Stop a run once `metric` has not risen by `min_delta` over `patience` evaluations in a row, counting only
    # the evaluations from the step at which the curriculum reaches full length (patience 0: run every step).
    "patience": 0, "min_delta": 0.005,
    **RUN_DEFAULTS,
}
# Named settings (``--preset NAME``).  "paper": the comparison of the paper's Fig. 2 (RoPE, stick-breaking, FoX,
# PaTH with its w: a rank-32 projection, then a causal convolution of size 3) on A5 words of length 20 over the
# paper's generators, depths 1-4, three seeds; every run trains until its accuracy has stopped rising (less
# than 0.5 points over 4 evaluations, 2000 steps, once the words have reached full length), at most 15000 steps.
PRESETS = {"paper": {"groups": ["A5"], "lengths": [20], "layers": [1, 2, 3, 4],
                     "mixers": ["rope", "fox", "stickbreaking", "path"], "seeds": [0, 1, 2], "w_conv": 3,
                     "w_rank": 32, "steps": 15000, "eval_every": 500, "patience": 4, "min_delta": 0.005}}
TINY = {"groups": ["S3"], "lengths": [6], "layers": [1, 2], "mixers": ["rope", "path"], "d_model": 32,
        "batch_size": 4, "steps": 3, "warmup": 1, "curriculum_steps": 1, "eval_n": 8, "eval_batch_size": 8,
        "eval_every": 2, "log_every": 1}


def curriculum_length(step: int, length: int, config: dict) -> int:
    """The word length of training step ``step`` (0-based): ``length`` when ``curriculum_steps`` is 0,
    else ``min(length, curriculum_start + step // curriculum_steps)``."""
    every = config.get("curriculum_steps") or 0
    if every == 0:
        return length
    return max(1, min(length, config.get("curriculum_start", 2) + step // every))


def full_length_step(length: int, config: dict) -> int:
    """The first training step (0-based) whose words have length ``length`` under the curriculum (0 without one)."""
    every = config.get("curriculum_steps") or 0
    return 0 if every == 0 else max(0, (length - config.get("curriculum_start", 2)) * every)


def generators_for(config: dict, group: str):
    """The generators of ``group`` under ``config["generators"]`` (a dict per group, one list for every group,
    or None): a list of generators, or None for tokens uniform over the group."""
    gens = config.get("generators")
    if isinstance(gens, dict):
        return gens.get(group)
    if gens is None or isinstance(gens, (list, tuple)):
        return gens
    raise ValueError(f"`generators` must be a dict per group, a list or None, got {type(gens).__name__}")


def run(config: dict, *, device, progress: bool = True):
    every, start = config.get("curriculum_steps") or 0, config.get("curriculum_start", 2)
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"`curriculum_steps` must be an int >= 0 (0: no curriculum), got {every!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 1:
        raise ValueError(f"`curriculum_start` must be an int >= 1, got {start!r}")
    if config["metric"] not in ("accuracy", "last_accuracy"):
        raise ValueError(f"`metric` must be 'accuracy' or 'last_accuracy', got {config['metric']!r}")
    runs = []
    for group in config["groups"]:
        G = len(tasks.group_elements(group))
        for length in config["lengths"]:
            gens = generators_for(config, group)
            ev = tasks.word_problem(group, config["eval_n"], length, seed=EVAL_SEED + length, generators=gens)

            def evaluate_fn(model, ev=ev):  # words are short: keep the accuracy of every position
                return eval_split(model, *ev, device=device, config=config, per_position=True)

            for seed in config["seeds"]:
                for mixer in config["mixers"]:
                    for n_layers in config["layers"]:
                        def sample(step, seed=seed, length=length, group=group, gens=gens):
                            return tasks.word_problem(group, config["batch_size"],
                                                      curriculum_length(step, length, config),
                                                      seed=data_seed(seed, step), generators=gens)

                        model_kwargs = dict(vocab=G, d_model=config["d_model"], n_layers=n_layers,
                                            n_heads=config["n_heads"], mlp_ratio=config["mlp_ratio"],
                                            form=config["form"], beta_max=config["beta_max"].get(mixer),
                                            short_conv=short_conv(config, mixer), **w_settings(config, mixer))
                        stop_when = plateau(config["metric"], min_delta=config.get("min_delta", 0.005),
                                            patience=config.get("patience", 0),
                                            start=full_length_step(length, config))
                        r = train_run(mixer, seed, model_kwargs=model_kwargs, sample=sample,
                                      evaluate_fn=evaluate_fn, config={**config, "length": length}, device=device,
                                      progress=progress, desc=f"{group} L{length} {mixer} x{n_layers} s{seed}",
                                      stop_when=stop_when)
                        # plateaued: whether the evaluations end flat by the stopping rule (patience 0: None)
                        flat = stop_when(r["history"]["eval"]) if config.get("patience", 0) else None
                        runs.append({"group": group, "length": length, "n_layers": n_layers, "seed": seed,
                                     "mixer": mixer, "beta_max": model_kwargs["beta_max"], "plateaued": flat, **r})
    return runs, summarize(runs, config)


def summarize(runs, config) -> dict:
    """Per group, mixer and length: accuracy by depth (stats over seeds) and the smallest depth reaching
    the threshold, per seed that ran there (``None``: no depth that ran reached it)."""
    metric, thr = config["metric"], config["threshold"]
    out = {"metric": metric, "threshold": thr, "total_train_steps": len(runs) * config["steps"], "groups": {}}
    for group in config["groups"]:
        g = out["groups"][group] = {}
        for mixer in config["mixers"]:
            m = g[mixer] = {}
            for length in config["lengths"]:
                sel = [r for r in runs if r["group"] == group and r["mixer"] == mixer and r["length"] == length]
                by_depth = {str(d): stats([r["final"][metric] for r in sel if r["n_layers"] == d])
                            for d in config["layers"]}
                min_layers = {}
                for seed in dict.fromkeys(r["seed"] for r in sel):  # seeds that ran here (None: none reached)
                    ok = [r["n_layers"] for r in sel if r["seed"] == seed and (r["final"][metric] or 0) >= thr]
                    min_layers[str(seed)] = min(ok) if ok else None
                m[str(length)] = {"accuracy_by_layers": by_depth, "min_layers_by_seed": min_layers}
    return out
