"""Course tools for lecturers: student copies of the labs, and grading the copies students hand back.

    python -m pathedu.course student [OUTDIR] [--labs DIR]   (default OUTDIR: ./student_labs)
    python -m pathedu.course grade SUBMISSIONS [--out grades.csv] [--timeout 120]

The labs are the notebooks ``NN_<name>_lab.ipynb`` of the repository's ``notebooks/`` folder; they are not part of
the installed package.  Run from a clone, ``student`` finds them there; after ``pip install`` point it at that
folder of a clone with ``--labs DIR``.  Grading runs notebooks in a Jupyter kernel: it needs ``nbclient``,
``nbformat`` and ``ipykernel``, which ``pip install "pathedu[course]"`` installs (from a clone:
``pip install ".[course]"``).

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

Grading (:func:`grade`) executes every ``*.ipynb`` under SUBMISSIONS (recursively; the folder right below
SUBMISSIONS is the student id, or the file name for a notebook directly in it) with nbclient, in grading mode
(``PATHEDU_GRADING=1``: a check rejects an answer that calls pathedu's own forms), each check recording its
verdict as a JSON line in the file named by ``PATHEDU_GRADING_RESULTS``.  It writes a CSV with the columns
``student, notebook, exercise, verdict, message`` (one row per exercise of each notebook, the last verdict its
checks gave; ``not run`` when no check of it ran; ``error`` for a notebook that could not be run) and prints one
summary line per student.
"""
from __future__ import annotations

import argparse
import copy
import csv
import importlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

SOLUTION_TAG = "solution"
LABS_DIR = Path(__file__).resolve().parent.parent / "notebooks"  # in a clone: the repository's notebooks/
COURSE_DEPENDENCIES = ("nbclient", "nbformat", "ipykernel")  # the `course` extra of pyproject.toml
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


def labs(folder: Path | None = None) -> list[Path]:
    """The lab notebooks ``NN_<name>_lab.ipynb`` in ``folder`` (default :data:`LABS_DIR`), in chapter order."""
    return sorted(Path(LABS_DIR if folder is None else folder).glob("[0-9][0-9]_*_lab.ipynb"))


class LabsNotFound(FileNotFoundError):
    """No lab notebook where :func:`student` looked; the message says where the labs are."""


def _no_labs_message(folder: Path) -> str:
    return (f"no lab notebooks (NN_<name>_lab.ipynb) found in {folder}. The labs are not part of the installed "
            "package: they are the notebooks/ folder of pathedu's repository (the book's pages link to it). Clone "
            "the repository and point this command at that folder: "
            "`python -m pathedu.course student OUTDIR --labs PATH/TO/pathedu/notebooks` (run from a clone, the "
            "command finds them by itself).")


def student(outdir: Path = DEFAULT_OUT, notebooks=None, *, labs_dir: Path | None = None) -> list[Path]:
    """Write a student copy of every lab in ``labs_dir`` (default :data:`LABS_DIR`; or of the files ``notebooks``)
    into ``outdir``; returns the paths written.  :class:`LabsNotFound` when there is no lab to copy; ``ValueError``
    when ``outdir`` is the labs' own folder."""
    outdir = Path(outdir)
    folder = Path(LABS_DIR if labs_dir is None else labs_dir)
    sources = [Path(p) for p in notebooks] if notebooks else labs(folder)
    if not sources:
        raise LabsNotFound(_no_labs_message(folder))
    if outdir.resolve() in {LABS_DIR.resolve(), folder.resolve()}:
        raise ValueError("`outdir` must not be notebooks/ (the copies would replace the labs)")
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sources:
        nb = json.loads(src.read_text())
        dest = outdir / src.name
        dest.write_text(json.dumps(student_copy(nb), indent=1, ensure_ascii=False) + "\n")
        written.append(dest)
    return written


# ---------------------------------------------------------------------------
# Grading the copies students hand back
# ---------------------------------------------------------------------------

COLUMNS = ("student", "notebook", "exercise", "verdict", "message")
DEFAULT_REPORT = Path("grades.csv")
_CHECK_CALL = re.compile(r"\b(ch\d\d)\.(check_\w+)\(")


