"""The kernels' design notes (``kernels/NOTES_*.md``) stay design documents, and code that cites them cites them by
a heading that exists.

A citation names the file and a ``## `` heading of it in double quotes, on one line or wrapped across a docstring's
or a comment's lines: ``NOTES_path.md, "The dyadic schedule"`` (a ``kernels/`` prefix and reST double backquotes
around the file name are fine).  A mention of a notes file without a heading is not a citation a reader can follow,
so code has none; the notes themselves may name each other bare.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book"))
import style  # noqa: E402

NOTES = sorted((ROOT / "kernels").glob("NOTES_*.md"))
MAX_LINES = 400
# Where code cites the notes: the package's and the kernels' sources, and the tests.
CODE_DIRS = ("kernels", "pathedu", "tests")
SKIP = {Path(__file__).resolve(), (ROOT / "tests" / "test_readers.py").resolve()}  # they quote bad citations on purpose

_MENTION = re.compile(r"NOTES_\w+")
_CITATION = re.compile(r'NOTES_(\w+)\.md`*,\s*"([^"]+)"')
_JOIN = re.compile(r"[ \t]*\n[ \t]*(?:#[ \t]*)?")  # a line break inside a docstring or a comment block


def _headings(note: Path) -> set[str]:
    return {line[3:].strip() for line in note.read_text().splitlines() if line.startswith("## ")}


HEADINGS = {note.name: _headings(note) for note in NOTES}


def _joined(text: str) -> tuple[str, list[int]]:
    """``text`` with its line breaks (and a comment's ``#`` after one) made single spaces, and for each character of
    the result the line it came from, so that a citation wrapped across lines reads as one."""
    out, lines, line, pos = [], [], 1, 0
    for m in _JOIN.finditer(text):
        chunk = text[pos:m.start()]
        out.append(chunk)
        lines.extend([line] * len(chunk))
        out.append(" ")
        lines.append(line)
        line += m.group(0).count("\n")
        pos = m.end()
    out.append(text[pos:])
    lines.extend([line] * (len(text) - pos))
    return "".join(out), lines


def _citations(text: str):
    """``[(line, note, heading or None)]`` for every mention of a notes file in ``text``; ``heading`` None where the
    mention is not a citation by heading."""
    joined, lines = _joined(text)
    found = []
    for m in _MENTION.finditer(joined):
        c = _CITATION.match(joined, m.start())
        note = (c.group(1) if c else m.group(0)[len("NOTES_"):]) + ".md"
        found.append((lines[m.start()], "NOTES_" + note, re.sub(r"\s+", " ", c.group(2)).strip() if c else None))
    return found


def _code_files():
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts and path.resolve() not in SKIP:
                yield path


def test_there_are_design_notes():
    assert {n.name for n in NOTES} >= {"NOTES_path.md", "NOTES_flash.md", "NOTES_linear.md"}
    for note in NOTES:
        assert HEADINGS[note.name], f"{note.name} has no '## ' headings to cite"


def test_each_note_is_short_and_speaks_of_the_design():
    problems = []
    for note in NOTES:
        text = note.read_text()
        n = len(text.splitlines())
        if n > MAX_LINES:
            problems.append(f"{note.name}: {n} lines (at most {MAX_LINES})")
        for line, matched, why in style.register_violations(text, reader=False):
            problems.append(f"{note.name}:{line}: {matched!r} ({why})")
    assert not problems, "design notes, not logs:\n" + "\n".join(problems)


def test_headings_are_unique_within_a_note():
    for note in NOTES:
        heads = [line[3:].strip() for line in note.read_text().splitlines() if line.startswith("## ")]
        assert len(heads) == len(set(heads)), f"{note.name} repeats a heading: a citation would be ambiguous"


def _bad_citation(note: str, heading) -> str | None:
    if note not in HEADINGS:
        return f"{note} does not exist"
    if heading is None:
        return f'cites {note} without a heading (write {note}, "Heading")'
    if heading not in HEADINGS[note]:
        return f"{note} has no heading {heading!r}"
    return None


def test_code_cites_the_notes_by_existing_headings():
    problems = []
    for path in _code_files():
        for line, note, heading in _citations(path.read_text()):
            if (why := _bad_citation(note, heading)):
                problems.append(f"{path.relative_to(ROOT)}:{line}: {why}")
    assert not problems, "citations of the design notes:\n" + "\n".join(problems)


def test_the_notes_cite_each_other_by_existing_headings():
    problems = []
    for note in NOTES:
        for line, cited, heading in _citations(note.read_text()):
            if heading is not None and (why := _bad_citation(cited, heading)):
                problems.append(f"{note.name}:{line}: {why}")
            elif heading is None and cited not in HEADINGS:
                problems.append(f"{note.name}:{line}: {cited} does not exist")
    assert not problems, "\n".join(problems)


def test_data_files_the_notes_cite_exist():
    """A number quoted from a committed data file can be checked there: the file must still be in the repository
    (found by name, wherever the data folder is)."""
    present = {p.name for p in ROOT.rglob("*.json") if ".git" not in p.parts and "_build" not in p.parts}
    problems = []
    for note in NOTES:
        for line_no, line in enumerate(note.read_text().splitlines(), 1):
            for name in re.findall(r"([\w{},.-]+\.json)", line):
                for expanded in _expand_braces(name.split("/")[-1]):
                    if expanded not in present:
                        problems.append(f"{note.name}:{line_no}: {expanded} is not in the repository")
    assert not problems, "\n".join(problems)


def _expand_braces(name: str) -> list[str]:
    """``bench_{nope,fox}_fwdbwd.json`` -> both names (the notes abbreviate families of files so)."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in _expand_braces(name[:m.start()] + alt + name[m.end():])]


def test_the_citation_reader_follows_wrapped_lines_and_refuses_bare_mentions():
    text = 'x = 1  # see kernels/NOTES_path.md,\n    # "The dyadic\n    # schedule"; and NOTES_flash.md alone\n'
    assert _citations(text) == [(1, "NOTES_path.md", "The dyadic schedule"), (3, "NOTES_flash.md", None)]
    assert _bad_citation("NOTES_path.md", "The dyadic schedule") is None
    assert _bad_citation("NOTES_path.md", "No such heading") is not None
    assert _bad_citation("NOTES_path.md", None) is not None
    assert _bad_citation("NOTES_nowhere.md", "x") is not None


_KERNEL_MODULES = {p.stem for p in (ROOT / "kernels").glob("*.py")}


def _defined_names() -> dict[str, set[str]]:
    """For each module of ``kernels/`` and ``pathedu/`` (by its file's stem), the names it defines at any depth:
    functions, classes and assignments at the start of a line."""
    names: dict[str, set[str]] = {}
    for path in list((ROOT / "kernels").glob("*.py")) + list((ROOT / "pathedu").rglob("*.py")):
        text = path.read_text()
        found = set(re.findall(r"^\s*(?:def|class)\s+(\w+)", text, re.M))
        found |= set(re.findall(r"^(\w+)\s*(?::[^=\n]*)?=", text, re.M))
        names.setdefault(path.stem, set()).update(found)
    return names


def test_code_names_in_the_notes_exist():
    """Where a note says where a decision lives in the code, the name is there: ``module.name`` for a module of
    ``kernels/`` must be defined in that module, and a private ``_name`` cited alone somewhere in the kernels or the
    package.  A renamed function makes its section point nowhere; this says which."""
    defined = _defined_names()
    everywhere = set().union(*defined.values())
    problems = []
    for note in NOTES:
        for line_no, line in enumerate(note.read_text().splitlines(), 1):
            for span in re.findall(r"`([^`]+)`", line):
                if ".json" in span:  # a data file's name, checked by test_data_files_the_notes_cite_exist
                    continue
                # a name, or module.name; not a keyword argument (name=...) nor part of a longer dotted path
                for module, name in re.findall(r"(?<![\w.~{,])(?:(\w+)\.)?(_?[A-Za-z]\w*)(?![\w}])(?!\s*=[^=])", span):
                    if module in _KERNEL_MODULES and name not in ("py", "md"):
                        if name not in defined.get(module, set()):
                            problems.append(f"{note.name}:{line_no}: {module}.{name} is not defined in kernels/{module}.py")
                    elif not module and name.startswith("_") and name[1:2].islower() and name not in everywhere:
                        problems.append(f"{note.name}:{line_no}: {name} is defined nowhere in kernels/ or pathedu/")
    assert not problems, "names in the design notes:\n" + "\n".join(problems)
