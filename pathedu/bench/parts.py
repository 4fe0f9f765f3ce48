"""Where the time goes: each launch of the UT-based kernels timed apart, on a CUDA GPU.

    python -m pathedu.bench.parts [--T 1024 8192] [--out FILE]

The chunked DeltaNet kernel (chapter 5; Gated DeltaNet of chapter 7 shares it) is two passes: the WY
preparation pass (:class:`pathedu.kernels.ut_prepare.WYPrepared`: ``_ut_diag_inverse``, then
``_wy_prepare``) and the chunk loop of the linear template (``_linear_fwd``, its ``"delta"`` hook, with
and without the scalar decay).  PaTH and PaTH-FoX
are the same preparation pass and a scan; the scan's time is the total minus the preparation's
(``scan = total - prepare``, derived, not timed apart).  PaTH's forward + backward is timed step by step
(subject ``path_backward``: the forward and the backward's steps, the meeting points in each storage dtype).  RoPE's
rotation pre-pass (subject ``rope``) is timed beside a plain copy of q and k, its memory floor.  Each part
is timed on its own with ``triton.testing.do_bench`` (median), on the inputs of :mod:`pathedu.bench.path` and
:mod:`pathedu.bench.pathfox`, beside the whole ops of flash-linear-attention when it is installed.
The data file (``{"meta": ..., "rows": [{"T", "subject", "part", "ms"}]}``) is what
the chapters and ``kernels/NOTES_path.md``, "Where the time goes", cite.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys

import torch

from ._common import run_meta, seeded_qkv, to_bthd, write_rows


def _delta_parts(q, k, v, bench):
    """Parts of the chunked (gated) DeltaNet kernel on bench-sized inputs, in ms."""
    from ..kernels._launch import per_token, prepare_qkv
    from ..kernels.delta_rule import _factor_dtype, _prepare, chunked_delta_rule
    from ..kernels.linear_attention import linear_launch
    from ..kernels.ut_prepare import check_block
    from .fox import _log_f
    from .path import delta_inputs

    qn, kn, beta = delta_inputs(q, k)
    log_f = _log_f(q)
    x = prepare_qkv(qn, kn, v)
    beta3, log_f3 = per_token(beta, "beta", x), per_token(log_f, "log_f", x)
    chunk = check_block(None, x.n.D)

    wy_dtype = _factor_dtype(None, x.dtype)

    def prepared(gate=None):  # as chunked_delta_rule makes it
        return _prepare(x, x.k, beta3, chunk, delta=True, log_f3=gate, wy_dtype=wy_dtype)[0]

    prep, precision = _prepare(x, x.k, beta3, chunk, delta=True, wy_dtype=wy_dtype)
    prep_g = prepared(log_f3)
    out = {
        "prepare (both launches)": bench(prepared),
        "prepare: _ut_diag_inverse": bench(prep.invert_diagonal_blocks),
        "prepare: _wy_prepare": bench(prep.prepare),
        "prepare, gated (both launches)": bench(lambda: prepared(log_f3)),
        "chunk loop, no gate": bench(lambda: linear_launch(x, "delta", chunk=chunk, prep=prep,
                                                            precision=precision)),
        "chunk loop, scalar decay": bench(lambda: linear_launch(x, "delta", log_f3, chunk=chunk, prep=prep_g,
                                                                 precision=precision)),
        "deltanet_triton (total)": bench(lambda: chunked_delta_rule(qn, kn, v, beta)),
        "gated_deltanet_triton (total)": bench(lambda: chunked_delta_rule(qn, kn, v, beta, log_f=log_f)),
    }
    if importlib.util.find_spec("fla") is not None:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        a = [to_bthd(t) for t in (qn, kn, v, beta.to(q.dtype))]
        out["fla chunk_delta_rule (total)"] = bench(lambda: chunk_delta_rule(*a, scale=1.0))
        g = [to_bthd(t) for t in (qn, kn, v, log_f, beta.to(q.dtype))]
        out["fla chunk_gated_delta_rule (total)"] = bench(lambda: chunk_gated_delta_rule(*g, scale=1.0))
    return out


def _path_parts(q, k, v, bench):
    """PaTH-FoX's preparation pass and total (the scan is the difference), in ms."""
    from ..kernels._launch import per_token, prepare_qkv
    from ..kernels.path_attention import _prepare, path_attention
    from ..kernels.ut_prepare import check_block
    from .fox import _log_f
    from .path import path_inputs

    w, beta = path_inputs(q)
    log_f = _log_f(q)
    x = prepare_qkv(q, k, v)
    w3, beta3 = per_token(w, "w", x, extra=(x.n.D,)), per_token(beta, "beta", x)
    block = check_block(None, x.n.D)

    def prepared():  # as path_attention makes it by default (dense update)
        return _prepare(x, w3, beta3, block)

    prep = prepared()
    out = {
        "prepare (both launches)": bench(prepared),
        "prepare: _ut_diag_inverse": bench(prep.invert_diagonal_blocks),
        "prepare: _ut_prepare": bench(prep.prepare),
        "pathfox_triton (total)": bench(lambda: path_attention(q, k, v, w, beta, log_f=log_f)),
    }
    out["scan (total - prepare, derived)"] = out["pathfox_triton (total)"] - out["prepare (both launches)"]
    return out


