"""Shared grading machinery for the exercises (one home for every chapter's checks).

Three things live here, and the chapters only supply text and references:

* **Checks** (:func:`check_function`, :func:`check_parts`, :func:`call_student`, :func:`verdict`): run the
  student's function on fresh inputs against the library and phrase what is wrong.
* **Hints in three levels** (:class:`Exercises`): each chapter registers, per exercise ``n``, a tuple
  ``(nudge, structure, recipe)``; ``chNN.hint(n, level)`` prints one.  A stub that still raises
  ``NotImplementedError`` gets "not attempted yet" and a pointer to ``chNN.hint(n)``, never the recipe; a wrong
  answer gets the specific diagnosis of a known mistake when there is one, else the level-1 hint.
* **Grading mode** (:func:`grading`, or the environment variable ``PATHEDU_GRADING=1``): a check rejects an
  answer that uses pathedu's own implementation.  While the check runs, every public function of the reference
  modules (:data:`WATCHED`) is replaced, wherever pathedu's namespaces and the answer's own namespace hold it,
  by a tripwire that records a call made (directly or through helpers) from the student's code; the grader's
  own reference computations do not count.  An answer that *is* a function defined in pathedu (the same object,
  a ``functools.partial`` or ``functools.wraps`` wrapper of one) is caught by identity.

  Caught: ``fn = pathedu.nope.linear_matrix``; ``lambda q, k, v: nope.linear_matrix(q, k, v)``; a call through any
  module attribute (``pathedu.nope.X``, ``alibi.blockwise_softmax``, an import inside the function); an alias
  imported before grading started (``from pathedu.nope import linear_matrix as f``) when it sits in the answer's
  module globals, closure or default arguments; a call through other pathedu code (``pathedu.constructions``,
  the grader's private helpers) made from the student's function.
  Not caught: answers that are values (numbers, lists) computed with pathedu outside the checked function;
  pathedu's code pasted or copied (``types.FunctionType(f.__code__, ...)``); aliases kept in containers, objects
  or another module's globals; classes (``KVCache``) and modules outside :data:`WATCHED` (``masks``, ``checks``,
  ``symbolic``, ...); work done in another thread or process.  Each check may allow a few helpers that the
  exercise builds on (``allow=`` of :meth:`Exercises.check`, e.g. ``rope.apply_rope`` for the relative logit).

  The tripwires run in the process of the code they watch, so code that means to can get round them (it can
  find the original functions, or switch the tripwires off).  ``python -m pathedu.course grade`` therefore also
  reads the answer's source (:func:`pathedu_in_source`): a watched function named in a function the answer
  needs, through an import or a module attribute, is caught there, in the grader's own process.  A name spelt
  at run time (``getattr(nope, "linear_" + "matrix")``) together with a tripwire switched off is not caught,
  no more than pasted source is.

Checks are feedback: they run in the caller's process and trust it.  A grade comes from
``python -m pathedu.course grade``, which runs the checks in its own process on the answers' outputs (see
:mod:`pathedu.course`); there a check's inputs are drawn afresh (:func:`fresh_inputs`).
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import functools
import hashlib
import importlib
import inspect
import numbers
import os
import sys
import traceback
import types
from dataclasses import dataclass, field

import torch

LEVELS = (1, 2, 3)
GRADING_ENV = "PATHEDU_GRADING"
#: The modules whose public functions are the reference forms that grading mode forbids.
WATCHED = ("pathedu.nope", "pathedu.alibi", "pathedu.fox", "pathedu.rope", "pathedu.path", "pathedu.pathfox",
           "pathedu.stickbreaking", "pathedu.cope", "pathedu.tasks",
           "pathedu.kernels.flash_attention", "pathedu.kernels.linear_attention", "pathedu.kernels.path_attention",
           "pathedu.kernels.delta_rule", "pathedu.kernels.rope", "pathedu.kernels.stickbreaking",
           "pathedu.kernels.cope")


# ---------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------

#: The kinds of exercise and the points each is worth by default: writing a function (``code``), committing to a
#: number or a shape before a cell reveals it (``predict``), a short written answer that a person marks
#: (``explain``), naming and fixing a planted bug (``bug``: 1 point for the name, 2 for the fix).
KINDS = {"code": 2, "predict": 1, "explain": 2, "bug": 3}


@dataclass
class Verdict:
    """What a check found; prints as one line and is truthy when the answer is right.

    ``score`` is the fraction of the exercise's points earned (``None``: all when ``ok``, none otherwise);
    ``marking`` is the rubric when a person marks the answer (an *explain* exercise: status "Needs marking");
    ``answer`` is what the marker or the report shows of the answer (a prediction, a named bug, a text)."""

    name: str
    ok: bool
    message: str
    score: float | None = None
    marking: str = ""
    answer: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @property
    def fraction(self) -> float:
        """The fraction of the exercise's points earned, in [0, 1]."""
        return (1.0 if self.ok else 0.0) if self.score is None else float(self.score)

    @property
    def status(self) -> str:
        """``"Correct"``, ``"Not yet"`` or ``"Needs marking"``."""
        return "Needs marking" if self.marking and self.ok else ("Correct" if self.ok else "Not yet")

    def __repr__(self) -> str:
        return f"{self.status} [{self.name}]: {self.message}"


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("pathedu_exercise", default=None)


def verdict(name: str, ok: bool, message: str, **extra) -> Verdict:
    """A :class:`Verdict` (``extra``: its ``score``, ``marking``, ``answer``), printed at once, or by the
    registered check that is running (see :meth:`Exercises.check`), which prints the final verdict once."""
    v = Verdict(name, bool(ok), message, **extra)
    if _CURRENT.get() is None:
        print(repr(v))
    return v


