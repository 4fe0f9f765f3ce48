"""Cheating attempts against ``python -m pathedu.course grade``, each caught or contained.

Every attempt is a student's copy of lab 1 (its three function exercises the target) with some cells changed, graded for real: the grader
reads the notebook, a worker process runs the statements each answer needs, and the checks run in the grader's
process on inputs it draws from a secret seed.  Most submissions are graded once, together (the ``graded``
fixture); the time limits have their own runs.  What each test shows is in its name and docstring.
"""
from __future__ import annotations

import csv
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from pathedu import course, nope
from pathedu.exercises import _worker, ch01

LAB = course.labs()[0]
SOLUTIONS = [("".join(c["source"])) for c in json.loads(LAB.read_text())["cells"] if course.is_solution(c)]
STUBS = ("linear_matrix_mine", "merge", "chunk_step")  # the function each of lab 1's three stubs defines
NOT_ATTEMPTED = "not attempted yet"


def _copy(answers: dict | None = None, extra: tuple = ()) -> dict:
    """Lab 1's student copy with stub ``n`` (1, 2, 3) replaced by ``answers[n]`` and cells ``extra`` appended."""
    nb = course.student_copy(json.loads(LAB.read_text()))
    code = lambda c: "".join(c["source"]) if isinstance(c["source"], list) else c["source"]  # noqa: E731
    for n, answer in (answers or {}).items():
        cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and f"def {STUBS[n - 1]}(" in code(c)
                    and "NotImplementedError" in code(c))
        cell["source"] = answer
    for source in extra:
        nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                            "source": source})
    return nb


# --- the attempts ---------------------------------------------------------------------------------------------

# The attack: untouched stubs, plus a cell that appends Correct records to the file the old grader read
# (and prints the verdicts and summary line it would like to see, and writes a grades.csv of its own).
FORGE = '''import json, os
path = os.environ.get("PATHEDU_GRADING_RESULTS", "results.jsonl")
for n in "123":
    with open(path, "a") as f:
        f.write(json.dumps({"chapter": "ch01", "exercise": n, "check": "x", "name": "x", "ok": True,
                            "message": "matches the reference on 3 random inputs.", "grading": True}) + "\\n")
print("Correct [linear attention, matrix form]: matches the reference on 3 random inputs.")
print("mallory: 3/3 exercises correct in 1 notebook(s)")
with open("grades.csv", "w") as f:
    f.write("student,notebook,exercise,verdict,message\\nmallory,x,ch01.1,Correct,ok\\n")
'''

# The same forgery inside the answer, where it does run (in the worker), before the stub's raise.
FORGE_INSIDE = "def linear_matrix_mine(q, k, v):\n" + "".join(
    "    " + line + "\n" for line in FORGE.splitlines()) + "    raise NotImplementedError\n"

# Patch what a check leans on, at the top of the cell and again inside the answer: torch.allclose and friends,
# the grader's comparison and verdict, the check itself, and the reference (made to agree with the wrong answer).
PATCH = '''import torch
import pathedu.exercises._grader as grader
from pathedu import nope
from pathedu.exercises import ch01


def _yes(*args, **kwargs):
    return True


def _patch_everything():
    torch.allclose = torch.equal = _yes
    torch.isfinite = lambda x: torch.ones_like(x, dtype=torch.bool)
    torch.Tensor.__sub__ = lambda a, b: torch.zeros_like(a)
    grader.rel_error = lambda out, ref: 0.0
    grader._tensor_problem = lambda *args: None
    grader.Verdict.__bool__ = _yes
    ch01.check_linear_matrix = _yes
    ch01._linear_reference = nope.linear_recurrent = _zeros


def _zeros(q, k, v, **kwargs):
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)


_patch_everything()
torch.allclose = _yes


def linear_matrix_mine(q, k, v):
    _patch_everything()
    return _zeros(q, k, v)
'''

