"""The three kinds of exercise beyond "write the function": predict, then run (``check_prediction``), explain
(``check_explanation``) and find the bug (``check_bug``); their points and partial credit; and every lab's planted
bug, which its check recognises and grades with one point of three for the name alone."""
import inspect
import json
import re

import pytest
import torch

from helpers import exercise_modules
from pathedu import course
from pathedu.exercises import (BUG_KINDS, KINDS, Exercises, Verdict, check_bug, check_explanation,
                               check_prediction)

MODULES = exercise_modules()


# --- predict, then run ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("guess, truth, kw, ok, fraction", [
    (3.0, 3.0, {}, True, 1.0),
    (3, 3.0, {}, True, 1.0),                                  # an int for a float
    (torch.tensor(2.5), 2.5, {}, True, 1.0),                  # a one-element tensor
    (3.2, 3.0, dict(rtol=0.1), True, 1.0),
    (3.5, 3.0, dict(rtol=0.1), False, 0.0),
    (3.5, 3.0, dict(rtol=0.1, near=0.5), False, 0.5),          # close: half the point
    (9.0, 3.0, dict(rtol=0.1, near=0.5), False, 0.0),
    (float("nan"), 3.0, dict(rtol=1.0), False, 0.0),
    (True, 1.0, dict(rtol=1.0), False, 0.0),                  # a bool is no number
    ((2, 3, 24, 16), (2, 3, 24, 16), {}, True, 1.0),
    ([2, 3, 24, 16], (2, 3, 24, 16), {}, True, 1.0),          # a list is a shape too
    ((2, 3, 16, 24), (2, 3, 24, 16), {}, False, 0.5),         # half the entries right
    ((2, 3, 24), (2, 3, 24, 16), {}, False, 0.0),             # wrong length
    ("Yes ", "yes", {}, True, 1.0),
    (False, True, {}, False, 0.0),
])
def test_a_prediction_earns_its_share_of_the_point(guess, truth, kw, ok, fraction, capsys):
    v = check_prediction("p", guess, truth, **kw)
    assert (v.ok, v.fraction) == (ok, fraction)
    assert v.status == ("Correct" if ok else "Not yet")
    assert v.answer  # the report shows what was predicted
    if not ok and not isinstance(truth, (tuple, str, bool)):
        assert repr(float(truth)) not in v.message  # the next cell reveals it, not the check


def test_an_untouched_prediction_is_not_attempted(capsys):
    v = check_prediction("p", None, 1.0)
    assert not v and "not attempted yet" in v.message and v.fraction == 0


# --- explain ----------------------------------------------------------------------------------------------------

def test_a_written_answer_is_recorded_for_marking_with_its_rubric(capsys):
    text = " ".join(["word"] * 30)
    v = check_explanation("e", text, rubric="2 points. 1: this; 1: that.")
    assert v.ok and v.status == "Needs marking" and v.marking.startswith("2 points") and v.answer == text
    assert "2 points" not in v.message and "30 words" in v.message  # the student does not read the rubric
    assert repr(v).startswith("Needs marking [e]")


@pytest.mark.parametrize("text, says", [(None, "not attempted yet"), ("", "not attempted yet"),
                                        ("  \n ", "not attempted yet"), ("too short", "write at least 20"),
                                        (42, "as a string")])
def test_an_empty_short_or_non_text_answer_is_not_yet(text, says, capsys):
    v = check_explanation("e", text, rubric="r")
    assert not v and says in v.message and not v.marking and v.status == "Not yet"


# --- find the bug -----------------------------------------------------------------------------------------------

def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(5, 3, generator=g, dtype=torch.float64),)


def _right(x):
    return x.cumsum(0)


def _planted(x):
    return x.cumsum(0) - x


def _stub(x):
    raise NotImplementedError


@pytest.mark.parametrize("named, fixed, ok, points", [
    ("index", _right, True, 3), ("INDEX ", _right, True, 3),
    ("index", _planted, False, 1), ("index", _stub, False, 1),
    ("self", _right, False, 2), (None, _right, False, 2), ("nonsense", _right, False, 2),
    ("self", _planted, False, 0),
])
def test_a_bug_earns_one_point_for_its_name_and_two_for_the_fix(named, fixed, ok, points, capsys):
    v = check_bug("b", named, fixed, bug="index", reference=_right, make_inputs=_inputs, buggy=_planted)
    assert v.ok == ok and v.fraction == pytest.approx(points / 3) and f"({points}/3 points)" in v.message
    if fixed is _planted:
        assert "planted bug computes" in v.message
    if named == "nonsense":
        assert all(f'"{kind}"' in v.message for kind in BUG_KINDS)


