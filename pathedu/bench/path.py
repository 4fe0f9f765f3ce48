"""Chapter 5 ops: PaTH attention and DeltaNet, our Triton kernels against SDPA and flash-linear-attention.

``ops()`` is what ``python -m pathedu.bench path`` times.  PaTH's transitions
use unit ``w`` and ``beta`` uniform in [0, 2) (fp32, drawn from a generator
seeded by T, so ``path_triton`` and ``fla_path`` see the same ones); DeltaNet
uses l2-normalised ``q, k`` (made outside the timed region) and ``beta`` uniform
in [0, 1), rounded to the input dtype so that both implementations see the
same numbers.  fla's layout is ``[B, T, H, D]``: transposes happen in ``setup``,
outside the timed region; outputs are returned as ``(B, H, T, Dv)`` views.
fla's ``chunk_delta_rule`` scales ``q`` by ``D ** -0.5`` unless told otherwise
and does not normalise ``q, k`` by default: it is called with ``scale=1.0``.

Run as a script on a GPU (``python -m pathedu.bench.path --help``), the module
also checks the kernels: agreement with float64 references and with fla,
error growth with T, robustness at T = 16384 with ``beta`` near 2, a tile
sweep, and finally the benchmark table (kernels/NOTES_path.md records the results).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Op


def path_inputs(q):
    """Unit ``w`` (fp32, like ``q``'s shape) and ``beta`` in [0, 2) (fp32, ``q.shape[:-1]``), seeded by T."""
    g = torch.Generator(device=q.device).manual_seed(q.shape[-2] + 1)
    w = F.normalize(torch.randn(q.shape, device=q.device, generator=g, dtype=torch.float32), dim=-1)
    beta = 2 * torch.rand(q.shape[:-1], device=q.device, generator=g, dtype=torch.float32)
    return w, beta


def delta_inputs(q, k):
    """l2-normalised ``q, k`` and ``beta`` in [0, 1) rounded to ``q.dtype`` (then fp32), seeded by T."""
    g = torch.Generator(device=q.device).manual_seed(q.shape[-2] + 2)
    beta = torch.rand(q.shape[:-1], device=q.device, generator=g, dtype=torch.float32).to(q.dtype).float()
    return F.normalize(q.float(), dim=-1).to(q.dtype), F.normalize(k.float(), dim=-1).to(q.dtype), beta


def _blhd(x):
    return x.transpose(1, 2).contiguous()


def _sdpa(q, k, v):
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _fla_path(q, k, v):
    from fla.ops.path_attn import parallel_path_attn

    w, beta = path_inputs(q)
    args = [_blhd(x) for x in (q, k, v, w)] + [beta.transpose(1, 2).contiguous()]
    return lambda: parallel_path_attn(*args)[0].transpose(1, 2)


def _path_triton(q, k, v):
    from ..kernels.path_attention import path_attention

    w, beta = path_inputs(q)
    return lambda: path_attention(q, k, v, w, beta)


def _fla_delta(q, k, v):
    from fla.ops.delta_rule import chunk_delta_rule

    qn, kn, beta = delta_inputs(q, k)
    args = [_blhd(x) for x in (qn, kn, v)] + [beta.to(q.dtype).transpose(1, 2).contiguous()]
    return lambda: chunk_delta_rule(*args, scale=1.0)[0].transpose(1, 2)


def _delta_triton(q, k, v):
    from ..kernels.delta_rule import chunked_delta_rule

    qn, kn, beta = delta_inputs(q, k)
    return lambda: chunked_delta_rule(qn, kn, v, beta)


def ops():
    return [
        Op("sdpa", _sdpa, peer=True),
        Op("fla_path", _fla_path, peer=True),
        Op("path_triton", _path_triton, reference="fla_path"),
        Op("fla_delta_rule", _fla_delta, peer=True),
        Op("deltanet_triton", _delta_triton, reference="fla_delta_rule"),
    ]


# ---------------------------------------------------------------------------
# Checks on a GPU (python -m pathedu.bench.path)
# ---------------------------------------------------------------------------

def path_ref64(q, k, v, w, beta, scale=None):
    """PaTH in float64 by the global masked UT form (independent of the kernels), ``(..., T, D)``."""
    q, k, v, w, beta = (x.double() for x in (q, k, v, w, beta))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return torch.softmax(scale * _scores64(q, k, w, beta, causal_fill=float("-inf")), -1) @ v


def householder_ref64(q, k, v, w, beta):
    q, k, v, w, beta = (x.double() for x in (q, k, v, w, beta))
    return _scores64(q, k, w, beta, causal_fill=0.0) @ v


def delta_ref64(q, k, v, beta):
    return householder_ref64(q, k, beta.double()[..., None] * v.double(), k, beta)


def _scores64(q, k, w, beta, causal_fill):
    T = q.shape[-2]
    eye = torch.eye(T, dtype=torch.float64, device=q.device)
    L = eye + (beta[..., :, None] * (w @ w.transpose(-1, -2))).tril(-1)
    A = torch.linalg.solve_triangular(L, torch.diag_embed(beta), upper=False, unitriangular=True)
    s = q @ k.transpose(-1, -2) - (q @ w.transpose(-1, -2)).tril() @ A @ (w @ k.transpose(-1, -2)).tril(-1)
    return s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), causal_fill)


