r"""Context parallelism measured: one device against several, for PaTH and FoX.

    torchrun --nproc-per-node 2 -m pathedu.bench.cp [--T 32768 65536 ...] [--B 1] [--H 16] [--D 64]
             [--dtype bfloat16] [--reps 10] --out FILE

For each ``T`` and each mechanism (``path``, ``fox``):

* **one device** (rank 0 alone; the others wait): the kernel on the whole sequence (``path_triton``,
  ``fox_triton``), its time and peak memory, or ``"fits": false`` when it runs out of memory;
* **all ranks**: :func:`pathedu.distributed.context_parallel_path` / ``_fox`` with ``local="kernel"``, each
  rank holding ``T / R`` tokens: the time of the slowest rank (per repetition, then the median), each rank's
  peak memory and the bytes it sends (:func:`pathedu.distributed._sent_bytes`, the chain's count);
* **agreement**: where the one-device run fits, each rank's chunk of its output against the context-parallel
  output (relative RMS error; the bar is 0.005 in bf16).

Each rank draws only its own chunk (seed ``1000 * T + chunk``), so a ``T`` too long for one device can still
be split; rank 0 draws every chunk for the one-device run.  ``w`` is unit-norm, ``beta`` in [0, 2), FoX's
gate ``logsigmoid(3 + N(0, 1))``.  Timing: CUDA events around each call after a barrier (``time.perf_counter``
on a CPU), warm-up first.  Rank 0 writes ``{"meta", "rows"}``: the command, commit, device, versions, world
size, backend, sizes and dtype in ``meta``; one row per ``(T, mechanism, setting)``.

``--device cpu`` (gloo, Triton's interpreter) is a smoke test of this script, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ._common import rel_rms, run_meta


def _chunk(T: int, R: int, c: int, lead, D: int, dtype, device):
    """Chunk ``c`` of ``R`` of the sequence: ``q, k, v, w, beta, log_f``, drawn from its own seed."""
    a, b = c * T // R, (c + 1) * T // R
    g = torch.Generator(device=device).manual_seed(1000 * T + c)
    shape = tuple(lead) + (b - a,)
    q, k, v = (torch.randn(shape + (D,), generator=g, device=device, dtype=torch.float32).to(dtype)
               for _ in range(3))
    w = F.normalize(torch.randn(shape + (D,), generator=g, device=device), dim=-1)
    beta = 2 * torch.rand(shape, generator=g, device=device)
    log_f = F.logsigmoid(3.0 + torch.randn(shape, generator=g, device=device))
    return q, k, v, w, beta, log_f


def _timed(fn, device, reps: int, group=None) -> tuple[float, object]:
    """Median over ``reps`` of the slowest rank's time in ms (after one warm-up call), and the last output."""
    out = fn()
    times = []
    for _ in range(reps):
        if group is not False:
            dist.barrier(group=group)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            out = fn()
            ms = 1e3 * (time.perf_counter() - t0)
        if group is not False:  # the slowest rank sets the pace
            t = torch.tensor([ms], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            ms = t.item()
        times.append(ms)
    return statistics.median(times), out


def _peak(device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def _reset(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def main(argv=None) -> int:
    from .. import distributed, fox, path

    p = argparse.ArgumentParser(prog="python -m pathedu.bench.cp", description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, nargs="+", default=[32768, 65536])
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--mechanisms", nargs="+", default=["path", "fox"], choices=["path", "fox"])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("python -m pathedu.bench.cp needs CUDA GPUs (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, R = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype, lead = getattr(torch, a.dtype), (a.B, a.H)
    rows = []
    for T in a.T:
        if T % R:
            raise SystemExit(f"--T {T} is not a multiple of the {R} ranks")
        mine = _chunk(T, R, rank, lead, a.D, dtype, device)
        for mech in a.mechanisms:
            single, cp_fn = ((path.path_triton, distributed.context_parallel_path) if mech == "path" else
                             (fox.fox_triton, distributed.context_parallel_fox))
            args = (lambda c: c[:5]) if mech == "path" else (lambda c: c[:3] + c[5:])
            # One device: rank 0 on the whole sequence.
            one = {"fits": False}
            ref = None
            if rank == 0:
                _reset(device)
                try:
                    whole = [torch.cat(parts, dim=-2 if parts[0].dim() == len(lead) + 2 else -1)
                             for parts in zip(*(_chunk(T, R, c, lead, a.D, dtype, device) for c in range(R)))]
                    ms, ref = _timed(lambda: single(*args(whole)), device, a.reps, group=False)
                    one = {"fits": True, "ms": ms, "peak_bytes": _peak(device)}
                    del whole
                except torch.cuda.OutOfMemoryError as e:
                    one = {"fits": False, "error": str(e).splitlines()[0]}
            dist.barrier()
            # All ranks: the sequence split in R chunks.
            _reset(device)
            ms, out = _timed(lambda: cp_fn(*args(mine), local="kernel"), device, a.reps)
            peak = torch.tensor([_peak(device) or 0], dtype=torch.int64, device=device)
            peaks = [torch.zeros_like(peak) for _ in range(R)]
            dist.all_gather(peaks, peak)
            # Agreement with the one-device output, where it fits: every rank's chunk against rank 0's slice.
            fits = torch.tensor([1 if one["fits"] else 0], device=device)
            dist.broadcast(fits, src=0)
            err = None
            if fits.item():
                rows_of = lambda r: slice(r * T // R, (r + 1) * T // R)  # noqa: E731
                want = ref[..., rows_of(0), :].contiguous() if rank == 0 else torch.empty_like(out)
                if rank == 0:
                    for r in range(1, R):
                        dist.send(ref[..., rows_of(r), :].contiguous(), dst=r)
                else:
                    dist.recv(want, src=0)
                e = torch.tensor([rel_rms(out.float(), want.float())], dtype=torch.float64, device=device)
                dist.all_reduce(e, op=dist.ReduceOp.MAX)
                err = e.item()
            width = a.D * 2 + (1 if mech == "fox" else 0)  # Dv = D here
            itemsize = torch.empty((), dtype=torch.promote_types(dtype, torch.float32)).element_size()
            sent = [distributed._sent_bytes([T // R] * R, r, a.B * a.H, width, itemsize) for r in range(R)]
            row = dict(T=T, mechanism=mech, one_device=one, ranks=R, cp_ms=ms,
                       cp_peak_bytes=[int(x.item()) for x in peaks] if cuda else None, cp_sent_bytes=sent,
                       speedup=one["ms"] / ms if one.get("fits") else None, rel_rms_vs_one_device=err)
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
            del out, ref
    if rank == 0:
        meta = run_meta("torchrun --nproc-per-node {} -m pathedu.bench.cp ".format(R)
                        + " ".join(argv if argv is not None else sys.argv[1:]), device)
        meta.update(world_size=R, backend=dist.get_backend(), dtype=a.dtype,
                    sizes=dict(B=a.B, H=a.H, D=a.D, Dv=a.D, T=a.T), local_step="kernel",
                    timer="CUDA events after a barrier, slowest rank, median" if cuda else "perf_counter (smoke test)")
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        print(f"wrote {a.out}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
