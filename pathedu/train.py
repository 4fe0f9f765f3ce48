r"""Training: an ordinary PyTorch loop, and the accuracy the experiments report.

:func:`train` runs AdamW with a linear warm-up then cosine decay of the learning rate,
gradient-norm clipping, bf16 autocast on GPUs with native bf16 (fp32 on the CPU and on older GPUs such
as the T4), a tqdm progress bar
(``progress=False`` hides it) and an evaluation every ``eval_every`` steps and at the end.

Data come from a function ``sample(step) -> (inputs, targets)``: ``inputs (B, T)`` long
token ids, ``targets (B, T)`` long class ids with :data:`pathedu.tasks.IGNORE` (-100) at the
positions that are not scored.  The loss is the mean cross-entropy over the scored positions
of the batch.  Make ``sample`` deterministic in ``step`` (e.g. ``seed = base + step`` for a
:mod:`pathedu.tasks` generator) and the run is reproducible: :func:`train` also calls
``torch.manual_seed(seed)`` first.  Build the model after ``torch.manual_seed`` too.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Callable

import torch
import torch.nn.functional as F

from .tasks import IGNORE

__all__ = ["lr_at", "masked_loss", "accuracy", "evaluate", "train", "lm_targets", "gradient_agreement"]


def lr_at(step: int, *, lr: float, steps: int, warmup: int, min_lr_ratio: float = 0.1) -> float:
    """The learning rate before optimizer step ``step`` (0-based): linear warm-up from ``lr/warmup``
    to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr_ratio * lr`` at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def masked_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits (B, T, C)`` over the positions where ``targets (B, T) != -100``
    (0 when no position is scored)."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"`targets` must have shape {tuple(logits.shape[:-1])}, got {tuple(targets.shape)}")
    if not (targets != IGNORE).any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def lm_targets(tokens: torch.Tensor, mask: torch.Tensor):
    """Next-token prediction on the masked positions: ``inputs = tokens[:, :-1]``,
    ``targets = tokens[:, 1:]`` where ``mask[:, 1:]`` is true, -100 elsewhere (flip-flop: the read
    bit is predicted at the ``r`` one position earlier)."""
    if tokens.shape != mask.shape:
        raise ValueError(f"`mask` must have the shape of `tokens` {tuple(tokens.shape)}, got {tuple(mask.shape)}")
    inputs = tokens[:, :-1]
    targets = torch.where(mask[:, 1:], tokens[:, 1:], torch.full_like(tokens[:, 1:], IGNORE))
    return inputs, targets


def _hits(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(right, scored)``, bool like ``targets``: the argmax prediction is the target, at a scored position."""
    scored = targets != IGNORE
    return (logits.argmax(-1) == targets) & scored, scored


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """``(correct, scored)``: argmax predictions equal to ``targets`` at the scored positions."""
    right, scored = _hits(logits, targets)
    return int(right.sum()), int(scored.sum())


def _autocast_on(amp, device: torch.device) -> bool:
    """``amp`` (bf16 autocast) resolved: None means on a CUDA GPU with native bf16 (compute capability 8.0 and up:
    A100, H100, ...), fp32 elsewhere: the CPU, and GPUs without it such as Colab's T4 (where bf16 would be emulated;
    the kernels were never run there)."""
    if amp is not None and not isinstance(amp, bool):
        raise ValueError(f"`amp` must be True, False or None (bf16 autocast where the GPU has bf16), got {amp!r}")
    if amp is not None:
        return amp
    return device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)


@torch.no_grad()
def evaluate(model, inputs: torch.Tensor, targets: torch.Tensor, *, batch_size: int = 64, device=None,
             amp: bool | None = None, per_position: bool = False) -> dict:
    """Accuracy of ``model`` on fixed data, in batches: ``{"accuracy", "error", "correct", "scored",
    "loss"}``; also ``"last_accuracy"``, the accuracy at the last position alone (when scored there), and with
    ``per_position``, ``"position_accuracy"``: a list of ``T`` accuracies, one per position (None where nothing
    is scored).  ``inputs, targets (N, T)`` on the CPU; moved to ``device`` batch by batch."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    amp = _autocast_on(amp, device)
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    pos_c = torch.zeros(inputs.shape[-1], dtype=torch.long)  # right and scored answers per position
    pos_n = torch.zeros_like(pos_c)
    for s in range(0, inputs.shape[0], batch_size):
        x, y = inputs[s:s + batch_size].to(device), targets[s:s + batch_size].to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
        right, scored = _hits(logits, y)
        pos_c += right.sum(0).cpu()
        pos_n += scored.sum(0).cpu()
        if scored.any():
            loss_sum += float(masked_loss(logits, y)) * int(scored.sum())
    model.train(was_training)
    correct, scored = int(pos_c.sum()), int(pos_n.sum())
    last_c, last_n = int(pos_c[-1]), int(pos_n[-1])
    acc = correct / scored if scored else float("nan")
    out = {"accuracy": acc, "error": 1 - acc, "correct": correct, "scored": scored,
           "loss": loss_sum / scored if scored else float("nan"),
           "last_accuracy": last_c / last_n if last_n else float("nan")}
    if per_position:
        out["position_accuracy"] = [int(c) / int(n) if n else None for c, n in zip(pos_c, pos_n)]
    return out


