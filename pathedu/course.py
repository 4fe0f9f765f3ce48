"""Course tools for lecturers: student copies of the labs, and grading the copies students hand back.

    python -m pathedu.course student [OUTDIR] [--labs DIR]   (default OUTDIR: ./student_labs)
    python -m pathedu.course grade SUBMISSIONS [--out grades.csv] [--timeout 60] [--notebook-timeout 600]

The labs are the notebooks ``NN_<name>_lab.ipynb`` of the repository's ``notebooks/`` folder; they are not part of
the installed package.  Run from a clone, ``student`` finds them there; after ``pip install`` point it at that
folder of a clone with ``--labs DIR``.  Grading needs ``nbformat`` and IPython, which the ``course`` extra
installs (from a clone: ``pip install ".[course]"``).

A lab's exercise is four cells: the task (Markdown), a stub that raises ``NotImplementedError`` and calls the
chapter's check (which prints ``Not yet [...]`` without raising), a solution cell tagged ``solution`` (and
``hide-cell``, which folds it in the book), and a check cell ``assert chNN.check_...(...)`` that may go on to use
the student's answer.  In the other kinds of exercise (:data:`pathedu.exercises.KINDS`) the stub assigns ``None``
(a prediction, a planted bug's name, next to a fixed function that raises) or an empty string (a written answer),
and a prediction's check cell is followed by the cell that reveals the answer.  A student copy
(:func:`student_copy`):

* drops every cell tagged ``solution``;
* clears every output (committed outputs can show answers) and execution count;
* turns each check cell's ``assert chNN.check_...(...)`` into ``ok = chNN.check_...(...)`` and runs the rest of
  the cell only ``if ok:``, so "Run all" on an untouched copy goes through every exercise and prints
  ``Not yet`` for each instead of stopping at the first.

The copies go outside ``notebooks/`` by default, where the test command does not collect them.

Grading (:func:`grade`) RUNS THE STUDENTS' CODE, with your user's rights: see the warning below.  It grades every
``*.ipynb`` under SUBMISSIONS (recursively; the folder right below SUBMISSIONS is the student id, or the file name
for a notebook directly in it), every exercise of the notebook's chapter (its name's ``NN_`` prefix and the check
modules it imports), and decides each verdict in its own process, where no student code runs:

1. It reads the notebook without running it (:func:`plan_exercises`).  An exercise's answer is the argument of
   the last call of its check, ``chNN.check_x(answer)``; the statements of the code cells before that call that
   the answer depends on (its definitions, imports, assignments, followed back to where each name is bound) are
   all that will run.  Any other cell, one that writes files or forges results for instance, never runs.
2. A fresh worker process per exercise runs those statements in a temporary working directory of its own and
   evaluates the answer (:mod:`pathedu.exercises._worker`).  Workers are forked from a server that imported
   torch and pathedu, takes requests from the grader alone and never runs a submission's code; a worker keeps
   no file descriptor but its channel to the grader, and on Linux no process of the same user can trace the
   server, the workers or the grader while it grades.
3. The chapter's check runs in the grader's process, on inputs drawn there from a secret seed (the checks' own
   seeds are public: :func:`pathedu.exercises._grader.fresh_inputs`).  Each call of the student's function goes
   to the worker as plain data and its result comes back as plain data (numbers, strings, tuples, lists, dicts,
   plain tensors and arrays: nothing unpickled, no object of the student's), which the check compares with the
   references it computes itself.  What the student's code does in its own process (patching the check,
   ``torch.allclose`` or pathedu, writing result files, detecting that it is graded) cannot reach the verdict.
4. Grading mode's rule holds: an answer that is, or calls, pathedu's own forms is "Not yet"; so is a prediction
   (a *predict, then run* exercise) computed with them before its check.  Calls are seen by
   tripwires in the worker and, where the student's code could switch those off, by reading the answer's source
   in the grader (:func:`pathedu.exercises._grader.pathedu_in_source`), which also refuses the checks' own
   references (``ch01._merge_reference``).  Pathedu's code pasted, or reached through a name spelt at run time
   after switching the tripwires off, is not caught.

Each check (building the answer included) gets ``--timeout`` seconds and each notebook ``--notebook-timeout``;
a worker that runs over is ended with everything it started in its process group.  That contains mistakes and
casual mischief (a loop that never ends, files deleted or written in the working folder, which is removed
afterwards), but it is **not a security sandbox**: the code runs as your user and can reach anything your user
can, the grader's own installed code included (and through it the next verdicts).  Run the grader in a
container with a read-only file system (``python -m pathedu.course grade --help`` shows how) or on a machine you
can wipe.  Grading needs ``os.fork`` (Linux, macOS; on Windows, use the container).

The CSV has the columns ``student, notebook, exercise, kind, verdict, points, max_points, message, answer``: one
row per exercise of each notebook, ``Correct`` or ``Not yet`` with the check's message, ``not run`` when the
notebook does not call the check or the answer could not be built (the message says why), and a first row
``error`` for a notebook that could not be read or ran out of time.  ``kind`` is the exercise's kind (``code``,
``predict``, ``explain``, ``bug``; :data:`pathedu.exercises.KINDS`); ``points`` what it earned out of
``max_points``, with partial credit where the check gives it (a bug named but not fixed, some entries of a
predicted shape).  A written answer (``explain``) gets the verdict ``needs marking``, its rubric as the message,
the student's text as ``answer`` and no points: the marker fills them in.  Each notebook's last row, exercise
``total``, sums the points.  One summary line per student is printed.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import csv
import importlib
import io
import json
import os
import random
import re
import signal
import socket
import struct
import symtable
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SOLUTION_TAG = "solution"
LABS_DIR = Path(__file__).resolve().parent.parent / "notebooks"  # in a clone: the repository's notebooks/
COURSE_DEPENDENCIES = ("nbclient", "nbformat", "ipykernel")  # the `course` extra of pyproject.toml
DEFAULT_OUT = Path("student_labs")
_CHECK = re.compile(r"^assert (ch\d\d\.check_\w+\(.*\))\s*$")
_CHECK_CALL = re.compile(r"\b(ch\d\d)\.(check_\w+)\(")


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


def student_copy(nb: dict, *, keep_lesson_outputs: bool = False) -> dict:
    """A copy of notebook ``nb`` (nbformat 4, as a dict) for students: see the module docstring.

    With ``keep_lesson_outputs``, the cells before the first exercise (the first code cell that calls a check
    or is a solution) keep their outputs: the lab's demonstrations, which show a student who runs them the same
    thing, and no answer.  The book's student edition is made so; the copies handed out are not."""
    nb = copy.deepcopy(nb)
    cells, lesson = [], keep_lesson_outputs
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and (is_solution(cell) or _CHECK_CALL.search(_source(cell))):
            lesson = False
        if is_solution(cell):
            continue
        if cell["cell_type"] == "code":
            if not lesson:
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


