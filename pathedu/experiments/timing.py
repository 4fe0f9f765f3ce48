"""Step times of an experiment's runs, and the whole experiment's time estimated from them.

``python -m pathedu.experiments.timing NAME [--tiny] [--mixers ...] [--forms ...] [--device DEV] [--steps N]
[--set KEY=JSON] [--out FILE]`` times ``--steps`` training steps (after ``--warmup`` untimed ones, which absorb
Triton's compilation and autotuning) of every distinct model/shape of the experiment's configuration and
prints one JSON line per shape, then the estimate: the sum over runs of ``steps x step time``
(evaluation and compilation not included).

``--forms triton chunked`` times every shape once in each form (:func:`pathedu.models.select_form`), so that the
rows set a model's training step with the Triton kernels beside the same step with the PyTorch forms; the estimate
then uses the first form.  ``--out FILE`` also writes the rows as a data file (``{"meta": {...}, "rows": [...]}``,
the meta as :func:`pathedu.bench._common.run_meta` makes it, with the configuration).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from . import get_module, make_config
from ._common import short_conv, w_settings
from .. import tasks
from ..models import FORMS, build_model, select_form
from ..train import lm_targets, masked_loss

__all__ = ["shapes", "time_steps", "estimate"]


def shapes(name: str, config: dict):
    """``(mixer, model_kwargs, batch_fn, n_runs)`` for each distinct model and batch shape of ``config``."""
    out = []
    if name == "flipflop":
        for mixer in config["mixers"]:
            kw = dict(vocab=5, d_model=config["d_model"], n_layers=config["n_layers"], n_heads=config["n_heads"],
                      mlp_ratio=config["mlp_ratio"], form=config["form"], short_conv=short_conv(config, mixer),
                      **w_settings(config, mixer))
            fn = lambda s: lm_targets(*tasks.flipflop(config["batch_size"], config["length"], seed=s))  # noqa: E731
            out.append((mixer, kw, fn, len(config["seeds"])))
    elif name == "word_problem":
        for group in config["groups"]:
            G = len(tasks.group_elements(group))
            for length in config["lengths"]:
                for mixer in config["mixers"]:
                    for L in config["layers"]:
                        kw = dict(vocab=G, d_model=config["d_model"], n_layers=L, n_heads=config["n_heads"],
                                  mlp_ratio=config["mlp_ratio"], form=config["form"],
                                  beta_max=config["beta_max"].get(mixer), short_conv=short_conv(config, mixer),
                                  **w_settings(config, mixer))
                        fn = (lambda s, g=group, n=length:  # noqa: E731
                              tasks.word_problem(g, config["batch_size"], n, seed=s))
                        out.append((mixer, kw, fn, len(config["seeds"])))
    elif name == "mqrar":
        for mixer in config["mixers"]:
            kw = dict(vocab=config["vocab"], d_model=config["d_model"], n_layers=config["n_layers"],
                      n_heads=config["n_heads"], mlp_ratio=config["mlp_ratio"], form=config["form"],
                      beta_max=config["beta_max"].get(mixer), short_conv=short_conv(config, mixer),
                      **w_settings(config, mixer))
            fn = lambda s: tasks.mqrar(config["batch_size"], config["length"], n_keys=config["n_keys"],  # noqa: E731
                                       n_back=1, vocab=config["vocab"], seed=s)
            out.append((mixer, kw, fn, len(config["seeds"]) * len(config["n_backs"])))
    return out


def time_steps(mixer, model_kwargs, batch_fn, *, device, steps: int = 10, warmup: int = 3) -> dict:
    """Seconds per training step (data generation, forward, backward, AdamW), median of ``steps``."""
    device = torch.device(device)
    torch.manual_seed(0)
    model = build_model(mixer, **model_kwargs).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    amp = device.type == "cuda"
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        x, y = batch_fn(i)
        x, y = x.to(device), y.to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            loss = masked_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    return {"step_s": times[len(times) // 2], "min_s": times[0],
            "form": select_form(mixer, model_kwargs.get("form", "auto"), device=device, T=x.shape[1])}


def estimate(name: str, config: dict, *, device, steps: int = 10, warmup: int = 3, verbose: bool = True,
             forms=None) -> dict:
    """Rows of :func:`time_steps` for every shape of :func:`shapes` (and every form of ``forms``, a list of
    :data:`pathedu.models.FORMS`; None: the configuration's), and the estimate from the first form's rows."""
    forms = [config["form"]] if forms is None else list(forms)
    total = 0.0
    rows = []
    for mixer, kw, fn, n_runs in shapes(name, config):
        for i, form in enumerate(forms):
            t = time_steps(mixer, dict(kw, form=form), fn, device=device, steps=steps, warmup=warmup)
            run_s = t["step_s"] * config["steps"] * n_runs
            total += run_s if i == 0 else 0.0
            row = {"mixer": mixer, "n_layers": kw["n_layers"], "vocab": kw["vocab"], "asked": form, **t,
                   "runs": n_runs, "train_s": run_s}
            rows.append(row)
            if verbose:
                print(json.dumps(row), flush=True)
    return {"rows": rows, "total_train_s": total, "total_train_min": total / 60}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pathedu.experiments.timing")
    p.add_argument("name")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--preset", help="named settings of the experiment (e.g. 'paper')")
    p.add_argument("--mixers", nargs="+")
    p.add_argument("--forms", nargs="+", choices=FORMS, help="time every shape in each of these forms")
    p.add_argument("--out", help="also write the rows to this JSON file (a new file only)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--set", action="append", metavar="KEY=JSON")
    args = p.parse_args(argv)
    from .__main__ import _parse_set

    get_module(args.name)
    config = make_config(args.name, tiny=args.tiny, preset=args.preset, mixers=args.mixers,
                         **_parse_set(args.set))
    if args.out and os.path.exists(args.out):
        p.error(f"--out {args.out} exists: a timing run never writes over a file")
    est = estimate(args.name, config, device=args.device, steps=args.steps, warmup=args.warmup, forms=args.forms)
    print(json.dumps({"experiment": args.name, "device": str(args.device),
                      "total_train_min": round(est["total_train_min"], 2)}))
    if args.out:
        from ..bench._common import run_meta, write_rows

        command = "python -m pathedu.experiments.timing " + " ".join(sys.argv[1:] if argv is None else argv)
        meta = dict(run_meta(command, args.device), experiment=args.name, config=config, steps=args.steps,
                    warmup=args.warmup)
        write_rows(args.out, meta, est["rows"])


if __name__ == "__main__":
    main()
