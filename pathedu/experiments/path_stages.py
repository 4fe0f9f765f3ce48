r"""PaTH's kernels stage by stage on captured tensors: where the GPU and Triton's interpreter part ways.

``python -m pathedu.experiments.path_stages dump INPUTS.pt LAYER ROWS OUT.pt`` (on the GPU) runs the stages of a
forward to be differentiated and of the backward of :func:`pathedu.kernels.path_attention.path_attention` on one
layer's tensors saved by ``gradient_probe --save-inputs`` and writes every intermediate, in three files ``OUT_0.pt`` ..
``OUT_2.pt`` (each under the device's 16 MiB limit on files back).  ``compare INPUTS.pt LAYER ROWS OUT.pt`` (on the
CPU, in the interpreter) recomputes the stages and prints, for each, how far the GPU's is from the
interpreter's: chained (each side from its own previous stage) and isolated (the interpreter's stage on the GPU's
inputs).  It tells, for instance, a backward whose softmax reads statistics of other logits than those it
differentiates (a forward that ran the scan, where the backward runs the dyadic schedule) from carries or UT
factors that disagree: a forward to be differentiated therefore runs on the backward's schedule.

A diagnostic of the kernels' internals (it calls their private launchers), not a public API.
"""
from __future__ import annotations

import argparse
import os

import torch

__all__ = ["stages", "compare"]

_GROUPS = (("out", "lse", "qt", "kt", "ad", "g", "inv"), ("X", "dX", "dad", "dv"),
           ("dqt", "dkt", "dg", "dq", "dk", "dw", "dbeta"))


def _setup(args, device):
    from ..checks import check_scale
    from ..kernels._launch import per_token, prepare_qkv
    from ..kernels.ut_prepare import check_block

    q, k, v, w, beta = (a.to(device) for a in args)
    x = prepare_qkv(q, k, v, backward=True)
    w3 = per_token(w, "w", x, extra=(x.n.D,), backward=True)
    beta3 = per_token(beta, "beta", x, backward=True)
    return x, w3, beta3, check_scale(None, x.n.D), check_block(None, x.n.D)


def stages(args, do, device) -> dict:
    """Every intermediate of PaTH's forward to be differentiated (the preparation pass, the meeting points, the
    output and its log-sum-exp) and of its backward on ``args = (q, k, v, w, beta)`` ``(B, H, T, ·)`` and the
    output gradient ``do``, on ``device``; CPU tensors keyed by stage."""
    from ..kernels import path_attention as pa
    from ..kernels.flash_attention import bwd_delta
    from ..kernels.path_carry import carry_backward
    from ..kernels.ut_prepare import ut_prepare_backward

    x, w3, beta3, scale, block = _setup(args, device)
    n = x.n
    out, lse, prep, X, C = pa._path_train_forward(x, w3, beta3, None, scale, block)
    do3 = do.to(x.device).reshape(x.BH, n.T, n.Dv).to(x.dtype).contiguous()
    dX, dad, dv, _, _ = pa._bwd_kernel(x, None, do3, lse, bwd_delta(out, do3), scale, block, prep, X)
    dqt, dkt, dg = carry_backward(prep.qt, prep.kt, prep.g, block, dX, x.dtype, C)
    dq, dk, dw, dbeta = ut_prepare_backward(x.q, x.k, w3, beta3, prep, dqt, dkt, dad, dg)
    res = dict(out=out, lse=lse, qt=prep.qt, kt=prep.kt, ad=prep.ad, g=prep.g, inv=prep.inv, X=X, dX=dX, dad=dad,
               dv=dv, dqt=dqt, dkt=dkt, dg=dg, dq=dq, dk=dk, dw=dw, dbeta=dbeta)
    return {key: t.detach().cpu() for key, t in res.items()}


def _rel(a, b) -> str:
    a, b = a.double(), b.double()
    bad = int((~torch.isfinite(a)).sum())
    err = ((a - b).nan_to_num().norm() / b.norm().clamp_min(1e-300)).item()
    return f"{err:.2e}" + (f" ({bad} non-finite)" if bad else "")