def test_an_untouched_bug_exercise_is_not_attempted_and_a_bad_kind_is_refused(capsys):
    v = check_bug("b", None, _stub, bug="index", reference=_right, make_inputs=_inputs, buggy=_planted)
    assert not v and "not attempted yet" in v.message and v.fraction == 0
    with pytest.raises(ValueError, match="`bug` must be one of"):
        check_bug("b", "index", _right, bug="typo", reference=_right, make_inputs=_inputs, buggy=_planted)


def test_kinds_have_points_and_an_unknown_kind_is_refused():
    assert KINDS == {"code": 2, "predict": 1, "explain": 2, "bug": 3}
    ex = Exercises("ch99", {1: ("a", "b", "c")})
    with pytest.raises(ValueError, match="`kind` must be one of"):
        ex.check(1, kind="essay")
    check = ex.check(1, kind="predict", points=4)(lambda x: Verdict("x", True, "m"))
    assert (check.kind, check.points) == ("predict", 4.0)
    assert Verdict("x", False, "m", score=0.25).fraction == 0.25 and Verdict("x", True, "m").fraction == 1.0



# --- declared checks: the three kinds whose check every chapter shares ----------------------------------------

def test_a_declared_check_is_the_shared_check_under_the_stubs_name_docstring_and_arguments(capsys):
    ex = Exercises("ch99", {1: ("a", "b", "c"), 2: ("d", "e", "f"), 3: ("g", "h", "i")})
    truths = []

    def truth():
        truths.append(1)
        return (2, 3)

    @ex.prediction(1, "predict: p", truth, rtol=0.1)
    def check_p(shape) -> Verdict:
        """Exercise 1: a shape."""

    @ex.explanation(2, "explain: e", rubric="2 points. 1: this; 1: that.", min_words=3)
    def check_e(text) -> Verdict:
        """Exercise 2: a text."""

    @ex.planted_bug(3, "find the bug: b", bug="index", reference=_right, make_inputs=_inputs, buggy=_planted)
    def check_b(bug, fixed) -> Verdict:
        """Exercise 3: a bug."""

    for check, name, n, kind, args in [(check_p, "check_p", 1, "predict", ((2, 3),)),
                                       (check_e, "check_e", 2, "explain", ("one two three",)),
                                       (check_b, "check_b", 3, "bug", ("index", _right))]:
        assert (check.__name__, check.__qualname__.rsplit(".", 1)[-1], check.__module__) == (name, name, __name__)
        doc = f"Exercise {n}: a {dict(predict='shape', explain='text', bug='bug')[kind]}."
        assert check.__doc__ == doc + ("\n\nMarked by a person against its rubric." if kind == "explain" else "")
        assert (check.exercise.n, check.label, check.kind, check.points) == (n, str(n), kind, float(KINDS[kind]))
        v = check(*args)
        assert v.ok and capsys.readouterr().out == repr(v) + "\n"
        assert check.evaluate(*args).ok and capsys.readouterr().out == ""  # the grader's view prints nothing
    assert len(truths) == 2  # the truth is computed at each check, not once
    assert check_p(shape=(2, 4)).fraction == 0.5  # by the stub's argument name, as a written check takes it
    assert check_p((2, 3)).message == check_prediction("predict: p", (2, 3), (2, 3), rtol=0.1).message
    v = check_e("one two three")
    assert v.status == "Needs marking" and v.marking == "2 points. 1: this; 1: that." and "2 points" not in v.message
    assert check_b("self", _planted).fraction == 0 and check_b("index", _planted).fraction == pytest.approx(1 / 3)
    stub = check_e(None)
    assert not stub and "not attempted yet" in stub.message and "ch99.hint(2)" in stub.message
    with pytest.raises(TypeError):
        check_p()


