"""Grading mode: a check rejects an answer that is, or calls, pathedu's own implementation, and accepts the labs'
solutions; the grader's own reference computations never trip it, and everything is put back afterwards.  The
course grader's reading of an answer's source finds the same functions without running anything."""
import functools
import json
import math
import re

import pytest
import torch

from helpers import exercise_modules

import pathedu
from pathedu import alibi, cope, course, fox, nope, path, pathfox, rope, stickbreaking, tasks
from pathedu.exercises import _grader, ch01, ch02, ch03, ch04, ch05, ch07, ch09, ch10, ch11, grading, grading_mode
from pathedu.nope import linear_recurrent as imported_before_grading

# (check, pathedu's own answer, the function the verdict must name): at least one per chapter, by identity
# (the answer *is* the library's function) and by the tripwire (the answer calls it).
OWN = [
    (ch01.check_linear_matrix, nope.linear_matrix, "pathedu.nope.linear_matrix"),
    (ch01.check_chunk_step, lambda q, k, v, S: nope.linear_recurrent(q, k, v, initial_state=S, return_state=True),
     "pathedu.nope.linear_recurrent"),
    (ch02.check_retnet_recurrent, alibi.retnet_recurrent, "pathedu.alibi.retnet_recurrent"),
    (ch02.check_alibi_bias, lambda T, s: alibi.alibi_bias(T, s), "pathedu.alibi.alibi_bias"),
    (ch02.check_alibi_slopes, lambda n: alibi.alibi_slopes(n), "pathedu.alibi.alibi_slopes"),
    (ch03.check_fox_matrix, fox.fox_matrix, "pathedu.fox.fox_matrix"),
    (ch03.check_log_gate_matrix, lambda lf: fox.log_gate_matrix(lf), "pathedu.fox.log_gate_matrix"),
    (ch03.check_gla_recurrent, lambda q, k, v, lf: pathedu.fox.gla_chunked(q, k, v, lf), "pathedu.fox.gla_chunked"),
    (ch04.check_apply_rope_half, lambda x: rope.apply_rope(x, pairing="half"), "pathedu.rope.apply_rope"),
    (ch05.check_interval_product, path.interval_product, "pathedu.path.interval_product"),
    (ch05.check_ut_factor, lambda w, beta: path.ut_transform(w, beta)[1], "pathedu.path.ut_transform"),
    (ch05.check_householder_chunk_step,
     lambda q, k, v, w, b, S: path.householder_chunked(q, k, v, w, b, chunk=q.shape[-2], initial_state=S,
                                                       return_state=True), "pathedu.path.householder_chunked"),
    (ch07.check_gamma, lambda lf: torch.exp(fox.log_gate_matrix(lf)), "pathedu.fox.log_gate_matrix"),
    (ch07.check_gated_deltanet_chunk,
     lambda q, k, v, b, lf, S: pathfox.gated_deltanet_chunked(q, k, v, b, lf, chunk=q.shape[0], initial_state=S,
                                                              return_state=True),
     "pathedu.pathfox.gated_deltanet_chunked"),
    (ch09.check_flipflop_answers, lambda tokens: tasks.flipflop_reads(tokens), "pathedu.tasks.flipflop_reads"),
    (ch10.check_stick_log_weights,  # z_ij = z_i . e_j: the logits as queries against unit keys, scale 1
     lambda z: stickbreaking.stickbreaking_log_weights(z, torch.eye(z.shape[-1], dtype=z.dtype).expand_as(z),
                                                       scale=1.0), "pathedu.stickbreaking.stickbreaking_log_weights"),
    (ch11.check_cope_matrix, cope.cope_matrix, "pathedu.cope.cope_matrix"),
]
OWN_IDS = [f"{c.__module__[-4:]}-{c.__name__}" for c, _, _ in OWN]


@pytest.mark.parametrize("check, answer, name", OWN, ids=OWN_IDS)
def test_grading_mode_rejects_pathedus_own_function(check, answer, name, capsys):
    assert check(answer), "outside grading mode the library's own function is a right answer"
    with grading():
        verdict = check(answer)
    assert not verdict and name in verdict.message and "write it yourself" in verdict.message
    assert capsys.readouterr().out.splitlines()[-1] == repr(verdict)
    assert check(answer), "grading mode ends with its context"


def _solutions(lab):
    """The lab's solution cells run in one namespace, and each exercise's check call from its check cell."""
    nb = json.loads(lab.read_text())
    ns = {"__name__": "__main__", "torch": torch, "math": math, "nope": nope, "alibi": alibi, "fox": fox,
          "rope": rope, "path": path, "pathfox": pathfox}
    # the lab's own imports first (its first code cell that imports pathedu, after the hidden install cell)
    imports = next(c for c in nb["cells"] if c["cell_type"] == "code" and "remove-cell" not in course.tags(c)
                   and "pathedu" in "".join(c["source"]))
    exec("".join(imports["source"]), ns)
    for cell in nb["cells"]:
        if course.is_solution(cell):
            exec("".join(cell["source"]), ns)
    calls = [m for cell in nb["cells"] if cell["cell_type"] == "code"
             for m in re.findall(r"^assert (ch\d\d)\.(check_\w+)\((.*)\)$", "".join(cell["source"]), re.M)]
    return ns, calls



