"""Hints in three levels (``chNN.hint(n, level)``) for every exercise of every chapter, and what the checks say
before the recipe: a stub is "not attempted yet" (with a pointer to ``chNN.hint(n)``), a generic wrong answer gets
the level-1 nudge and where level 2 is."""
import json
import re

import pytest
import torch

from helpers import exercise_modules
from pathedu import course, fox
from pathedu.exercises import REGISTRY, ch01, ch02, ch03, ch04, ch05, ch07

CHAPTERS = list(exercise_modules().values())
EXERCISE_COUNTS = {"ch01": 6, "ch02": 7, "ch03": 7, "ch04": 6, "ch05": 8, "ch07": 7, "ch08": 5, "ch09": 6, "ch10": 6,
                   "ch11": 6}
#: Every lab has at least one exercise of each kind beyond "write the function".
NEW_KINDS = ("predict", "explain", "bug")


def _chapter(module):
    return module.__name__.rsplit(".", 1)[-1]


def _checks(module):
    return [getattr(module, name) for name in module.__all__ if name.startswith("check_")]


EXERCISES = [(m, n) for m in CHAPTERS for n in REGISTRY[_chapter(m)]]
EX_IDS = [f"{_chapter(m)}-{n}" for m, n in EXERCISES]
CHECKS = [(m, c) for m in CHAPTERS for c in _checks(m)]
CHECK_IDS = [f"{_chapter(m)}-{c.__name__}" for m, c in CHECKS]


def test_every_chapter_registers_a_hint_for_each_exercise_it_checks():
    assert {_chapter(m): len(REGISTRY[_chapter(m)]) for m in CHAPTERS} == EXERCISE_COUNTS
    for module in CHAPTERS:
        numbers = {check.exercise.n for check in _checks(module)}
        assert numbers == set(REGISTRY[_chapter(module)]), _chapter(module)
        assert "hint" in module.__all__


@pytest.mark.parametrize("module", CHAPTERS, ids=_chapter)
def test_every_chapter_has_an_exercise_of_each_new_kind(module):
    kinds = [check.kind for check in _checks(module)]
    assert all(kinds.count(kind) >= 1 for kind in NEW_KINDS), kinds
    assert {check.points for check in _checks(module) if check.kind == "bug"} == {3.0}


@pytest.mark.parametrize("path", course.labs(), ids=lambda p: p.name[:2])
def test_the_labs_number_their_exercises_as_the_hints_do(path):
    nb = json.loads(path.read_text())
    headings = {int(n) for c in nb["cells"] if c["cell_type"] == "markdown"
                for n in re.findall(r"^### Exercise (\d+)", "".join(c["source"]), re.M)}
    assert headings == set(REGISTRY[f"ch{path.name[:2]}"])


@pytest.mark.parametrize("module, n", EXERCISES, ids=EX_IDS)
def test_three_levels_printed_and_returned_each_different(module, n, capsys):
    texts, shown = [], []
    for level in (1, 2, 3):
        shown.append(module.hint(n, level))
        assert capsys.readouterr().out == shown[-1] + "\n"
        assert shown[-1].startswith(f"Hint {level}/3 for exercise {n}: ")
        texts.append(REGISTRY[_chapter(module)][n].hints[level - 1])
        assert texts[-1] in shown[-1]
    assert module.hint(n) == shown[0]
    assert len(set(texts)) == 3, "a nudge, the structure and the recipe are three different texts"
    assert shown[0].endswith(f"More: {_chapter(module)}.hint({n}, 2).")
    assert shown[1].endswith(f"More: {_chapter(module)}.hint({n}, 3).")
    assert "More:" not in shown[2]


@pytest.mark.parametrize("bad", [0, 99, -1, "1", 1.0, True, None])
def test_a_bad_exercise_number_names_n_and_lists_the_valid_ones(bad):
    with pytest.raises(ValueError, match=r"`n` must be one of 1, 2, 3, 4, 5, 6, 7, 8 .*got"):
        ch05.hint(bad)


@pytest.mark.parametrize("bad", [0, 4, "2", 2.0, False])
def test_a_bad_level_names_level_and_lists_the_valid_ones(bad):
    with pytest.raises(ValueError, match=r"`level` must be one of 1, 2, 3, got"):
        ch01.hint(1, bad)


def _stub_args(check):
    """An untouched stub for ``check``: a function raising NotImplementedError, the notebooks' ``None`` (a value, a
    prediction, an empty written answer), or ``(None, stub)`` for a planted bug (no name, no fix)."""
    def stub(*args):
        raise NotImplementedError("exercise: write your answer here")

    by_kind = {"predict": (None,), "explain": ("",), "bug": (None, stub)}
    if check.kind in by_kind:
        return by_kind[check.kind]
    return {"check_stuck_product": (None, None), "check_half_life_gamma": (None,)}.get(check.__name__, (stub,))


@pytest.mark.parametrize("module, check", CHECKS, ids=CHECK_IDS)
def test_the_first_not_yet_on_a_stub_points_at_the_hints_not_the_recipe(module, check, capsys):
    verdict = check(*_stub_args(check))
    out = capsys.readouterr().out
    assert not verdict and out == repr(verdict) + "\n"
    ex = check.exercise
    assert out.startswith("Not yet") and "not attempted yet" in out
    assert f"{ex.chapter}.hint({ex.n})" in out
    for recipe in ex.hints[1:]:
        assert recipe not in out
    assert "Hint" not in verdict.message


GENERIC_WRONG = [  # (check, an answer no known mistake matches)
    (ch01.check_linear_matrix, lambda q, k, v: v),
    (ch01.check_online_softmax_merge, lambda m1, l1, a1, m2, l2, a2: (m1, l1, a1)),
    (ch02.check_alibi_bias, lambda T, slope: 1 / 0),
    (ch02.check_retnet_recurrent, lambda q, k, v, gamma: v),
    (ch03.check_log_gate_matrix, lambda lf: 2 * fox.log_gate_matrix(lf)),
    (ch03.check_fox_matrix, lambda q, k, v, log_f: v),
    (ch04.check_apply_rope_half, lambda x: x),
    (ch04.check_complex_step, lambda S, q, k, v, omega: (S, v)),
    (ch05.check_delta_step, lambda S, k, v, beta: S),
    (ch05.check_householder_chunk_step, lambda q, k, v, w, beta, S: (v, S)),
    (ch07.check_gated_delta_step, lambda S, k, v, beta, log_f: S),
    (ch07.check_gated_deltanet_matrix, lambda q, k, v, beta, log_f: v),
]


@pytest.mark.parametrize("check, wrong", GENERIC_WRONG, ids=[c.__name__ for c, _ in GENERIC_WRONG])
def test_a_generic_wrong_answer_gets_the_nudge_and_where_to_find_more(check, wrong, capsys):
    verdict = check(wrong)
    ex = check.exercise
    assert not verdict
    assert ex.hints[0] in verdict.message and f"more: {ex.chapter}.hint({ex.n}, 2)" in verdict.message
    assert ex.hints[2] not in verdict.message


def test_known_mistakes_still_get_their_specific_diagnosis(capsys):
    def strict_mask(q, k, v):
        return (q @ k.mT * torch.ones(q.shape[-2], q.shape[-2], dtype=q.dtype).tril(-1)) @ v

    verdict = ch01.check_linear_matrix(strict_mask)
    assert "diagonal" in verdict.message and ch01.EXERCISES.exercises[1].hints[0] not in verdict.message
