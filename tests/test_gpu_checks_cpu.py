"""The GPU checks module (pathedu.bench.checks) on the CPU: every chapter's checks at tiny sizes in
Triton's interpreter (a smoke test of the code the GPU run uses), the record schema, the command line
(write, merge), the readers the book uses (load_checks, describe) and the shared error measures."""
import importlib.util
import json

import pytest
import torch

import pathedu.bench as bench
from pathedu.bench import _common, checks

FIELDS = {"chapter", "check", "op", "reference", "dtype", "T", "shape", "metric", "value", "limit", "finite", "ok",
          "params"}


def test_every_chapter_has_checks_and_smoke_sizes():
    assert set(checks.CHECKS) == set(bench.CHAPTERS) == set(checks.SMOKE)
    assert "checks" not in bench.CHAPTERS
    assert checks.targets(["path.fla_path", "nope"]) == [("path", "fla_path"), ("nope", "bench_sizes"),
                                                         ("nope", "robust"), ("nope", "fp32"), ("nope", "backward"),
                                                         ("nope", "linear_backward")]
    with pytest.raises(ValueError, match="unknown section"):
        checks.targets(["path.nothing"])


@pytest.mark.parametrize("chapter", sorted(checks.CHECKS))
def test_checks_run_on_cpu_at_smoke_sizes(chapter):
    records, seconds = checks.run([chapter], device="cpu", fla="no", smoke=True)
    assert set(seconds) == {f"{chapter}.{s}" for s in checks.CHECKS[chapter]}
    assert records, "a chapter's checks record something"
    for r in records:
        assert FIELDS <= set(r) and r["chapter"] == chapter and r["check"] in checks.CHECKS[chapter]
        assert r["metric"] in _common.METRICS and isinstance(r["shape"], list) and isinstance(r["T"], int)
    bad = [checks.format_record(r) for r in records if not r["ok"]]
    assert not bad, "\n".join(bad)
    json.dumps(records)  # the file's records are plain JSON


def test_a_failing_check_is_a_record_not_an_exception():
    rec = checks.Recorder("nope", "robust")
    r = rec.compare("boom", lambda: 1 / 0, reference="-", limit=1.0)
    assert not r["ok"] and "ZeroDivisionError" in r["error"] and r["value"] is None
    x = torch.ones(3, 4)
    r = rec.compare("nan", lambda: (x * float("nan"), x), reference="ones", limit=1.0)
    assert not r["ok"] and not r["finite"]
    r = rec.compare("far", lambda: (x * 2, x), reference="ones", limit=0.5)
    assert not r["ok"] and r["finite"] and r["value"] == pytest.approx(1.0) and r["T"] == 3 and r["shape"] == [3, 4]
    r = rec.compare("peer", lambda: (x * 2, x), reference="ones", limit=None)
    assert r["ok"]  # no limit: recorded, only finiteness required
    assert not checks.run(["alibi.fla_fox"], device="cpu", fla="yes", smoke=True)[0][0]["ok"] or \
        importlib.util.find_spec("fla") is not None  # fla asked for and missing: a failed record


def test_command_line_writes_and_merges_one_schema(tmp_path, monkeypatch):
    a, b, merged = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "gpu_checks.json"
    assert checks.main(["nope.robust", "--smoke", "--device", "cpu", "--fla", "no", "--out", str(a)]) == 0
    assert checks.main(["alibi.fp32", "--smoke", "--device", "cpu", "--out", str(b)]) == 0
    assert checks.main(["--merge", str(a), str(b), "--out", str(merged)]) == 0
    data = json.loads(merged.read_text())
    meta = data["meta"]
    assert {"command", "commit", "device", "torch", "triton", "python", "date", "seconds", "parts"} <= set(meta)
    assert set(meta["seconds"]) == {"nope.robust", "alibi.fp32"} and len(meta["parts"]) == 2
    assert {r["chapter"] for r in data["records"]} == {"nope", "alibi"}
    monkeypatch.setenv("PATHEDU_COMMIT", "abc123")
    assert _common.run_meta("x", "cpu")["commit"] == "abc123"
    # the book's reader: the new file first, per chapter
    monkeypatch.setattr(bench, "CHECKS_FILE", merged)
    got = bench.load_checks("alibi")
    assert got["records"] and all(r["chapter"] == "alibi" for r in got["records"])
    assert all(bench.describe(r).endswith(": ok") for r in got["records"])