class StudentError(str):
    """What :func:`call_student` says when the student's function raised; ``stub`` is true for
    ``NotImplementedError`` (an exercise not attempted yet)."""

    stub: bool = False


class RemoteError(Exception):
    """An exception raised by a student's function in another process (``python -m pathedu.course grade``):
    ``student_type``, ``student_line`` and ``student_stub`` describe it as :func:`call_student` would."""

    def __init__(self, type_name: str, message: str, line: int, stub: bool):
        super().__init__(message)
        self.student_type, self.student_line, self.student_stub = type_name, line, stub


def call_student(fn, *args):
    """Run the student's function: ``(result, None)``, or ``(None, message)`` naming the
    exception and the line it came from (the student's code failed: say where, kindly).
    The message is a :class:`StudentError`, whose ``stub`` says whether it was ``NotImplementedError``."""
    try:
        return fn(*args), None
    except Exception as exc:
        if isinstance(exc, RemoteError):
            name, line, stub = exc.student_type, exc.student_line, exc.student_stub
        else:
            name, line = type(exc).__name__, traceback.extract_tb(exc.__traceback__)[-1].lineno
            stub = isinstance(exc, NotImplementedError)
        err = StudentError(f"your function raised {name}: {exc} (line {line})")
        err.stub = stub
        return None, err


def not_attempted(name: str, what: str = "") -> Verdict:
    """The verdict on an untouched stub: not attempted yet, and where the hints are (never the recipe).
    ``what`` says what is still the stub (default: the function raises ``NotImplementedError``)."""
    ex = _CURRENT.get()
    what = what or ("your function still raises NotImplementedError. Replace the `raise` line with your code and "
                    "run the cell again")
    where = f" Stuck? {ex.chapter}.hint({ex.n}) prints a first hint." if ex is not None else ""
    return verdict(name, False, f"not attempted yet: {what}.{where}")


def fallback_hint() -> str:
    """The generic hint of the running exercise: its level-1 hint and where the next level is."""
    ex = _CURRENT.get()
    return ex.fallback() if ex is not None else ""


def student_failed(name: str, err: str, hint: str | None = None) -> Verdict:
    """The verdict when the student's function raised: "not attempted yet" for a stub, else where it
    failed and ``hint`` (default: the running exercise's level-1 hint)."""
    if getattr(err, "stub", False):
        return not_attempted(name)
    hint = fallback_hint() if hint is None else hint
    return verdict(name, False, f"{err}. {hint}" if hint else err)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error relative to max |ref|, in float64; inf when ``out`` is not finite."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def diagnose(student_fn, args, wrong_variants, rtol: float = 1e-6) -> str:
    """The message of the first known wrong variant ``(fn, message)`` whose output the
    student's matches on ``args``, else ``''``: a specific hint instead of "wrong"."""
    out, err = call_student(student_fn, *args)
    if err is not None or not isinstance(out, torch.Tensor):
        return ""
    for fn, message in wrong_variants:
        ref = fn(*args)
        if out.shape == ref.shape and rel_error(out, ref) <= rtol:
            return message
    return ""


def switched_off(with_fn, flags_and_messages) -> list:
    """Known wrong variants ``(fn, message)`` for the ``wrong_variants`` of :func:`check_function`, from one
    function ``with_fn`` that computes the right answer by default and takes a keyword flag per step a student may
    get wrong: for each ``(flag, message)``, ``with_fn`` with that flag set to ``False``."""
    return [(functools.partial(with_fn, **{flag: False}), message) for flag, message in flags_and_messages]


def paragraph(text: str) -> str:
    """``text`` with every run of white space (line breaks and indentation included) made one space: a rubric
    written in the source as an indented paragraph reads as one line in the marker's report."""
    return " ".join(text.split())


def seeded(seed: int) -> torch.Generator:
    """The generator of a check's inputs for ``seed``: fixed seeds give the same inputs at every run (the course
    grader salts them, :func:`fresh_inputs`)."""
    return torch.Generator().manual_seed(seed)


def randn64(g: torch.Generator, *shape) -> torch.Tensor:
    """A float64 tensor of ``shape`` drawn from the standard normal with ``g``."""
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def rand64(g: torch.Generator, *shape) -> torch.Tensor:
    """A float64 tensor of ``shape`` drawn uniformly from [0, 1) with ``g``."""
    return torch.rand(shape, generator=g, dtype=torch.float64)


def unit(x: torch.Tensor) -> torch.Tensor:
    """``x`` scaled to unit length along its last dim: ``(..., D) -> (..., D)``."""
    return x / x.norm(dim=-1, keepdim=True)


def outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched outer product ``a b^T``: ``(..., m), (..., n) -> (..., m, n)``."""
    return a[..., :, None] * b[..., None, :]


def _run_trials(name, student_fn, reference_fn, make_inputs, trials, hint, compare, success) -> Verdict:
    """The trial loop shared by the checks: run ``student_fn`` and ``reference_fn`` on
    ``trials`` fresh inputs; ``compare(out, ref, seed)`` returns what is wrong (a message
    without the hint) or ``None``.  The first failure is the verdict; else ``success``.
    A stub (``NotImplementedError``) gets :func:`not_attempted` instead of the hint."""
    for seed in range(trials):
        args = make_inputs(seed)
        ref = reference_fn(*args)
        out, err = call_student(student_fn, *args)
        if err is not None and err.stub:
            return not_attempted(name)
        problem = err if err is not None else compare(out, ref, seed)
        if problem is not None:
            return verdict(name, False, f"{problem}. {hint}" if hint else f"{problem}.")
    return verdict(name, True, success)


def _tensor_problem(out, ref, seed, rtol, says) -> str | None:
    """What is wrong with tensor ``out`` against ``ref`` (type, shape, then values), phrased
    with ``says = (not-a-tensor, wrong-shape, values-differ)`` prefixes; ``None`` when right."""
    not_tensor, bad_shape, differs = says
    if not isinstance(out, torch.Tensor):
        return f"{not_tensor}, got {type(out).__name__}"
    if out.shape != ref.shape:
        return f"{bad_shape} {tuple(ref.shape)}, got {tuple(out.shape)}"
    err = rel_error(out, ref)
    if not err <= rtol:
        return f"{differs} (relative error {err:.2e} on trial {seed})"
    return None


def check_function(name, student_fn, reference_fn, make_inputs, *, trials: int = 3, rtol: float = 1e-6,
                   hint: str | None = None, wrong_variants=()) -> Verdict:
    """Run ``student_fn`` and ``reference_fn`` on ``trials`` fresh inputs from
    ``make_inputs(seed) -> tuple`` and compare (max error relative to max |ref|).
    When the answer matches one of ``wrong_variants`` (``(fn, message)``, see
    :func:`diagnose`), that message replaces ``hint`` (default: the running exercise's
    level-1 hint, :func:`fallback_hint`)."""
    hint = fallback_hint() if hint is None else hint
    if wrong_variants:
        hint = diagnose(student_fn, make_inputs(0), wrong_variants) or hint

    def compare(out, ref, seed):
        return _tensor_problem(out, ref, seed, rtol, ("expected a torch.Tensor", "expected shape",
                                                      "values differ from the reference"))

    return _run_trials(name, student_fn, reference_fn, make_inputs, trials, hint, compare,
                       f"matches the reference on {trials} random inputs.")


def _diagnose_parts(student_fn, args, wrong_variants, rtol) -> str:
    """:func:`diagnose` for functions that return a tuple of tensors."""
    out, err = call_student(student_fn, *args)
    if err is not None:
        return ""
    for fn, message in wrong_variants:
        ref = fn(*args)
        if (isinstance(out, (tuple, list)) and len(out) == len(ref)
                and all(isinstance(o, torch.Tensor) and o.shape == r.shape and rel_error(o, r) <= rtol
                        for o, r in zip(out, ref))):
            return message
    return ""


def check_parts(name, student_fn, reference_fn, make_inputs, part_names, *, trials: int = 3, rtol: float = 1e-8,
                hint: str | None = None, wrong_variants=()) -> Verdict:
    """Like :func:`check_function`, for functions that return a tuple of tensors:
    each part is compared on its own, so the verdict can say which one is wrong."""
    hint = fallback_hint() if hint is None else hint
    hint = _diagnose_parts(student_fn, make_inputs(0), wrong_variants, rtol) or hint
    want = "(" + ", ".join(part_names) + ")"

    def compare(out, ref, seed):
        if not isinstance(out, (tuple, list)) or len(out) != len(part_names):
            got = (f"a {type(out).__name__} of length {len(out)}" if isinstance(out, (tuple, list))
                   else type(out).__name__)
            return f"expected a tuple {want}, got {got}"
        problems = (_tensor_problem(o, r, seed, rtol, (f"`{part}` should be a torch.Tensor",
                                                       f"`{part}` should have shape",
                                                       f"`{part}` differs from the reference"))
                    for part, o, r in zip(part_names, out, ref))
        return next((p for p in problems if p is not None), None)

    return _run_trials(name, student_fn, reference_fn, make_inputs, trials, hint, compare,
                       f"{want} match the reference on {trials} random inputs.")


# ---------------------------------------------------------------------------
# Predict, explain, find the bug
# ---------------------------------------------------------------------------

def _entry_right(guess, truth, rtol: float, atol: float) -> bool:
    """Whether one entry of a prediction is right: a string or a bool exactly (strings without case and outer
    spaces), a number within ``atol + rtol * |truth|``."""
    if isinstance(guess, torch.Tensor) and guess.numel() == 1 and not guess.is_complex():
        guess = guess.item()
    if isinstance(truth, str):
        return isinstance(guess, str) and guess.strip().lower() == truth.strip().lower()
    if isinstance(truth, bool) or isinstance(guess, bool):
        return isinstance(guess, bool) and isinstance(truth, bool) and guess == truth
    if not isinstance(guess, numbers.Real) or guess != guess:  # a number, not NaN
        return False
    return abs(float(guess) - truth) <= atol + rtol * abs(truth)


def _shown(value) -> str:
    """A prediction as a verdict quotes it: floats to six significant digits, tuples and lists entry by entry."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, (tuple, list)) and len(value) <= 16:
        inner = ", ".join(_shown(x) for x in value)
        return f"({inner}{',' if len(value) == 1 else ''})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)[:200]


