"""Where a forward + backward step spends its time, launch by launch, on a CUDA GPU.

    python -m pathedu.bench.kernels CHAPTER --ops OP [OP ...] [--T 1024 8192] --out FILE

Each named op of :func:`pathedu.bench.chapter_ops` (ours or a peer's) runs the step that ``python -m pathedu.bench
CHAPTER --backward`` times (forward, then backward from a fixed output gradient) under ``torch.profiler``; the
time each kernel ran on the GPU is summed over ``--steps`` steps and divided by their number.  PyTorch's own kernels
(``at::native``: casts, zero fills, sums, the elementwise glue between launches) are kept by name and flagged
``torch``, so that a data file says how much of a step is the algorithm's kernels and how much the work between
them.  The data file: ``{"meta": ..., "rows": [{"op", "T", "kernel", "torch", "ms", "calls"}]}``, ``ms`` and
``calls`` per step.
"""
from __future__ import annotations

import argparse
import sys

from . import CHAPTERS, chapter_ops
from ._common import run_meta, seeded_qkv, write_rows


def is_torch_kernel(name: str) -> bool:
    """Whether a profiled kernel is PyTorch's own (elementwise, reduction, copy, fill) rather than a Triton or
    library kernel of the op: PyTorch's kernels live in the ``at::native`` namespace, and copies show as
    ``Memcpy``/``Memset``."""
    return "at::native" in name or name.startswith(("Memcpy", "Memset"))


def per_step(events, steps: int) -> list[dict]:
    """Rows ``{"kernel", "torch", "ms", "calls"}`` per step from ``(name, device_us, count)`` triples of a profile
    of ``steps`` steps, slowest first; entries that ran nothing on the GPU (host-side calls) are left out."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    rows = [dict(kernel=name, torch=is_torch_kernel(name), ms=us / 1e3 / steps, calls=count / steps)
            for name, us, count in events if us > 0]
    return sorted(rows, key=lambda r: -r["ms"])


def main(argv=None) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .__main__ import _with_backward

    p = argparse.ArgumentParser(prog="python -m pathedu.bench.kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("chapter", choices=CHAPTERS)
    p.add_argument("--ops", nargs="+", required=True)
    p.add_argument("--T", type=int, nargs="+", default=[1024, 8192])
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", required=True, help="JSON file to write")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m pathedu.bench.kernels needs a CUDA GPU", file=sys.stderr)
        return 2
    unknown = set(a.ops) - {o.name for o in chapter_ops(a.chapter)}
    if unknown:
        p.error(f"--ops: {sorted(unknown)} are not ops of chapter {a.chapter!r}")
    meta = run_meta("python -m pathedu.bench.kernels " + " ".join(argv if argv is not None else sys.argv[1:]))
    meta.update(dtype="bfloat16", sizes=dict(B=a.B, H=a.H, D=a.D, T=a.T), pass_="forward+backward",
                timer=f"torch.profiler, time on the GPU summed over {a.steps} steps, per step")
    rows = []
    for T in a.T:
        q, k, v = seeded_qkv((a.B, a.H), T, a.D, seed=T, device="cuda", dtype=torch.bfloat16)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        for op in chapter_ops(a.chapter):
            if op.name not in a.ops:
                continue
            try:
                fn = op.setup(q, k, v)
                step = _with_backward(fn, fn())
                step()  # compile and autotune outside the profile
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(a.steps):
                        step()
                    torch.cuda.synchronize()
            except Exception as exc:  # a peer that refuses (fla's gated backwards on Hopper) is recorded
                meta.setdefault("failures", []).append(dict(op=op.name, T=T, error=f"{type(exc).__name__}: {exc}"[:500]))
                print(f"  {op.name} at T={T}: {type(exc).__name__}: {exc}"[:200], file=sys.stderr)
                continue
            events = [(e.key, e.self_device_time_total, e.count) for e in prof.key_averages()]
            found = per_step(events, a.steps)
            total = sum(r["ms"] for r in found)
            glue = sum(r["ms"] for r in found if r["torch"])
            print(f"{op.name} at T={T}: {total:.3f} ms a step, of which PyTorch's kernels {glue:.3f} ms", flush=True)
            for r in found[:12]:
                print(f"    {r['ms']:9.3f} ms  {r['calls']:4.1f} x  {r['kernel'][:90]}")
            rows += [dict(op=op.name, T=T, **r) for r in found]
        del q, k, v
        torch.cuda.empty_cache()
    write_rows(a.out, meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