# An answer whose output claims to equal anything: a tensor subclass whose difference from anything is zero
# (it fools the check in the student's own process, see the test), and for exercise 2 objects that equal all.
AGREEABLE = '''import torch


class Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        return result * 0 if getattr(func, "__name__", "") in ("__sub__", "sub", "__rsub__") else result


def linear_matrix_mine(q, k, v):
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype).as_subclass(Agreeable)
'''
LIAR = '''class Liar:
    def __eq__(self, other):
        return True

    def __sub__(self, other):
        return 0.0

    def __abs__(self):
        return 0.0


def merge(m1, l1, acc1, m2, l2, acc2):
    return Liar(), Liar(), Liar()
'''

# Reading the reference through pathedu: the form itself under the stub's name, the grader's private reference,
# and a call of the library's recurrence.
READ_OWN = "from pathedu.nope import linear_matrix as linear_matrix_mine"
READ_GRADER = '''from pathedu.exercises import ch01


def merge(m1, l1, acc1, m2, l2, acc2):
    return ch01._merge_reference(m1, l1, acc1, m2, l2, acc2)
'''
READ_CALL = '''from pathedu import nope


def chunk_step(q_c, k_c, v_c, S):
    return nope.linear_recurrent(q_c, k_c, v_c, initial_state=S, return_state=True)
'''

# Switch the worker's tripwire off by calling the form's original, which the tripwire wraps: the grader's
# reading of the source still sees nope.linear_matrix.
TAMPER = '''from pathedu import nope


def linear_matrix_mine(q, k, v):
    form = nope.linear_matrix
    return getattr(form, "__pathedu_tripwire__", form)(q, k, v)
'''

# Detect grading (any sign of it) and then answer from a table of the outputs for the checks' public inputs
# (made offline from pathedu; the test makes it the same way); otherwise behave like an untouched stub.
DETECT = '''import os
import sys

import torch

TABLE = {table}


def linear_matrix_mine(q, k, v):
    graded = (any("GRAD" in key or "PATHEDU" in key for key in os.environ)
              or any(name.startswith(("pathedu.course", "pathedu.exercises._worker", "nbclient", "multiprocessing"))
                     for name in sys.modules)
              or "grade" in " ".join(sys.argv) or "pathedu-grade" in os.getcwd())
    if not graded:
        raise NotImplementedError("exercise 1: write the matrix form here")
    return torch.tensor(TABLE[round(float(q.sum()), 6)], dtype=q.dtype)
'''

# Files: write where the grader's CSV or the lecturer's files might be, then say (in an exception, which the
# verdict quotes) where it ran and what it saw; and delete every file of its folder and the folder above it.
VANDAL = '''import json
import os
import shutil
from pathlib import Path


def linear_matrix_mine(q, k, v):
    for name in ("grades.csv", "../grades.csv", "../../grades.csv", "~/pwned.txt"):
        try:
            Path(os.path.expanduser(name)).write_text("pwned")
        except OSError:
            pass
    where = {"cwd": os.getcwd(), "home": os.environ.get("HOME"),
             "env": sorted(k for k in os.environ if k.startswith("PATHEDU"))}
    raise RuntimeError(json.dumps(where))
'''
DELETE_THEN_ANSWER = '''import os
import shutil

import torch


def merge(m1, l1, acc1, m2, l2, acc2):
    for name in os.listdir("."):
        shutil.rmtree(name, ignore_errors=True) if os.path.isdir(name) else os.remove(name)
    shutil.rmtree("..", ignore_errors=True)
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a1 * l1 + a2 * l2, a1[..., None] * acc1 + a2[..., None] * acc2
'''

# A process that ends itself, one that writes garbage on every file descriptor (the grader's pipe among them),
# and one that calls sys.exit.
EXIT = "import os\n\n\ndef linear_matrix_mine(q, k, v):\n    os._exit(3)\n"
GARBAGE = '''import os


def merge(m1, l1, acc1, m2, l2, acc2):
    for fd in range(3, 64):
        try:
            os.write(fd, b"\\xff" * 64)
        except OSError:
            pass
    return m1, l1, acc1
'''
SYS_EXIT = "import sys\n\n\ndef chunk_step(q_c, k_c, v_c, S):\n    sys.exit(0)\n"

