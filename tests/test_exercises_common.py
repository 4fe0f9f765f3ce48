"""The generic exercise-check contract, for every chapter with a (check, right, wrong-variants) table:
the right answer passes, each wrong answer fails without raising, a stub gets a friendly "Not yet",
and answers that are not functions (or return no tensor) never raise."""
import pytest

import test_exercises_ch01
import test_exercises_ch05
import test_exercises_ch07

TABLES = test_exercises_ch01.CHECKS + test_exercises_ch05.CASES + test_exercises_ch07.CASES
CHECKS = [check for check, _, _ in TABLES]
IDS = [f"{check.__module__.rsplit('.', 1)[-1]}-{check.__name__}" for check in CHECKS]
WRONG_CASES = [(check, name, fn) for check, _, wrong in TABLES for name, fn in wrong.items()]
WRONG_IDS = [f"{i}-{name}" for (check, _, wrong), i in zip(TABLES, IDS) for name in wrong]


def stub(*args):
    raise NotImplementedError("write your answer here")


@pytest.mark.parametrize("check, right", [(c, r) for c, r, _ in TABLES], ids=IDS)
def test_right_answer_passes(check, right, capsys):
    verdict = check(right)
    assert verdict and verdict.ok, verdict
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("check, name, wrong", WRONG_CASES, ids=WRONG_IDS)
def test_wrong_answer_fails_without_raising(check, name, wrong, capsys):
    verdict = check(wrong)
    assert not verdict, name
    out = capsys.readouterr().out
    assert out.startswith("Not yet"), (name, out)


@pytest.mark.parametrize("check", CHECKS, ids=IDS)
def test_stub_gets_a_friendly_not_yet(check, capsys):
    verdict = check(stub)
    assert not verdict
    out = capsys.readouterr().out
    assert out.startswith("Not yet") and "NotImplementedError" in out


@pytest.mark.parametrize("check", CHECKS, ids=IDS)
def test_non_function_answers_do_not_raise(check):
    assert not check(lambda *a: None)
    assert not check(lambda *a: "42")
    assert not check(None)
