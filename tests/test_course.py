"""Student copies of the labs (``python -m pathedu.course student``): no solution, no output, and "Run all" on an
untouched copy prints "Not yet" for every exercise instead of stopping at the first.  Grading the copies handed
back (``python -m pathedu.course grade``): which statements build an answer, one CSV row per exercise, a summary
line per student, every lab's solutions graded Correct.  (The cheating attempts are in test_grading_cheats.py.)"""
import ast
import csv
import json

import pytest

from pathedu import course

LABS = course.labs()


def _nb(path):
    return json.loads(path.read_text())


def _code(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_every_lab_tags_its_solutions():
    assert len(LABS) >= 6
    for path in LABS:
        cells = [c for c in _nb(path)["cells"] if c["cell_type"] == "code"]
        solutions = [c for c in cells if course.is_solution(c)]
        assert solutions, path.name
        for c in cells:
            starts = _code(c).lstrip().startswith("# Solution")
            assert starts == course.is_solution(c), f"{path.name}: a solution cell must carry the tag, and only it"
            if starts:
                assert "hide-cell" in course.tags(c), "the book folds solutions away"


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.name[:2])
def test_a_student_copy_has_no_solution_no_output_and_no_stopping_check(path):
    nb = _nb(path)
    copy = course.student_copy(nb)
    n_solutions = sum(course.is_solution(c) for c in nb["cells"])
    assert len(copy["cells"]) == len(nb["cells"]) - n_solutions
    assert not any(course.is_solution(c) for c in copy["cells"])
    code = [c for c in copy["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert not any(_code(c).startswith("assert ch") for c in code)
    guarded = [c for c in code if _code(c).startswith("ok = ch")]
    assert len(guarded) == n_solutions  # one check cell per exercise
    assert nb == _nb(path), "the copy must not change the lab"


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.name[:2])
def test_a_copy_for_the_books_student_edition_keeps_the_lessons_outputs_only(path):
    """The cells before the first exercise keep their outputs (what a student who runs them sees too); from the
    first exercise on, none (a check cell's output comes from running the solution)."""
    nb = _nb(path)
    copy = course.student_copy(nb, keep_lesson_outputs=True)
    assert not any(course.is_solution(c) for c in copy["cells"])
    code = [c for c in copy["cells"] if c["cell_type"] == "code"]
    first = next(i for i, c in enumerate(code) if "ch" in _code(c) and course._CHECK_CALL.search(_code(c)))
    originals = [c for c in nb["cells"] if c["cell_type"] == "code" and not course.is_solution(c)]
    assert [c["outputs"] for c in code[:first]] == [c["outputs"] for c in originals[:first]]
    assert any(c["outputs"] for c in code[:first]), "a lab shows something before its exercises"
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code[first:])


def test_the_check_guard_keeps_the_rest_of_the_cell_under_if_ok():
    src = "assert ch01.check_x(f)\n\n# then use f\ny = f(1)\nfor i in range(2):\n    print(i)"
    assert course._guard_check(src) == ("ok = ch01.check_x(f)\nif ok:  # the rest of this cell uses your answer\n"
                                        "    # then use f\n    y = f(1)\n    for i in range(2):\n        print(i)")
    assert course._guard_check("assert ch02.check_y(g)") == "ok = ch02.check_y(g)"
    assert course._guard_check("x = 1\nassert ch01.check_x(f)") == "x = 1\nassert ch01.check_x(f)"


def test_the_command_writes_outside_the_labs_and_refuses_notebooks(tmp_path):
    written = course.student(tmp_path / "copies")
    assert [p.name for p in written] == [p.name for p in LABS]
    assert all(p.parent == tmp_path / "copies" for p in written)
    with pytest.raises(ValueError, match="notebooks/"):
        course.student(course.LABS_DIR)