@pytest.mark.parametrize("lab", course.labs(), ids=lambda p: p.name[:2])
def test_grading_mode_accepts_every_solution_of_the_labs(lab, capsys):
    """Their references call pathedu all the time (the grader's calls do not count), and the helpers an
    exercise builds on stay allowed (``rope.apply_rope`` for the relative logit, ``path.ut_transform`` for the
    Householder chunk)."""
    ns, calls = _solutions(lab)
    assert len(calls) == sum(course.is_solution(c) for c in json.loads(lab.read_text())["cells"]) + (
        1 if lab.name.startswith("07") else 0)  # lab 7's exercise 3 has two checks in one cell
    modules = exercise_modules()
    with grading():
        for chapter, name, args in calls:
            verdict = getattr(modules[chapter], name)(*eval(f"({args},)", ns))
            assert verdict, (chapter, name, verdict)


def test_an_alias_imported_before_grading_started_is_caught_and_put_back(capsys):
    def via_alias(q, k, v):
        return imported_before_grading(q, k, v)

    with grading():
        verdict = ch01.check_linear_matrix(via_alias)
    assert not verdict and "pathedu.nope.linear_recurrent" in verdict.message
    assert imported_before_grading is nope.linear_recurrent
    assert globals()["imported_before_grading"] is nope.linear_recurrent


def _closure():
    f = nope.linear_recurrent
    return lambda q, k, v: f(q, k, v)


def _default(q, k, v, impl=nope.linear_recurrent):
    return impl(q, k, v)


def _kwdefault(q, k, v, *, impl=nope.linear_recurrent):
    return impl(q, k, v)


def _through_the_grader(q, k, v):
    return ch01._linear_reference(q, k, v)  # the grader's private reference, which calls pathedu


INDIRECT = {
    "closure": _closure(),
    "default argument": _default,
    "keyword default": _kwdefault,
    "partial": functools.partial(nope.linear_chunked, chunk=4),
    "wrapped": torch.no_grad()(nope.linear_matrix),
    "through the grader's helper": _through_the_grader,
    "re-exported by another module": lambda q, k, v: pathedu.alibi.retnet_matrix(q, k, v, 1.0),
    "imported inside the function": lambda q, k, v: __import__("pathedu.nope", fromlist=["x"]).linear_naive(q, k, v),
}


@pytest.mark.parametrize("answer", INDIRECT.values(), ids=INDIRECT.keys())
def test_indirect_uses_of_pathedu_are_caught(answer, capsys):
    with grading():
        verdict = ch01.check_linear_matrix(answer)
    assert not verdict and "pathedu." in verdict.message and "write it yourself" in verdict.message


def test_everything_is_put_back_after_a_check():
    with grading():
        ch01.check_linear_matrix(_closure())
        ch01.check_linear_matrix(_default)
        ch01.check_linear_matrix(_kwdefault)
    for fn, qualname in _grader.watched_functions().values():
        module, _, name = qualname.rpartition(".")
        assert getattr(__import__(module, fromlist=[name]), name) is fn, qualname
        assert not hasattr(fn, "__pathedu_tripwire__")
    assert _closure.__code__ and _default.__defaults__ == (nope.linear_recurrent,)
    assert _kwdefault.__kwdefaults__ == {"impl": nope.linear_recurrent}
    assert alibi.blockwise_softmax is nope.blockwise_softmax


def test_the_environment_variable_switches_grading_mode_on(monkeypatch, capsys):
    monkeypatch.delenv("PATHEDU_GRADING", raising=False)
    assert not grading_mode()
    monkeypatch.setenv("PATHEDU_GRADING", "1")
    assert grading_mode()
    assert not ch05.check_interval_product(path.interval_product)
    monkeypatch.setenv("PATHEDU_GRADING", "0")
    assert ch05.check_interval_product(path.interval_product)


def _relative_logit_with_helpers(q, k, delta):
    R = rope.rotation_matrix(delta, q.shape[-1])  # allowed in this exercise, like apply_rope and frequencies
    unused = rope.frequencies(q.shape[-1]) + rope.to_complex(q).real.sum()  # to_complex is not
    return torch.einsum("bd,de,be->b", k, R, q) + 0 * unused.sum()


