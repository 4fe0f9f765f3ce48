"""Course tools for lecturers: student copies of the labs.

    python -m pathedu.course student [OUTDIR]      (default OUTDIR: ./student_labs)

A lab's exercise is four cells: the task (Markdown), a stub that raises ``NotImplementedError`` and calls the
chapter's check (which prints ``Not yet [...]`` without raising), a solution cell tagged ``solution`` (and
``hide-cell``, which folds it in the book), and a check cell ``assert chNN.check_...(...)`` that may go on to use
the student's answer.  A student copy (:func:`student_copy`):

* drops every cell tagged ``solution``;
* clears every output (committed outputs can show answers) and execution count;
* turns each check cell's ``assert chNN.check_...(...)`` into ``ok = chNN.check_...(...)`` and runs the rest of
  the cell only ``if ok:``, so "Run all" on an untouched copy goes through every exercise and prints
  ``Not yet`` for each instead of stopping at the first.

The copies go outside ``notebooks/`` by default, where the test command does not collect them.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

SOLUTION_TAG = "solution"
LABS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
DEFAULT_OUT = Path("student_labs")
_CHECK = re.compile(r"^assert (ch\d\d\.check_\w+\(.*\))\s*$")


def tags(cell: dict) -> list:
    return cell.get("metadata", {}).get("tags", [])


def is_solution(cell: dict) -> bool:
    return SOLUTION_TAG in tags(cell)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _guard_check(source: str) -> str:
    """``assert chNN.check_x(...)`` + the rest -> ``ok = chNN.check_x(...)`` + the rest under ``if ok:``."""
    lines = source.split("\n")
    match = _CHECK.match(lines[0])
    if match is None:
        return source
    rest = lines[1:]
    while rest and not rest[0].strip():
        rest = rest[1:]
    out = [f"ok = {match.group(1)}"]
    if rest:
        out += ["if ok:  # the rest of this cell uses your answer"]
        out += [("    " + line) if line.strip() else "" for line in rest]
    return "\n".join(out)


def student_copy(nb: dict) -> dict:
    """A copy of notebook ``nb`` (nbformat 4, as a dict) for students: see the module docstring."""
    nb = copy.deepcopy(nb)
    cells = []
    for cell in nb["cells"]:
        if is_solution(cell):
            continue
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            cell["source"] = _guard_check(_source(cell))
        cells.append(cell)
    nb["cells"] = cells
    return nb


def labs(folder: Path = LABS_DIR) -> list[Path]:
    """The lab notebooks, in chapter order."""
    return sorted(folder.glob("[0-9][0-9]_*_lab.ipynb"))


def student(outdir: Path = DEFAULT_OUT, notebooks=None) -> list[Path]:
    """Write a student copy of every lab (or of ``notebooks``) into ``outdir``; returns the paths written."""
    outdir = Path(outdir)
    sources = [Path(p) for p in notebooks] if notebooks else labs()
    if not sources:
        raise FileNotFoundError(f"no lab notebooks found in {LABS_DIR}")
    if outdir.resolve() == LABS_DIR.resolve():
        raise ValueError("`outdir` must not be notebooks/ (the copies would replace the labs)")
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sources:
        nb = json.loads(src.read_text())
        dest = outdir / src.name
        dest.write_text(json.dumps(student_copy(nb), indent=1, ensure_ascii=False) + "\n")
        written.append(dest)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pathedu.course", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("student", help="write student copies of the labs (no solutions, no outputs)")
    s.add_argument("outdir", nargs="?", default=str(DEFAULT_OUT))
    s.add_argument("--notebooks", nargs="*", help="only these notebooks (default: every lab)")
    a = p.parse_args(argv)
    for path in student(Path(a.outdir), a.notebooks):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
