"""Context parallelism (:mod:`pathedu.distributed`) on the CPU: gloo process groups of 2 and 3 spawned processes.

Each group runs every case of its list in one process group (process start-up is paid once per group), the
workers put each case's result (or the exception's type and message) on a queue, and the parent gives up
after a deadline and kills what is left, so that no case can hang the suite.  The output of every rank is
compared with :func:`pathedu.path.path_matrix` / :func:`pathedu.fox.fox_matrix` on the whole sequence,
computed in float64 in the worker from the same seeded inputs.
"""
from __future__ import annotations

import datetime
import json
import os
import queue
import re
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from forms import householder_extras, token_gate_extras
from helpers import rand_qkv, rel_err

from pathedu import distributed
from pathedu.fox import fox_matrix
from pathedu.path import path_matrix

TOL = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 1e-2}
DEADLINE_S = 90  # for a whole group of workers; the process group's own timeout is 20 s


def _case(name, fn, lengths, *, lead=(2, 3), D=8, Dv=12, dtype="float64", seed=0, **extra):
    return dict(name=name, fn=fn, lengths=tuple(lengths), lead=tuple(lead), D=D, Dv=Dv, dtype=dtype, seed=seed,
                **extra)


# Good cases (their outputs are checked) and bad ones (what every rank raises), run in this order: the good
# cases after the bad ones check that a refused call leaves the process group usable.
CASES = {
    3: [
        _case("path_uneven", "path", (5, 13, 9)),
        _case("fox_uneven", "fox", (5, 13, 9), seed=1),
        _case("path_D_differs", "path", (5, 13, 9), bad="D", bad_rank=1),
        _case("fox_Dv_differs", "fox", (5, 13, 9), bad="Dv", bad_rank=2),
        _case("path_dtype_differs", "path", (4, 4, 4), bad="dtype", bad_rank=0),
        _case("path_beta_out_of_range", "path", (5, 13, 9), bad="beta", bad_rank=2),
        _case("fox_log_f_positive", "fox", (5, 13, 9), bad="log_f", bad_rank=0),
        _case("fox_v_requires_grad", "fox", (3, 3, 3), bad="grad", bad_rank=1),
        _case("path_empty_middle", "path", (6, 0, 7), lead=(2,), seed=2),
        _case("fox_empty_first", "fox", (0, 7, 4), lead=(2,), seed=3),
        _case("path_fp32", "path", (5, 13, 9), dtype="float32", seed=4),
        _case("fox_fp32", "fox", (5, 13, 9), dtype="float32", seed=5),
        _case("path_subgroup_0_2", "path", (7, 10), seed=6, members=(0, 2)),
        _case("fox_subgroup_1_2", "fox", (6, 9), seed=7, members=(1, 2)),
        _case("path_after_errors", "path", (9, 5, 13), lead=(), D=6, Dv=5, seed=8),
        # The kernel-backed local step (Triton's interpreter here): chunks longer than a UT block (64 tokens),
        # so that queries and keys are carried across several blocks' transitions.
        _case("path_kernels", "path", (70, 0, 90), lead=(2,), D=16, Dv=24, dtype="float32", seed=16, local="kernel"),
        _case("path_kernels_bf16", "path", (40, 66, 20), lead=(2,), D=32, Dv=16, dtype="bfloat16", seed=19,
              local="kernel"),
        _case("fox_kernels", "fox", (33, 70, 5), lead=(2,), D=16, Dv=16, dtype="float32", seed=17, local="kernel"),
        _case("fox_kernels_bf16", "fox", (20, 45, 30), lead=(2,), D=16, Dv=16, dtype="bfloat16", seed=18,
              local="kernel"),
        _case("path_kernels_small_D", "path", (4, 4, 4), D=8, dtype="float32", local="kernel", bad="local",
              bad_rank=None),
    ],
    2: [
        _case("path_two", "path", (11, 16), seed=10),
        _case("fox_two", "fox", (11, 16), seed=11),
        _case("path_D_differs", "path", (4, 6), bad="D", bad_rank=0),
        _case("fox_Dv_differs", "fox", (4, 6), bad="Dv", bad_rank=1),
        _case("path_empty_last", "path", (9, 0), seed=12),
        _case("fox_empty_last", "fox", (9, 0), seed=13),
        _case("path_lead_9_dims", "path", (3, 4), lead=(1, 1, 1, 2, 1, 1, 1, 1, 2), D=4, Dv=3, seed=14),
        _case("fox_fp32_one_token", "fox", (1, 1), lead=(3,), dtype="float32", seed=15),
    ],
}
GOOD = [(world, c) for world, cases in CASES.items() for c in cases if "bad" not in c]
BAD = [(world, c) for world, cases in CASES.items() for c in cases if "bad" in c]


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------

