r"""Flip-flop language modelling (the PaTH paper's Table 1; Liu et al., 2023).

Setting: the PaTH paper's Table 1 model (1 layer, 2 heads, d_model 64) and test splits; Liu et al.'s training
data, which the PaTH paper does not state: sequences of 512 tokens with ``p_ignore = 0.8``.  Three test splits of
the same length: in-distribution (``p_ignore = 0.8``), sparse (0.98: long gaps between a write and its read) and
dense (0.1).  The model reads the tokens and, at every ``r``, predicts the next token, the bit that the read
must return (:func:`pathedu.train.lm_targets`); the loss is on those positions only (``loss="reads"``;
``loss="all"`` trains next-token prediction on every position, the bits' and instructions'
randomness included, and still scores the reads).  The error of a split is the fraction of
its read bits predicted wrongly.  Every run uses the same evaluation sequences.

Sizes we chose (the paper does not fix them here): batch 32, 3000 steps, AdamW lr 1e-3,
warm-up 300, cosine to 0.1 lr, weight decay 0.1, clip 1; 512 evaluation sequences per split
(the sparse split then holds about 1,300 reads, so errors below ~0.1% read as 0).

Time on one H100 (measured, bf16 autocast, Triton forms): a step takes 6.5 ms (rope), 6.8 (nope),
8.3 (alibi), 14 (fox), 11 (path), 14 (pathfox); deltanet / gated_deltanet (matrix forms) 11 / 12.5 ms.
15 runs x 3000 steps = about 10 minutes, plus compilation and evaluation: about 11-12 minutes.
A 300-step check (seed 0): in-distribution / sparse / dense error 0.2% / 23% / 0% for path,
33% / 46% / 31% for rope, 20% / 39% / 1.3% for fox.
"""
from __future__ import annotations

from .. import tasks
from ..train import lm_targets
from ._common import (EVAL_SEED, RUN_DEFAULTS, beta_probe, data_seed, eval_split, short_conv, stats, train_run,
                      w_settings)

# The runs: the product of these settings, in run()'s loop order (setting -> field of a run's record).
GRID = {"seeds": "seed", "mixers": "mixer"}

DEFAULTS = {
    "mixers": ["nope", "alibi", "fox", "rope", "path"],
    "seeds": [0, 1, 2],
    "d_model": 64, "n_layers": 1, "n_heads": 2, "mlp_ratio": 4,
    "length": 512, "p_ignore": 0.8, "loss": "reads",
    "splits": {"in_distribution": 0.8, "sparse": 0.98, "dense": 0.1},
    "batch_size": 32, "steps": 3000, "lr": 1e-3, "weight_decay": 0.1, "warmup": 300, "clip": 1.0,
    "eval_n": 512, "eval_batch_size": 128, "eval_every": 1000, "log_every": 10,
    **RUN_DEFAULTS,
    "w_conv": 0,  # PaTH's short convolution on w (filter size; 0: none), for path and pathfox only
    "w_rank": None,  # rank of PaTH's projection to w (None: full rank), for path and pathfox only
    "short_conv": {},  # mixer -> filter size of the short convolution on q, k, v (none by default)
}
# Named settings (``--preset NAME``).  "paper": Table 1's comparison with every softmax mixer of the book, three
# seeds, PaTH and PaTH-FoX with the paper's w (a rank-32 projection, then a causal convolution of size 3).
PRESETS = {"paper": {"mixers": ["nope", "alibi", "fox", "rope", "path", "pathfox", "stickbreaking", "cope"],
                     "seeds": [0, 1, 2], "w_conv": 3, "w_rank": 32}}
TINY = {"seeds": [0], "d_model": 32, "length": 32, "batch_size": 4, "steps": 4, "warmup": 1, "eval_n": 8,
        "eval_batch_size": 8, "eval_every": 2, "log_every": 1}

# Table 1 of the PaTH paper: error (%) on in-distribution / sparse / dense.
PAPER_TABLE1 = {
    "rope": {"in_distribution": 6.9, "sparse": 40.3, "dense": 0.01},
    "stickbreaking": {"in_distribution": 9.6, "sparse": 38.9, "dense": 0.0},
    "fox": {"in_distribution": 8.3, "sparse": 36.3, "dense": 0.0},
    "path": {"in_distribution": 0.0, "sparse": 0.0001, "dense": 0.0},
}


def _batch(n, length, p_ignore, seed, loss):
    tokens, mask = tasks.flipflop(n, length, p_ignore=p_ignore, seed=seed)
    if loss == "all":
        inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
        return inputs, targets
    return lm_targets(tokens, mask)


def run(config: dict, *, device, progress: bool = True):
    if config["loss"] not in ("reads", "all"):
        raise ValueError(f"`loss` must be 'reads' or 'all', got {config['loss']!r}")
    # Evaluation data: scored at the reads only, whatever the training loss.
    evals = {name: _batch(config["eval_n"], config["length"], p, EVAL_SEED + i, "reads")
             for i, (name, p) in enumerate(config["splits"].items())}

    def evaluate_fn(model):
        return {name: eval_split(model, x, y, device=device, config=config)
                for name, (x, y) in evals.items()}

    # What a trained model does with its gates on the sparse split: does PaTH use beta > 1 (reflections)?
    probe = beta_probe(evals["sparse"][0][:config["eval_batch_size"]], device) if "sparse" in evals else None
    model_kwargs = dict(vocab=len(tasks.FLIPFLOP_VOCAB), d_model=config["d_model"], n_layers=config["n_layers"],
                        n_heads=config["n_heads"], mlp_ratio=config["mlp_ratio"], form=config["form"])
    runs = []
    for seed in config["seeds"]:
        for mixer in config["mixers"]:
            def sample(step, seed=seed):
                return _batch(config["batch_size"], config["length"], config["p_ignore"], data_seed(seed, step),
                              config["loss"])

            kwargs = {**model_kwargs, **w_settings(config, mixer), "short_conv": short_conv(config, mixer)}
            r = train_run(mixer, seed, model_kwargs=kwargs, sample=sample, evaluate_fn=evaluate_fn, probe=probe,
                          config=config, device=device, progress=progress, desc=f"flipflop {mixer} s{seed}")
            runs.append({"seed": seed, "mixer": mixer, **r})
    return runs, summarize(runs, config)


def summarize(runs, config) -> dict:
    """Per mixer and split: the error (%) over seeds, beside the paper's Table 1."""
    summary = {"error_percent": {}, "paper_table1_error_percent": PAPER_TABLE1,
               "total_train_steps": len(runs) * config["steps"]}
    for mixer in config["mixers"]:
        summary["error_percent"][mixer] = {
            split: stats([None if r["final"][split]["error"] is None else 100 * r["final"][split]["error"]
                          for r in runs if r["mixer"] == mixer])
            for split in config["splits"]}
    return summary
