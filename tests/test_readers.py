"""What the book owes its readers, checked on the sources (no build): the register, Part I's length, schematics.

* Register: the book's pages, its slides, the labs, the README and every docstring of the package speak of the
  subject, never of how the project was made (``book/style.py`` lists the patterns: work sessions, commits, runs
  counted by the call, comparison-run files, "reverted", "first version", notes sections, ...). A reader's page
  also never sends its reader to the maintainers' design notes.
* Each chapter of Part I is at most ``PART_ONE_WORDS`` words of prose, counted by ``style.prose_words``: the page
  without its front matter, code cells, fenced code, display maths and directive options, inline maths one word.
* Each chapter of Part I has a schematic: a code cell tagged ``schematic`` whose figure caption starts with
  "Schematic".
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

import helpers

ROOT = Path(__file__).resolve().parent.parent
tools = helpers.load_book_tools()
style = tools.load_style()


def _reader_pages() -> dict[str, str]:
    """Every text a reader reads: book pages (prose and code), slides, labs (every cell), the README."""
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf8")
             for p in sorted((ROOT / "book").glob("*.md")) + sorted((ROOT / "book" / "slides").glob("*.md"))}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        texts[path.relative_to(ROOT).as_posix()] = "\n".join(c.source for c in nb.cells)
    texts["README.md"] = (ROOT / "README.md").read_text(encoding="utf8")
    return texts


def _docstrings() -> dict[str, str]:
    """Every module, class and function docstring of the installed package (``pathedu/`` and ``kernels/``)."""
    texts = {}
    for path in sorted(list((ROOT / "pathedu").rglob("*.py")) + list((ROOT / "kernels").rglob("*.py"))):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                if doc := ast.get_docstring(node, clean=False):
                    texts[f"{path.relative_to(ROOT).as_posix()}:{getattr(node, 'name', '<module>')}"] = doc
    return texts


def _report(found: dict[str, list]) -> str:
    return "\n".join(f"{name}, line {line}: {text!r} ({why})" for name, hits in found.items() for line, text, why in hits)


def test_reader_pages_speak_of_the_subject():
    found = {name: hits for name, text in _reader_pages().items() if (hits := style.register_violations(text))}
    assert not found, "these places speak of how the project was made:\n" + _report(found)


def test_docstrings_speak_of_the_subject():
    found = {name: hits for name, text in _docstrings().items()
             if (hits := style.register_violations(text, reader=False))}
    assert not found, "these docstrings speak of how the project was made:\n" + _report(found)


@pytest.mark.parametrize("text, why", [
    ("as measured in session 24", "a work session"),
    ("the kernel of 0a9af33 was faster", "a commit hash"),
    ("load('launches_8a8958b.json')", "a commit hash"),
    ("alternated twice in one call on an H200", "GPU runs counted by the call"),
    ("(`pathedu/data/ab_wy_fp16.json`)", "a comparison run's file"),
    ("that kernel was reverted", "the project's history"),
    ("the hook, as first built, lost 5%", "the project's history"),
    ("(`kernels/NOTES_path.md`, section 24)", "a notes section"),
    ("runs cut for lack of device time", "runs cut for lack of GPU time"),
])
def test_the_register_catches_the_log_habits(text, why):
    assert why in {w for _, _, w in style.register_violations(text)}, text


@pytest.mark.parametrize("text", [
    "The kernel keeps one running maximum per row; a call of `path_triton` launches three kernels.",
    "fla refuses this backward on purpose (fla issue 640).",
    "Positions 1e10000 apart; the hash of a string; the 128 x 128 tile.",
])
def test_the_register_leaves_the_subject_alone(text):
    assert not style.register_violations(text), style.register_violations(text)


PART_ONE = tools.part_one()


def test_part_one_is_the_dualities_and_the_closing_chapter():
    assert PART_ONE[0] == "book/ch01_nope_linear" and PART_ONE[-1] == "book/ch08_six_dualities"
    assert "book/ch06_computing_path" in PART_ONE and len(PART_ONE) == 8


@pytest.mark.parametrize("docname", PART_ONE)
def test_part_one_chapters_are_short_enough(docname):
    words = style.prose_words((ROOT / f"{docname}.md").read_text(encoding="utf8"))
    assert words <= tools.PART_ONE_WORDS, f"{docname}: {words} words of prose (at most {tools.PART_ONE_WORDS})"


def test_prose_words_counts_prose_only():
    page = ("---\njupytext: {}\n---\n\n# A title here\n\nOne two three $x_i + y$ four.\n\n$$\na = b\n$$\n\n"
            "```{code-cell} ipython3\nprint('not prose at all')\n```\n\n:::{admonition} Note\nfive six\n:::\n")
    assert style.prose_words(page) == 3 + 4 + 1 + 2  # title, the sentence (maths = one word), the admonition


def _schematics(docname: str) -> list[str]:
    """The captions of the schematics of a page: code cells tagged ``schematic``."""
    nb = tools.read_page(ROOT / f"{docname}.md")
    captions = []
    for cell in nb.cells:
        if cell.cell_type == "code" and style.is_schematic(cell):
            caption = str(cell.metadata.get("mystnb", {}).get("figure", {}).get("caption", ""))
            captions.append(caption)
    return captions


@pytest.mark.parametrize("docname", PART_ONE)
def test_part_one_chapters_have_a_schematic(docname):
    captions = _schematics(docname)
    assert captions, f"{docname} has no schematic (a code cell tagged `schematic`)"
    for caption in captions:
        assert re.match(r"\s*Schematic\b", caption), f"{docname}: a schematic's caption must say so: {caption[:60]!r}"


def test_the_readme_quick_start_runs():
    """The README's Python block runs as printed (on a CPU: Triton's interpreter) and leaves gradients."""
    readme = (ROOT / "README.md").read_text(encoding="utf8")
    (block,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["o"].shape == scope["v"].shape and scope["q"].grad is not None
