"""Command line: ``python -m pathedu.bench CHAPTER [--T ...] [--out FILE]`` (needs a CUDA GPU)."""
from __future__ import annotations

import argparse
import sys
import time

from . import CHAPTERS, DATA_DIR, chapter_ops
from ._common import rel_rms, run_meta, seeded_qkv, write_rows


def _leaves(out):
    """The tensors whose ``.grad`` a backward from ``out`` fills (its graph's AccumulateGrad nodes)."""
    found, seen, todo = [], set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):
            found.append(node.variable)
        todo.extend(f for f, _ in node.next_functions)
    return found


def _with_backward(fn, out):
    """``fn`` followed by a backward pass with a fixed output gradient; every leaf's ``.grad`` is
    dropped first, so that no accumulation (an extra add per leaf) is timed."""
    import torch

    if out.grad_fn is None:
        raise RuntimeError("the op's output has no grad_fn: it has no backward pass")
    g = torch.Generator(device=out.device).manual_seed(0)
    do = torch.randn(out.shape, dtype=out.dtype, device=out.device, generator=g)
    leaves = _leaves(out)

    def step():
        for t in leaves:
            t.grad = None
        fn().backward(do)

    return step


def main(argv=None) -> int:
    import torch
    import triton
    from tqdm.auto import tqdm

    p = argparse.ArgumentParser(prog="python -m pathedu.bench", description=__doc__)
    p.add_argument("chapter", choices=CHAPTERS)
    p.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--ops", nargs="*", help="only these ops (peers and references are always kept)")
    p.add_argument("--skip", nargs="*", default=[],
                   help="leave these ops out, peers included (e.g. fla ops that autotune for minutes); "
                        "the command recorded in the data file says which")
    p.add_argument("--rep", type=int, default=200, help="do_bench repetition time, ms")
    p.add_argument("--no-checks", action="store_true",
                   help="accepted for old command lines; the GPU checks are `python -m pathedu.bench.checks CHAPTER`")
    p.add_argument("--backward", action="store_true",
                   help="time forward + backward (q, k, v and the gates require grad; the output's gradient is "
                        "a fixed random tensor); default file bench_CHAPTER_fwdbwd.json")
    p.add_argument("--out", help=f"JSON file to write (default {DATA_DIR}/bench_CHAPTER.json)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m pathedu.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    ops = [o for o in chapter_ops(a.chapter) if not a.ops or o.name in a.ops or o.peer or o.reference is None]
    ops = [o for o in ops if o.name not in a.skip and (a.backward or not o.backward_only)]
    meta = run_meta("python -m pathedu.bench " + " ".join(argv if argv is not None else sys.argv[1:]))
    meta.update(dtype=a.dtype, sizes=dict(B=a.B, H=a.H, D=a.D, T=a.T), causal=True,
                pass_="forward+backward" if a.backward else "forward", timer="triton.testing.do_bench, median ms")
    if a.backward:
        from ..kernels import flash_attention

        # which pass the FlashAttention template's backward took: the ops pass no atomic_dq, so the measured default
        meta["template_backward"] = f"auto: single pass without a bias from T = {flash_attention.SINGLE_PASS_MIN_T}"
    out = a.out or str(DATA_DIR / f"bench_{a.chapter}{'_fwdbwd' if a.backward else ''}.json")
    rows = []
    for T in tqdm(a.T, desc="sequence lengths"):
        q, k, v = seeded_qkv((a.B, a.H), T, a.D, seed=T, device="cuda", dtype=dtype)
        if a.backward:
            q, k, v = (x.requires_grad_() for x in (q, k, v))
        outs, times = {}, {}
        for op in ops:
            if op.max_T is not None and T > op.max_T:
                continue
            try:
                start = time.perf_counter()
                fn = op.setup(q, k, v)
                outs[op.name] = fn()  # also compiles / autotunes before timing
                if a.backward:
                    fn = _with_backward(fn, outs[op.name])
                    outs[op.name] = outs[op.name].detach()
                    fn()
                torch.cuda.synchronize()
                # the first call compiles and autotunes (fla's backwards for minutes): say who takes the time
                print(f"  {op.name} at T={T}: first call {time.perf_counter() - start:.1f} s", file=sys.stderr)
                times[op.name] = triton.testing.do_bench(fn, warmup=50, rep=a.rep, return_mode="median")
            except Exception as exc:  # a peer missing or refusing (fla's gated backwards on Hopper) is recorded
                why = f"{type(exc).__name__}: {exc}"
                print(f"  {op.name} at T={T}: {why}", file=sys.stderr)
                meta.setdefault("failures", []).append(dict(op=op.name, T=T, error=why[:500]))
                continue
        for op in ops:
            if op.name not in times:
                continue
            row = dict(op=op.name, T=T, ms=times[op.name], peer=op.peer)
            if "sdpa" in times:
                row["ratio_to_sdpa"] = times[op.name] / times["sdpa"]
            if op.reference and op.reference in times:
                row["ratio_to_reference"] = times[op.name] / times[op.reference]
            if op.reference and op.reference in outs:
                row["reference"] = op.reference
                row["rel_rms_err"] = rel_rms(outs[op.name], outs[op.reference])
                row["finite"] = bool(torch.isfinite(outs[op.name]).all())
            rows.append(row)
        del q, k, v, outs
        torch.cuda.empty_cache()
        write_rows(out, meta, rows, say=False)  # after every T: a run cut short still leaves its data
    print(f"\n{meta['device']}  B={a.B} H={a.H} D={a.D} {a.dtype}  commit {meta['commit']}")
    print(f"{'op':24s} {'T':>6s} {'ms':>9s} {'x SDPA':>7s} {'x ref':>6s}  rel RMS err vs reference")
    for r in rows:
        err = f"{r['rel_rms_err']:.2e} vs {r['reference']}" if "rel_rms_err" in r else ""
        print(f"{r['op']:24s} {r['T']:6d} {r['ms']:9.3f} {r.get('ratio_to_sdpa', float('nan')):7.2f} "
              f"{r.get('ratio_to_reference', float('nan')):6.2f}  {err}")
    write_rows(out, meta, rows)
    print(f"(the chapter's GPU checks: python -m pathedu.bench.checks {a.chapter} --out FILE)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
