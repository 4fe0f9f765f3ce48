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

When the environment variable ``PATHEDU_GRADING_RESULTS`` names a file, every check appends its verdict to it as
one JSON line (``python -m pathedu.course grade`` reads them).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect
import json
import os
import sys
import traceback
import types
from dataclasses import dataclass, field

import torch

LEVELS = (1, 2, 3)
GRADING_ENV = "PATHEDU_GRADING"
RESULTS_ENV = "PATHEDU_GRADING_RESULTS"
#: The modules whose public functions are the reference forms that grading mode forbids.
WATCHED = ("pathedu.nope", "pathedu.alibi", "pathedu.fox", "pathedu.rope", "pathedu.path", "pathedu.pathfox",
           "pathedu.stickbreaking", "pathedu.cope", "pathedu.tasks",
           "pathedu.kernels.flash_attention", "pathedu.kernels.linear_attention", "pathedu.kernels.path_attention",
           "pathedu.kernels.delta_rule", "pathedu.kernels.rope", "pathedu.kernels.stickbreaking",
           "pathedu.kernels.cope")


# ---------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------

@dataclass
class Verdict:
    """What a check found; prints as one line and is truthy when the answer is right."""

    name: str
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"{'Correct' if self.ok else 'Not yet'} [{self.name}]: {self.message}"


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("pathedu_exercise", default=None)


def verdict(name: str, ok: bool, message: str) -> Verdict:
    """A :class:`Verdict`, printed at once, or by the registered check that is running (see
    :meth:`Exercises.check`), which prints the final verdict once."""
    v = Verdict(name, bool(ok), message)
    if _CURRENT.get() is None:
        print(repr(v))
    return v


class StudentError(str):
    """What :func:`call_student` says when the student's function raised; ``stub`` is true for
    ``NotImplementedError`` (an exercise not attempted yet)."""

    stub: bool = False


def call_student(fn, *args):
    """Run the student's function: ``(result, None)``, or ``(None, message)`` naming the
    exception and the line it came from (the student's code failed: say where, kindly).
    The message is a :class:`StudentError`, whose ``stub`` says whether it was ``NotImplementedError``."""
    try:
        return fn(*args), None
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        err = StudentError(f"your function raised {type(exc).__name__}: {exc} (line {last.lineno})")
        err.stub = isinstance(exc, NotImplementedError)
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
    (see :meth:`check`)."""

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

    def check(self, n: int, *, label: str | None = None, allow=()):
        """Decorate exercise ``n``'s check function (``label`` names it in grading reports when one exercise has
        several checks, e.g. ``"3a"``; ``allow`` lists pathedu functions, as ``"pathedu.rope.apply_rope"``, that
        grading mode lets this exercise's answers call).

        The decorated check runs with the exercise's hints in reach (:func:`fallback_hint`,
        :func:`not_attempted`), in grading mode when it is on, prints its final verdict once and records it
        when ``PATHEDU_GRADING_RESULTS`` names a file."""
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
                _record(v, ex, label, check.__name__)
                return v

            run.exercise, run.label, run.allow = ex, label, allow
            return run

        return decorate


def _record(v: Verdict, ex: Exercise, label: str, check_name: str) -> None:
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    row = {"chapter": ex.chapter, "exercise": label, "check": check_name, "name": v.name, "ok": v.ok,
           "message": v.message, "grading": grading_mode()}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


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
    """``{id(function): (function, "pathedu.module.name")}`` for every public function of :data:`WATCHED`."""
    found = {}
    for modname in WATCHED:
        module = importlib.import_module(modname)
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


def _graded(check, answers, allow, entry) -> Verdict:
    """Run ``check()`` (the check with the ``answers`` bound) in grading mode: an answer that is pathedu's own
    function, or that calls one, is "Not yet" whatever the check found."""
    allowed = {id(_resolve(name)) for name in allow}
    own = sorted({name for answer in answers if callable(answer) for fn in _unwrap(answer)
                  if id(fn) not in allowed and (name := _pathedu_name(fn)) is not None})
    with _armed(answers, allow, entry) as state:
        v = check()
    if own:
        return Verdict(v.name, False, f"your answer is {', '.join(own)} itself, pathedu's own code; write it yourself.")
    if state.calls:
        return Verdict(v.name, False, f"your answer calls {', '.join(sorted(state.calls))}; write it yourself "
                                      "(grading mode: pathedu's own forms are off limits here).")
    return v
