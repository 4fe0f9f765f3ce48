"""GPU benchmarks: ``python -m pathedu.bench CHAPTER [...]``.

Each chapter registers its ops in a module of this package (``nope``, ...)
through a function ``ops() -> list[Op]``.  A run times every op with
``triton.testing.do_bench`` (median, after warm-up), measures the peers
(PyTorch SDPA always; flash-linear-attention where installed) *in the same
run*, checks every op's output against the chapter's reference op (relative
RMS error), prints a table with ratios, and writes a JSON data file recording
command, commit, device, versions, sizes and dtype.  The book plots those
files (:func:`pathedu.plotting.plot_benchmark`); nothing in them is typed by hand.

Data files ship with the package: ``pathedu/data/bench_<chapter>.json``.

The GPU checks (robustness, accuracy, agreement with flash-linear-attention) are
not timings: they live in :mod:`pathedu.bench.checks` (``python -m pathedu.bench.checks``),
one record schema for every chapter, committed as ``pathedu/data/gpu_checks.json``
and read with :func:`load_checks`.  Helpers shared by the ops and the checks:
:mod:`pathedu.bench._common`.
"""
from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CHECKS_FILE = DATA_DIR / "gpu_checks.json"
# Every module of this package is a chapter's set of ops, but __main__, the private helpers, the checks,
# the parts profiler, the launch profiler, the kernel profiler of a training step, the register report and the
# context-parallel benchmark (torchrun).
TOOLS = ("checks", "parts", "launches", "kernels", "registers", "cp")
CHAPTERS = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and m.name not in TOOLS)


@dataclass
class Op:
    """A timed operation.

    ``setup(q, k, v) -> fn``: q, k, v are ``(B, H, T, D)`` tensors on the GPU;
    ``setup`` does every conversion (layouts, gates) outside the timed region and
    returns a zero-argument callable whose result is the output ``(B, H, T, Dv)``.
    ``reference``: the op this one's output is checked against (None: it is a reference).
    ``peer``: an outside implementation (SDPA, fla) rather than ours.  ``backward_only``: timed only with
    ``--backward`` (a variant that differs from another op in its backward alone).
    """

    name: str
    setup: Callable
    reference: str | None = None
    peer: bool = False
    max_T: int | None = None  # skip sizes this op cannot handle
    backward_only: bool = False


def load(chapter: str, *, backward: bool = False) -> dict:
    """The committed benchmark data of a chapter: ``pathedu/data/bench_<chapter>.json`` (forward), or
    ``bench_<chapter>_fwdbwd.json`` with ``backward=True`` (forward + backward)."""
    path = DATA_DIR / f"bench_{chapter}{'_fwdbwd' if backward else ''}.json"
    if not path.exists():
        flag = " --backward" if backward else ""
        raise FileNotFoundError(f"no benchmark data for chapter {chapter!r} at {path}; "
                                f"run `python -m pathedu.bench {chapter}{flag}` on a GPU")
    return json.loads(path.read_text())


def load_checks(chapter: str) -> dict:
    """A chapter's committed GPU-check results: ``{"meta": {...}, "records": [...]}`` in the schema of
    :mod:`pathedu.bench.checks` (one dict per measurement: ``check, op, reference, dtype, T, shape,
    metric, value, limit, finite, ok, params``), from ``pathedu/data/gpu_checks.json``."""
    if CHECKS_FILE.exists():
        data = json.loads(CHECKS_FILE.read_text())
        records = [r for r in data["records"] if r["chapter"] == chapter]
        if records:
            return dict(meta=data["meta"], records=records)
    raise FileNotFoundError(f"no GPU check results for chapter {chapter!r} in {CHECKS_FILE}; "
                            f"run `python -m pathedu.bench.checks {chapter} --out FILE` on a GPU")


def describe(record: dict) -> str:
    """One GPU-check record (:func:`load_checks`) as a line of text: op, dtype, T, case, measure, limit, verdict."""
    case = ", ".join(f"{k} {v}" for k, v in record.get("params", {}).items())
    value = "not finite" if record["value"] is None else f"{record['value']:.1e}"
    limit = "" if record["limit"] is None else f" (limit {record['limit']:.0e})"
    verdict = "ok" if record["ok"] else "FAILED" + (f": {record['error']}" if "error" in record else "")
    return (f"{record['op']}, {record['dtype']}, T = {record['T']}{', ' + case if case else ''}: "
            f"{record['metric']} {value}{limit} vs {record['reference']}: {verdict}")


def chapter_ops(chapter: str) -> list[Op]:
    if chapter not in CHAPTERS:
        raise ValueError(f"unknown chapter {chapter!r}; choose from {CHAPTERS}")
    return importlib.import_module(f"{__name__}.{chapter}").ops()