def submissions(folder: Path) -> list[tuple[str, str, Path]]:
    """``(student, notebook, path)`` for every ``*.ipynb`` under ``folder`` (recursively, checkpoints skipped):
    the student is the first folder below ``folder``, or the file's name without ``.ipynb`` for a notebook
    directly in it; the notebook is the path below the student's folder (or the file name)."""
    folder = Path(folder)
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):  # .ipynb_checkpoints, hidden folders
            continue
        if len(rel.parts) == 1:
            found.append((path.stem, path.name, path))
        else:
            found.append((rel.parts[0], Path(*rel.parts[1:]).as_posix(), path))
    return found


def expected_exercises(nb: dict) -> list[tuple[str, str]]:
    """``(chapter, exercise)`` of every check a notebook calls, in order of first call (``exercise`` is the
    check's label, e.g. ``"1"`` or ``"3a"``)."""
    seen = []
    for cell in nb.get("cells", []):
        for key in _checks_called(cell):
            if key not in seen:
                seen.append(key)
    return seen


def _checks_called(cell: dict) -> list[tuple[str, str]]:
    """``(chapter, exercise)`` of every check call in ``cell`` (none in a Markdown cell)."""
    if cell.get("cell_type") != "code":
        return []
    return [(chapter, _label(chapter, name)) for chapter, name in _CHECK_CALL.findall(_source(cell))]


def _label(chapter: str, check_name: str) -> str:
    try:
        return getattr(importlib.import_module(f"pathedu.exercises.{chapter}"), check_name).label
    except (ImportError, AttributeError):
        return check_name


def _cell_error(nb: dict, chapter: str, label: str) -> str:
    """The error shown by the first cell that calls ``chapter``'s check ``label`` and raised, else ``''``."""
    for cell in nb.get("cells", []):
        if (chapter, label) not in _checks_called(cell):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"
    return ""


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class CourseDependencyMissing(ImportError):
    """A package that grading needs is not installed; the message names the extra that installs it."""


def require_course_dependencies(kernel_name: str = "python3") -> None:
    """Raise :class:`CourseDependencyMissing` unless nbclient, nbformat (and, for the ``python3`` kernel,
    ipykernel) can be imported: they come with ``pip install "pathedu[course]"``."""
    import importlib.util

    wanted = COURSE_DEPENDENCIES if kernel_name == "python3" else COURSE_DEPENDENCIES[:2]
    missing = []
    for name in wanted:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise CourseDependencyMissing(
            f"grading runs notebooks in a Jupyter kernel and needs {', '.join(missing)} (not installed): "
            "pip install \"pathedu[course]\" (from a clone of the repository: pip install \".[course]\")")


def run_notebook(path: Path, *, timeout: int = 120, kernel_name: str = "python3"):
    """Execute notebook ``path`` in grading mode; returns ``(nb, records, failure)``: the executed notebook (a
    dict; ``None`` when it could not be read), the checks' records (dicts, in order) and what stopped it
    (``''`` when it ran to the end; a cell that raises does not stop it)."""
    import nbclient
    import nbformat

    from .exercises._grader import GRADING_ENV, RESULTS_ENV

    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # not a notebook: reported, not raised
        return None, [], f"could not read the notebook: {type(exc).__name__}: {exc}"
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        results.touch()
        env = {**os.environ, GRADING_ENV: "1", RESULTS_ENV: str(results)}
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True,
                                         resources={"metadata": {"path": str(Path(path).parent)}})
        failure = ""
        try:
            client.execute(env=env)
        except Exception as exc:  # a timeout, a dead kernel, no such kernel: the notebook did not run
            failure = f"the notebook did not run to the end: {type(exc).__name__}: {exc}"
        records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    return nb, records, failure