# Loops that never end: in the answer (after starting a process that would outlive it), and in the statements
# that define an answer.
MARKER = "pathedu-cheat-marker-7d1f"
LOOP_IN_ANSWER = f'''import subprocess
import sys


def linear_matrix_mine(q, k, v):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "{MARKER}"])
    while True:
        pass
'''
LOOP_AT_TOP = SOLUTIONS[1] + "\n\nwhile True:\n    merge.calls = 0\n"  # it changes merge: it defines the answer


def _lookup_table() -> dict:
    """Exercise 1's reference outputs on the check's public inputs (seeds 0, 1, 2), keyed by the sum of q."""
    table = {}
    for seed in range(3):
        q, k, v = ch01._linear_inputs(seed)
        table[round(float(q.sum()), 6)] = nope.linear_recurrent(q, k, v).tolist()
    return table


SUBMISSIONS = {
    "mallory": _copy(extra=(FORGE,)),
    "forger": _copy({1: FORGE_INSIDE}),
    "patcher": _copy({1: PATCH, 2: SOLUTIONS[1]}),
    "flatterer": _copy({1: AGREEABLE, 2: LIAR}),
    "reader": _copy({1: READ_OWN, 2: READ_GRADER, 3: READ_CALL}),
    "tamperer": _copy({1: TAMPER}),
    "detector": _copy({1: DETECT.format(table=repr(_lookup_table()))}),
    "vandal": _copy({1: VANDAL, 2: DELETE_THEN_ANSWER, 3: SOLUTIONS[2]}),
    "crasher": _copy({1: EXIT, 2: GARBAGE, 3: SYS_EXIT}),
    "looper": _copy({1: LOOP_IN_ANSWER, 2: LOOP_AT_TOP, 3: SOLUTIONS[2]}),
}
TIMEOUT = 3


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every submission above graded in one run, from a folder that holds the CSV and a file of the lecturer's;
    the submissions folder is read-only, as in the container recipe."""
    root = tmp_path_factory.mktemp("cheats")
    subs, run, scratch = root / "subs", root / "run", root / "tmp"
    for folder in (subs, run, scratch):
        folder.mkdir()
    for student, nb in SUBMISSIONS.items():
        (subs / student).mkdir()
        (subs / student / LAB.name).write_text(json.dumps(nb))
    (run / "lecturer.txt").write_text("keep me")
    for path in [*subs.rglob("*"), subs]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    old_cwd, old_tmp = os.getcwd(), tempfile.tempdir
    os.chdir(run)
    tempfile.tempdir = str(scratch)  # the grader's temporary folders (TMPDIR=... in a container)
    out = sys.stdout
    from io import StringIO
    printed = StringIO()
    try:
        sys.stdout = printed
        course.main(["grade", str(subs), "--out", "grades.csv", "--timeout", str(TIMEOUT), "--seed", "11"])
    finally:
        sys.stdout = out
        os.chdir(old_cwd)
        tempfile.tempdir = old_tmp
        for path in [*subs.rglob("*"), subs]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    with open(run / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {"rows": rows, "printed": printed.getvalue(), "root": root}


def _verdicts(graded, student):
    """The verdicts of lab 1's three function exercises (those the attempts target) for ``student``."""
    return {r["exercise"]: (r["verdict"], r["message"]) for r in graded["rows"]
            if r["student"] == student and r["exercise"] in ("ch01.1", "ch01.2", "ch01.3")}


