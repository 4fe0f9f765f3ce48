r"""MQRAR-N: multi-query repeated associative recall with N-back (the PaTH paper, section 4.1 and Fig. 2).

Setting (the paper's): 2 layers, d_model 256, 2 heads, 32 keys, sequences of length 768,
``N = n_back`` in 1..4; one model trained per ``(mixer, N, seed)``.  At every key token whose key
was assigned at least N times before, the model outputs the value of the N-th most recent
assignment (:func:`pathedu.tasks.mqrar`); accuracy is over those positions of fresh sequences.

Our sizes: 480 value ids (``vocab = 512``), batch 32, 2000 steps, lr 1e-3, one seed by default.

Time on one H100 (measured, bf16 autocast, Triton forms; ``python -m pathedu.experiments.timing mqrar``):
a step takes 12-13 ms (rope), 9 ms (fox), 25 ms (path), 27 ms (pathfox), 16 ms (linear, matrix form) alone.
Eight processes of PaTH runs on one H100: about 1940 of 2000 steps in 440 s each.
The defaults with ``--jobs 8`` (16 runs, two per process) took 9 minutes on one H100; the record is
``pathedu/data/exp_mqrar.json``.  On Colab's T4 (not measured): the runs train in fp32 there
(no native bf16, :func:`pathedu.train.train`), and two CPU cores allow no parallel processes, so expect at least
the sum of the runs' single-process times, which ``python -m pathedu.experiments.timing NAME`` estimates on the
machine at hand.

What the committed runs show (chapter 9): FoX and PaTH-FoX recall at N = 1 and 2 and nothing at N = 3 and 4;
RoPE learns nothing at any N in 2000 steps; PaTH learns N = 1, and at N = 2 every seed of the committed series
collapsed.  Measured during training (``--set grad_check_every=50``) and per layer
(:mod:`pathedu.experiments.gradient_probe`), the cause was PaTH's kernel backward, which normalised its
recomputed logits with the forward's statistics; with that fixed PaTH learns N = 2 with every seed and begins N = 3
(``exp_mqrar_fixed.json``: PaTH and PaTH-FoX, N = 1-4, three seeds).  The first series' PaTH and PaTH-FoX rows
(``exp_mqrar.json``) predate the fix.
The default mixers are the softmax side (rope, fox, path, pathfox); the linear duals at the same
size, the price of a fixed-size state, are a second command:
``python -m pathedu.experiments mqrar --mixers linear gla deltanet gated_deltanet --out ...``.
Without a short convolution on ``q, k, v`` they learn nothing here (``exp_mqrar_linear_duals.json``, and
small CPU runs without a time limit, ``exp_mqrar_small_cpu.json``); their reference implementations have
one, and ``--set 'short_conv={"deltanet": 4, ...}'`` (a filter size per mixer, :mod:`pathedu.models`) adds it:
DeltaNet and Gated DeltaNet then recall N = 1-3 almost perfectly (``exp_mqrar_linear_conv.json``).  Sixteen
processes on one H100 are too many for the PyTorch forms (most runs stopped at their time limit); eight
finished DeltaNet's 2000 steps in 330 s and Gated DeltaNet's in 380 s.
"""
from __future__ import annotations

from .. import tasks
from ._common import (EVAL_SEED, RUN_DEFAULTS, beta_probe, data_seed, eval_split, short_conv, stats, train_run,
                      w_settings)

# The runs: the product of these settings, in run()'s loop order (setting -> field of a run's record).
GRID = {"n_backs": "n_back", "seeds": "seed", "mixers": "mixer"}

