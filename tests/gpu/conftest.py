"""GPU-only tests, for the device machine: `bash tests/gpu/run.sh` (installs the carried wheels, runs these
tests on several xdist workers, writes the GPU-check results), or `python -m pytest tests/gpu -o addopts=""`.

* test_checks.py: every chapter's GPU checks (pathedu.bench.checks), one test per section, every record ok;
* test_forms.py: every Triton form of tests/forms.py against its family's matrix form in float64, in
  bf16, fp16 and fp32, odd sequence lengths, head dims 16 to 128, Dv != D;
* test_notebooks.py: every lab notebook executed top to bottom in a Jupyter kernel of this Python;
* sanitize.py (a script, not a test): every Triton form at small shapes under a memory checker
  (``compute-sanitizer --tool memcheck python3 tests/gpu/sanitize.py``), for accesses outside a tensor that
  fault only in some runs.

They are not collected by the default test command (pyproject's norecursedirs excludes this folder),
so CI on a CPU machine neither runs nor skips them; without a CUDA GPU they refuse to start.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/: helpers.py, forms.py

# pytest put the repository root on sys.path for the root's conftest.py (its "prepend" import mode).  From there the
# folder kernels/ is found as a top-level package `kernels`, the name of the PyPI package that transformers (which
# fla imports) probes for, and every fla op failed to import ("attempted relative import beyond top-level
# package").  pathedu is imported first (from PYTHONPATH, an install, or this root), then the root leaves sys.path.
import pathedu  # noqa: E402,F401

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]

if not torch.cuda.is_available():
    raise pytest.UsageError("tests/gpu needs a CUDA GPU (run it on the device machine: bash tests/gpu/run.sh)")


def pytest_configure(config):
    config.addinivalue_line("markers", "heavy(seconds): a long test (a chapter's GPU checks, a notebook); "
                                       "its estimated seconds order the schedule")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (-n N, --dist load) the controller first hands each worker a run of
    consecutive tests, ``max(2, len(items) // N // 4)`` of them.  Put the long tests first, longest
    first, one every such run, so that they start at once and on different workers; the short
    ones fill the gaps.  (The order is the same on every worker, as xdist requires.)"""
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    heavy = [it for it in items if it.get_closest_marker("heavy")]
    if workers <= 1 or not heavy:
        return
    heavy.sort(key=lambda it: -it.get_closest_marker("heavy").kwargs.get("seconds", 60))
    light = [it for it in items if not it.get_closest_marker("heavy")]
    run = max(2, len(items) // workers // 4)
    ordered = []
    for it in heavy:
        ordered.append(it)
        ordered.extend(light[:run - 1])
        light = light[run - 1:]
    items[:] = ordered + light


def pytest_runtest_logreport(report):
    """With ``PATHEDU_GPU_FAILURES`` set (run.sh sets it), each failure's test id and traceback tail go to
    that file the moment it is reported, by the controller only: a run cut short by its time limit (whose
    final summary may never print) still says which tests failed and why."""
    path = os.environ.get("PATHEDU_GPU_FAILURES")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a") as f:
        f.write(f"== FAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext[-4000:]}\n\n")