def test_book_readers_read_the_committed_gpu_run():
    """The pages of chapters 3 and 4 print their GPU checks from pathedu/data/gpu_checks.json (a run on the device
    machine: an H100 or an H200, compiled kernels, not the interpreter)."""
    for chapter in ("fox", "rope"):
        data = bench.load_checks(chapter)
        meta = data["meta"]
        assert meta["device"] in ("NVIDIA H100 80GB HBM3", "NVIDIA H200") and meta["triton_mode"] == "gpu"
        assert meta["commit"] not in ("", "unknown")
        assert data["records"] and all(FIELDS <= set(r) and r["ok"] for r in data["records"])
        assert all(bench.describe(r) for r in data["records"])
    with pytest.raises(FileNotFoundError, match="python -m pathedu.bench.checks"):
        bench.load_checks("no_such_chapter")


def test_error_measures(monkeypatch):
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 3, 50, 8, generator=g)
    out = ref + 1e-3 * torch.randn(2, 3, 50, 8, generator=g)
    d, r = (out - ref).double(), ref.double()
    expect = {"rel_rms": (d.norm() / r.norm()).item(), "rel_max": (d.abs().max() / r.abs().max()).item(),
              "rel_rms_head": max((d[i, j].norm() / r[i, j].norm()).item() for i in range(2) for j in range(3)),
              "max_abs": d.abs().max().item()}
    monkeypatch.setattr(_common, "_CHUNK", 16)  # many chunks: the chunked sums are the whole-tensor sums
    for name, fn in _common.METRICS.items():
        assert fn(out, ref) == pytest.approx(expect[name], rel=1e-12), name
    assert _common.rel_rms(ref, ref) == 0.0 and _common.rel_max(out.bfloat16(), ref) > 0
    x = torch.randn(2, 3, 10, 4, generator=g)
    assert torch.equal(_common.from_bthd(_common.to_bthd(x)), x) and _common.to_bthd(x).shape == (2, 10, 3, 4)


def test_float64_references_by_slices_equal_one_call():
    from pathedu import path

    q, k, v, w, beta = checks._path_inputs("cpu", (2, 3), 20, 16, 8, seed=0)
    whole = path.path_matrix(*(x.double() for x in (q, k, v, w, beta)))
    sliced = checks.per_slice64(path.path_matrix, q, k, v, w, beta, max_elems=2 * 20 * 20)  # 2 heads a call
    assert sliced.dtype == torch.float64 and torch.allclose(sliced, whole, rtol=0, atol=1e-12)


def test_parts_profiler_runs_every_part_on_cpu():
    """``python -m pathedu.bench.parts`` times each launch apart; here each part runs once, in the interpreter."""
    from pathedu.bench import parts
    from pathedu.bench._common import seeded_qkv

    q, k, v = seeded_qkv((1, 1), 40, 16, seed=0, device="cpu")
    calls = []

    def once(fn):
        calls.append(fn())
        return 1.0

    for subject, fn in parts.SUBJECTS.items():
        times = fn(q, k, v, once)
        assert all(ms == 1.0 for part, ms in times.items() if "derived" not in part), subject
    assert calls and all(c is None or torch.isfinite(c).all() for c in calls if isinstance(c, torch.Tensor))


def test_forward_backward_timing_step_finds_the_leaves_and_drops_their_grads():
    """``python -m pathedu.bench CHAPTER --backward`` times ``fn().backward(do)`` with every leaf's grad dropped
    first (no accumulation timed), on the leaves the op's graph reaches (a peer's own re-laid-out inputs)."""
    from pathedu.bench.__main__ import _leaves, _with_backward

    q = torch.randn(2, 3, requires_grad=True)
    q_peer = _common.to_bthd(q[None])  # a new leaf, as a peer's layout change makes it
    assert q_peer.is_leaf and q_peer.requires_grad
    w = torch.randn(2, requires_grad=True)  # q_peer is (1, 3, 2)

    def fn():
        return (q_peer * w).sum(-1)

    step = _with_backward(fn, fn())
    assert {id(t) for t in _leaves(fn())} == {id(q_peer), id(w)}
    step()
    first = w.grad.clone()
    step()
    assert torch.equal(w.grad, first) and q.grad is None  # dropped, not accumulated; q is not in the graph
    with pytest.raises(RuntimeError, match="no grad_fn"):
        _with_backward(fn, fn().detach())