def _find_lab(name, folder: Path) -> Path:
    """A notebook named on the command line: a path to a file, or a lab of ``folder`` by its file name, with or
    without ``.ipynb``, or by the start of it (``01`` is ``01_nope_linear_lab.ipynb``); ``ValueError`` naming
    ``notebooks`` when none or several match."""
    path = Path(name)
    if path.is_file():
        return path
    matches = [p for p in labs(folder) if p.name.startswith(str(name))]  # the whole name starts it too
    if len(matches) != 1:
        found = "several labs: " + ", ".join(p.name for p in matches) if matches else "no such file and no lab"
        raise ValueError(f"notebooks: {name!r} matches {found} in {folder}")
    return matches[0]


def student(outdir: Path = DEFAULT_OUT, notebooks=None, *, labs_dir: Path | None = None) -> list[Path]:
    """Write a student copy of every lab in ``labs_dir`` (default :data:`LABS_DIR`; or of the files ``notebooks``)
    into ``outdir``; returns the paths written.  :class:`LabsNotFound` when there is no lab to copy; ``ValueError``
    when ``outdir`` is the labs' own folder."""
    outdir = Path(outdir)
    folder = Path(LABS_DIR if labs_dir is None else labs_dir)
    sources = [_find_lab(p, folder) for p in notebooks] if notebooks else labs(folder)
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

COLUMNS = ("student", "notebook", "exercise", "kind", "verdict", "points", "max_points", "message", "answer")
TOTAL = "total"  # the exercise column of each notebook's last row, which sums its points
DEFAULT_REPORT = Path("grades.csv")
DEFAULT_TIMEOUT = 60            # seconds, one check (every call of the answer it makes, and building the answer)
DEFAULT_NOTEBOOK_TIMEOUT = 600  # seconds, every exercise of one notebook
_CHAPTER = re.compile(r"ch\d\d")


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


def _check_function(chapter: str, name: str):
    """The grader's own check ``pathedu.exercises.<chapter>.<name>``, or ``None``."""
    if not _CHAPTER.fullmatch(chapter) or not name.startswith("check_"):
        return None
    try:
        check = getattr(importlib.import_module(f"pathedu.exercises.{chapter}"), name)
    except (ImportError, AttributeError):
        return None
    return check if hasattr(check, "evaluate") else None


def _label(chapter: str, check_name: str) -> str:
    check = _check_function(chapter, check_name)
    return check.label if check is not None else check_name


def chapter_checks(chapter: str) -> list:
    """Every registered check of ``chapter`` (``"ch01"``), in the order of its module's ``__all__``."""
    try:
        module = importlib.import_module(f"pathedu.exercises.{chapter}")
    except ImportError:
        return []
    checks = [getattr(module, name, None) for name in getattr(module, "__all__", ())]
    return [c for c in checks if hasattr(c, "evaluate")]


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class CourseDependencyMissing(ImportError):
    """A package that grading needs is not installed; the message names the extra that installs it."""


#: What ``grade`` imports from the course extra: nbformat reads the notebooks, IPython (ipykernel's) turns the
#: cells' IPython syntax (``%magic``, ``!command``) into Python before the grader reads them.
GRADING_NEEDS = ("nbformat", "IPython")


def require_course_dependencies() -> None:
    """Raise :class:`CourseDependencyMissing` unless what grading needs (:data:`GRADING_NEEDS`) can be imported:
    it comes with ``pip install "pathedu[course]"``."""
    import importlib.util

    missing = []
    for name in GRADING_NEEDS:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise CourseDependencyMissing(
            f"grading needs {', '.join(missing)} (not installed), from the course extra "
            f"({', '.join(COURSE_DEPENDENCIES)}): pip install \"pathedu[course]\" (from a clone of the repository: "
            "pip install \".[course]\")")