def test_a_declared_check_needs_a_docstring_the_right_arguments_and_a_known_bug_kind():
    ex = Exercises("ch99", {1: ("a", "b", "c")})
    with pytest.raises(ValueError, match="needs a docstring"):
        @ex.explanation(1, "e", rubric="r")
        def check_e(text):
            pass
    with pytest.raises(TypeError, match="must take 1 argument, got 2"):
        @ex.prediction(1, "p", lambda: 1.0)
        def check_p(a, b):
            """Exercise 1."""
    with pytest.raises(ValueError, match="`bug` must be one of"):
        ex.planted_bug(1, "b", bug="typo", reference=_right, make_inputs=_inputs, buggy=_planted)


@pytest.mark.parametrize("module", MODULES.values(), ids=list(MODULES))
def test_every_check_keeps_its_public_name_and_docstring(module):
    for name in module.__all__:
        check = getattr(module, name)
        if name == "hint":
            continue
        assert (check.__name__, check.__qualname__, check.__module__) == (name, name, module.__name__)
        assert check.__doc__ and check.__doc__.strip()
        arity = {"predict": 1, "explain": 1, "bug": 2}.get(check.kind)
        if arity is not None:
            assert len(inspect.signature(check).parameters) == arity, name
        if check.kind == "explain":  # the docstring names the module constant the marker's rubric is
            rubric = re.fullmatch(r"(?s).+\n\nMarked by a person against :data:`(\w+)`\.", check.__doc__)
            assert rubric and isinstance(getattr(module, rubric[1]), str), name
            assert check(" ".join(["word"] * 40)).marking == getattr(module, rubric[1]), name


# --- every lab's planted bug ------------------------------------------------------------------------------------

def _bug_exercises():
    """(module, its bug check, the planted form the check diagnoses, the kind the lab's solution names)."""
    found = []
    for lab in course.labs():
        module = MODULES[f"ch{lab.name[:2]}"]
        cells = json.loads(lab.read_text())["cells"]
        named = {m for c in cells if course.is_solution(c) for m in re.findall(r'^bug = "(\w+)"', "".join(c["source"]),
                                                                                re.M)}
        planted = [getattr(module, n) for n in dir(module) if n.endswith("_planted")]
        bug_checks = [getattr(module, n) for n in module.__all__ if getattr(getattr(module, n), "kind", "") == "bug"]
        assert len(named) == len(planted) == len(bug_checks) == 1, lab.name
        found.append((module, bug_checks[0], planted[0], named.pop()))
    return found


BUGS = _bug_exercises()


@pytest.mark.parametrize("module, check, planted, kind", BUGS, ids=[m.__name__[-4:] for m, *_ in BUGS])
def test_each_labs_planted_bug_is_recognised_and_named_in_the_recipe(module, check, planted, kind, capsys):
    assert kind in BUG_KINDS
    v = check(kind, planted)
    assert not v and v.fraction == pytest.approx(1 / 3) and "planted bug computes" in v.message
    other = next(k for k in BUG_KINDS if k != kind)
    assert check(other, planted).fraction == 0
    assert f'"{kind}"' in check.exercise.hints[2]  # the recipe names the kind; the nudge does not
    assert f'"{kind}"' not in check.exercise.hints[0]


@pytest.mark.parametrize("lab", course.labs(), ids=lambda p: p.name[:2])
def test_each_lab_shows_the_planted_form_that_its_check_diagnoses(lab):
    """The lab's ``*_planted`` function (a lesson cell, not a solution) computes what the check's copy does."""
    module, check, planted, _ = next(b for b in BUGS if b[0].__name__.endswith(f"ch{lab.name[:2]}"))
    cells = json.loads(lab.read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if c["cell_type"] == "code" and not course.is_solution(c)
                  and re.search(r"^def \w+_planted\(", "".join(c["source"]), re.M))
    definition = source.split("\n\n\n")[0]
    ns = {"torch": torch, **{name: getattr(module, name) for name in ("fox", "tasks") if hasattr(module, name)}}
    exec(definition, ns)
    shown = next(v for k, v in ns.items() if k.endswith("_planted"))
    (inputs,) = [getattr(module, n) for n in dir(module) if n.endswith("_bug_inputs")]
    args = inputs(0)
    assert torch.allclose(shown(*args), planted(*args))