def check_prediction(name: str, guess, truth, *, rtol: float = 0.0, atol: float = 0.0,
                     near: float | None = None) -> Verdict:
    """A *predict, then run* exercise: the student's ``guess``, written down before a cell reveals ``truth``.

    ``truth`` is a number, a bool, a string, or a tuple of them (a shape); a number is right within
    ``atol + rtol * |truth|``, and with ``near`` (a relative tolerance) a number that is off but within
    ``near * |truth|`` earns half the points.  A tuple earns the fraction of its entries that are right, and is
    Correct when all are.  ``None`` is an untouched stub.  The verdict never says what ``truth`` is (the next
    cell shows it)."""
    if guess is None:
        return not_attempted(name, "your prediction is still None: write down a value before you run the cell "
                                   "that reveals it")
    shown = _shown(guess)
    if isinstance(truth, tuple):
        if not isinstance(guess, (tuple, list)) or len(guess) != len(truth):
            return verdict(name, False, f"expected {len(truth)} entries (a tuple, like a shape), got {shown}.",
                           answer=shown)
        right = sum(_entry_right(g, t, rtol, atol) for g, t in zip(guess, truth))
        if right == len(truth):
            return verdict(name, True, f"your prediction {shown} is right.", answer=shown)
        return verdict(name, False, f"{right} of the {len(truth)} entries of your prediction {shown} are right; "
                                    "run the next cell and find the others.", score=right / len(truth),
                       answer=shown)
    if _entry_right(guess, truth, rtol, atol):
        return verdict(name, True, f"your prediction {shown} is right.", answer=shown)
    if isinstance(guess, torch.Tensor) and guess.numel() == 1 and not guess.is_complex():
        guess = guess.item()
    if (near is not None and isinstance(guess, numbers.Real) and not isinstance(guess, bool)
            and not isinstance(truth, bool) and abs(float(guess) - truth) <= near * abs(truth)):
        return verdict(name, False, f"your prediction {shown} is close but not within the tolerance (half the "
                                    "points); run the next cell and see how far.", score=0.5, answer=shown)
    return verdict(name, False, f"your prediction {shown} is off; run the next cell and see why.", answer=shown)


def check_explanation(name: str, text, *, rubric: str, min_words: int = 20) -> Verdict:
    """An *explain* exercise: a short written answer ``text`` (a string), which a person marks against
    ``rubric``.  The check only sees that it is there (``None``, an empty string: not attempted yet) and long
    enough (``min_words``); then the verdict is "Needs marking", truthy, with the rubric for the marker (the
    course grader writes it and the answer into its report) and not in the message a student reads."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return not_attempted(name, "your answer is still empty: write a few sentences in the string")
    if not isinstance(text, str):
        return verdict(name, False, f"expected your answer as a string (text in quotes), got {type(text).__name__}.")
    words = len(text.split())
    if words < min_words:
        return verdict(name, False, f"{words} words: write at least {min_words} (two or three sentences).",
                       answer=text)
    return verdict(name, True, f"{words} words recorded; your lecturer marks them against a rubric.",
                   marking=rubric, answer=text)


#: The kinds of planted bug a *find the bug* exercise asks to name (the key is the answer).
BUG_KINDS = {
    "index": "an index one place off: a position, a block boundary or a gate read at the wrong token",
    "self": "a token's own gate (or transition) acts on itself",
    "order": "a product of matrices taken in the wrong order",
    "scale": "a scale missing, or applied where it does not belong",
    "space": "log space and linear space mixed up: a log gate used as a gate, or gates added",
    "mask": "the causal mask wrong: the diagonal dropped, or the future let in",
}


def check_bug(name: str, named, fixed, *, bug: str, reference, make_inputs, buggy, trials: int = 3,
              rtol: float = 1e-8) -> Verdict:
    """A *find the bug* exercise: ``named`` is the student's name for the planted bug (a key of
    :data:`BUG_KINDS`; right: 1 of 3 points) and ``fixed`` their fixed function, compared with ``reference`` on
    ``make_inputs(seed)`` as :func:`check_function` does (right: 2 of 3 points).  ``buggy`` is the planted form:
    a "fix" that still computes it is told so.  Correct when both are right; partial credit otherwise."""
    if bug not in BUG_KINDS:
        raise ValueError(f"`bug` must be one of {', '.join(BUG_KINDS)}, got {bug!r}")
    _, err = call_student(fixed, *make_inputs(0)) if callable(fixed) else (None, None)
    stub_fix = fixed is None or (err is not None and getattr(err, "stub", False))
    if named is None and stub_fix:
        return not_attempted(name, "`bug` is still None and your fixed function still raises "
                                   "NotImplementedError")
    kinds = ", ".join(f'"{k}"' for k in BUG_KINDS)
    if named is None:
        said = "name the bug too (set `bug`)"
    elif not isinstance(named, str) or named.strip().lower() not in BUG_KINDS:
        said = f"`bug` must be one of {kinds}, got {repr(named)[:80]}"
    elif named.strip().lower() == bug:
        said = "the bug is named right"
    else:
        said = f"the planted bug is not {named.strip().lower()!r}"
    name_ok = said == "the bug is named right"
    if stub_fix:
        fix_ok, fixed_said = False, "your fixed function still raises NotImplementedError"
    else:
        v = check_function(name, fixed, reference, make_inputs, trials=trials, rtol=rtol, hint="",
                           wrong_variants=[(buggy, "It still computes what the planted bug computes")])
        fix_ok = v.ok
        fixed_said = "the fixed function matches the reference" if fix_ok else f"the fix: {v.message}"
    points = int(name_ok) + 2 * int(fix_ok)
    ok = name_ok and fix_ok
    message = f"{said}; {fixed_said} ({points}/3 points)."
    if not ok:
        message += f" {fallback_hint()}" if fallback_hint() else ""
    return verdict(name, ok, message, score=points / 3, answer=repr(named)[:80])


# ---------------------------------------------------------------------------
# Hints in three levels, and the registry of every chapter's exercises
# ---------------------------------------------------------------------------

class Hint(str):
    """A hint as :meth:`Exercises.hint` printed it.  It is returned too (for scripts and tests) but a notebook
    does not display it a second time when ``chNN.hint(n)`` is a cell's last line."""

    def _ipython_display_(self):
        pass