@pytest.mark.parametrize("chapter", bench.CHAPTERS)
def test_every_op_of_ours_times_forward_and_backward_again_and_again(chapter):
    """``--backward`` times the same step many times: every op of ours (peers need a GPU) must run it twice on
    inputs that require grad, its setup's derived inputs (normalised keys, gates) being leaves of their own."""
    from pathedu.bench import chapter_ops
    from pathedu.bench.__main__ import _leaves, _with_backward

    for op in chapter_ops(chapter):
        if op.peer:
            continue
        q, k, v = (x.requires_grad_() for x in _common.seeded_qkv((1, 2), 32, 16, seed=32, device="cpu"))
        fn = op.setup(q, k, v)
        out = fn()
        step = _with_backward(fn, out)
        step()
        step()
        leaves = _leaves(out)
        assert leaves and all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves), op.name


def test_register_report_compiles_for_sm90_without_a_gpu():
    """`python -m pathedu.bench.registers` compiles a kernel for an H100 on this CPU-only machine (in a process of its
    own with Triton's interpreter off) and reads its registers and spills from the cubin."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pathedu.bench.registers", "--kernels", "_ut_diag_inverse (DeltaNet)",
                          "_linear_fwd (DeltaNet: delta)"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line[:48].strip(): line[48:].split() for line in out.stdout.splitlines()[1:]}
    warps, regs, stack, fit = (int(x) for x in rows["_ut_diag_inverse (DeltaNet)"])
    assert warps == 1 and 0 < regs <= 255 and stack >= 0 and fit == 65536 // (32 * regs)
    assert int(rows["_linear_fwd (DeltaNet: delta)"][1]) <= 255


def test_register_report_says_when_ptxas_serialises_the_tensor_core_products():
    """``--serialized`` compiles each kernel's PTX again with Triton's ptxas (``-v``) and reports its message C7515:
    the FlashAttention template's main tile keeps its products pipelined; PaTH's forward carries do not
    (``kernels/NOTES_path.md``, "The carries": the reversed carries did too while they rebuilt the carries)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pathedu.bench.registers", "--serialized", "--kernels",
                          "_flash_fwd (none, 64 x 64, 4 warps)", "_carry_fwd"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    after = {lines[i][:48].strip(): lines[i + 1].strip() for i in range(1, len(lines) - 1, 2)}
    assert after["_flash_fwd (none, 64 x 64, 4 warps)"] == "tensor-core products pipelined"
    carries = after["_carry_fwd"]
    assert carries.startswith("tensor-core products serialised by ptxas:") and "register" in carries


def test_sass_fingerprint_ignores_addresses_and_sees_instructions():
    """``registers --sass`` compares two trees' machine code by a hash of the SASS instructions without their
    addresses: the same instructions at other addresses hash alike, one changed operand does not."""
    from pathedu.bench.registers import sass_fingerprint

    listing = """        /*0000*/                   MOV R1, c[0x0][0x28] ;            /* 0x00000a0000017a02 */
        /*0010*/                   S2R R0, SR_TID.X ;                /* 0x0000000000007919 */
        /*0020*/              @!P0 BRA 0x40 ;                        /* 0x000000000000a947 */"""
    moved = listing.replace("/*0000*/", "/*0100*/").replace("/*0010*/", "/*0110*/").replace("/*0020*/", "/*0120*/")
    digest, n = sass_fingerprint(listing)
    assert n == 3 and sass_fingerprint(moved) == (digest, 3)
    assert sass_fingerprint(listing.replace("R1,", "R2,"))[0] != digest


