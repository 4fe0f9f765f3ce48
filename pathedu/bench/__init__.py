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
"""
from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
# Every module of this package (but __main__) is a chapter's set of ops.
CHAPTERS = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


@dataclass
class Op:
    """A timed operation.

    ``setup(q, k, v) -> fn``: q, k, v are ``(B, H, T, D)`` tensors on the GPU;
    ``setup`` does every conversion (layouts, gates) outside the timed region and
    returns a zero-argument callable whose result is the output ``(B, H, T, Dv)``.
    ``reference``: the op this one's output is checked against (None: it is a reference).
    ``peer``: an outside implementation (SDPA, fla) rather than ours.
    """

    name: str
    setup: Callable
    reference: str | None = None
    peer: bool = False
    max_T: int | None = None  # skip sizes this op cannot handle


def load(chapter: str) -> dict:
    """The committed benchmark data of a chapter (``pathedu/data/bench_<chapter>.json``)."""
    path = DATA_DIR / f"bench_{chapter}.json"
    if not path.exists():
        raise FileNotFoundError(f"no benchmark data for chapter {chapter!r} at {path}; run `python -m pathedu.bench {chapter}` on a GPU")
    return json.loads(path.read_text())


def load_checks(chapter: str) -> dict:
    """The chapter's committed ``gpu_checks()`` results: from its benchmark file,
    or, where that run recorded none, from a ``gpu_checks_*.json`` file that holds
    the chapter's key (with its own ``meta``: command, commit, device)."""
    checks = load(chapter).get("checks")
    if checks:
        return checks
    for path in sorted(DATA_DIR.glob("gpu_checks_*.json")):
        data = json.loads(path.read_text())
        if chapter in data:
            return data[chapter]
    raise FileNotFoundError(f"no GPU check results for chapter {chapter!r} in {DATA_DIR}")


def chapter_ops(chapter: str) -> list[Op]:
    if chapter not in CHAPTERS:
        raise ValueError(f"unknown chapter {chapter!r}; choose from {CHAPTERS}")
    return importlib.import_module(f"{__name__}.{chapter}").ops()