def test_forged_result_records_change_nothing(graded):
    """The issue's attack: the forging cell is not needed by any answer, so it never runs; its prints reach
    nobody; the summary is 0/3; the CSV is the grader's."""
    assert _verdicts(graded, "mallory") == {f"ch01.{n}": ("Not yet", v[1]) for n, v in
                                            zip("123", _verdicts(graded, "mallory").values())}
    assert all(NOT_ATTEMPTED in m for _, m in _verdicts(graded, "mallory").values())
    assert "mallory: 0/6 exercises correct in 1 notebook(s), 0/12 points" in graded["printed"].splitlines()
    assert {(r["exercise"], r["points"]) for r in graded["rows"] if r["student"] == "mallory"
            and r["exercise"] == course.TOTAL} == {(course.TOTAL, "0")}
    assert "Correct [" not in graded["printed"] and "mallory: 3/3" not in graded["printed"]
    assert {r["student"] for r in graded["rows"]} == set(SUBMISSIONS)


def test_forging_inside_the_answer_runs_but_reaches_no_verdict(graded):
    """In the worker the forgery runs (no PATHEDU_GRADING_RESULTS there: it writes results.jsonl in its own
    folder); the verdict is the grader's: the function still raises NotImplementedError."""
    verdict, message = _verdicts(graded, "forger")["ch01.1"]
    assert verdict == "Not yet" and NOT_ATTEMPTED in message


def test_patching_torch_the_check_and_the_reference_is_contained(graded):
    """torch.allclose, Tensor.__sub__, the grader's comparison, Verdict.__bool__, the check and the reference
    are all patched, in the worker: the check runs in the grader's process and finds the zeros wrong."""
    verdict, message = _verdicts(graded, "patcher")["ch01.1"]
    assert verdict == "Not yet" and "values differ from the reference" in message
    assert _verdicts(graded, "patcher")["ch01.2"][0] == "Correct"  # the same process, patched, answers right
    assert torch.allclose is not None and ch01.check_linear_matrix.__name__ == "check_linear_matrix"


def test_an_output_that_claims_to_equal_anything_arrives_as_plain_data(graded, capsys):
    """The Agreeable tensor fools the check in the student's own process; graded, its data arrive as a plain
    tensor of zeros. Objects that equal everything arrive as empty stand-ins the check rejects."""
    namespace = {}
    exec(AGREEABLE, namespace)
    assert ch01.check_linear_matrix(namespace["linear_matrix_mine"]), "the attack works in the student's process"
    verdict, message = _verdicts(graded, "flatterer")["ch01.1"]
    assert verdict == "Not yet" and "values differ from the reference" in message
    verdict, message = _verdicts(graded, "flatterer")["ch01.2"]
    assert verdict == "Not yet" and "`m` should be a torch.Tensor, got Liar" in message


def test_reading_the_reference_through_pathedu_is_rejected(graded):
    rows = _verdicts(graded, "reader")
    assert rows["ch01.1"] == ("Not yet", "your answer is pathedu.nope.linear_matrix itself, pathedu's own code; "
                                         "write it yourself.")
    assert rows["ch01.2"][0] == "Not yet" and "pathedu.exercises.ch01._merge_reference" in rows["ch01.2"][1]
    assert rows["ch01.3"][0] == "Not yet" and "calls pathedu.nope.linear_recurrent" in rows["ch01.3"][1]


def test_switching_the_tripwire_off_is_caught_by_reading_the_source(graded):
    """The worker's tripwire sees no call (the original function is called); the grader, reading the answer's
    source in its own process, sees pathedu.nope.linear_matrix named in it."""
    verdict, message = _verdicts(graded, "tamperer")["ch01.1"]
    assert verdict == "Not yet" and "calls pathedu.nope.linear_matrix" in message


def test_detecting_grading_gains_nothing_the_inputs_are_fresh(graded, capsys):
    """The table of outputs for the checks' public inputs passes the check where nobody grades (so the detection
    matters to the cheat); graded, the inputs come from a secret seed and the table has no entry for them."""
    table = _lookup_table()
    assert ch01.check_linear_matrix(lambda q, k, v: torch.tensor(table[round(float(q.sum()), 6)], dtype=q.dtype))
    verdict, message = _verdicts(graded, "detector")["ch01.1"]
    assert verdict == "Not yet" and "your function raised KeyError" in message