# The storage dtypes of PaTH's meeting-point rows that the backward's parts are timed with.
_X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _path_backward_parts(q, k, v, bench):
    """PaTH's forward + backward (``path_triton``; q, k, v, w, beta require grad), step by step, in ms: the forward
    of a call to be differentiated (:func:`pathedu.kernels.path_attention._path_train_forward`: the preparation
    pass, the carries, the dyadic forward), then the backward's steps
    (:func:`pathedu.kernels.path_attention._path_bwd_launch`), beside the scan (the forward without gradients) and
    fla's forward + backward.  The meeting-point rows ``X`` are timed in each storage dtype (fp32; fp16, the
    default for 16-bit inputs, :func:`pathedu.kernels.path_attention._stored_x_dtype`; bf16): the carries, the
    dyadic forward, ``_path_bwd`` and the whole forward + backward once per dtype; the later steps read the
    default's ``dX`` (the reversed carries read the carries that the forward kept, as a training step does; with
    fp16 factors they are also timed in each product precision, ``"fp16"`` and ``"tf32n"``).  The whole
    step is timed with the factors kept (the default) and made again (``save_factors=False``)."""
    from ..kernels import path_attention as pa
    from ..kernels._launch import per_token, prepare_qkv
    from ..kernels.flash_attention import bwd_delta
    from ..kernels.path_carry import carry_backward, carry_forward
    from ..kernels.ut_prepare import check_block, ut_prepare_backward
    from .path import path_inputs

    w, beta = (t.detach() for t in path_inputs(q))
    x = prepare_qkv(q, k, v)
    w3, beta3 = per_token(w, "w", x, extra=(x.n.D,)), per_token(beta, "beta", x)
    block = check_block(None, x.n.D)
    scale = x.n.D ** -0.5
    default = pa._stored_x_dtype(x.dtype)

    def tagged(dtype):  # the meeting points' dtype, as the parts' names show it
        return f"X {str(dtype).removeprefix('torch.')}" + (", the default" if dtype == default else "")

    # Each step on the previous one's outputs; what a step no longer needs is freed (T = 8192 at B = H = 32
    # keeps about 30 GB of fp32 intermediates alive at the peak).
    times = {"the scan (forward without gradients)": bench(
        lambda: pa._path_launch(x, w3, beta3, scale, block, "dense", {}))}
    times["forward 1: preparation pass (keeps the inverses)"] = bench(lambda: pa._bwd_prepare(x, w3, beta3, block))
    prep = pa._bwd_prepare(x, w3, beta3, block)
    for dtype in _X_DTYPES:
        tag = tagged(dtype)
        times[f"forward 2: carries to the meeting points ({tag})"] = bench(
            lambda: carry_forward(prep.qt, prep.kt, prep.g, block, dtype, keep_carries=True))
        X, C = carry_forward(prep.qt, prep.kt, prep.g, block, dtype, keep_carries=True)
        times[f"forward 3: _path_dyadic_fwd ({tag})"] = bench(
            lambda: pa._dyadic_forward(x, None, scale, block, prep, X))
        out, lse = pa._dyadic_forward(x, None, scale, block, prep, X)
        do = torch.randn_like(out)
        delta = bwd_delta(out, do)
        times[f"backward 2: _path_bwd ({tag})"] = bench(
            lambda: pa._bwd_kernel(x, None, do, lse, delta, scale, block, prep, X))
        if dtype == default:  # delta reads the output alone, whatever the meeting points: timed once
            times["backward 1: delta = dO . O"] = bench(lambda: bwd_delta(out, do))
            dX, dad, *_ = pa._bwd_kernel(x, None, do, lse, delta, scale, block, prep, X)
            kept = C
        del X, C
    times["backward 3: reversed carries"] = bench(lambda: carry_backward(prep.qt, prep.kt, prep.g, block, dX,
                                                                          x.dtype, kept))
    if prep.g.dtype == torch.float16:  # both product precisions of fp16 factors (kernels/NOTES_path.md, "The carries")
        for p in ("fp16", "tf32n"):
            times[f"backward 3: reversed carries (precision='{p}')"] = bench(
                lambda: carry_backward(prep.qt, prep.kt, prep.g, block, dX, x.dtype, kept, precision=p))
    dqt, dkt, dg = carry_backward(prep.qt, prep.kt, prep.g, block, dX, x.dtype, kept)
    del dX, kept
    times["backward 4: preparation pass backward"] = bench(lambda: ut_prepare_backward(x.q, x.k, w3, beta3, prep,
                                                                                       dqt, dkt, dad, dg))
    del prep, dqt, dkt, dg, dad, out, do, lse, delta
    torch.cuda.empty_cache()
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, w, beta)]
    g = torch.randn(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)

    def fwd_bwd(save=True):
        for t in leaves:
            t.grad = None
        pa.path_attention(*leaves, save_factors=save).backward(g)

    for dtype in _X_DTYPES:
        with pa.meeting_point_dtype(dtype):
            times[f"path_triton forward+backward (total, {tagged(dtype)})"] = bench(fwd_bwd)
    times["path_triton forward+backward (total, factors made again: save_factors=False)"] = bench(
        lambda: fwd_bwd(False))
    if importlib.util.find_spec("fla") is not None:
        from fla.ops.path_attn import parallel_path_attn

        fl = [to_bthd(t) for t in leaves]
        gl = to_bthd(g)

        def fla_step():
            for t in fl:
                t.grad = None
            parallel_path_attn(*fl)[0].backward(gl)

        times["fla parallel_path_attn forward+backward (total)"] = bench(fla_step)
    return times


