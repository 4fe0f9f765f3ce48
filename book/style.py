"""What a page of the book owes its reader, as code: the tests and ``python book/tools.py page`` use it.

* :func:`prose_words` counts the words a reader reads as prose on a MyST page: everything but the front matter,
  code cells, fenced code, display maths (``$$ ... $$`` and ``{math}`` blocks) and directive option lines;
  inline maths counts as one word.
* :data:`REGISTER` lists what a book about the subject never says: how this project was made (work sessions,
  commits, runs counted by the call, comparison runs named by their files, what was reverted or built first,
  references to the kernels' design notes by section; a reader's page does not point to those notes at all).  :func:`register_violations` finds them in any text.
* :func:`is_schematic` tells a schematic (a figure drawn to explain, not to report data) by its cell's tag.

Standard library only.
"""
from __future__ import annotations

import re

SCHEMATIC_TAG = "schematic"  # the tag of a code cell that draws a schematic (the caption also says so)

# (pattern, what it is).  Case-insensitive; each pattern names the developer's-log habit it catches.
REGISTER: list[tuple[str, str]] = [
    (r"\bsessions?\s+\d+", "a work session"),
    (r"\b(?:this|last|next|earlier|previous|later|an earlier|a later|one|each|every)\s+session\b",
     "a work session"),
    # 7 to 40 hex digits with a digit and a letter among them, alone or ending a name (launches_8a8958b.json); not
    # a number written with an exponent (1e10000)
    (r"(?<![A-Za-z0-9/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])(?![0-9]+e[0-9]+(?![\w-]))[0-9a-f]{7,40}(?![\w-])",
     "a commit hash"),
    (r"\bcommits?\s+[0-9a-f]{7,}", "a commit"),
    (r"\bdevice[- ]calls?\b", "GPU runs counted by the call"),
    (r"\b(?:in|within)\s+(?:one|a single|the same|two|three)\s+calls?\b", "GPU runs counted by the call"),
    (r"\bcalls?\s+(?:on|to)\s+(?:an?\s+|the\s+)?(?:H100|H200|GPU|device)\b", "GPU runs counted by the call"),
    (r"\bA/B\b", "a comparison run named as such"),
    (r"\bab_\w+(?:\.json)?\b", "a comparison run's file"),
    (r"\breverted\b", "the project's history"),
    (r"\bfirst version\b", "the project's history"),
    (r"\bas first (?:built|written)\b", "the project's history"),
    (r"\bNOTES\w*(?:\.md)?`*,?\s*(?:sections?\s*)?\d+", "a notes section"),
    (r"\bnotes?,?\s+sections?\s+\d+", "a notes section"),
    (r"\b(?:entry|entries)\s+\d+", "a work-log entry"),
    (r"\bwork[- ]log\b", "a work log"),
    (r"\b(?:device|GPU)[- ]time\b", "runs cut for lack of GPU time"),
    (r"(?<!fla )(?<!Triton )(?<!triton )(?<!fla's )\bissues?\s+#?\d+", "a work item of the project"),
]
# What a reader's page (the book, its labs and slides, the README) does not send its reader to: the kernels'
# design notes are for maintainers; Part III of the book explains the designs to readers.
READER_ONLY: list[tuple[str, str]] = [
    (r"\bNOTES_\w+", "a maintainer's notes, not the reader's page"),
]
_REGISTER = [(re.compile(p, re.I), why) for p, why in REGISTER]
_READER = _REGISTER + [(re.compile(p), why) for p, why in READER_ONLY]


def register_violations(text: str, reader: bool = True) -> list[tuple[int, str, str]]:
    """``[(line number, matched text, what it is)]`` for every place ``text`` speaks of the project's history.
    ``reader``: the text is a reader's page (book, lab, slides, README), which also never points to the
    maintainers' design notes; ``False`` for docstrings."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, why in (_READER if reader else _REGISTER):
            for m in pattern.finditer(line):
                found.append((number, m.group(0), why))
    return found


_FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")


def prose(text: str) -> str:
    """The prose of a MyST page: ``text`` without front matter, code, display maths and directive options."""
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
    kept, fence = [], None
    for line in text.split("\n"):
        if fence:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            continue
        m = _FENCE.match(line)
        if m:
            info = m.group(2).strip()
            # a directive whose body is prose (admonitions, figures' captions) keeps its body; code and maths go
            if info.startswith("{") and not re.match(r"\{(code-cell|code|code-block|math|raw)\}", info):
                continue
            fence = m.group(1)
            continue
        kept.append(line)
    text = "\n".join(kept)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", " x ", text)   # inline maths: one word
    text = re.sub(r"^(?:\+\+\+.*|:::.*|:[\w-]+:.*|\([\w-]+\)=)$", " ", text, flags=re.M)
    return text


def prose_words(text: str) -> int:
    """Words of prose on a MyST page (see :func:`prose`): runs of letters and digits, with ' and - inside."""
    return len(re.findall(r"[A-Za-z0-9][\w'’-]*", prose(text)))


def is_schematic(cell) -> bool:
    """A code cell (nbformat or jupytext) that draws a schematic: it carries the tag ``schematic``."""
    return SCHEMATIC_TAG in (cell.get("metadata", {}).get("tags", []) or [])
