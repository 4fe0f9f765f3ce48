r"""Where a kernel's gradient goes wrong inside a trained model: ``python -m pathedu.experiments.gradient_probe``.

The MQRAR runs of PaTH at N = 2 collapsed part-way through training, and :func:`pathedu.train.gradient_agreement`
showed why in outline: the gradient the Triton kernels gave drifted away from the float32 matrix form's as the
model trained (``pathedu/data/exp_mqrar_path_N2_gradcheck.json``).  This probe says which layer's and which
input's gradient drifts (chapter 9 of the book shows what it finds in PaTH's kernel backward).

It trains the MQRAR model (the ``mqrar`` experiment's settings; ``--set`` changes any) for ``--at`` steps of its
schedule, then runs one more training batch with every mixer's inputs captured: ``q, k, v`` and the per-token
quantities as the kernel received them (bf16 ``q, k, v`` under autocast), and the gradient that reached the
mixer's output.  For each layer and each input it compares the gradient of the Triton form on exactly those
tensors with float64 autograd through the matrix form on the same values (the kernel's own error), and the
float32 matrix form's with the same reference (how well conditioned the problem is).  Output: a new file
``probe_mqrar_<mixer>.json`` in the current folder (``-2``, ``-3``, ... when that exists), or ``--out FILE``
(an existing ``FILE`` only with ``--overwrite``).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

__all__ = ["capture_mixer_inputs", "input_gradient_errors", "probe"]

# The names of a mechanism's tensor arguments, in core_inputs' order (mixers whose arguments are all tensors).
ARG_NAMES = {"fox": ("q", "k", "v", "log_f"), "path": ("q", "k", "v", "w", "beta"),
             "pathfox": ("q", "k", "v", "w", "beta", "log_f")}


def capture_mixer_inputs(model, inputs, targets, *, amp: bool | None = None) -> list[dict]:
    """One forward and backward pass of ``model`` (a :class:`pathedu.models.LM`) on ``inputs, targets (B, T)``
    that keeps, per layer, the tensors its mixer passed to the mechanism (``"args"``, detached, in
    :meth:`pathedu.models.Mixer.core_inputs` order), the form that ran and the gradient of the loss with
    respect to the mechanism's output (``"do"``).  Leaves no gradient behind."""
    from ..models import LM
    from ..train import _autocast_on, masked_loss

    if not isinstance(model, LM):
        raise TypeError(f"`model` must be a pathedu.models.LM, got {type(model).__name__}")
    amp = _autocast_on(amp, inputs.device)
    records = []

    def wrap(mixer):
        def core(form, q, k, v, extra):
            args, kwargs = mixer.core_inputs(q, k, v, extra)
            out = type(mixer)._core(mixer, form, q, k, v, extra)
            rec = {"form": form, "args": [a.detach() for a in args], "kwargs": kwargs}
            out.register_hook(lambda g, rec=rec: rec.__setitem__("do", g.detach()))
            records.append(rec)
            return out
        return core

    mixers = [blk.mixer for blk in model.blocks]
    model.zero_grad(set_to_none=True)
    try:
        for m in mixers:
            m._core = wrap(m)
        with torch.autocast(device_type=inputs.device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(inputs)
        masked_loss(logits, targets).backward()
    finally:
        for m in mixers:
            del m._core
        model.zero_grad(set_to_none=True)
    return records


def _input_grads(fn, args, kwargs, do, dtype=None):
    leaves = [a.to(dtype if dtype is not None else a.dtype).clone().requires_grad_() for a in args]
    out = fn(*leaves, **kwargs)
    return torch.autograd.grad(out, leaves, do.to(out.dtype))


def input_gradient_errors(mixer: str, record: dict) -> dict:
    """For one captured layer (:func:`capture_mixer_inputs`): per input name, the relative RMS and max error
    of the Triton form's gradient (inputs as captured) and of the float32 matrix form's, both against float64
    autograd through the matrix form on the same values, and the reference's RMS."""
    from ..bench._common import rel_max, rel_rms
    from ..models import _FUNCS

    if mixer not in ARG_NAMES:
        raise ValueError(f"`mixer` must be one of {', '.join(ARG_NAMES)}, got {mixer!r}")
    args, kwargs, do = record["args"], record["kwargs"], record["do"]
    ref = _input_grads(_FUNCS[mixer]["matrix"], args, kwargs, do, torch.float64)
    runs = {"triton": _input_grads(_FUNCS[mixer]["triton"], args, kwargs, do),
            "matrix_fp32": _input_grads(_FUNCS[mixer]["matrix"], args, kwargs, do, torch.float32)}
    if mixer == "path":  # PaTH's kernel with one thing changed at a time, beside the default
        from ..kernels import path_attention as _pa
        # The backward's meeting-point rows in fp32 (the default for 16-bit inputs from the statistics fix until
        # fp16 replaced it) and in bf16 (as before the fix); the default ("triton") keeps them in fp16.
        for label, x_dtype in (("triton_x_fp32", torch.float32), ("triton_x_bf16", torch.bfloat16)):
            with _pa.meeting_point_dtype(x_dtype):
                runs[label] = _input_grads(_FUNCS[mixer]["triton"], args, kwargs, do)
        for label, kw in (("triton_inner32_w4", {"_config": {"backward": {"INNER": 32, "num_warps": 4,
                                                                          "num_stages": 1}}}),
                          ("triton_block32", {"block": 32})):
            try:
                runs[label] = _input_grads(_pa.path_attention, args, {**kwargs, **kw}, do)
            except Exception as exc:  # a variant that does not compile is recorded, not fatal
                print(f"variant {label}: {type(exc).__name__}: {exc}", file=sys.stderr)
    out = {}
    for i, name in enumerate(ARG_NAMES[mixer]):
        entry = {"ref_rms": float(ref[i].pow(2).mean().sqrt())}
        for label, grads in runs.items():
            entry[f"rel_rms_{label}"] = rel_rms(grads[i], ref[i])
            entry[f"rel_max_{label}"] = rel_max(grads[i], ref[i])
        out[name] = entry
    return out


def probe(config: dict, *, mixer: str = "path", n_back: int = 2, seed: int = 0, at: int = 800, device=None,
          progress: bool = True, save_inputs: str | None = None, save_rows: int = 2) -> dict:
    """Train ``mixer`` on MQRAR-``n_back`` for ``at`` steps of ``config``'s schedule, then
    :func:`input_gradient_errors` for every layer on the next training batch; returns the record.
    ``save_inputs``: a ``.pt`` file that receives every layer's captured tensors (the first ``save_rows``
    sequences of the batch, on the CPU), to replay them elsewhere (e.g. in Triton's interpreter)."""
    from . import metadata
    from ._common import beta_probe, train_run
    from .mqrar import model_kwargs, sampler

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    sample = sampler(config, seed, n_back)
    x, y = (t.to(device) for t in sample(at))  # the batch after the last step trained: the probe's
    start = time.perf_counter()
    r = train_run(mixer, seed, model_kwargs=model_kwargs(config, mixer), sample=sample, evaluate_fn=None,
                  config=config, device=device, progress=progress, desc=f"probe {mixer} N{n_back} s{seed}",
                  stop_after=at, keep_model=True, probe=beta_probe(x[:8], device))
    model = r.pop("model")
    layers = []
    captured = capture_mixer_inputs(model, x, y, amp=config.get("amp"))
    if save_inputs:
        torch.save([{"args": [a[:save_rows].cpu() for a in rec["args"]], "kwargs": rec["kwargs"],
                     "do": rec["do"][:save_rows].cpu()} for rec in captured], save_inputs)
    for rec in captured:
        layers.append({"form": rec["form"], "errors": input_gradient_errors(mixer, rec)})
    return {"experiment": "gradient_probe", **metadata(device), "config": config, "mixer": mixer, "n_back": n_back,
            "seed": seed, "at": at, "layers": layers, "probe": r.get("probe"), "history": r["history"],
            "wall_time_s": time.perf_counter() - start}


def main(argv=None) -> int:
    from . import make_config
    from .__main__ import _parse_set

    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m pathedu.experiments.gradient_probe", description=__doc__.split("\n")[0])
    p.add_argument("--mixer", default="path", choices=sorted(ARG_NAMES))
    p.add_argument("--n-back", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--at", type=int, default=800, help="training steps before the probe (default 800)")
    p.add_argument("--set", action="append", metavar="KEY=JSON", help="override an mqrar setting")
    p.add_argument("--tiny", action="store_true", help="tiny sizes, on the CPU (tests)")
    p.add_argument("--device")
    p.add_argument("--out", help="output JSON (default: a new file probe_mqrar_MIXER.json in the current folder)")
    p.add_argument("--overwrite", action="store_true", help="let --out replace an existing file")
    p.add_argument("--save-inputs", help="a .pt file for the captured tensors of every layer (first --save-rows rows)")
    p.add_argument("--save-rows", type=int, default=2)
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.out is not None and Path(a.out).exists() and not a.overwrite:
        p.error(f"{a.out} exists: pass --overwrite to replace it, or another --out")
    config = make_config("mqrar", tiny=a.tiny, **_parse_set(a.set))
    device = a.device or ("cpu" if a.tiny else None)
    rec = probe(config, mixer=a.mixer, n_back=a.n_back, seed=a.seed, at=a.at, device=device,
                progress=not a.no_progress, save_inputs=a.save_inputs, save_rows=a.save_rows)
    rec["command"] = "python -m pathedu.experiments.gradient_probe " + " ".join(shlex.quote(x) for x in argv)
    out = a.out or str(_new_file(f"probe_mqrar_{a.mixer}"))
    with open(out, "w") as f:
        json.dump(rec, f, indent=1)
    for i, layer in enumerate(rec["layers"]):
        for name, e in layer["errors"].items():
            others = "  ".join(f"{k[8:]} {v:.2e}" for k, v in e.items() if k.startswith("rel_rms_") and
                               k not in ("rel_rms_triton", "rel_rms_matrix_fp32"))
            print(f"layer {i} d{name:6s} triton {e['rel_rms_triton']:.2e} (max {e['rel_max_triton']:.2e})  "
                  f"fp32 matrix {e['rel_rms_matrix_fp32']:.2e}  {others}")
    print(f"written to {out}")
    return 0


def _new_file(stem: str) -> Path:
    """``STEM.json`` in the current folder, or ``STEM-2.json``, ... the first that does not exist."""
    path, n = Path(f"{stem}.json"), 1
    while path.exists():
        n += 1
        path = Path(f"{stem}-{n}.json")
    return path.resolve()


if __name__ == "__main__":
    raise SystemExit(main())