@pytest.mark.integration
def test_run_all_on_a_student_copy_says_not_yet_for_every_exercise(tmp_path):
    """Lab 1's copy, executed top to bottom in a kernel: every exercise answers "Not yet", none "Correct",
    no cell raises (the follow-up code of a check cell runs only once the answer is right)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    (path,) = course.student(tmp_path, [LABS[0]])
    # Lab 1's cells take seconds.  Once in a CI run (2026-11-23) this execution sat idle for the whole 600 s
    # cell timeout and then passed: a kernel message that never came (cause not found).  So a short timeout,
    # and one more try in a fresh kernel when a cell times out or the kernel dies.
    for attempt in (1, 2):
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path)}})
        try:
            client.execute()
            break
        except (nbclient.exceptions.CellTimeoutError, nbclient.exceptions.DeadKernelError):
            if attempt == 2:
                raise
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    n_exercises = sum(course.is_solution(c) for c in _nb(LABS[0])["cells"])
    assert text.count("Not yet [") >= n_exercises and "Correct [" not in text


# --- grading the copies students hand back (python -m pathedu.course grade) ---------------------------------

def test_submissions_name_the_student_by_folder_or_file(tmp_path):
    for rel in ["alice/01_nope_linear_lab.ipynb", "alice/week2/02_alibi_retnet_lab.ipynb", "bob.ipynb",
                "alice/.ipynb_checkpoints/01_nope_linear_lab-checkpoint.ipynb", "notes.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    found = [(s, n, p.relative_to(tmp_path).as_posix()) for s, n, p in course.submissions(tmp_path)]
    assert found == [("alice", "01_nope_linear_lab.ipynb", "alice/01_nope_linear_lab.ipynb"),
                     ("alice", "week2/02_alibi_retnet_lab.ipynb", "alice/week2/02_alibi_retnet_lab.ipynb"),
                     ("bob", "bob.ipynb", "bob.ipynb")]


def test_the_exercises_a_notebook_checks_are_read_from_its_cells():
    assert course.expected_exercises(_nb(LABS[5])) == [("ch07", "1"), ("ch07", "2"), ("ch07", "3a"), ("ch07", "3b"),
                                                       ("ch07", "4"), ("ch07", "5"), ("ch07", "6"), ("ch07", "7")]
    assert course.expected_exercises(course.student_copy(_nb(LABS[0]))) == [("ch01", str(n)) for n in range(1, 7)]


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.name[:2])
def test_each_lab_calls_every_check_of_its_chapter(path):
    """A submission is graded on every exercise of its chapter, called or not: so the labs must call them all."""
    chapter = f"ch{path.name[:2]}"
    plans = course.plan_exercises(course.student_copy(_nb(path)), path.name)
    assert [(p.chapter, p.label) for p in plans] == course.expected_exercises(_nb(path))
    assert {p.label for p in plans} == {c.label for c in course.chapter_checks(chapter)}
    assert not any(p.problem for p in plans)


def _notebook(*sources, markdown_first=False):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# A lab"}] if markdown_first else []
    cells += [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": s}
              for s in sources]
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _kept(plan):
    """The kept statements as source lines: ``{cell: [first line of each statement]}``."""
    kept = {}
    for piece in plan.pieces:
        body = ast.parse(piece["source"]).body
        kept[piece["cell"]] = [ast.unparse(body[i]).split("\n")[0] for i in piece["statements"]]
    return kept


def test_an_answer_is_built_from_the_statements_it_needs_and_no_others():
    """Followed back from the last check call: the function, the helper it calls, the imports they read, and a
    statement that changes torch's state; not the forging cell, not an unused global, not the first check call."""
    nb = _notebook(
        "try:\n    import pathedu\nexcept ImportError:\n    %pip install -q pathedu\n    import pathedu",
        "import os\nimport torch\nfrom pathedu.exercises import ch01",
        "torch.manual_seed(0)\nT = 4\nunused = torch.randn(1000)",
        "def helper(x):\n    return x.mT",
        "def linear_matrix_mine(q, k, v):\n    keep = torch.ones(q.shape[-2], q.shape[-2]).tril()\n"
        "    return ((q @ helper(k)) * keep) @ v\n\n\nok = ch01.check_linear_matrix(linear_matrix_mine)",
        "import json\nwith open(os.environ['PATHEDU_GRADING_RESULTS'], 'a') as f:\n    f.write(json.dumps({}))",
        "ok = ch01.check_linear_matrix(linear_matrix_mine)\nif ok:\n    print(T)",
        markdown_first=True)
    (plan, *others) = course.plan_exercises(nb, "01_nope_linear_lab.ipynb")
    assert (plan.chapter, plan.label, plan.answer) == ("ch01", "1", "((linear_matrix_mine,), {})")
    assert _kept(plan) == {3: ["import torch"], 4: ["torch.manual_seed(0)"], 5: ["def helper(x):"],
                           6: ["def linear_matrix_mine(q, k, v):"]}
    assert plan.own == plan.named == [] and plan.problem == ""
    assert [(p.label, p.problem) for p in others] == [(str(n), "its check is not called in this notebook")
                                                      for n in range(2, 7)]