def test_torch_is_allowed_and_answers_that_are_values_are_graded_as_usual(capsys):
    with grading():
        assert ch02.check_half_life_gamma(2 ** (-1 / 100))
        assert ch02.check_half_life_gamma(alibi.slope_to_gamma(math.log(2) / 100))  # a value: not caught
        assert ch04.check_relative_logit(lambda q, k, d: (rope.apply_rope(q[:, None], offset=d)[:, 0] * k).sum(-1))
        verdict = ch04.check_relative_logit(_relative_logit_with_helpers)
    assert not verdict and "pathedu.rope.to_complex" in verdict.message
    assert "apply_rope" not in verdict.message and "frequencies" not in verdict.message


SOURCES = [  # (answer's source, the answer expression, allow, (own, named))
    ("from pathedu.nope import linear_matrix as f", "f", (), (["pathedu.nope.linear_matrix"], [])),
    ("from pathedu import nope\nf = nope.linear_matrix", "f", (), (["pathedu.nope.linear_matrix"], [])),
    ("import pathedu\ndef f(q, k, v):\n    return pathedu.nope.linear_recurrent(q, k, v)", "f", (),
     ([], ["pathedu.nope.linear_recurrent"])),
    ("from pathedu import nope\ndef f(q, k, v):\n    g = nope.linear_matrix\n"
     "    return getattr(g, '__pathedu_tripwire__', g)(q, k, v)", "f", (), ([], ["pathedu.nope.linear_matrix"])),
    ("import pathedu.nope as n\ndef f(q, k, v):\n    return getattr(n, 'linear_chunked')(q, k, v)", "f", (),
     ([], ["pathedu.nope.linear_chunked"])),
    ("def f(q, k, v, impl=None):\n    from pathedu.alibi import retnet_matrix\n    return retnet_matrix(q, k, v, 1.0)",
     "f", (), ([], ["pathedu.alibi.retnet_matrix"])),
    ("import functools\nfrom pathedu import nope", "functools.partial(nope.linear_chunked, chunk=4)", (),
     ([], ["pathedu.nope.linear_chunked"])),
    ("from pathedu.exercises import ch01\ndef f(*a):\n    return ch01._merge_reference(*a)", "f", (),
     ([], ["pathedu.exercises.ch01._merge_reference"])),
    # not forbidden: an allowed helper, the student's own function named like pathedu's, constants, assigning
    ("from pathedu import rope\ndef f(q, k, d):\n    return (rope.apply_rope(q[:, None], offset=d)[:, 0] * k).sum(-1)",
     "f", ("pathedu.rope.apply_rope",), ([], [])),
    ("from pathedu import fox\ndef log_gate_matrix(lf):\n    return lf.cumsum(-1)\n"
     "def fox_matrix(q, k, v, lf):\n    return log_gate_matrix(lf)", "fox_matrix", (), ([], [])),
    ("from pathedu import tasks\ndef f(t):\n    return t.masked_fill(t == tasks.R, tasks.IGNORE)", "f", (), ([], [])),
    ("from pathedu import nope\ndef f(q, k, v):\n    nope.linear_recurrent = None\n    return v", "f", (), ([], [])),
    # beyond reading: a name spelt at run time (the worker's tripwire is there for that)
    ("from pathedu import nope\ndef f(q, k, v):\n    return getattr(nope, 'linear_' + 'matrix')(q, k, v)", "f", (),
     ([], [])),
]


@pytest.mark.parametrize("source, answer, allow, found", SOURCES, ids=range(len(SOURCES)))
def test_reading_an_answers_source_finds_the_pathedu_functions_it_names(source, answer, allow, found):
    """The course grader's second look, in its own process: nothing of the source runs."""
    import ast

    tree = ast.parse(source)
    assert _grader.pathedu_in_source(tree.body, ast.parse(answer, mode="eval").body, allow) == found


def test_an_error_raised_in_another_process_is_phrased_as_a_local_one():
    def remote(*args):
        raise _grader.RemoteError("ZeroDivisionError", "division by zero", 7, False)

    def stub(*args):
        raise _grader.RemoteError("NotImplementedError", "exercise 1", 2, True)

    _, err = _grader.call_student(remote, 1)
    assert err == "your function raised ZeroDivisionError: division by zero (line 7)" and not err.stub
    _, err = _grader.call_student(stub)
    assert err.stub and "NotImplementedError: exercise 1 (line 2)" in err


def test_evaluate_gives_the_verdict_without_grading_mode_or_printing(monkeypatch, capsys):
    """What the course grader calls in its own process: the check as it is, even with PATHEDU_GRADING=1."""
    monkeypatch.setenv("PATHEDU_GRADING", "1")
    verdict = ch01.check_linear_matrix.evaluate(nope.linear_matrix)
    assert verdict and capsys.readouterr().out == ""
    assert not ch01.check_linear_matrix(nope.linear_matrix)