@dataclass(frozen=True)
class Exercise:
    """One exercise of a chapter: its number and its hints ``(nudge, structure, recipe)``."""

    chapter: str
    n: int
    hints: tuple

    def text(self, level: int) -> str:
        more = f" More: {self.chapter}.hint({self.n}, {level + 1})." if level < len(LEVELS) else ""
        return f"Hint {level}/{len(LEVELS)} for exercise {self.n}: {self.hints[level - 1]}{more}"

    def fallback(self) -> str:
        """The generic hint on a wrong answer: the nudge, and where the structure is."""
        return f"Hint: {self.hints[0]} (more: {self.chapter}.hint({self.n}, 2))"


#: Every registered exercise: ``REGISTRY[chapter][n]`` (filled by each chapter's :class:`Exercises`).
REGISTRY: dict[str, dict[int, Exercise]] = {}


@dataclass
class Exercises:
    """A chapter's exercises: ``Exercises("ch01", {1: (nudge, structure, recipe), ...})``.

    ``hint`` is the chapter's ``chNN.hint(n, level=1)``; ``check(n)`` decorates a check function
    (see :meth:`check`); :meth:`prediction`, :meth:`explanation` and :meth:`planted_bug` declare the checks of the
    three kinds whose check is the same in every chapter, from a stub that gives the check its name, arguments and
    docstring."""

    chapter: str
    hints: dict
    exercises: dict = field(init=False)

    def __post_init__(self):
        self.exercises = {}
        for n, texts in self.hints.items():
            if not (isinstance(texts, tuple) and len(texts) == len(LEVELS) and all(isinstance(t, str) and t
                                                                                   for t in texts)):
                raise ValueError(f"exercise {n} of {self.chapter} needs {len(LEVELS)} hints (nudge, structure, recipe)")
            self.exercises[n] = Exercise(self.chapter, n, texts)
        REGISTRY[self.chapter] = self.exercises

    def hint(self, n, level=1) -> Hint:
        """Print the hint of level ``level`` for exercise ``n`` of this chapter, and return it.

        Level 1 is a nudge (what to think about), level 2 the structure (which quantities, which shapes),
        level 3 the recipe.  Raises ``ValueError`` naming the argument for an unknown ``n`` or ``level``."""
        valid = ", ".join(map(str, self.exercises))
        if not isinstance(n, int) or isinstance(n, bool) or n not in self.exercises:
            raise ValueError(f"`n` must be one of {valid} (the exercises of {self.chapter}), got {n!r}")
        if not isinstance(level, int) or isinstance(level, bool) or level not in LEVELS:
            raise ValueError(f"`level` must be one of {', '.join(map(str, LEVELS))}, got {level!r}")
        text = Hint(self.exercises[n].text(level))
        print(text)
        return text

    def check(self, n: int, *, label: str | None = None, allow=(), kind: str = "code", points: float | None = None):
        """Decorate exercise ``n``'s check function (``label`` names it in grading reports when one exercise has
        several checks, e.g. ``"3a"``; ``allow`` lists pathedu functions, as ``"pathedu.rope.apply_rope"``, that
        grading mode lets this exercise's answers call).

        The decorated check runs with the exercise's hints in reach (:func:`fallback_hint`,
        :func:`not_attempted`), in grading mode when it is on, and prints its final verdict once.  Its
        ``evaluate(*answers)`` returns the verdict without printing it and never in grading mode (the course
        grader's view: there the answers are stand-ins for functions that run in another process).  ``kind`` is
        one of :data:`KINDS`, and ``points`` what the exercise is worth (default: its kind's)."""
        if kind not in KINDS:
            raise ValueError(f"`kind` must be one of {', '.join(KINDS)}, got {kind!r}")
        ex = self.exercises[n]
        label = str(n) if label is None else label
        allow = tuple(allow)

        def decorate(check):
            @functools.wraps(check)
            def run(*args, **kwargs):
                token = _CURRENT.set(ex)
                try:
                    if grading_mode():
                        v = _graded(functools.partial(check, *args, **kwargs), args + tuple(kwargs.values()),
                                    allow, sys._getframe())
                    else:
                        v = check(*args, **kwargs)
                finally:
                    _CURRENT.reset(token)
                print(repr(v))
                return v

            def evaluate(*args, **kwargs) -> Verdict:
                token = _CURRENT.set(ex)
                try:
                    return check(*args, **kwargs)
                finally:
                    _CURRENT.reset(token)

            run.exercise, run.label, run.allow, run.evaluate = ex, label, allow, evaluate
            run.kind, run.points = kind, float(KINDS[kind] if points is None else points)
            return run

        return decorate

    def prediction(self, n: int, name: str, truth, *, rtol: float = 0.0, atol: float = 0.0,
                   near: float | None = None, points: float | None = None):
        """Declare exercise ``n`` a *predict, then run* exercise.  Decorates a stub of one argument, the student's
        prediction, whose docstring says what to predict; the check it becomes is
        ``check_prediction(name, prediction, truth(), rtol=rtol, atol=atol, near=near)`` (:func:`check_prediction`;
        ``truth`` is called at each check), registered as :meth:`check` does with ``kind="predict"``::

            @EXERCISES.prediction(4, "predict: the state's shape", _state_shape)
            def check_state_shape(shape) -> Verdict:
                \"\"\"Exercise 4: the shape of ...\"\"\"
        """
        def grade(guess):
            return check_prediction(name, guess, truth(), rtol=rtol, atol=atol, near=near)

        return self._declared(n, "predict", points, grade)

    def explanation(self, n: int, name: str, *, rubric: str, min_words: int = 20, points: float | None = None):
        """Declare exercise ``n`` an *explain* exercise.  Decorates a stub of one argument, the student's text,
        whose docstring says what to explain; the check it becomes is
        ``check_explanation(name, text, rubric=rubric, min_words=min_words)`` (:func:`check_explanation`: the
        rubric goes to the marker, never to the student), registered as :meth:`check` does with ``kind="explain"``.
        The check's docstring is the stub's followed by ``Marked by a person against :data:`NAME`.``, ``NAME``
        being the module constant that holds ``rubric`` (``its rubric`` where none does)."""
        def grade(text):
            return check_explanation(name, text, rubric=rubric, min_words=min_words)

        def marked(stub):
            held = [k for k, value in stub.__globals__.items() if value is rubric and not k.startswith("_")]
            against = f":data:`{held[0]}`" if held else "its rubric"
            return f"{stub.__doc__.rstrip()}\n\nMarked by a person against {against}."

        return self._declared(n, "explain", points, grade, doc=marked)

    def planted_bug(self, n: int, name: str, *, bug: str, reference, make_inputs, buggy, trials: int = 3,
                    rtol: float = 1e-8, points: float | None = None):
        """Declare exercise ``n`` a *find the bug* exercise.  Decorates a stub of two arguments, the student's name
        for the bug and their fixed function, whose docstring says what the fixed function takes and returns; the
        check it becomes is :func:`check_bug` with ``bug`` (the planted bug's kind, a key of :data:`BUG_KINDS`),
        ``reference``, ``make_inputs``, ``buggy`` (the planted form), ``trials`` and ``rtol``, registered as
        :meth:`check` does with ``kind="bug"``."""
        if bug not in BUG_KINDS:
            raise ValueError(f"`bug` must be one of {', '.join(BUG_KINDS)}, got {bug!r}")

        def grade(named, fixed):
            return check_bug(name, named, fixed, bug=bug, reference=reference, make_inputs=make_inputs,
                             buggy=buggy, trials=trials, rtol=rtol)

        return self._declared(n, "bug", points, grade)

    def _declared(self, n: int, kind: str, points, grade, doc=None):
        """The decorator of :meth:`prediction`, :meth:`explanation` and :meth:`planted_bug`: the stub's arguments,
        bound by its signature (positional or by the stub's names, as a written check takes them), go to
        ``grade``; the check keeps the stub's name, docstring (``doc(stub)`` instead, if given) and signature."""
        wants = len(inspect.signature(grade).parameters)

        def decorate(stub):
            signature = inspect.signature(stub)
            if len(signature.parameters) != wants:
                raise TypeError(f"the stub `{stub.__name__}` of exercise {n} of {self.chapter} must take {wants} "
                                f"argument{'s' if wants > 1 else ''}, got {len(signature.parameters)}")
            if not (stub.__doc__ or "").strip():
                raise ValueError(f"the stub `{stub.__name__}` of exercise {n} of {self.chapter} needs a docstring: "
                                 "what the student answers")

            @functools.wraps(stub)
            def check(*args, **kwargs):
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                return grade(*bound.arguments.values())

            if doc is not None:
                check.__doc__ = doc(stub)
            return self.check(n, kind=kind, points=points)(check)

        return decorate


