r"""Word problems of A5 and S5: accuracy against sequence length and depth (the PaTH paper's Fig. 2).

Each run trains a model of ``n_layers`` layers on words of one length (tokens uniform over the
group, as in Merrill et al.; ``generators`` restricts them, e.g. the paper's A5 3-cycles
``["(1 2 3)", "(1 2 4)", "(1 2 5)"]``) to output, at every position, the prefix product
(:func:`pathedu.tasks.word_problem`): sequence labelling with ``|G|`` classes.  ``accuracy`` is over
every position of fresh words of the same length, ``last_accuracy`` over the last position alone.
The summary gives, for each group, mixer, seed and length, the smallest depth whose ``metric``
reaches ``threshold`` (``None``: no depth tried did).

Our sizes (the paper's Fig. 2 does not give them all): d_model 128, 2 heads, batch 128,
500 steps, lr 1e-3; deltanet with ``beta`` in (0, 2) (``beta_max``); one seed by default
(every run is a full training run: 2 groups x 2 lengths x 4 depths x 4 mixers = 64 runs).

Time on one H100 (measured): a step takes 5-10 ms at 1 layer and 15-33 ms at 4 layers (launch-bound,
about the same at lengths 10 to 40); 64 runs x 500 steps = about 9 minutes, plus about 25 s of Triton
autotuning for each new (mixer, length): about 13 minutes.  **These defaults do not learn A5**: a
500-step check at length 20 (rope, path, deltanet; 1 and 2 layers) stayed at chance (6.6% accuracy,
loss 3.88 against log 60 = 4.09).  Word problems need many more steps (or a curriculum over lengths);
the budget and recipe are still to be found (``--steps``, ``--set lengths=[...]``).
"""
from __future__ import annotations

from .. import tasks
from ._common import EVAL_SEED, data_seed, eval_split, stats, train_run

DEFAULTS = {
    "groups": ["A5", "S5"],
    "lengths": [10, 20],
    "layers": [1, 2, 3, 4],
    "mixers": ["rope", "fox", "path", "deltanet"],
    "beta_max": {"deltanet": 2.0, "gated_deltanet": 2.0},
    "generators": None,
    "seeds": [0],
    "d_model": 128, "n_heads": 2, "mlp_ratio": 4,
    "batch_size": 128, "steps": 500, "lr": 1e-3, "weight_decay": 0.1, "warmup": 50, "clip": 1.0,
    "eval_n": 512, "eval_batch_size": 512, "eval_every": 250, "log_every": 10,
    "threshold": 0.9, "metric": "accuracy",
    "form": "auto",
}
TINY = {"groups": ["S3"], "lengths": [6], "layers": [1, 2], "mixers": ["rope", "path"], "d_model": 32,
        "batch_size": 4, "steps": 3, "warmup": 1, "eval_n": 8, "eval_batch_size": 8, "eval_every": 2,
        "log_every": 1}


def run(config: dict, *, device, progress: bool = True):
    if config["metric"] not in ("accuracy", "last_accuracy"):
        raise ValueError(f"`metric` must be 'accuracy' or 'last_accuracy', got {config['metric']!r}")
    runs = []
    for group in config["groups"]:
        G = len(tasks.group_elements(group))
        for length in config["lengths"]:
            ev = tasks.word_problem(group, config["eval_n"], length, seed=EVAL_SEED + length,
                                    generators=config["generators"])

            def evaluate_fn(model, ev=ev):
                return eval_split(model, *ev, device=device, batch_size=config["eval_batch_size"])

            for seed in config["seeds"]:
                for mixer in config["mixers"]:
                    for n_layers in config["layers"]:
                        def sample(step, seed=seed, length=length, group=group):
                            return tasks.word_problem(group, config["batch_size"], length,
                                                      seed=data_seed(seed, step), generators=config["generators"])

                        model_kwargs = dict(vocab=G, d_model=config["d_model"], n_layers=n_layers,
                                            n_heads=config["n_heads"], mlp_ratio=config["mlp_ratio"],
                                            form=config["form"], beta_max=config["beta_max"].get(mixer))
                        r = train_run(mixer, seed, model_kwargs=model_kwargs, sample=sample,
                                      evaluate_fn=evaluate_fn, config={**config, "length": length}, device=device,
                                      progress=progress, desc=f"{group} L{length} {mixer} x{n_layers} s{seed}")
                        runs.append({"group": group, "length": length, "n_layers": n_layers, "seed": seed,
                                     "mixer": mixer, "beta_max": model_kwargs["beta_max"], **r})
    return runs, summarize(runs, config)


def summarize(runs, config) -> dict:
    """Per group, mixer and length: accuracy by depth (stats over seeds) and the smallest depth reaching
    the threshold, per seed."""
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
                for seed in config["seeds"]:
                    ok = [r["n_layers"] for r in sel if r["seed"] == seed and (r["final"][metric] or 0) >= thr]
                    min_layers[str(seed)] = min(ok) if ok else None
                m[str(length)] = {"accuracy_by_layers": by_depth, "min_layers_by_seed": min_layers}
    return out
