"""What the three experiments share: one training run, seeds, summaries."""
from __future__ import annotations

import math
import statistics

import torch

from ..models import build_model, per_token_quantities, select_form
from ..train import evaluate, train



def data_seed(seed: int, step: int) -> int:
    """The task generator's seed of training batch ``step`` of run seed ``seed`` (disjoint from the
    evaluation seeds, which are >= 2**40)."""
    return (seed + 1) * 1_000_000_000 + step


EVAL_SEED = 2 ** 40

#: The run settings that every experiment's ``DEFAULTS`` holds, with their defaults: the mixers' form and
#: :func:`train_run`'s autocast, gradient checks and time limit.
RUN_DEFAULTS = {
    "form": "auto",
    "amp": None,  # bf16 autocast: None = on GPUs with native bf16; false = fp32 throughout (e.g. to rule out rounding)
    "grad_check_every": 0,  # >0: compare the step's gradient with the fp32 matrix form's every that many steps
    "time_limit_s": None,  # per run: stop (and evaluate) once training has taken this long
}


def w_settings(config: dict, mixer: str) -> dict:
    """PaTH's ``w`` under ``config``: ``{"w_conv": K, "w_rank": r}`` for the mixers with a ``w`` (path, pathfox;
    the settings ``w_conv``, 0 = no short convolution, and ``w_rank``, None = full rank, of
    :func:`pathedu.models.build_model`), ``{}`` for the others, whatever ``config`` says."""
    from ..layers import LAYERS

    if mixer not in LAYERS or not LAYERS[mixer].has_w:  # an unknown mixer: build_model names it
        return {}
    return {"w_conv": config.get("w_conv", 0), "w_rank": config.get("w_rank")}


def plateau(metric: str, *, min_delta: float, patience: int, start: int = 0):
    """A ``stop_when`` for :func:`pathedu.train.train`: true once ``patience`` evaluations in a row, among those at
    step >= ``start``, have not raised the best value of ``metric`` (over those evaluations) by at least
    ``min_delta``.  The first evaluation at or after ``start`` sets the best; ``patience`` 0 never stops."""
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
        raise ValueError(f"`patience` must be an int >= 0 (0: never stop early), got {patience!r}")
    if not min_delta >= 0:
        raise ValueError(f"`min_delta` must be >= 0, got {min_delta!r}")

    def stop_when(evals) -> bool:
        if patience == 0:
            return False
        best, since = None, 0
        for e in evals:
            value = e.get(metric)
            if e["step"] < start or value is None:
                continue
            if best is None or value >= best + min_delta:
                best, since = value, 0
            else:
                since += 1
        return since >= patience
    return stop_when


def short_conv(config: dict, mixer: str) -> int:
    """The filter size of ``mixer``'s short convolution on q, k, v under ``config`` (its ``short_conv`` setting maps
    mixers to sizes; a mixer it does not name, or a config without it, gets none: 0)."""
    return config.get("short_conv", {}).get(mixer, 0)


def train_run(mixer: str, seed: int, *, model_kwargs: dict, sample, evaluate_fn, config: dict, device,
              progress: bool, desc: str, probe=None, stop_after: int | None = None, keep_model: bool = False,
              stop_when=None) -> dict:
    """Seed, build ``mixer``'s model, train it; return ``{"n_params", "form", "final", "history",
    "train_time_s", "wall_time_s"}`` (``final``: the last evaluation), and ``"probe": probe(model)`` when a
    ``probe`` is given (what the trained model does, e.g. :func:`beta_probe`); ``stop_after``: see
    :func:`pathedu.train.train`, as is ``stop_when`` (e.g. :func:`plateau`); ``keep_model``: the model too, as
    ``"model"`` (not JSON: for a caller's use)."""
    torch.manual_seed(seed)
    model = build_model(mixer, **model_kwargs).to(device)
    hist = train(model, sample, steps=config["steps"], lr=config["lr"], weight_decay=config["weight_decay"],
                 warmup=config["warmup"], clip=config["clip"], evaluate_fn=evaluate_fn,
                 eval_every=config["eval_every"], log_every=config["log_every"], device=device, seed=seed,
                 progress=progress, desc=desc, amp=config.get("amp"),
                 grad_check_every=config.get("grad_check_every", 0), time_limit_s=config.get("time_limit_s"),
                 stop_after=stop_after, stop_when=stop_when)
    final = hist["eval"][-1] if hist["eval"] else {}
    return {"n_params": model.num_parameters(), "form": select_form(mixer, model_kwargs.get("form", "auto"),
                                                                       device=device, T=config.get("length", 0)),
            "final": final, "train_time_s": hist["train_time_s"], "wall_time_s": hist["wall_time_s"],
            "history": hist, **({"probe": probe(model)} if probe is not None else {}),
            **({"model": model} if keep_model else {})}


def beta_probe(tokens, device):
    """A probe for :func:`train_run`: per layer, the statistics of the per-token quantities that the trained
    model computes on ``tokens`` (``beta``: mean, fraction above 1 (a negative eigenvalue) and above 1.9
    (near a reflection); ``log_f``: mean, and fraction below log 0.5).  ``{}`` for mixers without them."""
    def probe(model):
        out = []
        for layer in per_token_quantities(model, tokens.to(device)):
            rec = {}
            if "beta" in layer:
                b = layer["beta"].float()
                rec["beta"] = {"mean": b.mean().item(), "above_1": (b > 1).float().mean().item(),
                               "above_1.9": (b > 1.9).float().mean().item()}
            if "log_f" in layer:
                f = layer["log_f"].float()
                rec["log_f"] = {"mean": f.mean().item(), "below_log_half": (f < math.log(0.5)).float().mean().item()}
            out.append(rec)
        return out
    return probe


def eval_split(model, inputs, targets, *, device, config: dict, per_position: bool = False) -> dict:
    """:func:`pathedu.train.evaluate` in batches of ``config["eval_batch_size"]``, with the training's
    ``config["amp"]`` (and its accuracy per position with ``per_position``); NaN metrics (nothing scored) become
    None."""
    m = evaluate(model, inputs, targets, batch_size=config["eval_batch_size"], device=device, amp=config.get("amp"),
                 per_position=per_position)
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in m.items()}


def stats(values) -> dict:
    """mean, min, max and n of the finite numbers in ``values`` (every value is kept in the runs)."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return {"n": 0, "mean": None, "min": None, "max": None}
    return {"n": len(vals), "mean": statistics.fmean(vals), "min": min(vals), "max": max(vals)}
