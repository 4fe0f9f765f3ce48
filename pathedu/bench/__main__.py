"""Command line: ``python -m pathedu.bench CHAPTER [--T ...] [--out FILE]`` (needs a CUDA GPU)."""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import platform
import subprocess
import sys

from . import CHAPTERS, DATA_DIR, chapter_ops


def _commit() -> str:
    """The checkout's commit; PATHEDU_COMMIT overrides it (the device machine gets the
    working tree without .git, so the caller passes the hash it committed)."""
    import os

    if os.environ.get("PATHEDU_COMMIT"):
        return os.environ["PATHEDU_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except Exception:
        return "unknown"


def _rel_rms(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def _write(path, meta, rows, checks) -> None:
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows, checks=checks), f, indent=1, default=str)


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
    p.add_argument("--rep", type=int, default=200, help="do_bench repetition time, ms")
    p.add_argument("--no-checks", action="store_true", help="skip the chapter's gpu_checks() (robustness, accuracy)")
    p.add_argument("--out", help=f"JSON file to write (default {DATA_DIR}/bench_CHAPTER.json)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("python -m pathedu.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    ops = [o for o in chapter_ops(a.chapter) if not a.ops or o.name in a.ops or o.peer or o.reference is None]
    meta = dict(
        command="python -m pathedu.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        commit=_commit(), device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        python=platform.python_version(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        dtype=a.dtype, sizes=dict(B=a.B, H=a.H, D=a.D, T=a.T), causal=True, pass_="forward",
        timer="triton.testing.do_bench, median ms",
    )
    out = a.out or str(DATA_DIR / f"bench_{a.chapter}.json")
    rows = []
    for T in tqdm(a.T, desc="sequence lengths"):
        g = torch.Generator(device="cuda").manual_seed(T)
        q, k, v = (torch.randn(a.B, a.H, T, a.D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        outs, times = {}, {}
        for op in ops:
            if op.max_T is not None and T > op.max_T:
                continue
            try:
                fn = op.setup(q, k, v)
                outs[op.name] = fn()  # also compiles / autotunes before timing
                torch.cuda.synchronize()
                times[op.name] = triton.testing.do_bench(fn, warmup=50, rep=a.rep, return_mode="median")
            except Exception as exc:  # a peer missing or failing is recorded, not fatal
                print(f"  {op.name} at T={T}: {type(exc).__name__}: {exc}", file=sys.stderr)
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
                row["rel_rms_err"] = _rel_rms(outs[op.name], outs[op.reference])
                row["finite"] = bool(torch.isfinite(outs[op.name]).all())
            rows.append(row)
        del q, k, v, outs
        torch.cuda.empty_cache()
        _write(out, meta, rows, None)  # after every T: a run cut short still leaves its data
    print(f"\n{meta['device']}  B={a.B} H={a.H} D={a.D} {a.dtype}  commit {meta['commit']}")
    print(f"{'op':24s} {'T':>6s} {'ms':>9s} {'x SDPA':>7s} {'x ref':>6s}  rel RMS err vs reference")
    for r in rows:
        err = f"{r['rel_rms_err']:.2e} vs {r['reference']}" if "rel_rms_err" in r else ""
        print(f"{r['op']:24s} {r['T']:6d} {r['ms']:9.3f} {r.get('ratio_to_sdpa', float('nan')):7.2f} "
              f"{r.get('ratio_to_reference', float('nan')):6.2f}  {err}")
    checks = None
    module = importlib.import_module(f"pathedu.bench.{a.chapter}")
    if hasattr(module, "gpu_checks") and not a.no_checks:
        checks = module.gpu_checks()  # robustness and accuracy cases the chapter defines
        print("gpu_checks:", json.dumps(checks, indent=1, default=str))
    _write(out, meta, rows, checks)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