def compare(args, do, gpu: dict) -> list[str]:
    """The lines :mod:`path_stages` prints: each stage of ``gpu`` (:func:`stages` on a GPU) against the
    interpreter's, chained and isolated (run this in the interpreter, on the CPU)."""
    from ..kernels import path_attention as pa
    from ..kernels.flash_attention import bwd_delta
    from ..kernels.path_carry import carry_backward, carry_forward
    from ..kernels.ut_prepare import ut_prepare_backward

    mine = stages(args, do, "cpu")
    lines = ["chained (each side from its own previous stages):"]
    lines += [f"  {key:6s} {_rel(gpu[key], mine[key])}" for key in mine]
    x, w3, beta3, scale, block = _setup(args, "cpu")
    prep = pa._bwd_prepare(x, w3, beta3, block)
    for key in ("qt", "kt", "ad", "g", "inv"):
        setattr(prep, key, gpu[key].to(getattr(prep, key).dtype))
    do3 = do.reshape(x.BH, x.n.T, x.n.Dv).to(x.dtype).contiguous()
    X_gpu = gpu["X"].to(mine["X"].dtype)
    X, C = carry_forward(prep.qt, prep.kt, prep.g, block, X_gpu.dtype, keep_carries=True)
    out, lse = pa._dyadic_forward(x, None, scale, block, prep, X_gpu)
    out_gpu = gpu["out"].to(out.dtype)
    dX, dad, dv, _, _ = pa._bwd_kernel(x, None, do3, gpu["lse"], bwd_delta(out_gpu, do3), scale, block, prep, X_gpu)
    dqt, dkt, dg = carry_backward(prep.qt, prep.kt, prep.g, block, gpu["dX"].float(), x.dtype, C)
    dq, dk, dw, dbeta = ut_prepare_backward(x.q, x.k, w3, beta3, prep, gpu["dqt"], gpu["dkt"], gpu["dad"], gpu["dg"])
    lines += ["isolated (the interpreter's stage on the GPU's inputs, against the GPU's stage):",
              f"  X      {_rel(gpu['X'], X)}",
              f"  out    {_rel(gpu['out'], out)}   lse {_rel(gpu['lse'], lse)}",
              f"  dX     {_rel(gpu['dX'], dX)}   dad {_rel(gpu['dad'], dad)}   dv {_rel(gpu['dv'], dv)}",
              f"  dqt    {_rel(gpu['dqt'], dqt)}   dkt {_rel(gpu['dkt'], dkt)}   dg {_rel(gpu['dg'], dg)}",
              f"  dq     {_rel(gpu['dq'], dq)}   dk {_rel(gpu['dk'], dk)}   dw {_rel(gpu['dw'], dw)}   "
              f"dbeta {_rel(gpu['dbeta'], dbeta)}"]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pathedu.experiments.path_stages", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("dump", "compare"))
    p.add_argument("inputs", help="a file of gradient_probe --save-inputs")
    p.add_argument("layer", type=int)
    p.add_argument("rows", type=int, help="how many sequences of the saved batch")
    p.add_argument("stages", help="OUT.pt: written as OUT_0.pt .. OUT_2.pt (dump), read back (compare)")
    a = p.parse_args(argv)
    rec = torch.load(a.inputs)[a.layer]
    args, do = [t[:a.rows] for t in rec["args"]], rec["do"][:a.rows]
    stem = os.path.splitext(a.stages)[0]
    if a.command == "dump":
        res = stages(args, do, "cuda" if torch.cuda.is_available() else "cpu")
        for i, keys in enumerate(_GROUPS):
            torch.save({key: res[key] for key in keys}, f"{stem}_{i}.pt")
        print({key: tuple(t.shape) for key, t in res.items()})
    else:
        gpu = {}
        for i in range(len(_GROUPS)):
            gpu.update(torch.load(f"{stem}_{i}.pt"))
        print("\n".join(compare(args, do, gpu)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