def _inputs(case, T, D, Dv, seed):
    """Float64 ``q, k, v`` and the extras (``w, beta`` or ``log_f``) of a whole sequence (the package's helpers)."""
    q, k, v = rand_qkv(case["lead"], T, D, Dv, seed=seed)
    ex = householder_extras(q, k, v, seed) if case["fn"] == "path" else token_gate_extras(q, k, v, seed)
    return [q, k, v, *ex.values()]


def _run_case(case, rank):
    """This rank's part of one case: its error against the reference, its output's shape and dtype, and the
    bytes it sent (counted by wrapping ``torch.distributed.isend``) next to :func:`distributed._sent_bytes`."""
    members = case.get("members")
    group = dist.new_group(list(members)) if members else None  # every rank of the world calls new_group
    if members and rank not in members:
        return {"skipped": True}
    me = members.index(rank) if members else rank
    lengths, D, Dv = case["lengths"], case["D"], case["Dv"]
    full = _inputs(case, sum(lengths), D, Dv, case["seed"])
    a, b = sum(lengths[:me]), sum(lengths[: me + 1])
    chunk = [x[..., a:b, :] if x.dim() == len(case["lead"]) + 2 else x[..., a:b] for x in full]
    bad = case.get("bad") if me == case.get("bad_rank") else None
    if bad in ("D", "Dv"):  # this rank's own chunk with another head dim (valid on its own)
        chunk = _inputs(case, b - a, D - 2 if bad == "D" else D, Dv + 3 if bad == "Dv" else Dv, case["seed"] + 99)
    dtype = torch.float32 if bad == "dtype" else getattr(torch, case["dtype"])
    chunk = [x.to(dtype) for x in chunk]
    if bad in ("beta", "log_f"):
        chunk[-1][..., 0] = 2.5 if bad == "beta" else 0.5
    if bad == "grad":
        chunk[2].requires_grad_()
    fn = distributed.context_parallel_path if case["fn"] == "path" else distributed.context_parallel_fox
    sent, isend = [], dist.isend

    def counting_isend(tensor, *args, **kw):
        sent.append(tensor.numel() * tensor.element_size())
        return isend(tensor, *args, **kw)

    dist.isend = counting_isend
    try:
        out = fn(*chunk, group=group, local=case.get("local", "auto"))
    finally:
        dist.isend = isend
    ref = (path_matrix if case["fn"] == "path" else fox_matrix)(*full)[..., a:b, :]
    lead_numel = torch.Size(case["lead"]).numel()
    # Blocks travel in the working dtype: float32 for 16-bit inputs, the input dtype otherwise.
    work_itemsize = torch.empty((), dtype=torch.promote_types(dtype, torch.float32)).element_size()
    width = D + Dv + (1 if case["fn"] == "fox" else 0)
    return {"err": rel_err(out, ref), "shape": tuple(out.shape), "dtype": str(out.dtype).removeprefix("torch."),
            "sent": sum(sent), "sends": len(sent), "want_sent": distributed._sent_bytes(
                lengths, me, lead_numel, width, work_itemsize)}


def _worker(rank, world, port, cases, results):
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=20))
        for case in cases:
            try:
                results.put((case["name"], rank, _run_case(case, rank)))
            except Exception as e:  # noqa: BLE001  (reported to the parent, which asserts on it)
                results.put((case["name"], rank, {"exc": type(e).__name__, "msg": str(e)}))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001
        results.put(("<setup>", rank, {"exc": type(e).__name__, "msg": str(e)}))
    finally:
        results.put(("<done>", rank, None))