def _grads(model, inputs, targets, *, amp: bool, form: str | None = None) -> tuple[torch.Tensor, float]:
    """Every parameter's gradient of the masked loss on one batch, flattened into one fp32 vector (zeros
    where a parameter gets none), and the loss; ``form``: run every mixer in that form (None: their own)."""
    from .models import forced_form

    model.zero_grad(set_to_none=True)
    with (forced_form(model, form) if form is not None else contextlib.nullcontext()), \
            torch.autocast(device_type=inputs.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(inputs)
    loss = masked_loss(logits, targets)
    loss.backward()
    g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten()
                   for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return g, float(loss.detach())


def gradient_agreement(model, inputs: torch.Tensor, targets: torch.Tensor, *, amp: bool | None = None,
                       reference_form: str = "matrix") -> dict:
    """How far the gradient a training step uses is from a reference gradient, on one batch.

    ``model``: a :class:`pathedu.models.LM`; ``inputs, targets (B, T)`` on its device.  Three gradients of
    all parameters: ``run`` (the mixers' own forms, e.g. the Triton kernels, with bf16 autocast as
    ``amp`` says: what the optimizer gets), ``ref`` (every mixer in ``reference_form``, float32, no
    autocast) and ``matrix_amp`` (``reference_form`` under the same autocast as ``run``: separates the
    kernels from the bf16 rounding of the rest of the model).  Returns the reference's loss and gradient
    norm, and for ``run`` and ``matrix_amp`` the relative error ``|g - ref| / |ref|`` and the cosine with
    ``ref``.  Leaves no gradient behind."""
    device = inputs.device
    amp = _autocast_on(amp, device)
    ref, loss_ref = _grads(model, inputs, targets, amp=False, form=reference_form)
    out = {"loss_ref": loss_ref, "grad_norm_ref": float(ref.norm())}
    denom = max(out["grad_norm_ref"], 1e-30)
    for name, form in (("run", None), ("matrix_amp", reference_form)):
        g, loss = _grads(model, inputs, targets, amp=amp, form=form)
        out[f"loss_{name}"] = loss
        out[f"rel_err_{name}"] = float((g - ref).norm()) / denom
        out[f"cos_{name}"] = float(torch.dot(g, ref)) / max(float(g.norm()) * denom, 1e-30)
    return out


def train(model: torch.nn.Module, sample: Callable[[int], tuple], *, steps: int, lr: float = 1e-3,
          weight_decay: float = 0.1, betas: tuple = (0.9, 0.95), warmup: int | None = None,
          min_lr_ratio: float = 0.1, clip: float = 1.0, evaluate_fn: Callable | None = None,
          eval_every: int | None = None, log_every: int = 1, device=None, amp: bool | None = None,
          seed: int = 0, progress: bool = True, desc: str = "train", grad_check_every: int = 0,
          time_limit_s: float | None = None, stop_after: int | None = None,
          stop_when: Callable[[list], bool] | None = None) -> dict:
    """Train ``model`` for ``steps`` optimizer steps on batches ``sample(step) -> (inputs, targets)``.

    * AdamW (``lr``, ``betas``, ``weight_decay`` on matrices only: not on biases, norms, embeddings);
      learning rate :func:`lr_at` (``warmup`` default ``steps // 10``); gradients clipped to norm ``clip``.
    * ``amp`` (default: GPUs with native bf16, compute capability 8.0+): bf16 autocast for the forward pass.
    * ``evaluate_fn(model) -> dict`` every ``eval_every`` steps (default ``steps // 10``) and after the
      last step.
    * ``seed``: ``torch.manual_seed(seed)`` before the first step.
    * ``grad_check_every`` (0: never): every that many steps, before the step, :func:`gradient_agreement`
      on the step's batch (``model`` must be a :class:`pathedu.models.LM`), kept in ``"grad_checks"``.
    * ``time_limit_s`` (None: none): stop after the step that takes the training time (evaluations and
      checks not counted) past this many seconds, evaluate, and record ``"stopped_at"`` (steps done).
    * ``stop_after`` (None: ``steps``): stop after that many steps of the ``steps``-step schedule, likewise
      (e.g. to look at a model part-way through a run).
    * ``stop_when(evals) -> bool`` (None: never): called with ``hist["eval"]`` after each periodic evaluation;
      true stops training there (that evaluation is the last; ``"stopped_at"`` records the steps done), e.g.
      when the accuracy has stopped improving (:func:`pathedu.experiments._common.plateau`).

    Returns the history: ``{"step": [...], "loss": [...], "lr": [...], "grad_norm": [...]}`` every
    ``log_every`` steps, ``"eval": [{"step": s, **metrics}, ...]``, ``"wall_time_s"`` (the whole loop),
    ``"train_time_s"`` (without evaluation), ``"steps"`` (asked for) and ``"stopped_at"`` (done).
    """
    from tqdm.auto import tqdm

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be a positive int, got {steps!r}")
    if not lr > 0:
        raise ValueError(f"`lr` must be positive, got {lr!r}")
    warmup = max(1, steps // 10) if warmup is None else warmup
    if warmup < 0:
        raise ValueError(f"`warmup` must be >= 0, got {warmup!r}")
    warmup = max(warmup, 1)
    eval_every = max(1, steps // 10) if eval_every is None else eval_every
    if isinstance(grad_check_every, bool) or not isinstance(grad_check_every, int) or grad_check_every < 0:
        raise ValueError(f"`grad_check_every` must be an int >= 0, got {grad_check_every!r}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise ValueError(f"`time_limit_s` must be positive or None, got {time_limit_s!r}")
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int)
                                   or not 1 <= stop_after <= steps):
        raise ValueError(f"`stop_after` must be an int in 1..steps ({steps}) or None, got {stop_after!r}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    amp = _autocast_on(amp, device)
    torch.manual_seed(seed)
    model.to(device).train()

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas,
                            fused=device.type == "cuda")
    hist = {"step": [], "loss": [], "lr": [], "grad_norm": [], "eval": []}
    if grad_check_every:
        hist["grad_checks"] = []
    eval_time = 0.0
    start = time.perf_counter()

    def run_eval(step):
        nonlocal eval_time
        if evaluate_fn is None:
            return None
        t0 = time.perf_counter()
        metrics = evaluate_fn(model)
        model.train()
        eval_time += time.perf_counter() - t0
        hist["eval"].append({"step": step, **metrics})
        return metrics

    bar = tqdm(range(steps), desc=desc, disable=not progress, leave=False, dynamic_ncols=True)
    done = steps
    for step in bar:
        cur_lr = lr_at(step, lr=lr, steps=steps, warmup=warmup, min_lr_ratio=min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        inputs, targets = sample(step)
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if grad_check_every and step % grad_check_every == 0:
            t0 = time.perf_counter()
            hist["grad_checks"].append({"step": step, **gradient_agreement(model, inputs, targets, amp=amp)})
            eval_time += time.perf_counter() - t0
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(inputs)
        loss = masked_loss(logits, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        # Stopping early (time limit, stop_after): the step is logged, and evaluated once, after the loop.
        out_of_time = time_limit_s is not None and time.perf_counter() - start - eval_time > time_limit_s
        stop = step + 1 < steps and (out_of_time or step + 1 == stop_after)
        if step % log_every == 0 or step == steps - 1 or stop:
            hist["step"].append(step)
            hist["loss"].append(float(loss.detach()))
            hist["lr"].append(cur_lr)
            hist["grad_norm"].append(float(gnorm))
            bar.set_postfix(loss=f"{hist['loss'][-1]:.4f}", refresh=False)
        if stop:
            done = step + 1
            break
        if (step + 1) % eval_every == 0 and step + 1 < steps:
            m = run_eval(step + 1)
            if m is not None and "accuracy" in m:
                bar.set_postfix(loss=f"{hist['loss'][-1]:.4f}", acc=f"{m['accuracy']:.3f}", refresh=False)
            if stop_when is not None and stop_when(hist["eval"]):
                done = step + 1
                break
    bar.close()
    if not (hist["eval"] and hist["eval"][-1]["step"] == done):
        run_eval(done)
    wall = time.perf_counter() - start
    hist.update(wall_time_s=wall, train_time_s=wall - eval_time, steps=steps, stopped_at=done)
    return hist