# --- reading a submission (nothing of it runs here) ---------------------------------------------------------

@dataclass
class _Cell:
    position: int                # 1-based, among all the notebook's cells
    source: str                  # as Python (IPython syntax turned into calls)
    tree: ast.Module | None      # None when the cell does not parse
    problem: str = ""            # its syntax error


@dataclass
class _Statement:
    cell: _Cell
    index: int                   # in the cell's body
    node: ast.stmt
    binds: frozenset             # names it certainly binds
    touches: frozenset           # names it binds or may change (binds included)
    reads: frozenset             # names it reads, in nested scopes too (a function's globals)
    late: frozenset              # the names of ``reads`` read in nested scopes: when a function runs
    star: bool                   # ``from x import *``


@dataclass
class ExercisePlan:
    """How one exercise of a submission is graded: the check, the notebook statements that build the answer,
    the answer's expression, and what reading the source found."""

    chapter: str
    label: str
    check: object
    pieces: list = field(default_factory=list)  # [{"cell", "source", "statements"}] in notebook order
    answer: str = ""             # "((args,), {kwargs})", evaluated after the pieces
    own: list = field(default_factory=list)    # pathedu functions the answer is
    named: list = field(default_factory=list)  # pathedu functions named in the functions it needs
    problem: str = ""            # why it is not graded ('' when it is)
    syntax: str = ""             # a cell before the check call that does not parse


def _python(source: str) -> str:
    """A cell's source as Python: IPython's ``%magic`` and ``!command`` lines become calls (which fail outside
    IPython, if they ever run)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - leave it to the parser to refuse
        return source


def _code_cells(nb: dict) -> list[_Cell]:
    cells = []
    for position, cell in enumerate(nb.get("cells", []), start=1):
        if cell.get("cell_type") != "code":
            continue
        source = _python(_source(cell))
        try:
            cells.append(_Cell(position, source, ast.parse(source, filename=f"<cell {position}>")))
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            line = getattr(exc, "lineno", None)
            cells.append(_Cell(position, source, None, f"cell {position} does not parse: "
                                                       f"{getattr(exc, 'msg', exc)}" + (f" (line {line})" if line else "")))
    return cells


def _names_read(node) -> tuple[set, set]:
    """``(read, late)``: the names ``node`` (a statement or an expression) reads from the notebook's namespace,
    and those of them read in nested scopes (function bodies: when the function runs, not when it is defined)."""
    try:
        table = symtable.symtable(ast.unparse(node), "<cell>", "eval" if isinstance(node, ast.expr) else "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        return names, names
    read, late = {s.get_name() for s in table.get_symbols() if s.is_referenced()}, set()
    stack = list(table.get_children())
    while stack:
        scope = stack.pop()
        late |= {s.get_name() for s in scope.get_symbols() if s.is_global()}
        stack.extend(scope.get_children())
    return read | late, late


def _root(node) -> str | None:
    """``x`` for ``x``, ``x.a.b``, ``x[i].a``, ``x.f(...).g``: the name whose object an expression starts from."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _target_names(target, binds: set, touches: set) -> None:
    if isinstance(target, ast.Name):
        binds.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            _target_names(t, binds, touches)
    elif isinstance(target, ast.Starred):
        _target_names(target.value, binds, touches)
    elif (name := _root(target)) is not None:  # x.a = ..., x[i] = ...: changes x
        touches.add(name)


_BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def _effects(node) -> tuple[set, set, bool, set]:
    """``(binds, touches, star, calls)`` of a top-level statement (see :class:`_Statement`); ``calls`` holds
    ``(x, f)`` for each statement ``x.f(...)`` (``x.append(...)`` may change ``x``; :func:`_statements` decides)."""
    binds, touches, star, calls = set(), set(), False, set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        binds.add(node.name)
    elif isinstance(node, ast.Import):
        binds |= {a.asname or a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom):
        star = any(a.name == "*" for a in node.names)
        binds |= {a.asname or a.name for a in node.names if a.name != "*"}
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            _target_names(target, binds, touches)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        if isinstance(node.target, ast.Name) and (isinstance(node, ast.AugAssign) or node.value is not None):
            binds.add(node.target.id)
        elif (name := _root(node.target)) is not None:
            touches.add(name)
    elif isinstance(node, ast.Delete):
        for target in node.targets:
            _target_names(target, touches, touches)
    elif isinstance(node, ast.Expr):
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
            name = _root(node.value.func)
            if name is not None:
                calls.add((name, node.value.func.attr))
    else:  # a block (for, while, if, with, try, match): whatever it binds, it may bind
        for sub in ast.walk(node):
            if isinstance(sub, (ast.For, ast.AsyncFor)):
                _target_names(sub.target, touches, touches)
            elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
                _target_names(sub.optional_vars, touches, touches)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                touches.add(sub.name)
            elif isinstance(sub, (ast.MatchAs, ast.MatchStar)) and sub.name:
                touches.add(sub.name)
        for name in _BLOCK_FIELDS:
            for sub in getattr(node, name, None) or []:
                for inner in ([sub] if isinstance(sub, ast.stmt) else getattr(sub, "body", [])):
                    b, t, s, c = _effects(inner)
                    touches |= b | t
                    star, calls = star or s, calls | c
    for sub in ast.walk(node):  # (x := ...) outside functions binds x
        if isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
            touches.add(sub.target.id)
    return binds, touches | binds, star, calls


