"""Every chapter's GPU checks (pathedu.bench.checks), one test per section: every record ok.

Each test runs the checks' command line for one ``CHAPTER.SECTION`` and writes its file into
``$PATHEDU_CHECKS_DIR`` (a temporary folder when unset); ``tests/gpu/run.sh`` merges those files into
the results file (``python -m pathedu.bench.checks --merge``).  ``$PATHEDU_FLA``: ``yes`` (the run
script: a missing flash-linear-attention fails), ``auto`` (default: compare with it where installed).
"""
import json
import os
from pathlib import Path

import pytest

from pathedu import bench
from pathedu.bench import checks

# Rough seconds on an H100 with a cold Triton cache (compiles, fla's autotuning): only orders the schedule.
SECONDS = {"alibi.fla_retention": 300, "path.growth": 240, "path.fla_path": 200, "path.fla_delta": 200,
           "alibi.fla_fox": 150, "path.small": 150, "path.robust": 90, "nope.bench_sizes": 60}


def test_every_chapter_has_gpu_checks():
    assert set(checks.CHECKS) == set(bench.CHAPTERS)


@pytest.mark.parametrize("target", [
    pytest.param(f"{c}.{s}", marks=pytest.mark.heavy(seconds=SECONDS.get(f"{c}.{s}", 40)))
    for c, s in checks.targets()])
def test_gpu_checks(target, tmp_path):
    out = Path(os.environ.get("PATHEDU_CHECKS_DIR") or tmp_path) / f"gpu_checks_{target}.json"
    rc = checks.main([target, "--out", str(out), "--fla", os.environ.get("PATHEDU_FLA", "auto")])
    records = json.loads(out.read_text())["records"]
    bad = [checks.format_record(r) for r in records if not r["ok"]]
    assert records and not bad, "\n".join(bad)
    assert rc == 0


GRAPH_FORMS = ("nope_triton", "alibi_triton", "fox_triton", "rope_triton", "path_triton", "pathfox_triton")


@pytest.mark.parametrize("name", GRAPH_FORMS)
def test_a_forward_with_value_checks_off_is_captured_by_a_cuda_graph(name):
    """``pathedu.checks.value_checks(False)``: no read of the device in the forward, so a CUDA graph captures
    it; replayed on new inputs (copied into the captured tensors), it gives the eager forward's output."""
    import torch

    from forms import FORMS, call
    from pathedu.checks import value_checks

    form = next(f for f in FORMS if f.name == name)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 256, 64, generator=g, dtype=torch.float64) for _ in range(3))
    ex = form.extras(q, k, v, 0)
    static = [x.to("cuda", torch.bfloat16) for x in (q, k, v)]
    static_ex = {n: x.to("cuda", torch.float32) for n, x in ex.items()}
    with value_checks(False):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compiles and autotunes outside the capture
            for _ in range(2):
                call(form, *static, static_ex)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call(form, *static, static_ex)
    q2, k2, v2 = (torch.randn(2, 2, 256, 64, generator=g, dtype=torch.float64) for _ in range(3))
    ex2 = form.extras(q2, k2, v2, 1)
    for dst, src in zip(static, (q2, k2, v2)):
        dst.copy_(src)
    for n, x in ex2.items():
        static_ex[n].copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    eager = call(form, *static, static_ex)
    err = (out.float() - eager.float()).abs().max().item()
    assert err <= 1e-3 * eager.float().abs().max().item(), err  # the same kernels on the same values
