"""Where a call's time goes at short sequence lengths: device work, launches and the host, on a CUDA GPU.

    python -m pathedu.bench.launches CHAPTER [CHAPTER ...] [--T 1024 2048] [--backward] [--out FILE]

At T = 1024 (B = H = 32, D = 64) SDPA takes about 0.39 ms, and a few small launches or a slow host path are
a visible share of a call.  For every op of the chapters' benchmarks (:mod:`pathedu.bench`) this measures,
on the same inputs:

* ``ms``: ``triton.testing.do_bench``'s median, what the benchmarks report (the L2 cache flushed before each call);
* ``device_ms``: the sum of the durations of the call's kernels, copies and fills, from ``torch.profiler``
  (averaged over the profiled calls), and ``kernels``: each launch's name, count per call and mean duration;
* ``loop_ms``: wall time per call of back-to-back calls with one synchronisation at the end (no cache flush);
* ``host_ms``: the median wall time of one call on an idle GPU from the call to its return, what the host spends
  before the caller can queue more work (it includes the wait of :class:`pathedu.checks.checked_after`);
* ``host_top``: where that host time goes, the Python functions with the most time per call (``cProfile``,
  cumulative and own time, ms per call): a synchronisation shows up as a built-in that waits.

``ms - device_ms`` is time the GPU spends idle or in launch gaps inside a call; when ``host_ms`` exceeds
``device_ms``, the host, not the GPU, sets the pace of back-to-back calls.  The data file
(``{"meta": ..., "rows": [...]}``) is what the design notes cite for where the short-T time goes
(``kernels/NOTES_flash.md``, "Where the time goes"; ``kernels/NOTES_path.md``, "Where the time goes").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

# Ops left out by default: references in float32 or pure PyTorch that are slow by design, not kernels.
SLOW_REFERENCES = ("alibi_blockwise_fp32", "retnet_chunked_fp32", "torch_rope_sdpa", "torch_rope_linear")


def _kernel_table(prof, calls: int) -> tuple[float, list[dict]]:
    """Device-side events of a profile (kernels, copies, fills): total ms per call, and per name the launches
    per call and the mean duration in microseconds, longest first."""
    from torch.autograd import DeviceType

    per_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        per_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    table = [dict(name=name[:120], per_call=len(d) / calls, mean_us=sum(d) / len(d), total_us=sum(d) / calls)
             for name, d in per_name.items()]
    table.sort(key=lambda r: -r["total_us"])
    return sum(r["total_us"] for r in table) / 1e3, table


def _host_profile(fn, calls: int, top: int = 14) -> list[str]:
    """The functions with the most cumulative and own time over ``calls`` calls of ``fn``, ms per call."""
    import cProfile
    import pstats

    import torch

    prof = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        prof.enable()
        fn()
        prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (calls, prim calls, own s, cumulative s, callers)}
    lines = []
    for what, col in (("cum", 3), ("own", 2)):
        for (file, line, name), st in sorted(stats.items(), key=lambda kv: -kv[1][col])[:top]:
            lines.append(f"{what} {st[col] * 1e3 / calls:7.3f} ms  {st[0] / calls:g}x  {name} "
                         f"({file.rsplit('/', 2)[-1] if '/' in file else file}:{line})")
    return lines


def measure(fn, *, rep: int = 50, calls: int = 20) -> dict:
    """The four measures of the module docstring for a zero-argument GPU callable ``fn`` (already warm)."""
    import torch
    import triton

    ms = triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    device_ms, kernels = _kernel_table(prof, calls)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5 * calls):
        fn()
    torch.cuda.synchronize()
    loop_ms = (time.perf_counter() - t0) * 1e3 / (5 * calls)
    host = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return dict(ms=ms, device_ms=device_ms, loop_ms=loop_ms, host_ms=statistics.median(host), kernels=kernels,
                host_top=_host_profile(fn, calls))


def main(argv=None) -> int:
    import torch

    from . import CHAPTERS, chapter_ops
    from ._common import run_meta, seeded_qkv
    from .__main__ import _with_backward

    p = argparse.ArgumentParser(prog="python -m pathedu.bench.launches", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("chapters", nargs="+", choices=CHAPTERS)
    p.add_argument("--T", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--ops", nargs="*", help="only these ops (SDPA is always kept)")
    p.add_argument("--skip", nargs="*", default=list(SLOW_REFERENCES), help="leave these ops out")
    p.add_argument("--backward", action="store_true", help="forward + backward, as `python -m pathedu.bench --backward`")
    p.add_argument("--rep", type=int, default=50, help="do_bench repetition time, ms")
    p.add_argument("--out", required=True, help="JSON file to write")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m pathedu.bench.launches needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    meta = run_meta("python -m pathedu.bench.launches " + " ".join(argv if argv is not None else sys.argv[1:]))
    meta.update(dtype=a.dtype, sizes=dict(B=a.B, H=a.H, D=a.D, T=a.T), causal=True,
                pass_="forward+backward" if a.backward else "forward")
    rows = []
    for T in a.T:
        q, k, v = seeded_qkv((a.B, a.H), T, a.D, seed=T, device="cuda", dtype=dtype)
        if a.backward:
            q, k, v = (x.requires_grad_() for x in (q, k, v))
        done = set()
        for chapter in a.chapters:
            for op in chapter_ops(chapter):
                if op.name in done or op.name in a.skip or (a.ops and op.name not in a.ops and op.name != "sdpa"):
                    continue
                if op.max_T is not None and T > op.max_T:
                    continue
                done.add(op.name)
                try:
                    fn = op.setup(q, k, v)
                    out = fn()
                    if a.backward:
                        fn = _with_backward(fn, out)
                    for _ in range(3):  # compile, autotune, warm the caches
                        fn()
                    torch.cuda.synchronize()
                    row = dict(op=op.name, chapter=chapter, T=T, **measure(fn, rep=a.rep))
                except Exception as exc:  # a peer missing or failing is recorded, not fatal
                    print(f"  {op.name} at T={T}: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                rows.append(row)
                top = ", ".join(f"{r['name'][:40]} {r['per_call']:g}x{r['mean_us']:.0f}us" for r in row["kernels"][:4])
                print(f"{op.name:22s} T={T:5d} ms {row['ms']:.3f} device {row['device_ms']:.3f} "
                      f"loop {row['loop_ms']:.3f} host {row['host_ms']:.3f} | {top}", flush=True)
                with open(a.out, "w") as f:  # after every op: a run cut short still leaves its data
                    json.dump(dict(meta=meta, rows=rows), f, indent=1)
        del q, k, v
        torch.cuda.empty_cache()
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