# ---------------------------------------------------------------------------
# Grading mode
# ---------------------------------------------------------------------------

_FORCED: contextvars.ContextVar = contextvars.ContextVar("pathedu_grading", default=False)


def grading_mode() -> bool:
    """Whether checks run in grading mode: inside :func:`grading`, or with ``PATHEDU_GRADING=1``."""
    return _FORCED.get() or os.environ.get(GRADING_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def grading(on: bool = True):
    """``with grading(): ...``: checks reject answers that use pathedu's own forms (see the module docstring)."""
    token = _FORCED.set(bool(on))
    try:
        yield
    finally:
        _FORCED.reset(token)


@functools.lru_cache(maxsize=None)
def watched_functions() -> dict:
    """``{id(function): (function, "pathedu.module.name")}`` for every public function of :data:`WATCHED` (a
    module that cannot be imported, a kernel module without Triton, has none that could be called)."""
    found = {}
    for modname in WATCHED:
        try:
            module = importlib.import_module(modname)
        except ImportError:  # pathedu.TritonUnavailable included
            continue
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if isinstance(obj, types.FunctionType) and id(obj) not in found:
                found[id(obj)] = (obj, f"{modname}.{name}")
    return found


def _resolve(qualname: str):
    modname, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(modname), name)


def _unwrap(fn, depth: int = 0):
    """The functions behind an answer: itself, a partial's ``func``, ``__wrapped__``, a method's ``__func__``."""
    if depth > 10:
        return
    yield fn
    inner = getattr(fn, "__pathedu_tripwire__", None)
    if inner is None and isinstance(fn, functools.partial):
        inner = fn.func
    if inner is None and isinstance(fn, types.MethodType):
        inner = fn.__func__
    if inner is None:
        try:
            inner = inspect.getattr_static(fn, "__wrapped__", None)
        except Exception:
            inner = None
    if inner is not None:
        yield from _unwrap(inner, depth + 1)


def _pathedu_name(fn) -> str | None:
    """``"pathedu.x.f"`` when ``fn`` is a Python function defined in pathedu, else ``None``."""
    if not isinstance(fn, types.FunctionType):
        return None
    module = fn.__globals__.get("__name__", "")
    if _is_pathedu(module):
        watched = watched_functions().get(id(fn))
        return watched[1] if watched else f"{module}.{fn.__qualname__}"
    return None


def _is_pathedu(module: str) -> bool:
    return module == "pathedu" or module.startswith("pathedu.")


@dataclass
class _Armed:
    entry: types.FrameType  # the frame of the running check: the walk up the stack stops there
    inner_codes: frozenset  # the code of every watched or allowed function: a call from inside one is internal
    calls: set = field(default_factory=set)


_ARMED: contextvars.ContextVar = contextvars.ContextVar("pathedu_armed", default=None)