# ---------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, cases) -> dict:
    """Run ``cases`` on ``world`` spawned gloo ranks; ``{(case name, rank): result}``.  Fails (never hangs) when a
    worker has not finished within :data:`DEADLINE_S`; stragglers are killed."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, cases, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    out, done, deadline = {}, set(), time.monotonic() + DEADLINE_S
    try:
        while len(done) < world and time.monotonic() < deadline:
            try:
                name, rank, res = results.get(timeout=0.5)
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    break  # every worker is gone without saying "done" (a crash)
                continue
            if name == "<done>":
                done.add(rank)
            else:
                out[name, rank] = res
    finally:
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    assert "<setup>" not in {name for name, _ in out}, out
    assert done == set(range(world)), f"ranks {sorted(set(range(world)) - done)} did not finish: {out}"
    return out


@pytest.fixture(scope="module")
def results():
    """Both groups, one after the other (each starts its own processes once)."""
    return {world: _spawn(world, cases) for world, cases in CASES.items()}


def _ranks(case, world):
    """``(global rank, rank in the case's group)`` of the ranks that take part in the case."""
    members = case.get("members") or tuple(range(world))
    return [(g, i) for i, g in enumerate(members)]


@pytest.mark.parametrize("world, case", GOOD, ids=[f"R{w}-{c['name']}" for w, c in GOOD])
def test_every_rank_gets_its_chunk_of_the_single_device_output(results, world, case):
    for g, i in _ranks(case, world):
        res = results[world][case["name"], g]
        assert "exc" not in res, res
        assert res["shape"] == case["lead"] + (case["lengths"][i], case["Dv"])
        assert res["dtype"] == case["dtype"]
        assert res["err"] <= TOL[case["dtype"]], (g, res["err"])
    if case.get("members"):
        skipped = set(range(world)) - set(case["members"])
        assert all(results[world][case["name"], g] == {"skipped": True} for g in skipped)


@pytest.mark.parametrize("world, case", GOOD, ids=[f"R{w}-{c['name']}" for w, c in GOOD])
def test_bytes_sent_are_the_chain_s(results, world, case):
    """Rank r < R-1 sends every nonempty block of ranks 0..r once; the last rank sends nothing."""
    ranks = _ranks(case, world)
    for g, i in ranks:
        res = results[world][case["name"], g]
        assert res["sent"] == res["want_sent"], (g, res)
        assert res["sends"] == sum(1 for L in case["lengths"][: i + 1] if L > 0) * (i + 1 < len(ranks))
    # the formula itself: a rank with nonempty earlier chunks that is not last sends something
    assert distributed._sent_bytes([5, 0, 7], 1, 6, 20, 8) == 5 * 6 * 20 * 8
    assert distributed._sent_bytes([5, 0, 7], 2, 6, 20, 8) == 0


def _messages(results, world, case):
    return [results[world][case["name"], r] for r in range(world)]


@pytest.mark.parametrize("world, case", BAD, ids=[f"R{w}-{c['name']}" for w, c in BAD])
def test_bad_input_raises_on_every_rank(results, world, case):
    """Every rank raises (none hangs), naming the argument; ranks that disagree all raise the same message."""
    got = _messages(results, world, case)
    assert all("exc" in r for r in got), got
    bad, bad_rank = case["bad"], case["bad_rank"]
    if bad == "local":  # the kernels do not fit D = 8: every rank raises its own error, naming `local`
        assert {r["exc"] for r in got} == {"ValueError"}, got
        assert all(r["msg"].startswith("`local`='kernel'") and "D=8" in r["msg"] for r in got), got
        return
    if bad in ("D", "Dv", "dtype"):  # cross-rank disagreement: one ValueError, the same text everywhere
        assert {r["exc"] for r in got} == {"ValueError"}
        assert len({r["msg"] for r in got}) == 1, got
        needle = {"D": "`q`, `k`", "Dv": "`v`", "dtype": "`q`"}[bad]
        assert needle in got[0]["msg"] and "every rank" in got[0]["msg"], got[0]
    else:  # a local error: the rank raises its own, every other rank the same type naming the argument and rank
        name = {"beta": "beta", "log_f": "log_f", "grad": "v"}[bad]
        kind = "RuntimeError" if bad == "grad" else "ValueError"
        assert {r["exc"] for r in got} == {kind}, got
        own = got[bad_rank]["msg"]
        assert own.startswith(f"`{name}`") and "invalid on rank" not in own, own
        for r, res in enumerate(got):
            if r != bad_rank:
                assert f"`{name}` is invalid on rank {bad_rank}" in res["msg"], res


def test_without_a_process_group_the_error_says_how_to_start_one():
    assert not dist.is_initialized()
    q, k, v = rand_qkv((2,), 5, 4, 3)
    ex = householder_extras(q, k, v, 0)
    with pytest.raises(RuntimeError, match=r"torchrun --nproc-per-node 2 .*init_process_group\(\"gloo\"\)"):
        distributed.context_parallel_path(q, k, v, ex["w"], ex["beta"])
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node 2"):
        distributed.context_parallel_fox(q, k, v, token_gate_extras(q, k, v, 0)["log_f"])


def test_the_torchrun_demo_agrees_with_the_matrix_forms():
    """``torchrun --nproc-per-node 2 -m pathedu.distributed``: what the module docstring tells readers to run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(_free_port()), "-m", "pathedu.distributed"],
                          capture_output=True, text=True, timeout=DEADLINE_S, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.search(r"vs path_matrix: (\S+); vs fox_matrix: (\S+)", proc.stdout)
    assert found, proc.stdout
    assert float(found.group(1)) <= 1e-10 and float(found.group(2)) <= 1e-10, proc.stdout


def test_the_local_step_is_chosen_by_device_size_and_dtype():
    """"auto": the kernels for CUDA tensors whose D, Dv fit them (16..128) in a float32 working dtype, else the
    matrix path; "kernel" refuses what the kernels cannot take; anything else is refused by name."""
    from pathedu.checks import QKV

    use = distributed._use_kernels
    n = QKV(lead=(2,), T=5, D=64, Dv=32)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert use("auto", n, torch.float32, cuda) and not use("auto", n, torch.float32, cpu)
    assert not use("auto", n, torch.float64, cuda) and not use("matrix", n, torch.float32, cuda)
    assert use("kernel", n, torch.float32, cpu)  # Triton's interpreter on a CPU
    assert not use("auto", QKV(lead=(2,), T=5, D=8, Dv=32), torch.float32, cuda)
    with pytest.raises(ValueError, match="`local`='kernel'.*D=256"):
        use("kernel", QKV(lead=(2,), T=5, D=256, Dv=32), torch.float32, cuda)
    with pytest.raises(ValueError, match="`local` must be one of"):
        use("triton", n, torch.float32, cuda)


def test_the_context_parallel_benchmark_runs_as_a_smoke_test(tmp_path):
    """``torchrun -m pathedu.bench.cp --device cpu``: one device against two ranks for PaTH and FoX, the record
    the GPU run will commit (its timings on a CPU mean nothing), and the two outputs agree."""
    out = tmp_path / "cp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "pathedu.bench.cp", "--device", "cpu", "--T", "96", "--B", "1", "--H", "1", "--D",
                          "16", "--dtype", "float32", "--reps", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["meta"]["world_size"] == 2 and data["meta"]["backend"] == "gloo"
    assert [(r["T"], r["mechanism"]) for r in data["rows"]] == [(96, "path"), (96, "fox")]
    for r in data["rows"]:
        assert r["one_device"]["fits"] and r["cp_ms"] > 0 and r["rel_rms_vs_one_device"] < 1e-5
        assert r["cp_sent_bytes"][0] == distributed._sent_bytes([48, 48], 0, 1, 32 + (r["mechanism"] == "fox"), 4)
        assert r["cp_sent_bytes"][1] == 0