def _rope_parts(q, k, v, bench):
    """RoPE's rotation pre-pass alone (both pairings), beside what bounds it (copying q and k once: the same bytes
    read and written), fla's rotary kernel and the FlashAttention template it feeds, in ms."""
    from .. import nope, rope
    from ..kernels.rope import rotate_qk

    out = {
        "memory floor: q.clone() + k.clone()": bench(lambda: (q.clone(), k.clone())),
        "rotate_qk, interleaved pairs": bench(lambda: rotate_qk(q, k)),
        "rotate_qk, half pairs": bench(lambda: rotate_qk(q, k, pairing="half")),
        "FlashAttention template alone (nope_triton)": bench(lambda: nope.nope_triton(q, k, v)),
        "rope_triton (total)": bench(lambda: rope.rope_triton(q, k, v)),
        "rope_triton, rotation hook (total)": bench(lambda: rope.rope_triton(q, k, v, rotation="fused")),
        "linear template alone (linear_triton)": bench(lambda: nope.linear_triton(q, k, v)),
        "complex_triton (total)": bench(lambda: rope.complex_triton(q, k, v)),
        "complex_triton, rotation hook (total)": bench(lambda: rope.complex_triton(q, k, v, rotation="fused")),
    }
    if importlib.util.find_spec("fla") is not None:
        from .rope import _fla_rotary

        emb = _fla_rotary(q)
        qt, kt = to_bthd(q), to_bthd(k)
        out["fla RotaryEmbedding, interleaved ([B, T, H, D])"] = bench(lambda: emb(qt, kt))
    return out


SUBJECTS = {"deltanet": _delta_parts, "pathfox": _path_parts, "path_backward": _path_backward_parts,
            "rope": _rope_parts}


def main(argv=None) -> int:
    import triton

    p = argparse.ArgumentParser(prog="python -m pathedu.bench.parts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, nargs="+", default=[1024, 8192])
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--subjects", nargs="+", default=list(SUBJECTS), choices=list(SUBJECTS))
    p.add_argument("--out", required=True, help="JSON file to write")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m pathedu.bench.parts needs a CUDA GPU", file=sys.stderr)
        return 2
    meta = run_meta("python -m pathedu.bench.parts " + " ".join(argv if argv is not None else sys.argv[1:]))
    meta.update(dtype="bfloat16", sizes=dict(B=a.B, H=a.H, D=a.D, T=a.T), timer="triton.testing.do_bench, median ms")

    def bench(fn):
        fn()  # compile first
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    rows = []
    for T in a.T:
        q, k, v = seeded_qkv((a.B, a.H), T, a.D, seed=T, device="cuda", dtype=torch.bfloat16)
        for subject in a.subjects:
            for part, ms in SUBJECTS[subject](q, k, v, bench).items():
                rows.append(dict(T=T, subject=subject, part=part, ms=ms))
                print(f"T={T:6d}  {subject:9s} {part:40s} {ms:9.3f} ms", flush=True)
    write_rows(a.out, meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