def _from_student(frame, armed: _Armed) -> bool:
    """Whether the call made by ``frame`` comes from the student's code: walking up to the check's entry,
    a frame outside pathedu before any frame inside a watched (or allowed) function."""
    while frame is not None and frame is not armed.entry:
        if frame.f_code in armed.inner_codes:
            return False
        if not _is_pathedu(frame.f_globals.get("__name__", "")):
            return True
        frame = frame.f_back
    return False


@functools.lru_cache(maxsize=None)
def _tripwire(fn_id: int):
    fn, qualname = watched_functions()[fn_id]

    @functools.wraps(fn)
    def wire(*args, **kwargs):
        armed = _ARMED.get()
        if armed is not None and _from_student(sys._getframe(1), armed):
            armed.calls.add(qualname)
        return fn(*args, **kwargs)

    wire.__pathedu_tripwire__ = fn
    return wire


def _alias_slots(answer, depth: int = 0):
    """Where an answer keeps pathedu functions: ``(kind, holder, key)`` for its module globals, closure cells
    and default arguments (and those of a partial's function and arguments)."""
    if depth > 3:
        return
    for fn in _unwrap(answer):
        if isinstance(fn, functools.partial):
            for arg in fn.args:
                if callable(arg):
                    yield from _alias_slots(arg, depth + 1)
            for arg in fn.keywords.values():
                if callable(arg):
                    yield from _alias_slots(arg, depth + 1)
        if not isinstance(fn, types.FunctionType):
            continue
        yield "globals", fn.__globals__, None
        for cell in fn.__closure__ or ():
            yield "cell", cell, None
        if fn.__defaults__:
            yield "defaults", fn, None
        if fn.__kwdefaults__:
            yield "kwdefaults", fn, None


@contextlib.contextmanager
def _armed(answers, allow, entry):
    """Replace every watched function (except ``allow``) by its tripwire in pathedu's namespaces and where the
    answers keep it; yield the :class:`_Armed` state that records the student's calls; restore everything."""
    watched = watched_functions()
    allowed = {id(_resolve(name)) for name in allow}
    wired = {i: _tripwire(i) for i in watched if i not in allowed}
    codes = {fn.__code__ for fn, _ in watched.values()} | {_resolve(name).__code__ for name in allow}
    state = _Armed(entry=entry, inner_codes=frozenset(codes))
    undo = []

    def wire_for(value):
        """The tripwire that replaces ``value``, or ``None`` when it is not a watched, unallowed function."""
        wire = wired.get(id(value))
        return wire if wire is not None and value is watched[id(value)][0] else None

    def patch_dict(d):
        for key, value in list(d.items()):
            wire = wire_for(value)
            if wire is not None:
                d[key] = wire
                undo.append((d, key, value, wire))

    try:
        for name, module in list(sys.modules.items()):
            if _is_pathedu(name) and not name.startswith("pathedu.exercises") and module is not None:
                patch_dict(vars(module))
        for kind, holder, _ in (slot for answer in answers for slot in _alias_slots(answer)):
            if kind == "globals":
                patch_dict(holder)
            elif kind == "cell":
                try:
                    value = holder.cell_contents
                except ValueError:  # an empty cell
                    continue
                wire = wire_for(value)
                if wire is not None:
                    holder.cell_contents = wire
                    undo.append((holder, "cell_contents", value, wire))
            elif kind == "defaults":
                old = holder.__defaults__
                new = tuple(wire_for(d) or d for d in old)
                if new != old:
                    holder.__defaults__ = new
                    undo.append((holder, "__defaults__", old, new))
            else:
                old = holder.__kwdefaults__
                new = {k: wire_for(d) or d for k, d in old.items()}
                if any(new[k] is not old[k] for k in old):
                    holder.__kwdefaults__ = new
                    undo.append((holder, "__kwdefaults__", old, new))
        token = _ARMED.set(state)
        try:
            yield state
        finally:
            _ARMED.reset(token)
    finally:
        for holder, key, value, wire in reversed(undo):
            if isinstance(holder, dict):
                if holder.get(key) is wire:
                    holder[key] = value
            elif getattr(holder, key) is wire:
                setattr(holder, key, value)


def answer_is_pathedu(answers, allow=()) -> list[str]:
    """The names of the pathedu functions that the callable ``answers`` are (the function itself, or a
    ``functools.partial`` or ``functools.wraps`` wrapper of one), except those in ``allow``."""
    allowed = {id(_resolve(name)) for name in allow}
    return sorted({name for answer in answers if callable(answer) for fn in _unwrap(answer)
                   if id(fn) not in allowed and (name := _pathedu_name(fn)) is not None})


def pathedu_verdict(v: Verdict, own, calls) -> Verdict:
    """``v``, unless the answer is pathedu's own function (``own``) or calls one (``calls``): then "Not yet",
    saying which."""
    if own:
        return Verdict(v.name, False, f"your answer is {', '.join(sorted(own))} itself, pathedu's own code; write "
                                      "it yourself.")
    if calls:
        return Verdict(v.name, False, f"your answer calls {', '.join(sorted(calls))}; write it yourself "
                                      "(grading mode: pathedu's own forms are off limits here).")
    return v


def _graded(check, answers, allow, entry) -> Verdict:
    """Run ``check()`` (the check with the ``answers`` bound) in grading mode: an answer that is pathedu's own
    function, or that calls one, is "Not yet" whatever the check found."""
    own = answer_is_pathedu(answers, allow)
    with _armed(answers, allow, entry) as state:
        v = check()
    return pathedu_verdict(v, own, state.calls)


# ---------------------------------------------------------------------------
# Reading an answer's source (the course grader, in its own process)
# ---------------------------------------------------------------------------

