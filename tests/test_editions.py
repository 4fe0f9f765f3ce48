"""The book's two editions (``python book/tools.py edition student|instructor --out DIR``): the student edition's
sources hold no solution (no problem's solution or its checking cell, no lab solution cell, no output of an
exercise), everything else of the book stays; the instructor edition is the normal build.  The student edition's
HTML is checked in a full build by tests/test_book.py (in the same worker as the book's own build: two builds at
once on two cores time out)."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import helpers
from pathedu import course

ROOT = Path(__file__).resolve().parent.parent
tools = helpers.load_book_tools()

SOLUTION_BLOCK = re.compile(r"^(:{3,}|`{3,})\{(admonition|dropdown)\}\s*Solution\b", re.M)
FOLDED = re.compile(r"Each\s+solution\s+is\s+folded\s+away")


def _code(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> tuple[Path, dict]:
    dest = tmp_path_factory.mktemp("student") / "source"
    return dest, tools.student_sources(dest)


def test_the_student_pages_keep_the_problems_and_lose_their_solutions(student):
    dest, removed = student
    pages = sorted((ROOT / "book").glob("*.md"))
    assert {p.relative_to(ROOT).as_posix() for p in pages} <= set(removed)
    total = 0
    for page in pages:
        original = page.read_text(encoding="utf8")
        text = (dest / page.relative_to(ROOT)).read_text(encoding="utf8")
        name = page.name
        assert not SOLUTION_BLOCK.search(text), name
        assert not FOLDED.search(text), name
        n = len(SOLUTION_BLOCK.findall(original))
        total += n
        assert removed[f"book/{name}"] == (n, n), f"{name}: each solution goes with the cell that checks it"
        cells = text.count("```{code-cell}")
        assert cells == original.count("```{code-cell}") - n, name
        sections = re.compile(r"^#{2,4} .*$", re.M)
        assert sections.findall(text) == sections.findall(original), name
        assert text.count("### Problem") == original.count("### Problem"), name
        if n:
            assert tools.STUDENT_NOTE in text, name
    assert total >= 60, "every chapter has problems with solutions"


def test_the_student_labs_hold_no_solution_and_no_exercise_output(student):
    dest, removed = student
    for lab in course.labs():
        nb = json.loads((dest / "notebooks" / lab.name).read_text(encoding="utf8"))
        original = json.loads(lab.read_text(encoding="utf8"))
        assert removed[f"notebooks/{lab.name}"] == sum(course.is_solution(c) for c in original["cells"]) > 0
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert not any(course.is_solution(c) or _code(c).lstrip().startswith("# Solution") for c in code)
        first = next(i for i, c in enumerate(code) if course._CHECK_CALL.search(_code(c)))
        assert all(c["outputs"] == [] for c in code[first:]), lab.name
        assert any(c["outputs"] for c in code[:first]), f"{lab.name}: the lesson keeps its figures and prints"
        assert not any(_code(c).startswith("assert ch") for c in code)


def test_everything_else_is_copied_and_the_assets_linked(student):
    dest, _ = student
    for name in tools.EDITION_SOURCES:
        assert (dest / name).exists(), name
    assert (dest / "_toc.yml").read_text() == (ROOT / "_toc.yml").read_text()
    assert (dest / "book" / "references.bib").read_bytes() == (ROOT / "book" / "references.bib").read_bytes()
    slides = sorted(p.relative_to(ROOT / "book").as_posix() for p in (ROOT / "book" / "slides").rglob("*.md"))
    assert slides and all((dest / "book" / s).read_bytes() == (ROOT / "book" / s).read_bytes() for s in slides)
    if tools.OFFLINE.is_dir():
        assert (dest / "book" / "offline").resolve() == tools.OFFLINE.resolve()


PAGE = """---
jupytext:
  text_representation:
    format_name: myst
---

# A chapter

```{code-cell} ipython3
x = 1
```

## Problems

Pen-and-paper problems. Each solution is folded
away; the hidden code cell after it checks the result.

### Problem 1.1 Say why

Why?

::::{admonition} Solution
:class: dropdown

Because:

:::{note}
a nested note
:::

```python
print("a fence inside")
```
::::

```{code-cell} ipython3
:tags: [hide-input]

# Problem 1.1
assert x == 1
```

:::{admonition} Remark
Kept, and so is the cell after it.
:::

```{code-cell} ipython3
y = 2
```
"""


def test_strip_solutions_removes_each_solution_block_and_its_check_cell_only():
    text, solutions, checks = tools.strip_solutions(PAGE)
    assert (solutions, checks) == (1, 1)
    assert "Because" not in text and "nested note" not in text and "a fence inside" not in text
    assert "# Problem 1.1\nassert" not in text
    assert "Pen-and-paper problems. " + tools.STUDENT_NOTE in text
    for kept in ("jupytext:", "x = 1", "### Problem 1.1 Say why\n\nWhy?", ":::{admonition} Remark", "y = 2"):
        assert kept in text, kept
    assert tools.strip_solutions(text) == (text, 0, 0)


def test_the_edition_command_builds_the_right_sources(tmp_path, monkeypatch, capsys):
    """The instructor edition builds the repository; the student edition its stripped copy in OUT/source; both
    strictly, with the slides, into OUT/_build/html."""
    runs, slides = [], []
    monkeypatch.setattr(tools, "_require_slide_assets", lambda: None)
    monkeypatch.setattr(tools, "build_slides", lambda out: slides.append(out))
    monkeypatch.setattr(tools.subprocess, "run", lambda cmd, **kw: runs.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0))
    for edition in ("instructor", "student"):
        tools.main(["edition", edition, "--out", str(tmp_path / edition)])
    (instructor, student_run) = runs
    assert instructor[1:3] == ["build", str(ROOT)] and student_run[1:3] == ["build", str(tmp_path / "student" / "source")]
    for cmd, edition in zip(runs, ("instructor", "student")):
        assert cmd[3:] == ["-W", "-n", "--keep-going", "--path-output", str(tmp_path / edition)]
    assert slides == [tmp_path / e / "_build" / "html" / "slides" for e in ("instructor", "student")]
    assert (tmp_path / "student" / "source" / "book" / "ch01_nope_linear.md").is_file()
    assert not (tmp_path / "instructor" / "source").exists()
    with pytest.raises(SystemExit):
        tools.main(["edition", "teacher", "--out", str(tmp_path)])