DEFAULTS = {
    "mixers": ["rope", "fox", "path", "pathfox"],
    "n_backs": [1, 2, 3, 4],
    "seeds": [0],
    "d_model": 256, "n_layers": 2, "n_heads": 2, "mlp_ratio": 4,
    "n_keys": 32, "vocab": 512, "length": 768,
    "beta_max": {},
    "short_conv": {},  # mixer -> filter size of the short convolution on q, k, v (pathedu.models; none by default)
    "w_conv": 0,  # PaTH's short convolution on w (filter size; 0: none), for path and pathfox only
    "w_rank": None,  # rank of PaTH's projection to w (None: full rank), for path and pathfox only
    "batch_size": 32, "steps": 2000, "lr": 1e-3, "weight_decay": 0.1, "warmup": 200, "clip": 1.0,
    "eval_n": 256, "eval_batch_size": 64, "eval_every": 500, "log_every": 10,
    **RUN_DEFAULTS,
}
# Named settings (``--preset NAME``).  "paper": the comparison of the paper's Fig. 2 (RoPE, stick-breaking, FoX,
# PaTH) and PaTH-FoX, three seeds; PaTH and PaTH-FoX with the paper's w (a rank-32 projection, then a causal
# convolution of size 3), the others without any short convolution, as the paper ran them.
PRESETS = {"paper": {"mixers": ["rope", "fox", "stickbreaking", "path", "pathfox"], "seeds": [0, 1, 2],
                     "n_backs": [1, 2, 3, 4], "w_conv": 3, "w_rank": 32, "short_conv": {}}}
TINY = {"mixers": ["rope", "path"], "n_backs": [1, 2], "d_model": 32, "n_keys": 4, "vocab": 16, "length": 32,
        "batch_size": 4, "steps": 3, "warmup": 1, "eval_n": 8, "eval_batch_size": 8, "eval_every": 2,
        "log_every": 1}


def run(config: dict, *, device, progress: bool = True):
    runs = []
    for n_back in config["n_backs"]:
        ev = tasks.mqrar(config["eval_n"], config["length"], n_keys=config["n_keys"], n_back=n_back,
                         vocab=config["vocab"], seed=EVAL_SEED + n_back)

        def evaluate_fn(model, ev=ev):
            return eval_split(model, *ev, device=device, config=config)

        # What the trained model does with its per-token quantities (PaTH's beta, the forget gates).
        probe = beta_probe(ev[0][:config["eval_batch_size"]], device)

        for seed in config["seeds"]:
            for mixer in config["mixers"]:
                sample = sampler(config, seed, n_back)
                r = train_run(mixer, seed, model_kwargs=model_kwargs(config, mixer), sample=sample,
                              evaluate_fn=evaluate_fn,
                              probe=probe, config=config, device=device, progress=progress,
                              desc=f"mqrar N{n_back} {mixer} s{seed}")
                runs.append({"n_back": n_back, "seed": seed, "mixer": mixer, **r})
    return runs, summarize(runs, config)


def model_kwargs(config: dict, mixer: str) -> dict:
    """The arguments of :func:`pathedu.models.build_model` for ``mixer`` under ``config``."""
    return dict(vocab=config["vocab"], d_model=config["d_model"], n_layers=config["n_layers"],
                n_heads=config["n_heads"], mlp_ratio=config["mlp_ratio"], form=config["form"],
                beta_max=config["beta_max"].get(mixer), short_conv=short_conv(config, mixer),
                **w_settings(config, mixer))


def sampler(config: dict, seed: int, n_back: int):
    """Training batch ``step`` of run ``seed`` at ``n_back``: ``sample(step) -> (tokens, targets)``."""
    def sample(step):
        return tasks.mqrar(config["batch_size"], config["length"], n_keys=config["n_keys"], n_back=n_back,
                           vocab=config["vocab"], seed=data_seed(seed, step))
    return sample


def summarize(runs, config) -> dict:
    """Per mixer and N: the accuracy over seeds."""
    return {"total_train_steps": len(runs) * config["steps"], "accuracy": {
        mixer: {str(nb): stats([r["final"]["accuracy"] for r in runs if r["mixer"] == mixer and r["n_back"] == nb])
                for nb in config["n_backs"]} for mixer in config["mixers"]}}