#: Calls of a module's function that change its state (``torch.manual_seed(0)``, ``torch.set_default_dtype``):
#: any other call ``module.f(...)`` is taken to leave the module as it was.
_STATE_CALLS = ("set", "manual_seed", "seed", "use_", "_set")


def _statements(cells: list[_Cell]) -> list[_Statement]:
    effects = [(cell, index, node, _effects(node)) for cell in cells
               for index, node in enumerate(cell.tree.body if cell.tree is not None else [])]
    modules = {n for *_, node, _ in effects if isinstance(node, (ast.Import, ast.ImportFrom))
               for n in _effects(node)[0]}
    out = []
    for cell, index, node, (binds, touches, star, calls) in effects:
        touches = touches | {x for x, f in calls if x not in modules or f.startswith(_STATE_CALLS)}
        read, late = _names_read(node)
        out.append(_Statement(cell, index, node, frozenset(binds), frozenset(touches), frozenset(read),
                              frozenset(late), star))
    return out


def _slice(before: list[_Statement], needed: set) -> list[_Statement]:
    """The statements of ``before`` that the names ``needed`` (at the end of ``before``) depend on, followed
    back to where each is bound: walking back, a statement that binds or may change a needed name is kept, the
    names it reads become needed, and a name it certainly binds (without reading it) stops being needed.  A
    kept function reads its globals when it is called, after all of ``before``: they are needed from the end
    too, until nothing more is kept."""
    needed = set(needed)
    while True:
        want, kept = set(needed), []
        for st in reversed(before):
            if want and (st.star or st.touches & want):
                kept.append(st)
                want -= st.binds - st.reads
                want |= st.reads
        late = set().union(*(st.late for st in kept))
        if late <= needed:
            return kept[::-1]
        needed |= late


def _check_calls(node) -> list[ast.Call]:
    """The calls ``chNN.check_x(...)`` a top-level statement makes when it runs (not those inside a function
    it defines), in source order."""
    found, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) and n is not node:
            continue
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                and _CHAPTER.fullmatch(n.func.value.id) and n.func.attr.startswith("check_")):
            found.append(n)
        stack.extend(ast.iter_child_nodes(n))
    return sorted(found, key=lambda c: (c.lineno, c.col_offset))


def _chapters_named(nb: dict, cells: list[_Cell], filename: str) -> set:
    """The chapters a notebook belongs to by its name (``01_...`` -> ``ch01``) or its imports of
    ``pathedu.exercises.chNN``."""
    found = set()
    if match := re.match(r"(\d\d)_", filename):
        found.add(f"ch{match.group(1)}")
    for cell in cells:
        for node in ast.walk(cell.tree) if cell.tree is not None else []:
            if isinstance(node, ast.ImportFrom) and node.module in ("pathedu.exercises", "exercises"):
                found |= {a.name for a in node.names if _CHAPTER.fullmatch(a.name)}
            elif isinstance(node, ast.Import):
                found |= {a.name.rsplit(".", 1)[-1] for a in node.names
                          if a.name.startswith("pathedu.exercises.") and _CHAPTER.fullmatch(a.name.rsplit(".", 1)[-1])}
    return {c for c in found if chapter_checks(c)}


def plan_exercises(nb: dict, filename: str = "") -> list[ExercisePlan]:
    """How each exercise of notebook ``nb`` (a dict) is graded, without running anything of it: the exercises
    whose checks it calls, in order of first call, then the other exercises of its chapters (its name's
    ``NN_`` prefix, the chapters it imports), which are "not run".  An exercise's answer is the arguments of
    the *last* call of its check; the statements before that call that the answer depends on
    (:func:`_slice`) are what the worker runs to build it."""
    from .exercises._grader import pathedu_in_source

    cells = _code_cells(nb)
    statements = _statements(cells)
    sites: dict = {}
    for position, st in enumerate(statements):
        for call in _check_calls(st.node):
            check = _check_function(call.func.value.id, call.func.attr)
            if check is not None:
                sites[(call.func.value.id, check.label)] = (position, call, check)
    order = [key for key in expected_exercises(nb) if key in sites]
    order += [key for key in sites if key not in order]
    plans = []
    for chapter, label in order:
        position, call, check = sites[(chapter, label)]
        before = statements[:position]
        site_cell = statements[position].cell.position
        args = ast.Tuple(elts=list(call.args), ctx=ast.Load())
        kwargs = ast.Dict(keys=[ast.Constant(k.arg) if k.arg else None for k in call.keywords],
                          values=[k.value for k in call.keywords])
        answer = ast.Tuple(elts=[args, kwargs], ctx=ast.Load())
        kept = _slice(before, _names_read(answer)[0])
        pieces: list = []
        for st in kept:
            if not pieces or pieces[-1]["cell"] != st.cell.position:
                pieces.append({"cell": st.cell.position, "source": st.cell.source, "statements": []})
            pieces[-1]["statements"].append(st.index)
        nodes = [st.node for st in kept]
        if getattr(check, "kind", "code") == "predict":
            # A prediction is written down, not computed: read every statement it depends on as if it were the
            # body of a function, so that a call of pathedu's forms (or of a check's reference) anywhere in them
            # is named.
            body = [n for n in nodes if not isinstance(n, (ast.Import, ast.ImportFrom))] or [ast.Pass()]
            nodes = nodes + [ast.FunctionDef(name="_prediction", args=ast.arguments(
                posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]), body=body,
                decorator_list=[], returns=None, type_params=[])]
        own, named = pathedu_in_source(nodes, ast.Tuple(elts=[*call.args, *(k.value for k in call.keywords)],
                                                        ctx=ast.Load()), check.allow)
        syntax = next((c.problem for c in cells if c.problem and c.position <= site_cell), "")
        plans.append(ExercisePlan(chapter, label, check, pieces, ast.unparse(answer), own, named, syntax=syntax))
    for chapter in sorted(_chapters_named(nb, cells, filename) | {c for c, _ in order}):
        for check in chapter_checks(chapter):
            if (chapter, check.label) not in sites and not any(p.chapter == chapter and p.label == check.label
                                                               for p in plans):
                problem = "its check is not called in this notebook"
                problem += next((f" ({c.problem})" for c in cells if c.problem), "")
                plans.append(ExercisePlan(chapter, check.label, check, problem=problem))
    return plans