def _loop_mixes(name: str) -> list[dict]:
    """``python -m pathedu.bench.registers --loops`` on kernel variant ``name`` (compiled for sm_90 in a process of
    its own, Triton's interpreter off): per loop of its machine code, the printed opcodes (the ten most frequent) and
    their counts per trip."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pathedu.bench.registers", "--loops", "--kernels", name],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    loops = [line for line in out.stdout.splitlines() if line.strip().startswith("loop ")]
    return [{op: int(n) for op, n in (item.rsplit(" ", 1) for item in line.split("(", 1)[1].rstrip(")").split(", "))}
            for line in loops]


def test_flash_loop_multiplies_once_per_logit_for_the_rescale_only():
    """``--loops`` reads the machine code's loops.  In the FlashAttention template's main loop (NoPE, 128 x 64 tiles,
    8 warps: 32 logits and 32 accumulator entries per thread and trip) each logit costs one exponential (MUFU), and
    the multiplies are the accumulator's rescale: the logits' scale rides in the exponent's fused multiply-add
    (``softmax_fold_scaled``).  Scaling the logit tile first, as before, made 64 multiplies a trip, about a tenth of
    the loop's instructions (kernels/NOTES_flash.md, "The logits' scale in the exponent").  In the diagonal loop the causal mask is one 32-bit compare per
    logit: compared as absolute positions, the offsets shared the address arithmetic's 64 bits and each logit took
    two compares (72 a trip)."""
    loops = _loop_mixes("_flash_fwd (none, 128 x 64, 8 warps)")
    assert len(loops) == 2  # key blocks left of the diagonal, then the diagonal's
    assert 32 <= loops[0]["MUFU"] <= 36 and loops[0]["FMUL"] <= 36
    assert loops[1].get("ISETP", 0) <= 48


def test_fox_loop_adds_its_gate_with_one_multiply_add_per_key():
    """FoX's key term ``c_r' - c_j log2(e)`` is one fused multiply-add per key (``_pieces.gate_keys``), so the main
    loop's multiplies are the accumulator's rescale only, as NoPE's (an add and a multiply per key, the
    alternative: 48 a trip)."""
    loops = _loop_mixes("_flash_fwd (loggate, 128 x 64, 8 warps)")
    assert len(loops) == 2 and loops[0]["FMUL"] <= 36


def test_launch_profiler_reports_where_the_host_time_goes(monkeypatch):
    """``python -m pathedu.bench.launches`` needs a GPU for its timings; its host profile (cProfile per call, the
    functions with the most time first) runs anywhere, and without a GPU the command says so and exits 2."""
    from pathedu.bench import launches

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    x = torch.randn(64, 64)

    def call():
        return torch.linalg.matrix_norm(x @ x)

    lines = launches._host_profile(call, calls=3, top=5)
    cum = [line for line in lines if line.startswith("cum")]
    own = [line for line in lines if line.startswith("own")]
    assert 2 <= len(cum) == len(own) <= 5  # as many as the calls reached, at most `top`
    assert "call" in cum[0] and "1x" in cum[0]  # the call itself has the most cumulative time, once per call
    ms = [float(line.split()[1]) for line in cum]
    assert ms == sorted(ms, reverse=True) and ms[0] > 0
    if not torch.cuda.is_available():
        assert launches.main(["nope", "--out", "unused.json"]) == 2


def test_kernel_profile_rows_are_per_step_and_flag_pytorchs_own_kernels():
    """``python -m pathedu.bench.kernels`` divides each kernel's profiled time by the number of steps and tells
    PyTorch's glue (``at::native``, copies) from the op's own kernels."""
    from pathedu.bench.kernels import per_step

    events = [("_hh_bwd_chunk", 5000.0, 5), ("void at::native::vectorized_elementwise_kernel<4>", 1000.0, 10),
              ("Memset (Device)", 50.0, 5), ("cudaLaunchKernel", 0.0, 40)]
    rows = per_step(events, 5)
    assert [r["kernel"] for r in rows] == ["_hh_bwd_chunk", "void at::native::vectorized_elementwise_kernel<4>",
                                           "Memset (Device)"]
    assert rows[0] == dict(kernel="_hh_bwd_chunk", torch=False, ms=1.0, calls=1.0)
    assert rows[1]["torch"] and rows[1]["ms"] == 0.2 and rows[1]["calls"] == 2.0 and rows[2]["torch"]
    with pytest.raises(ValueError, match="steps"):
        per_step(events, 0)