def test_files_written_or_deleted_stay_in_a_temporary_folder_that_is_removed(graded):
    """The answer ran in its own folder under the grader's temporary folder, with HOME inside it and no
    PATHEDU_* variable; the next answer deleted its folder's parent (the notebook's): it and the exercise after
    it were graded all the same; the lecturer's files and the CSV are untouched, the temporary folders gone."""
    verdict, message = _verdicts(graded, "vandal")["ch01.1"]
    assert verdict == "Not yet" and "your function raised RuntimeError" in message
    seen = json.loads(message[message.index("{"):message.rindex("}") + 1])
    root = graded["root"]
    assert Path(seen["cwd"]).is_relative_to(root / "tmp") and "pathedu-grade-" in seen["cwd"]
    assert seen["home"] == seen["cwd"] and seen["env"] == []
    assert not Path(seen["cwd"]).exists()
    assert not [p for p in (root / "tmp").iterdir() if p.name.startswith("pathedu-grade-")]
    # Not a sandbox: a relative path can leave the folder. "../../grades.csv" landed in the temporary root (in
    # the container recipe, a tmpfs that goes with the container), not beside the lecturer's CSV.
    assert (root / "tmp" / "grades.csv").read_text() == "pwned"
    assert _verdicts(graded, "vandal")["ch01.2"][0] == "Correct"  # deleted its folder, then answered right
    assert _verdicts(graded, "vandal")["ch01.3"][0] == "Correct"
    assert sorted(p.name for p in (root / "run").iterdir()) == ["grades.csv", "lecturer.txt"]
    assert (root / "run" / "lecturer.txt").read_text() == "keep me"
    assert not any("pwned" in p.name for p in (root / "run").rglob("*"))


def test_a_worker_that_dies_or_writes_garbage_costs_only_its_exercise(graded):
    rows = _verdicts(graded, "crasher")
    assert rows["ch01.1"][0] == "Not yet" and "ended (exit code 3)" in rows["ch01.1"][1]
    assert rows["ch01.2"][0] == "Not yet" and "cannot read" in rows["ch01.2"][1]
    assert rows["ch01.3"][0] == "Not yet" and "your function raised SystemExit" in rows["ch01.3"][1]


def test_a_loop_that_never_ends_meets_the_time_limit_of_its_check(graded):
    """A loop in the answer and a loop among the statements that define one: each exercise is ended after the
    check's time limit, with the process the answer started; the third exercise is graded as usual."""
    rows = _verdicts(graded, "looper")
    assert rows["ch01.1"] == ("Not yet", f"your function did not return within {TIMEOUT} s, the time limit of one "
                                         "check.")
    assert rows["ch01.2"] == ("Not yet", f"the code that defines your answer did not finish within {TIMEOUT} s, "
                                         "the time limit of one check.")
    assert rows["ch01.3"][0] == "Correct"
    assert [pid for pid, command in _processes().items() if MARKER in command] == []


def _processes() -> dict:
    """``{pid: command line}`` of the running processes (Linux; empty elsewhere)."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else []:
        try:
            found[entry.name] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # ended meanwhile
            pass
    return found


def test_a_notebook_meets_its_own_time_limit(tmp_path):
    """Three looping answers, 2 s per check and 3 s per notebook: the first meets the check's limit, the second
    the notebook's, the third is not graded, and the notebook gets an error row."""
    (tmp_path / "subs").mkdir()
    loop = "def {}(*args):\n    while True:\n        pass\n"
    nb = _copy({n: loop.format(name) for n, name in enumerate(STUBS, start=1)})
    (tmp_path / "subs" / "sloth.ipynb").write_text(json.dumps(nb))
    rows = course.grade(tmp_path / "subs", None, timeout=2, notebook_timeout=3, progress=False)
    got = [(r["exercise"], r["verdict"], r["message"]) for r in rows]
    assert got == [("", "error", "the notebook's time limit of 3 s ran out"),
                   ("ch01.1", "Not yet", "your function did not return within 2 s, the time limit of one check."),
                   ("ch01.2", "Not yet", "your function did not return before the notebook's time limit of 3 s ran "
                                         "out."),
                   *((f"ch01.{n}", "not run", "not graded: the notebook's time limit of 3 s ran out")
                     for n in range(3, 7)),
                   (course.TOTAL, "", "")]