def _rel_rms(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


DEVICE = "cuda"


def _rand(shape, T, D, Dv, seed, *, beta_hi=2.0, beta_lo=0.0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k = (torch.randn(*shape, T, D, device=DEVICE, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(*shape, T, Dv, device=DEVICE, generator=g, dtype=torch.float64)
    w = F.normalize(torch.randn(*shape, T, D, device=DEVICE, generator=g, dtype=torch.float64), dim=-1).float()
    u = torch.rand(*shape, T, device=DEVICE, generator=g, dtype=torch.float64)
    beta = (beta_lo + (beta_hi - beta_lo) * u).float()
    return q, k, v, w, beta


SMALL_SHAPES = [((2, 3), 1, 64, 64), ((1, 2), 1000, 64, 64), ((1, 3), 777, 128, 32), ((2, 1), 300, 16, 48),
                ((1, 2), 129, 96, 80), ((1, 1), 2048, 32, 128)]
# (dtype, shapes, PaTH variants): every shape in bf16 (the benchmark dtype), a few in fp16 and fp32.
SMALL_PLAN = [(torch.bfloat16, SMALL_SHAPES, ((2, "dense"), (1, "dense"), (2, "ut"))),
              (torch.float16, SMALL_SHAPES[1::2], ((2, "dense"),)),
              (torch.float32, SMALL_SHAPES[1:4:2], ((2, "dense"),))]


def check_small(log, plan=SMALL_PLAN):
    """Every dtype and odd sizes against float64 (inputs rounded to the dtype first)."""
    from ..kernels.delta_rule import chunked_delta_rule, chunked_householder
    from ..kernels.path_attention import path_attention

    worst = {}
    for dtype, shapes, variants in plan:
        for i, (lead, T, D, Dv) in enumerate(shapes):
            q, k, v, w, beta = _rand(lead, T, D, Dv, seed=i)
            q, k, v = (x.to(dtype) for x in (q, k, v))
            ref = path_ref64(q, k, v, w, beta)
            errs = {}
            for R, upd in variants:
                cfg = dict(R=R, update=upd, num_warps=4 * R)
                errs[f"path_R{R}_{upd}"] = _rel_rms(path_attention(q, k, v, w, beta, _config=cfg), ref)
            qs, ks = (q.float() / 8).to(dtype), (k.float() / 8).to(dtype)
            errs["householder"] = _rel_rms(chunked_householder(qs, ks, v, w, beta),
                                           householder_ref64(qs, ks, v, w, beta))
            qn, kn = (F.normalize(x.float(), dim=-1).to(dtype) for x in (q, k))
            errs["deltanet"] = _rel_rms(chunked_delta_rule(qn, kn, v, beta / 2), delta_ref64(qn, kn, v, beta / 2))
            errs_s = " ".join(f"{n}={e:.1e}" for n, e in errs.items())
            log(f"  {str(dtype):15s} lead={lead} T={T} D={D} Dv={Dv}: {errs_s}")
            for n, e in errs.items():
                worst[(n, dtype)] = max(worst.get((n, dtype), 0.0), e)
    return worst


def check_against_fla(log, Ts=(2048,)):
    """bf16, B=2, H=4, D=64: ours and fla's against float64 and against each other."""
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.path_attn import parallel_path_attn

    from ..kernels.delta_rule import chunked_delta_rule
    from ..kernels.path_attention import path_attention

    rows = []
    for T in Ts:
        q, k, v, w, beta = _rand((2, 4), T, 64, 64, seed=T)
        q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
        ref = path_ref64(q, k, v, w, beta)
        ours = path_attention(q, k, v, w, beta)
        fla = parallel_path_attn(*[_blhd(x) for x in (q, k, v, w)], beta.transpose(1, 2).contiguous())[0]
        fla = fla.transpose(1, 2)
        rows.append(dict(op="path", T=T, ours_vs_f64=_rel_rms(ours, ref), fla_vs_f64=_rel_rms(fla, ref),
                         ours_vs_fla=_rel_rms(ours, fla)))
        qn, kn = (F.normalize(x.float(), dim=-1).to(torch.bfloat16) for x in (q, k))
        b = (beta / 2).to(torch.bfloat16)
        ref = delta_ref64(qn, kn, v, b.float())
        ours = chunked_delta_rule(qn, kn, v, b.float())
        fla = chunk_delta_rule(*[_blhd(x) for x in (qn, kn, v)], b.transpose(1, 2).contiguous(), scale=1.0)[0]
        fla = fla.transpose(1, 2)
        rows.append(dict(op="deltanet", T=T, ours_vs_f64=_rel_rms(ours, ref), fla_vs_f64=_rel_rms(fla, ref),
                         ours_vs_fla=_rel_rms(ours, fla)))
    for r in rows:
        log(f"  {r['op']:9s} T={r['T']:5d}: ours vs f64 {r['ours_vs_f64']:.2e}  fla vs f64 {r['fla_vs_f64']:.2e}  "
            f"ours vs fla {r['ours_vs_fla']:.2e}")
    return rows


def error_growth(log, Ts=(512, 2048, 8192)):
    """bf16 PaTH against float64 as T grows: dense vs UT update, bf16 update operands, exact-fp32 prep; fla too."""
    from fla.ops.path_attn import parallel_path_attn

    from ..kernels.path_attention import path_attention

    variants = {"dense": dict(update="dense"), "ut": dict(update="ut"),
                "dense_bf16upd": dict(update="dense", update_dtype=torch.bfloat16),
                "dense_x3prep": dict(update="dense", prep_precision="x3")}
    rows = []
    for betas in ("uniform", "near2"):
        for T in Ts:
            lo = 0.0 if betas == "uniform" else 1.999
            q, k, v, w, beta = _rand((1, 2), T, 64, 64, seed=T + 7, beta_lo=lo)
            q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
            ref = path_ref64(q, k, v, w, beta)
            row = dict(beta=betas, T=T)
            for name, cfg in variants.items():
                row[name] = _rel_rms(path_attention(q, k, v, w, beta, _config=dict(R=2, num_warps=8, **cfg)), ref)
            fla = parallel_path_attn(*[_blhd(x) for x in (q, k, v, w)], beta.transpose(1, 2).contiguous())[0]
            row["fla"] = _rel_rms(fla.transpose(1, 2), ref)
            del ref
            torch.cuda.empty_cache()
            rows.append(row)
            errs_s = " ".join(f"{n}={e:.2e}" for n, e in row.items() if n not in ("beta", "T"))
            log(f"  beta {betas:7s} T={T:5d}: {errs_s}")
    return rows


def robustness(log, T=16384, D=64, H=2):
    """bf16, T = 16384, beta in [1.999, 2]: finite output, error against our fp32 run and against float64."""
    from ..kernels.path_attention import path_attention

    q, k, v, w, beta = _rand((1, H), T, D, D, seed=5, beta_lo=1.999)
    out16 = path_attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), w, beta)
    qr, kr, vr = (x.to(torch.bfloat16).float() for x in (q, k, v))
    out32 = path_attention(qr, kr, vr, w, beta)
    finite = bool(torch.isfinite(out16).all())
    res = dict(T=T, finite=finite, bf16_vs_fp32=_rel_rms(out16, out32))
    ref = torch.cat([path_ref64(qr[:, h:h + 1], kr[:, h:h + 1], vr[:, h:h + 1], w[:, h:h + 1], beta[:, h:h + 1])
                     for h in range(H)], dim=1)
    res["bf16_vs_f64"], res["fp32_vs_f64"] = _rel_rms(out16, ref), _rel_rms(out32, ref)
    log(f"  T={T} bf16, beta in [1.999, 2]: finite={finite}  bf16 vs fp32 run {res['bf16_vs_fp32']:.2e}  "
        f"bf16 vs f64 {res['bf16_vs_f64']:.2e}  fp32 vs f64 {res['fp32_vs_f64']:.2e}")
    return res


def sweep(log, Ts=(8192, 2048, 4096, 1024), B=32, H=32, D=64, full=(8192, 2048)):
    """Main-pass tiles, the update's form, the UT block, and the prep pass alone; SDPA and our FA template beside."""
    import triton

    from ..kernels._launch import dot_precision
    from ..kernels.flash_attention import attention
    from ..kernels.path_attention import Prepared, path_attention

    rows = []
    for T in Ts:
        g = torch.Generator(device="cuda").manual_seed(T)
        q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        w, beta = path_inputs(q)

        def bench(name, fn):
            try:
                fn()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            except Exception as exc:  # a config the compiler rejects is recorded, not fatal
                log(f"  T={T} {name}: {type(exc).__name__}: {str(exc)[:200]}")
                return None
            rows.append(dict(T=T, name=name, ms=ms))
            log(f"  T={T:5d} {name:40s} {ms:9.3f} ms")
            return ms

        bench("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        bench("flash_template (ch1 kernel, autotuned)", lambda: attention(q, k, v))
        bench("fla_path", _fla_path(q, k, v))
        bench("path autotuned", lambda: path_attention(q, k, v, w, beta))
        bench("deltanet_triton", _delta_triton(q, k, v))
        bench("fla_delta_rule", _fla_delta(q, k, v))
        if T not in full:
            continue
        q3, k3, w3 = (x.reshape(B * H, T, D) for x in (q, k, w))
        b3 = beta.reshape(B * H, T)
        for blk, store_ut, nw in ((64, False, 4), (64, False, 8), (64, True, 4), (32, False, 4)):
            bench(f"prep block={blk} store_ut={store_ut} warps={nw}", lambda: Prepared(
                q3, k3, w3, b3, T, blk, q_dtype=torch.float16, k_dtype=torch.bfloat16, update_dtype=torch.float16,
                norm_q=True, store_ut=store_ut, precision=dot_precision(torch.bfloat16), num_warps=nw))
        bench("prep for deltanet block=64 (fp32 out)", lambda: Prepared(
            q3, k3, k3, b3, T, 64, q_dtype=torch.float32, k_dtype=torch.float32, update_dtype=torch.float32,
            w_is_k=True, value_beta=True, precision=dot_precision(torch.bfloat16)))
        configs = [("dense", 64, r, nw, ns) for r, nw, ns in ((1, 4, 2), (1, 4, 3), (2, 4, 2), (2, 4, 3), (2, 8, 3))]
        configs += [("ut", 64, 1, 4, 2), ("dense", 32, 2, 4, 3)]
        for upd, blk, r, nw, ns in configs:
            cfg = dict(update=upd, R=r, num_warps=nw, num_stages=ns)
            bench(f"path {upd} block={blk} R={r} warps={nw} stages={ns}",
                  lambda: path_attention(q, k, v, w, beta, block=blk, _config=cfg))
        del q, k, v, w, beta, q3, k3, w3, b3
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    import argparse
    import json
    import os
    import sys
    import time

    p = argparse.ArgumentParser(prog="python -m pathedu.bench.path", description="Chapter 5 kernel checks on a GPU")
    p.add_argument("--out", default=".", help="folder for logs and JSON results")
    p.add_argument("--only", nargs="*", default=["small", "fla", "robust", "table"],
                   help="sections, run in this order (the benchmark table last by default)",
                   choices=["small", "fla", "growth", "robust", "sweep", "table"])
    p.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="sizes of the table")
    p.add_argument("--deadline", type=float, default=1e9, help="start no section after this many seconds")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "path_checks.log"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    import triton

    log(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    results, t0 = {}, time.time()

    def table(log):
        from .__main__ import main as bench_main

        bench_main(["path", "--out", os.path.join(a.out, "bench_path.json"), "--T", *map(str, a.T)])

    sections = dict(small=check_small, fla=check_against_fla, growth=error_growth, robust=robustness, sweep=sweep,
                    table=table)
    for name in a.only:  # in the order asked for
        if time.time() - t0 > a.deadline:
            log(f"== {name}: skipped (past the deadline)")
            continue
        log(f"== {name} ({time.time() - t0:.0f} s)")
        try:
            res = sections[name](log)
            if name == "small":
                res = {f"{k[0]} {k[1]}": v for k, v in res.items()}
                log("  worst relative RMS errors against float64:")
                for key, e in sorted(res.items()):
                    log(f"    {key:40s} {e:.2e}")
            results[name] = res
        except Exception as exc:  # keep going: later sections still report
            log(f"  FAILED: {type(exc).__name__}: {exc}")
        with open(os.path.join(a.out, "path_checks.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    log(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
