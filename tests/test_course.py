"""Student copies of the labs (``python -m pathedu.course student``): no solution, no output, and "Run all" on an
untouched copy prints "Not yet" for every exercise instead of stopping at the first."""
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
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    n_exercises = sum(course.is_solution(c) for c in _nb(LABS[0])["cells"])
    assert text.count("Not yet [") >= n_exercises and "Correct [" not in text