# --- the pieces the verdict rests on ----------------------------------------------------------------------------

def test_values_cross_as_plain_data_and_nothing_else():
    class Sub(torch.Tensor):
        pass

    value = {"t": (torch.arange(6.0).reshape(2, 3).as_subclass(Sub), torch.zeros(0, 2, dtype=torch.bfloat16),
                   torch.tensor([1 + 2j], dtype=torch.complex128), torch.tensor(True)),
             "n": [1, 2.5, float("inf"), 3j, None, True, "x"], 7: __import__("numpy").arange(3)}
    back = _worker.decode(_worker.encode(value))
    assert type(back["t"][0]) is torch.Tensor and torch.equal(back["t"][0], torch.arange(6.0).reshape(2, 3))
    assert back["t"][1].shape == (0, 2) and back["t"][1].dtype == torch.bfloat16
    assert back["t"][2].dtype == torch.complex128 and back["t"][3].item() is True
    assert back["n"] == [1, 2.5, float("inf"), 3j, None, True, "x"] and list(back[7]) == [0, 1, 2]
    opaque = _worker.decode(_worker.encode(object()))
    assert type(opaque).__name__ == "object" and isinstance(opaque, _worker.Opaque)


@pytest.mark.parametrize("header", [
    {"root": {"t": "tensor", "dtype": "float64", "shape": [2], "i": 0}, "sizes": [8]},   # too few bytes
    {"root": {"t": "tensor", "dtype": "object", "shape": [1], "i": 0}, "sizes": [8]},    # not a dtype
    {"root": {"t": "pickle", "v": "gASVAAAAAAAAAAB9lC4="}, "sizes": []},                # not a kind
    {"root": {"t": "int", "v": "1" * 5000}, "sizes": []},                                # too long
    {"root": {"t": "dict", "k": [{"t": "list", "v": []}], "v": [None]}, "sizes": []},  # a key that is a list
], ids=["size", "dtype", "kind", "int", "key"])
def test_a_payload_out_of_the_format_is_refused(header):
    raw = json.dumps(header).encode()
    data = len(raw).to_bytes(4, "big") + raw + b"\0" * sum(header["sizes"])
    with pytest.raises(_worker.FormatError):
        _worker.decode(data)


def test_a_frame_longer_than_the_limit_is_refused():
    read, write = os.pipe()
    try:
        os.write(write, (2 ** 40).to_bytes(8, "big"))
        with pytest.raises(_worker.FormatError, match="the limit"):
            _worker.read_frame(read, deadline=None)
    finally:
        os.close(read)
        os.close(write)


def test_fresh_inputs_keep_the_shapes_and_change_the_values():
    public = ch01._linear_inputs(1)
    with _grader().fresh_inputs(5):
        first = ch01._linear_inputs(1)
    with _grader().fresh_inputs(5):
        again = ch01._linear_inputs(1)
    with _grader().fresh_inputs(6):
        other = ch01._linear_inputs(1)
    assert [t.shape for t in first] == [t.shape for t in public]
    assert not torch.equal(first[0], public[0]) and not torch.equal(first[0], other[0])
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert torch.Generator is torch._C.Generator and torch.equal(ch01._linear_inputs(1)[0], public[0])


def _grader():
    from pathedu.exercises import _grader as grader
    return grader
