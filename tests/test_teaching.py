"""The teaching page sets every lab and every problem set, and its links point at what the book has.

Read from the page's source, without a build: the book build resolves the same links strictly, but only at the
end of a full build; these checks say which link is wrong in a second.
"""
from __future__ import annotations

import re
from pathlib import Path

import helpers
from pathedu import course

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "book" / "teaching.md").read_text(encoding="utf8")
tools = helpers.load_book_tools()


def _labels() -> set[str]:
    found = set()
    for page in (ROOT / "book").glob("*.md"):
        found |= set(re.findall(r"^\(([\w-]+)\)=$", page.read_text(encoding="utf8"), re.M))
    return found


def _targets(role: str) -> list[str]:
    """The targets of every ``{role}`` in the page: ``{ref}`text <label>``` and ``{ref}`label``` alike."""
    return [m.rsplit("<", 1)[-1].rstrip(">").strip() for m in re.findall(r"\{" + role + r"\}`([^`]+)`", PAGE)]


def test_every_lab_and_every_problem_set_is_on_the_page():
    labs = {f"../notebooks/{path.stem}" for path in course.labs()}
    linked = {t for t in _targets("doc") if t.startswith("../notebooks/")}
    assert labs, "no lab found"
    assert labs <= linked, f"labs the teaching page does not set: {sorted(labs - linked)}"
    for nn, _ in tools.toc_chapters():
        assert f"ch{nn}-problems" in _targets("ref"), f"chapter {nn}'s problems are not on the teaching page"
        assert f"{{glue:text}}`ch{nn}_problems`" in PAGE, f"chapter {nn}'s problem count is not on the page"


def test_every_link_of_the_page_has_a_target():
    labels = _labels()
    missing = sorted({t for t in _targets("ref") if t not in labels})
    assert not missing, f"labels that no page defines: {missing}"
    for doc in _targets("doc"):
        path = (ROOT / "book" / doc).resolve()
        assert path.with_suffix(".md").is_file() or path.with_suffix(".ipynb").is_file(), f"no page {doc}"
        assert path.relative_to(ROOT).with_suffix("").as_posix() in tools.toc_files(), f"{doc} is not in _toc.yml"
    for name in set(re.findall(r"\{glue:text\}`lab(\d\d)_exercises`", PAGE)):
        assert any(p.name.startswith(name) for p in course.labs()), f"the page counts the exercises of no lab {name}"


def test_no_count_is_typed():
    """Counts of labs, exercises and problems come from the page's cell (glued), never typed in the prose."""
    prose = re.sub(r"```.*?```", "", PAGE, flags=re.S)
    typed = re.findall(r"\b\d+\s+(?:labs?|exercises?|problems?)\b", prose, re.I)
    assert not typed, f"typed counts: {typed}"
