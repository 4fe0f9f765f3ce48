"""Every lab notebook follows CONTRIBUTING.md's conventions.

* the first cell is the install cell, with the repository URL and branch of
  ``_config.yml`` (rewritten by ``python book/tools.py sync``) and the tag
  ``remove-cell`` (the book hides it);
* the notebook is committed executed: every code cell has run, in order, and
  no output is an error;
* every cell whose output cannot be reproduced exactly (widgets, timings,
  progress bars) tells nbval to ignore its output;
* every notebook is a page of the book (listed in ``_toc.yml``).
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf8"))
IGNORE_TAGS = {"nbval-ignore-output", "nbval-skip"}
IGNORE_COMMENTS = ("# NBVAL_IGNORE_OUTPUT", "# NBVAL_SKIP")

# Source that makes output vary from run to run: interactive widgets, clocks, progress bars.
NONDETERMINISTIC = re.compile(
    r"\binteract(ive|_manual)?\b|\bipywidgets\b|\bwidgets\.|Slider\(|\bdisplay\(.*Widget"
    r"|%%?timeit?\b|\btime\.(perf_counter|time|monotonic|process_time)\b|\bdo_bench\b|\bbenchmark\("
    r"|\btqdm\b|\bprogress"
)


def _toc_files(node) -> set[str]:
    if isinstance(node, dict):
        found = {str(node[key]) for key in ("root", "file") if key in node}
        return found.union(*(_toc_files(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_toc_files(v) for v in node)) if node else set()
    return set()


def _install_source() -> str:
    url = CONFIG["repository"]["url"].rstrip("/")
    branch = CONFIG["repository"].get("branch", "main")
    return "\n".join([
        "# Install pathedu when it is not importable (as on Colab); hidden in the book.",
        "try:",
        "    import pathedu",
        "except ImportError:",
        f'    %pip install -q "pathedu @ git+{url}@{branch}"',
        "    import pathedu",
    ])


def _ids(paths):
    return [p.name for p in paths]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds the labs; chapter 1's lab at least"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_install_cell_first(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "code"
    assert first.source == _install_source(), "run `python book/tools.py sync`"
    assert "remove-cell" in first.metadata.get("tags", [])
    assert not any(c.cell_type == "code" and "%pip install" in c.source for c in nb.cells[1:])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_executed_without_errors(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in code]
    assert None not in counts, "commit the notebook executed: `python book/tools.py execute notebooks/" + path.name + "`"
    assert counts == list(range(1, len(code) + 1)), f"cells were not run once, top to bottom: {counts}"
    assert any(c.outputs for c in code), "no outputs committed"
    for i, c in enumerate(code):
        for out in c.outputs:
            assert out.output_type != "error", f"code cell {i} has an error output: {out.get('ename')}"
            assert not (out.output_type == "stream" and out.name == "stderr" and "Traceback" in out.text), i


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_nondeterministic_cells_are_ignored_by_nbval(path):
    nb = nbformat.read(path, as_version=4)
    for i, c in enumerate(nb.cells[1:], start=1):
        if c.cell_type != "code" or not c.outputs:
            continue
        # Cells that only define or import (no output) cannot trip nbval.
        if NONDETERMINISTIC.search(c.source) or any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                                                      for o in c.outputs):
            ignored = IGNORE_TAGS & set(c.metadata.get("tags", [])) or c.source.lstrip().startswith(IGNORE_COMMENTS)
            assert ignored, (f"cell {i} shows a widget, a timing or a progress bar: tag it `nbval-ignore-output`\n"
                             + c.source[:300])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_listed_in_the_toc(path):
    toc = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf8")))
    assert f"notebooks/{path.stem}" in toc, f"add notebooks/{path.stem} to _toc.yml"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_kernel_and_seed(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    code = "\n".join(c.source for c in nb.cells[1:] if c.cell_type == "code")
    if re.search(r"\btorch\.(randn|rand|randint|randperm|normal)\b", code):
        assert "torch.manual_seed(" in code, "seed the random generators in the first code cell after the imports"


def test_every_lab_figure_has_a_numbered_caption():
    """A code cell that draws a figure carries ``mystnb.figure`` (caption and name): the book numbers it."""
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
                figure = cell.metadata.get("mystnb", {}).get("figure", {})
                assert figure.get("caption") and figure.get("name"), f"{path.name} cell {i}: no caption/name"
                # MyST-NB names every display output of the cell: a second one (a tqdm bar) duplicates the name.
                shown = [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]
                assert len(shown) == 1, f"{path.name} cell {i}: a captioned cell must display only its figure"