def _import_pathedu(name: str):
    """Module ``name`` when it is part of pathedu (importing pathedu's own modules only), else ``None``."""
    if not _is_pathedu(name):
        return None
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a name that is no module of pathedu
        return None


def _member(obj, attr: str):
    """``obj.attr`` for a pathedu module or function (never an attribute of anything else)."""
    if isinstance(obj, types.ModuleType) and _is_pathedu(obj.__name__):
        found = getattr(obj, attr, None)
        return found if found is not None else _import_pathedu(f"{obj.__name__}.{attr}")
    if isinstance(obj, (types.FunctionType, functools.partial)) and attr in ("__wrapped__", "func"):
        return getattr(obj, attr, None)
    return None


def _static_value(node, env: dict):
    """What a name, an attribute chain or ``getattr(x, "name")`` denotes, when it leads to pathedu through the
    imports and plain assignments recorded in ``env``; else ``None``."""
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _static_value(node.value, env)
        return None if base is None else _member(base, node.attr)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        base = _static_value(node.args[0], env)
        return None if base is None else _member(base, node.args[1].value)
    return None


def _record_bindings(statements, env: dict) -> None:
    """Update ``env`` (name -> the pathedu module or function it holds, or ``None``) with the imports and
    assignments of ``statements`` and of the blocks nested in them, in order (not inside functions)."""
    for node in statements:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    env[alias.asname] = _import_pathedu(alias.name)
                else:
                    root = alias.name.split(".")[0]
                    env[root] = _import_pathedu(root)
                    _import_pathedu(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = _import_pathedu(node.module or "") if not node.level else None
            for alias in node.names:
                if alias.name != "*":
                    env[alias.asname or alias.name] = None if module is None else _member(module, alias.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            env[node.name] = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and getattr(node, "value", None) is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = _static_value(node.value, env)
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        env[name.id] = value if isinstance(target, ast.Name) else None
        else:
            for field_name in ("body", "orelse", "finalbody", "handlers"):
                _record_bindings(getattr(node, field_name, None) or [], env)


def pathedu_in_source(statements, answer, allow=()) -> tuple[list[str], list[str]]:
    """``(own, named)``: the forbidden functions that the expression ``answer`` is, and those named (read, not
    assigned to) inside the functions and lambdas of ``statements`` or of ``answer`` (AST nodes), through the
    imports (``from pathedu.nope import linear_matrix``, ``from pathedu import nope``, ``import pathedu``) and
    plain assignments (``f = nope.linear_matrix``) of ``statements``, imports inside the function, and
    ``getattr(module, "name")`` with a literal name.  Forbidden: the watched forms (:data:`WATCHED`, less
    ``allow``) and every function of ``pathedu.exercises`` (the checks' own references).  Only pathedu's own
    modules are imported; nothing of the source runs."""
    watched = watched_functions()
    allowed = {id(_resolve(name)) for name in allow}

    def name_of(fn):
        if id(fn) in allowed:
            return None
        if id(fn) in watched:
            return watched[id(fn)][1]
        module = getattr(fn, "__module__", None) or ""
        if isinstance(fn, types.FunctionType) and module.startswith("pathedu.exercises."):
            return f"{module}.{fn.__qualname__}"  # the grader's own references and helpers
        return None

    def forbidden(obj):
        if obj is None or not callable(obj):
            return None
        return next((name for fn in _unwrap(obj) if (name := name_of(fn)) is not None), None)

    env: dict = {}
    _record_bindings(statements, env)
    own = set()
    if isinstance(answer, ast.Tuple):
        parts = list(answer.elts)
    else:
        parts = [answer]
    for part in parts:
        name = forbidden(_static_value(part, env))
        if name:
            own.add(name)
    named = set()
    functions = [n for root in [*statements, answer] for n in ast.walk(root)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for part in parts:  # an answer built from pathedu's functions (a partial, a wrapper) names them too
        if not forbidden(_static_value(part, env)):
            functions.append(part)
    for fn in functions:
        local = dict(env)
        _record_bindings([n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))], local)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) or (isinstance(node, (ast.Name, ast.Attribute))
                                              and isinstance(node.ctx, ast.Load)):
                name = forbidden(_static_value(node, local))
                if name:
                    named.add(name)
    return sorted(own), sorted(named - own)


# ---------------------------------------------------------------------------
# Fresh inputs
# ---------------------------------------------------------------------------

_SECRET: contextvars.ContextVar = contextvars.ContextVar("pathedu_secret", default=None)


class _SaltedGenerator(torch.Generator):
    """A ``torch.Generator`` whose ``manual_seed(s)`` seeds it from ``s`` and the secret of
    :func:`fresh_inputs`."""

    def manual_seed(self, seed):
        secret = _SECRET.get()
        if secret is not None:
            digest = hashlib.blake2b(f"{secret}:{int(seed)}".encode(), digest_size=8).digest()
            seed = int.from_bytes(digest, "little") >> 1
        return super().manual_seed(seed)


@contextlib.contextmanager
def fresh_inputs(secret: int):
    """While active, every ``torch.Generator()`` made through ``torch.Generator`` is seeded from its seed *and*
    ``secret``, and torch's global generator from ``secret``: a check draws the same shapes from new random
    values that nobody could know in advance (the checks' fixed seeds are public).  For the course grader's
    process only (it swaps ``torch.Generator`` for the duration; it is not thread-safe)."""
    saved, state = torch.Generator, torch.get_rng_state()
    token = _SECRET.set(int(secret))
    torch.Generator = _SaltedGenerator
    torch.manual_seed(int(secret) & (2 ** 63 - 1))
    try:
        yield
    finally:
        torch.Generator = saved
        torch.set_rng_state(state)
        _SECRET.reset(token)