def test_a_value_built_by_a_loop_keeps_the_loop_that_fills_its_list():
    nb = _notebook("import torch\nfrom pathedu.exercises import ch03\nx = 1\np = torch.ones(())\nproducts = []\n"
                   "for _ in range(5):\n    p = p * 0.9\n    products.append(p.item())\n"
                   "n_stuck = len(products)\nvalue = products[-1]",
                   "ok = ch03.check_stuck_product(n_stuck, value)")
    plan = next(p for p in course.plan_exercises(nb) if p.label == "4")
    assert _kept(plan) == {1: ["import torch", "p = torch.ones(())", "products = []", "for _ in range(5):",
                               "n_stuck = len(products)", "value = products[-1]"]}
    assert plan.answer == "((n_stuck, value), {})"


def test_reading_the_source_finds_pathedu_answers_and_a_cell_that_does_not_parse():
    nb = _notebook("from pathedu import nope\nfrom pathedu.exercises import ch01",
                   "from pathedu.nope import linear_matrix as linear_matrix_mine",
                   "def merge(m1, l1, acc1, m2, l2, acc2):\n    return ch01._merge_reference(m1, l1, acc1, m2, l2, acc2)",
                   "def chunk_step(q, k, v, S)\n    return q",
                   "ok = ch01.check_linear_matrix(linear_matrix_mine)",
                   "ok = ch01.check_online_softmax_merge(merge)",
                   "ok = ch01.check_chunk_step(chunk_step)")
    plans = {p.label: p for p in course.plan_exercises(nb)}
    assert plans["1"].own == ["pathedu.nope.linear_matrix"] and plans["1"].named == []
    assert plans["2"].named == ["pathedu.exercises.ch01._merge_reference"]
    assert plans["3"].syntax.startswith("cell 4 does not parse") and "line 1" in plans["3"].syntax


def _copy_with(lab, answers: dict):
    """A student copy of ``lab`` whose stub cells (found by the function they define) hold ``answers``."""
    copy = course.student_copy(_nb(lab))
    for cell in copy["cells"]:
        for name, answer in answers.items():
            if cell["cell_type"] == "code" and f"def {name}(" in _code(cell) and "NotImplementedError" in _code(cell):
                cell["source"] = answer
    return copy


def test_the_grade_command_writes_the_csv_and_a_summary_line_per_student(tmp_path, monkeypatch, capsys):
    subs = tmp_path / "subs"
    for student in ("alice", "bob"):
        (subs / student).mkdir(parents=True)
        (subs / student / LABS[0].name).write_text(json.dumps(course.student_copy(_nb(LABS[0]))))
    ran = []

    def fake(student, notebook, path, *, timeout, notebook_timeout, seed):
        ran.append((student, timeout, notebook_timeout, seed))
        rows = [dict(student=student, notebook=notebook, exercise=f"ch01.{n}", verdict=v, message="m")
                for n, v in zip("123", ["Correct", "Not yet", "not run"])]
        return rows if student == "alice" else [dict(rows[0], exercise="", verdict="error")] + rows

    monkeypatch.setattr(course, "grade_notebook", fake)
    out = tmp_path / "report.csv"
    assert course.main(["grade", str(subs), "--out", str(out), "--timeout", "30", "--notebook-timeout", "90",
                        "--seed", "7"]) == 0
    assert ran == [("alice", 30, 90, 7), ("bob", 30, 90, 8)]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["student", "notebook", "exercise", "kind", "verdict", "points", "max_points", "message",
                             "answer"]
    assert [(r["student"], r["exercise"], r["verdict"]) for r in rows] == [
        ("alice", "ch01.1", "Correct"), ("alice", "ch01.2", "Not yet"), ("alice", "ch01.3", "not run"),
        ("bob", "", "error"), ("bob", "ch01.1", "Correct"), ("bob", "ch01.2", "Not yet"), ("bob", "ch01.3", "not run")]
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["alice: 1/3 exercises correct in 1 notebook(s)",
                           "bob: 1/3 exercises correct in 1 notebook(s); 1 notebook(s) did not run to the end"]
    with pytest.raises(ValueError, match="`submissions`"):
        course.grade(tmp_path / "missing", None)
    with pytest.raises(ValueError, match="`timeout`"):
        course.grade(subs, None, timeout=0)