def notebook_rows(student: str, notebook: str, nb, records, failure: str) -> list[dict]:
    """The report's rows for one executed notebook (see :func:`run_notebook`)."""
    rows = []
    if failure:
        rows.append(dict(student=student, notebook=notebook, exercise="", verdict="error",
                         message=_one_line(failure)))
    last = {}
    for r in records:
        last[(r["chapter"], r["exercise"])] = r
    expected = expected_exercises(nb) if nb is not None else []
    for key in expected + [k for k in last if k not in expected]:
        chapter, label = key
        exercise = f"{chapter}.{label}"
        if key in last:
            r = last[key]
            rows.append(dict(student=student, notebook=notebook, exercise=exercise,
                             verdict="Correct" if r["ok"] else "Not yet", message=_one_line(r["message"])))
        else:
            why = _cell_error(nb, chapter, label) if nb is not None else ""
            rows.append(dict(student=student, notebook=notebook, exercise=exercise, verdict="not run",
                             message=_one_line(f"its check did not run ({why})" if why
                                               else "its check did not run")))
    return rows


def summary(rows: list[dict]) -> list[str]:
    """One line per student: exercises correct out of those in their notebooks, and notebooks that failed."""
    lines = []
    for student in dict.fromkeys(r["student"] for r in rows):
        mine = [r for r in rows if r["student"] == student]
        graded = [r for r in mine if r["exercise"]]
        correct = sum(r["verdict"] == "Correct" for r in graded)
        notebooks = len(dict.fromkeys(r["notebook"] for r in mine))
        failed = sum(r["verdict"] == "error" for r in mine)
        line = f"{student}: {correct}/{len(graded)} exercises correct in {notebooks} notebook(s)"
        lines.append(line + (f"; {failed} notebook(s) did not run to the end" if failed else ""))
    return lines


def grade(folder: Path, out: Path | None = DEFAULT_REPORT, *, timeout: int = 120, kernel_name: str = "python3",
          progress: bool = True) -> list[dict]:
    """Grade every notebook under ``folder`` (see the module docstring): write the CSV to ``out`` (unless
    ``None``), print one summary line per student and return the rows.  :class:`CourseDependencyMissing` when
    nbclient, nbformat or ipykernel is missing (``pip install "pathedu[course]"``)."""
    from tqdm.auto import tqdm

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"`submissions` must be a folder, got {str(folder)!r}")
    require_course_dependencies(kernel_name)
    found = submissions(folder)
    rows = []
    for student, notebook, path in tqdm(found, desc="grading", unit="notebook", disable=not progress):
        nb, records, failure = run_notebook(path, timeout=timeout, kernel_name=kernel_name)
        rows += notebook_rows(student, notebook, nb, records, failure)
    if out is not None:
        with open(out, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    for line in summary(rows):
        print(line)
    if not found:
        print(f"no notebooks found under {folder}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pathedu.course", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("student", help="write student copies of the labs (no solutions, no outputs)")
    s.add_argument("outdir", nargs="?", default=str(DEFAULT_OUT))
    s.add_argument("--labs", help="the folder of lab notebooks: a clone's notebooks/ (default: the clone this "
                                  "package runs from)")
    s.add_argument("--notebooks", nargs="*", help="only these notebooks (default: every lab)")
    g = sub.add_parser("grade", help="run the students' notebooks in grading mode and write a CSV of verdicts")
    g.add_argument("submissions", help="folder of submitted notebooks (one folder per student, or one file each)")
    g.add_argument("--out", default=str(DEFAULT_REPORT), help=f"the CSV to write (default: {DEFAULT_REPORT})")
    g.add_argument("--timeout", type=int, default=120, help="seconds allowed per cell (default: 120)")
    g.add_argument("--kernel", default="python3", help="the Jupyter kernel to run them in (default: python3)")
    a = p.parse_args(argv)
    try:
        if a.command == "grade":
            grade(Path(a.submissions), Path(a.out), timeout=a.timeout, kernel_name=a.kernel)
            print(f"wrote {a.out}")
            return 0
        written = student(Path(a.outdir), a.notebooks, labs_dir=None if a.labs is None else Path(a.labs))
    except (LabsNotFound, CourseDependencyMissing, ValueError) as exc:
        p.exit(2, f"{p.prog} {a.command}: error: {exc}\n")
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