# --- running the answers: a worker process per exercise ------------------------------------------------------

class _OutOfTime(BaseException):
    """The worker did not answer before the deadline (a BaseException: no check's ``except Exception`` stops it)."""


class _WorkerGone(BaseException):
    """The worker ended, or sent what the grader cannot read."""


class _Zygote:
    """The grader's end of the fork server (:func:`pathedu.exercises._worker.zygote`): one per grading process,
    started on first use (it imports torch and pathedu: seconds), started again if it dies."""

    _running = None

    def __init__(self):
        import subprocess

        mine, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PATHEDU_")}
        boot = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
                "from pathedu.exercises._worker import zygote; zygote(int(sys.argv[2]))")
        self.process = subprocess.Popen([sys.executable, "-I", "-c", boot, json.dumps(sys.path),
                                         str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        start_new_session=True)  # its errors on stderr; a worker silences its own
        theirs.close()
        self.control = mine

    @classmethod
    def running(cls) -> "_Zygote":
        if cls._running is None or cls._running.process.poll() is not None:
            cls._running = cls()
        return cls._running

    def fork(self, workdir: str) -> tuple[int, int]:
        """``(pid, fd)`` of a new worker for ``workdir``."""
        from .exercises import _worker

        self.control.settimeout(600)  # the first fork waits for torch's import
        try:
            _worker.write_frame(self.control.fileno(), _worker.encode({"op": "fork", "workdir": workdir}))
            data, fds, _, _ = socket.recv_fds(self.control, 8, 1)
        finally:
            self.control.settimeout(None)
        if len(data) != 8 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError("the fork server did not answer")
        return struct.unpack(">q", data)[0], fds[0]

    def reap(self, pid: int):
        """The exit code of worker ``pid`` (after it was ended), or ``None``."""
        from .exercises import _worker

        try:
            _worker.write_frame(self.control.fileno(), _worker.encode({"op": "reap", "pid": pid}), time.monotonic() + 30)
            reply = _worker.decode(_worker.read_frame(self.control.fileno(), time.monotonic() + 30))
        except (OSError, EOFError, _worker.OutOfTime, _worker.FormatError):
            return None
        return reply.get("code") if isinstance(reply, dict) else None


class _Worker:
    """The grader's end of one worker process (:func:`pathedu.exercises._worker.serve`)."""

    def __init__(self, workdir: str):
        from .exercises import _worker

        self._w = _worker
        try:
            self.pid, self.fd = _Zygote.running().fork(workdir)
        except OSError:  # the fork server died (a worker may have killed it): once more, with a new one
            _Zygote._running = None
            self.pid, self.fd = _Zygote.running().fork(workdir)
        self.group, self.code, self.closed = None, None, False

    def request(self, message: dict, deadline: float) -> dict:
        """Send ``message``, return the reply (a dict); :class:`_OutOfTime` or :class:`_WorkerGone` after
        ending the worker."""
        w = self._w
        try:
            w.write_frame(self.fd, w.encode(message), deadline)
            reply = w.decode(w.read_frame(self.fd, deadline))
        except w.OutOfTime:
            self.close()
            raise _OutOfTime() from None
        except (EOFError, OSError, w.FormatError) as exc:
            code = self.close()
            why = (f"sent what the grader cannot read ({exc})" if isinstance(exc, w.FormatError)
                   else f"ended (exit code {code})")
            raise _WorkerGone(f"the process running your code {why}") from None
        if self.group is None:
            self._find_group()
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self.close()
            raise _WorkerGone("the process running your code sent a reply the grader cannot read")
        return reply

    def _find_group(self) -> None:
        try:  # the worker leads its own process group from its first step: remember it, to end it all
            if os.getpgid(self.pid) == self.pid:
                self.group = self.pid
        except OSError:
            pass

    def close(self):
        """End the worker and everything in its process group; its exit code."""
        if self.closed:
            return self.code
        self.closed = True
        if self.group is None:
            self._find_group()
        for kill, target in ((os.killpg, self.group), (os.kill, self.pid)):
            if target is not None:
                try:
                    kill(target, signal.SIGKILL)
                except OSError:
                    pass
        os.close(self.fd)
        self.code = _Zygote.running().reap(self.pid) if _Zygote._running is not None else None
        return self.code


class _Answer:
    """The grader's stand-in for a student's function: calling it runs the function in the worker on the
    arguments given (sent as plain data) and returns what came back (plain data again)."""

    def __init__(self, worker: _Worker, handle: int, name: str, deadline, calls: set):
        self._worker, self._handle, self._deadline, self._calls = worker, handle, deadline, calls
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        from .exercises._grader import RemoteError

        reply = self._worker.request({"op": "call", "handle": self._handle, "args": list(args), "kwargs": kwargs},
                                     self._deadline())
        calls = reply.get("calls")
        self._calls.update(c for c in (calls if isinstance(calls, list) else []) if isinstance(c, str))
        if reply["ok"]:
            return reply.get("value")
        raise _remote_error(reply.get("error"), RemoteError)

    def __repr__(self) -> str:
        return f"<your function {self.__name__}>"


def _remote_error(error, cls):
    error = error if isinstance(error, dict) else {}
    line = error.get("line")
    return cls(_one_line(error.get("type", "Exception"), 80), _one_line(error.get("message", ""), 500),
               line if isinstance(line, int) else 0, bool(error.get("stub")))


def _describe(error) -> str:
    error = error if isinstance(error, dict) else {}
    where = str(error.get("where", ""))
    where = f"{where.strip('<>')}, line {error.get('line')}" if where.startswith("<cell") else "the check call"
    message = f"{error.get('type', 'Exception')}: {error.get('message', '')}".rstrip(": ")
    return f"{message} ({where})"


class _Budget:
    """A notebook's time limit, counted from its first worker's start (not from the fork server's)."""

    def __init__(self, seconds: float):
        self.seconds, self._deadline = seconds, None

    def deadline(self) -> float:
        if self._deadline is None:
            self._deadline = time.monotonic() + self.seconds
        return self._deadline


def _grade_exercise(plan: ExercisePlan, workdir: str, timeout: float, budget: _Budget,
                    secret: int) -> tuple[str, str, str, dict]:
    """``(verdict, message, failure, extra)`` of one planned exercise; ``failure`` is non-empty when the
    notebook's time ran out (the exercises after it are not graded); ``extra`` holds the verdict's ``fraction``
    of the points, its ``marking`` rubric and its ``answer`` when the check got that far."""
    from .exercises._grader import Verdict, fresh_inputs, pathedu_verdict

    worker = _Worker(workdir)
    start, deadline = time.monotonic(), budget.deadline()

    def until() -> float:
        return min(start + timeout, deadline)

    def out_of_time(what: str) -> tuple[str, str, str]:
        if deadline < start + timeout and time.monotonic() >= deadline - 1e-3:
            failure = f"the notebook's time limit of {budget.seconds:g} s ran out"
            return "Not yet", f"{what} before {failure}.", failure, {}
        return "Not yet", f"{what} within {timeout:g} s, the time limit of one check.", "", {}

    try:
        try:
            loaded = worker.request({"op": "load", "pieces": plan.pieces, "answer": plan.answer,
                                     "allow": list(plan.check.allow)}, until())
        except _OutOfTime:
            return out_of_time("the code that defines your answer did not finish")
        except _WorkerGone as exc:
            return "not run", _one_line(f"its answer could not be built: {exc}"), "", {}
        if not loaded["ok"]:
            cause = loaded.get("first") or loaded.get("error")
            extra = f"; {plan.syntax}" if plan.syntax else ""
            return "not run", _one_line(f"its answer could not be built: {_describe(cause)}{extra}"), "", {}
        values, calls = [], set()
        described = loaded.get("answers")
        n_args, names = loaded.get("n_args"), loaded.get("names")
        if not (isinstance(described, list) and isinstance(n_args, int) and isinstance(names, list)
                and len(described) == n_args + len(names) and all(isinstance(n, str) for n in names)
                and all(isinstance(d, dict) for d in described)):
            return "not run", "its answer could not be built: the process running your code sent a bad reply", "", {}
        for d in described:
            if isinstance(d.get("handle"), int):
                values.append(_Answer(worker, d["handle"], _one_line(d.get("name", "answer"), 80), until, calls))
            else:
                values.append(d.get("value"))
        args, kwargs = values[:n_args], dict(zip(names, values[n_args:]))
        try:
            with fresh_inputs(secret), contextlib.redirect_stdout(io.StringIO()):
                v = plan.check.evaluate(*args, **kwargs)
            if not isinstance(v, Verdict):
                raise TypeError(f"the check returned {type(v).__name__}")
        except _OutOfTime:
            return out_of_time("your function did not return")
        except _WorkerGone as exc:
            return "Not yet", _one_line(f"{exc} while the check ran."), "", {}
        except Exception as exc:  # noqa: BLE001 - an answer that the check could not handle
            return ("Not yet", _one_line(f"the check could not use your answer ({type(exc).__name__}: {exc})."), "",
                    {})
        own = set(plan.own) | {n for n in loaded.get("own", []) if isinstance(n, str)}
        v = pathedu_verdict(v, own, (set(plan.named) | calls) - own)
        extra = {"fraction": v.fraction, "marking": v.marking if v.ok else "", "answer": v.answer}
        if extra["marking"]:
            return "needs marking", _one_line(f"rubric: {v.marking}", 2000), "", extra
        return ("Correct" if v.ok else "Not yet"), _one_line(v.message), "", extra
    finally:
        worker.close()


def read_notebook(path: Path) -> dict:
    """Notebook ``path`` as a dict (nbformat 4; an older format is converted)."""
    import warnings

    import nbformat

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbformat's notes on missing cell ids and the like
        return dict(nbformat.read(str(path), as_version=4))


def grade_notebook(student: str, notebook: str, path: Path, *, timeout: float = DEFAULT_TIMEOUT,
                   notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT, seed: int | None = None) -> list[dict]:
    """The report's rows for one submitted notebook (see the module docstring): one per exercise, and a row
    with the verdict ``error`` first when the notebook could not be read or its time ran out.  ``seed`` fixes
    the secret from which the checks' inputs are drawn (default: a new one each time)."""
    def row(exercise, verdict, message, kind="", points="", max_points="", answer=""):
        return dict(student=student, notebook=notebook, exercise=exercise, kind=kind, verdict=verdict,
                    points=points, max_points=max_points, message=_one_line(message, 2000),
                    answer=_one_line(answer, 2000))

    try:
        nb = read_notebook(path)
        plans = plan_exercises(nb, Path(path).name)
    except Exception as exc:  # noqa: BLE001 - not a notebook: reported, not raised
        return [row("", "error", f"could not read the notebook: {type(exc).__name__}: {exc}")]
    draw = random.SystemRandom() if seed is None else random.Random(seed)
    budget = _Budget(notebook_timeout)
    rows, failure = [], ""
    with tempfile.TemporaryDirectory(prefix="pathedu-grade-", ignore_cleanup_errors=True) as workdir:
        for plan in plans:
            exercise = f"{plan.chapter}.{plan.label}"
            kind, out_of = getattr(plan.check, "kind", "code"), getattr(plan.check, "points", 1.0)
            if plan.problem:
                rows.append(row(exercise, "not run", plan.problem, kind, 0, _points(out_of)))
            elif failure:
                rows.append(row(exercise, "not run", f"not graded: {failure}", kind, 0, _points(out_of)))
            else:
                folder = os.path.join(workdir, f"exercise-{len(rows) + 1}")
                verdict, message, failure, extra = _grade_exercise(plan, folder, timeout, budget,
                                                                   draw.getrandbits(62))
                earned = "" if extra.get("marking") else _points(extra.get("fraction", 0.0) * out_of)
                rows.append(row(exercise, verdict, message, kind, earned, _points(out_of), extra.get("answer", "")))
    if failure:
        rows.insert(0, row("", "error", failure))
    if plans:
        graded = [r for r in rows if r["exercise"]]
        to_mark = sum(r["verdict"] == "needs marking" for r in graded)
        rows.append(row(TOTAL, "", f"plus {to_mark} written answer(s) to mark (their points are not counted yet)"
                        if to_mark else "", "", _points(sum(float(r["points"] or 0) for r in graded)),
                        _points(sum(float(r["max_points"]) for r in graded))))
    return rows


def _points(x: float):
    """Points as the report writes them: an int when whole, else rounded to two decimals."""
    x = round(float(x), 2)
    return int(x) if x == int(x) else x


@contextlib.contextmanager
def _not_dumpable():
    """On Linux, while grading: this process is non-dumpable, so that a worker (the same user) can neither trace
    it nor read its memory under ``/proc``."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):
        prctl = None
    before = prctl(3, 0, 0, 0, 0) if prctl else -1  # PR_GET_DUMPABLE
    if before > 0:
        prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    try:
        yield
    finally:
        if before > 0:
            prctl(4, before, 0, 0, 0)


def summary(rows: list[dict]) -> list[str]:
    """One line per student: exercises correct out of those in their notebooks, points (those of the written
    answers still to be marked left out), and notebooks that failed."""
    lines = []
    for student in dict.fromkeys(r["student"] for r in rows):
        mine = [r for r in rows if r["student"] == student]
        graded = [r for r in mine if r["exercise"] and r["exercise"] != TOTAL]
        correct = sum(r["verdict"] == "Correct" for r in graded)
        notebooks = len(dict.fromkeys(r["notebook"] for r in mine))
        failed = len({r["notebook"] for r in mine if r["verdict"] == "error"})
        line = f"{student}: {correct}/{len(graded)} exercises correct in {notebooks} notebook(s)"
        if any(r.get("max_points") not in (None, "") for r in graded):
            earned = _points(sum(float(r.get("points") or 0) for r in graded))
            line += f", {earned}/{_points(sum(float(r.get('max_points') or 0) for r in graded))} points"
        to_mark = sum(r["verdict"] == "needs marking" for r in graded)
        line += f" ({to_mark} written answer(s) to mark)" if to_mark else ""
        lines.append(line + (f"; {failed} notebook(s) did not run to the end" if failed else ""))
    return lines


def grade(folder: Path, out: Path | None = DEFAULT_REPORT, *, timeout: float = DEFAULT_TIMEOUT,
          notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT, progress: bool = True,
          seed: int | None = None) -> list[dict]:
    """Grade every notebook under ``folder`` (see the module docstring; **it runs the students' code**): write
    the CSV to ``out`` (unless ``None``), print one summary line per student and return the rows.
    :class:`CourseDependencyMissing` when nbformat or IPython is missing (``pip install "pathedu[course]"``);
    ``OSError`` where there is no ``os.fork`` (Windows: grade in the container, or on Linux or macOS)."""
    from tqdm.auto import tqdm

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"`submissions` must be a folder, got {str(folder)!r}")
    if not (timeout > 0 and notebook_timeout > 0):
        raise ValueError(f"`timeout` and `notebook_timeout` must be > 0, got {timeout} and {notebook_timeout}")
    require_course_dependencies()
    if not hasattr(os, "fork"):
        raise OSError("grading forks a process per exercise, which this system cannot: grade on Linux or macOS, "
                      "or in the container that `python -m pathedu.course grade --help` shows")
    found = submissions(folder)
    rows = []
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the checks' references are small: one thread, none waiting for another
    try:
        with _not_dumpable():
            for i, (student, notebook, path) in enumerate(tqdm(found, desc="grading", unit="notebook",
                                                               disable=not progress)):
                rows += grade_notebook(student, notebook, path, timeout=timeout, notebook_timeout=notebook_timeout,
                                       seed=None if seed is None else seed + i)
    finally:
        torch.set_num_threads(threads)
    if out is not None:
        with open(out, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
            writer.writeheader()
            writer.writerows(rows)
    for line in summary(rows):
        print(line)
    if not found:
        print(f"no notebooks found under {folder}")
    return rows


#: An image with pathedu and its course extra (CPU PyTorch), built from a clone of the repository.
CONTAINER_BUILD = """\
docker build -t pathedu-grader -f - . <<'EOF'
FROM python:3.11-slim
COPY pyproject.toml README.md /src/
COPY pathedu /src/pathedu
COPY kernels /src/kernels
RUN pip install --no-cache-dir torch --index-url https://download.pytorch.org/whl/cpu \\
 && pip install --no-cache-dir "/src[course]"
EOF"""

#: Grading in that image: no network, a read-only file system (the grader's code included), the submissions
#: mounted read-only, a tmpfs for the working folders, only out/ writable; ``-I`` keeps the working folder off
#: Python's path.
CONTAINER_RUN = """\
docker run --rm --network none --read-only --tmpfs /tmp:rw,size=2g -w / --user "$(id -u):$(id -g)" \\
    --memory 8g --pids-limit 512 --cap-drop ALL --security-opt no-new-privileges \\
    -v "$PWD/submissions:/submissions:ro" -v "$PWD/out:/out" \\
    pathedu-grader python -I -m pathedu.course grade /submissions --out /out/grades.csv"""

GRADE_HELP = f"""\
WARNING: grading runs the students' code, with your user's rights. Run it in a container (below) or on a
machine you can wipe. Each exercise's answer is built and called in a fresh process, in a temporary working
directory of its own (HOME and TMPDIR point inside it), with a time limit per check and per notebook; that
contains mistakes and casual mischief (a loop that never ends, a cell that deletes or writes files in its
folder), but it is not a security sandbox: the code can still reach anything your user can, the grader's own
installed code included.

The verdicts come from the grader's own process: it reads each notebook without running it, takes the
statements an exercise's answer depends on, has a worker run them and call the answer on inputs the grader
draws afresh, and compares what comes back (plain data only) with references it computes itself. Cells that
forge results, patch the checks or torch, or detect grading change nothing; an answer that is or calls
pathedu's own forms is "Not yet".

In a container: no network, a read-only file system (the grader's code included), the submissions mounted
read-only, a tmpfs for the working folders, only the output folder writable. Build the image once, from a
clone, then grade (-I keeps the working folder off Python's path):

{CONTAINER_BUILD}

{CONTAINER_RUN}
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pathedu.course", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("student", help="write student copies of the labs (no solutions, no outputs)")
    s.add_argument("outdir", nargs="?", default=str(DEFAULT_OUT))
    s.add_argument("--labs", help="the folder of lab notebooks: a clone's notebooks/ (default: the clone this "
                                  "package runs from)")
    s.add_argument("--notebooks", nargs="*", help="only these notebooks: paths, or labs by name or its start, "
                                                  "e.g. 01 (default: every lab)")
    g = sub.add_parser("grade", help="grade the students' notebooks (runs their code!) and write a CSV of verdicts",
                       description=GRADE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("submissions", help="folder of submitted notebooks (one folder per student, or one file each)")
    g.add_argument("--out", default=str(DEFAULT_REPORT), help=f"the CSV to write (default: {DEFAULT_REPORT})")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds allowed for one check: building the answer and every call the check makes "
                        f"(default: {DEFAULT_TIMEOUT})")
    g.add_argument("--notebook-timeout", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT,
                   help=f"seconds allowed for all the checks of one notebook (default: {DEFAULT_NOTEBOOK_TIMEOUT})")
    g.add_argument("--seed", type=int, default=None,
                   help="the secret the checks' inputs are drawn from, to repeat a run (default: a new one)")
    a = p.parse_args(argv)
    try:
        if a.command == "grade":
            grade(Path(a.submissions), Path(a.out), timeout=a.timeout, notebook_timeout=a.notebook_timeout,
                  seed=a.seed)
            print(f"wrote {a.out}")
            return 0
        written = student(Path(a.outdir), a.notebooks, labs_dir=None if a.labs is None else Path(a.labs))
    except (LabsNotFound, CourseDependencyMissing, ValueError, OSError) as exc:
        p.exit(2, f"{p.prog} {a.command}: error: {exc}\n")
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