def test_the_grade_help_says_it_runs_the_students_code_and_shows_a_container(capsys):
    with pytest.raises(SystemExit):
        course.main(["grade", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "grading runs the students' code" in text and "not a security sandbox" in text
    for part in ("docker run", "--network none", "--read-only", "--tmpfs /tmp", ":ro", "python -m pathedu.course grade"):
        assert part in text, part


def test_how_to_use_says_that_grading_runs_the_students_code_and_shows_the_container():
    page = (course.LABS_DIR.parent / "book" / "how_to_use.md").read_text(encoding="utf8")
    text = " ".join(page.split())
    assert "Grading runs your students' code" in text and "not a security sandbox" in text
    assert "course.CONTAINER_BUILD" in page and "course.CONTAINER_RUN" in page  # the recipe the --help prints
    assert "--network none" in course.CONTAINER_RUN and ":ro" in course.CONTAINER_RUN
    assert "--read-only" in course.CONTAINER_RUN and "--tmpfs /tmp" in course.CONTAINER_RUN


def test_grade_runs_the_answers_and_decides_in_its_own_process(tmp_path):
    """alice filled exercise 1's stub with the lab's solution, bob answered it with pathedu's function, dave's
    stub cell does not parse; an unreadable file is reported, not a crash."""
    nb = _nb(LABS[0])
    solution = next(_code(c) for c in nb["cells"] if course.is_solution(c))
    assert "def linear_matrix_mine" in solution
    answers = {"alice": solution, "bob": "from pathedu.nope import linear_matrix as linear_matrix_mine",
               "dave": "def linear_matrix_mine(q, k, v)\n    return v"}
    for student, answer in answers.items():
        (tmp_path / "subs" / student).mkdir(parents=True)
        (tmp_path / "subs" / student / LABS[0].name).write_text(
            json.dumps(_copy_with(LABS[0], {"linear_matrix_mine": answer})))
    (tmp_path / "subs" / "carol.ipynb").write_text("not a notebook")
    out = tmp_path / "grades.csv"
    course.grade(tmp_path / "subs", out, timeout=60, progress=False)
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    rows = [(r["student"], r["notebook"], r["exercise"], r["verdict"], r["message"]) for r in table
            if r["exercise"] in ("", "ch01.1", "ch01.2", "ch01.3")]
    stub = ("Not yet", "not attempted yet: your function still raises NotImplementedError. Replace the `raise` "
                       "line with your code and run the cell again. Stuck? ch01.hint({}) prints a first hint.")
    lab = LABS[0].name
    assert rows[:7] == [
        ("alice", lab, "ch01.1", "Correct", "matches the reference on 3 random inputs."),
        ("alice", lab, "ch01.2", stub[0], stub[1].format(2)),
        ("alice", lab, "ch01.3", stub[0], stub[1].format(3)),
        ("bob", lab, "ch01.1", "Not yet",
         "your answer is pathedu.nope.linear_matrix itself, pathedu's own code; write it yourself."),
        ("bob", lab, "ch01.2", stub[0], stub[1].format(2)),
        ("bob", lab, "ch01.3", stub[0], stub[1].format(3)),
        ("carol", "carol.ipynb", "", "error", rows[6][4]),
    ]
    assert rows[6][4].startswith("could not read the notebook")
    dave = rows[7]
    assert dave[2:4] == ("ch01.1", "not run")
    assert "its answer could not be built: NameError: name 'linear_matrix_mine' is not defined" in dave[4]
    assert "does not parse" in dave[4]
    # points: alice has exercise 1's two of the notebook's twelve; the unreadable notebook has no total
    totals = {r["student"]: (r["points"], r["max_points"]) for r in table if r["exercise"] == course.TOTAL}
    assert totals == {"alice": ("2", "12"), "bob": ("0", "12"), "dave": ("0", "12")}


def _with_solutions(lab):
    """A student copy of ``lab`` whose stubs hold the lab's solutions."""
    nb = _nb(lab)
    cells = nb["cells"]
    solution_after = {i - 1: _code(c) for i, c in enumerate(cells) if course.is_solution(c)}
    filled = [dict(c, source=solution_after[i]) if i in solution_after else c
              for i, c in enumerate(cells) if not course.is_solution(c)]
    return course.student_copy(dict(nb, cells=filled))


def test_every_solution_of_every_lab_is_graded_correct_on_fresh_inputs(tmp_path):
    """Each lab's solutions in its stubs, graded as a student's copy: every exercise Correct (a written answer:
    needs marking, its rubric in the message, its text as the answer, no points yet), every point earned, on
    inputs drawn from a secret seed (two seeds); the answers' source names no forbidden pathedu function."""
    for lab in LABS:
        (tmp_path / "subs" / "sol").mkdir(parents=True, exist_ok=True)
        (tmp_path / "subs" / "sol" / lab.name).write_text(json.dumps(_with_solutions(lab)))
    for seed in (1, 2):
        rows = course.grade(tmp_path / "subs", None, timeout=120, progress=False, seed=seed)
        graded = [r for r in rows if r["exercise"] != course.TOTAL]
        assert len(graded) == sum(len(course.expected_exercises(_nb(lab))) for lab in LABS)
        assert len(rows) - len(graded) == len(LABS)  # one total per notebook
        wrong = [(r["exercise"], r["verdict"], r["message"]) for r in graded
                 if r["verdict"] != ("needs marking" if r["kind"] == "explain" else "Correct")]
        assert not wrong
        for r in graded:
            if r["kind"] == "explain":
                assert r["points"] == "" and r["message"].startswith("rubric: ") and len(r["answer"].split()) >= 20
            else:
                assert r["points"] == r["max_points"] and float(r["points"]) > 0, r
        for total in (r for r in rows if r["exercise"] == course.TOTAL):
            mine = [r for r in graded if r["notebook"] == total["notebook"]]
            assert total["points"] == course._points(sum(float(r["points"] or 0) for r in mine))
            assert total["max_points"] == course._points(sum(float(r["max_points"]) for r in mine))
            assert "to mark" in total["message"]
        kinds = {(r["notebook"][:2], r["kind"]) for r in graded}
        assert all((lab.name[:2], kind) in kinds for lab in LABS for kind in ("code", "predict", "explain", "bug"))


def _lab1_with(sources: dict) -> dict:
    """Lab 1's student copy with the stub cells of exercises 4-6 (found by what they assign) replaced."""
    copy = course.student_copy(_nb(LABS[0]))
    for cell in copy["cells"]:
        for start, source in sources.items():
            if cell["cell_type"] == "code" and _code(cell).startswith(start):
                cell["source"] = source
    return copy


def test_partial_credit_and_the_new_kinds_are_graded_and_totalled(tmp_path):
    """A prediction with some entries right, a bug named but not fixed, a bug fixed but misnamed, a written
    answer too short and one long enough, a prediction computed with pathedu's form or read from the check's own
    truth instead of written down: each gets its points, and the notebook's total adds them up."""
    fixed = next(_code(c) for c in _nb(LABS[0])["cells"]
                 if course.is_solution(c) and "def linear_chunked_fixed" in _code(c)).replace('bug = "scale"', "")
    planted = next(_code(c) for c in _nb(LABS[0])["cells"] if "def linear_chunked_planted" in _code(c))
    planted = planted.split("\n\n\nprint(")[0].replace("linear_chunked_planted", "linear_chunked_fixed")
    words = " ".join(["because"] * 25)
    submissions = {
        "ann": {"state_shape = None": "state_shape = (2, 3, 16, 24)",
                "why_order = ": f'why_order = "{words}"',
                "bug = None": 'bug = "scale"\n' + planted},
        "ben": {"state_shape = None": "state_shape = [2, 3, 24, 16]",
                "why_order = ": 'why_order = "the mask counts"',
                "bug = None": 'bug = "mask"\n' + fixed},
        "cid": {"state_shape = None": ("import torch\nfrom pathedu import nope\nx = torch.zeros(2, 3, 40, 16)\n"
                                       "_, S = nope.linear_recurrent(x, x, torch.zeros(2, 3, 40, 24), "
                                       "return_state=True)\nstate_shape = tuple(S.shape)")},
        "dan": {"state_shape = None": "state_shape = ch01._state_shape()"},
    }
    for student, sources in submissions.items():
        (tmp_path / "subs" / student).mkdir(parents=True)
        (tmp_path / "subs" / student / LABS[0].name).write_text(json.dumps(_lab1_with(sources)))
    out = tmp_path / "grades.csv"
    course.grade(tmp_path / "subs", out, progress=False, seed=5)
    with open(out, newline="") as f:
        rows = {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}

    def got(student, n):
        r = rows[student, n if n == course.TOTAL else f"ch01.{n}"]
        return r["kind"], r["verdict"], r["points"], r["max_points"]

    assert got("ann", 4) == ("predict", "Not yet", "0.5", "1")  # two of four entries
    assert "2 of the 4 entries" in rows["ann", "ch01.4"]["message"] and rows["ann", "ch01.4"]["answer"] == "(2, 3, 16, 24)"
    assert got("ann", 5) == ("explain", "needs marking", "", "2")
    assert rows["ann", "ch01.5"]["message"].startswith("rubric: 2 points.") and rows["ann", "ch01.5"]["answer"] == words
    assert got("ann", 6) == ("bug", "Not yet", "1", "3")  # named, not fixed
    assert "planted bug computes" in rows["ann", "ch01.6"]["message"]
    assert got("ann", course.TOTAL) == ("", "", "1.5", "12")
    assert "plus 1 written answer(s) to mark" in rows["ann", course.TOTAL]["message"]
    assert got("ben", 4) == ("predict", "Correct", "1", "1")  # a list is a shape too
    assert got("ben", 5) == ("explain", "Not yet", "0", "2")  # three words
    assert got("ben", 6) == ("bug", "Not yet", "2", "3")  # fixed, misnamed
    assert got("ben", course.TOTAL)[2:] == ("3", "12")
    assert got("cid", 4) == ("predict", "Not yet", "0", "1")
    assert "pathedu.nope.linear_recurrent" in rows["cid", "ch01.4"]["message"]
    assert got("dan", 4) == ("predict", "Not yet", "0", "1")  # the check's own truth, read through pathedu
    assert "pathedu.exercises.ch01._state_shape" in rows["dan", "ch01.4"]["message"]


def test_student_finds_a_lab_by_its_name_or_its_start_and_refuses_an_unknown_one(tmp_path):
    """``--notebooks 01`` and ``--notebooks 01_nope_linear_lab`` name the lab of notebooks/; a name that matches no
    lab (or several) is a ValueError naming the argument, raised before the output folder is made."""
    from pathedu import course

    first = course.labs()[0]
    for name in (first.name[:2], first.stem, first.name, str(first)):
        out = tmp_path / f"by_{len(name)}"
        assert [p.name for p in course.student(out, [name])] == [first.name]
    for bad in ("no_such_lab", "1"):  # no lab; two labs (10_, 11_)
        out = tmp_path / "bad"
        with pytest.raises(ValueError, match="notebooks"):
            course.student(out, [bad])
        assert not out.exists()
