"""PaTH's ``w`` is a unit vector by definition: every PaTH / PaTH-FoX / (gated) Householder RNN form refuses a
``w`` whose transitions ``H_t = I - beta_t w_t w_t^T`` expand (``beta_t |w_t|^2 > 2``: an unnormalised ``w``), with
a ``ValueError`` naming ``w`` (before, fp32 forms and the kernels returned NaN or overflowed without a word),
within a tolerance that passes a unit vector rounded to bfloat16 in any dtype; ``w_t = 0`` (no transition) and
shorter ``w_t`` pass.  The Triton forms count it in the launch that reads ``w`` anyway (no wait of its own), and
Triton's interpreter prints no warning before that error."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from forms import FORMS, call
from pathedu import checks, path

W_FORMS = [f for f in FORMS if f.family in ("path", "householder", "pathfox", "gated_householder")]


def _inputs(form, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float32 if form.kind == "triton" else torch.float64
    q, k, v = (torch.randn(1, 2, T, 16, generator=g, dtype=torch.float64) for _ in range(3))
    ex = form.extras(q, k, v, seed)
    return (q.to(dtype), k.to(dtype), v.to(dtype)), {n: x.to(dtype) for n, x in ex.items()}


def test_the_forms_that_take_w_are_all_here():
    assert len(W_FORMS) == 20 and {f.kind for f in W_FORMS} >= {"naive", "matrix", "triton"}


REFUSED = r"`w` gives transitions .* that expand: beta_t \|w_t\|\^2 must be <= 2.*normalize\(w, dim=-1\)"


@pytest.mark.parametrize("case", ["one_row_1.2", "unnormalised"])
@pytest.mark.parametrize("form", W_FORMS, ids=lambda f: f.name)
def test_a_w_that_is_not_unit_is_refused_naming_w(form, case):
    (q, k, v), ex = _inputs(form)
    w, beta = ex["w"], ex["beta"]
    if case == "unnormalised":
        w = torch.randn(w.shape, generator=torch.Generator().manual_seed(3), dtype=w.dtype)
    else:
        w, beta = w.clone(), beta.clone()
        w[0, 1, 17] *= 1.2  # one row of one head: beta |w|^2 = 2.88
        beta[0, 1, 17] = 2.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=REFUSED):
            call(form, q, k, v, {**ex, "w": w, "beta": beta})
    assert not caught, [str(c.message) for c in caught]  # nothing from Triton's interpreter before the error


@pytest.mark.parametrize("form", [f for f in W_FORMS if f.kind in ("naive", "matrix", "triton")],
                         ids=lambda f: f.name)
def test_zero_and_shorter_w_pass_and_compute_the_same_function(form):
    """``w_t = 0`` is no transition (the paper's constructions use it); a shorter ``w_t`` a milder one."""
    (q, k, v), ex = _inputs(form, seed=2)
    w = ex["w"].clone()
    w[..., ::3, :] = 0
    w[..., 1::3, :] *= 0.5
    ex = {**ex, "w": w}
    out = call(form, q, k, v, ex)
    ref_form = next(f for f in FORMS if f.family == form.family and f.kind == "naive")
    ref = call(ref_form, q.double(), k.double(), v.double(), {n: x.double() for n, x in ex.items()})
    assert ((out.double() - ref).abs().max() / ref.abs().max()).item() < (2e-3 if form.kind == "triton" else 1e-10)


@pytest.mark.parametrize("form", [f for f in W_FORMS if f.name in ("path_triton", "pathfox_triton")],
                         ids=lambda f: f.name)
def test_a_forward_to_be_differentiated_refuses_it_too(form):
    (q, k, v), ex = _inputs(form)
    w = (2 * ex["w"]).requires_grad_()  # beta |w|^2 up to 8
    with pytest.raises(ValueError, match=REFUSED):
        call(form, q.requires_grad_(), k, v, {**ex, "w": w})


@pytest.mark.parametrize("form", [f for f in W_FORMS if f.kind in ("matrix", "triton")], ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_unit_vector_rounded_to_16_bits_passes_in_every_dtype(form, dtype):
    """References in float32/float64 are evaluated on inputs rounded to 16 bits: those must pass."""
    (q, k, v), ex = _inputs(form, seed=1)
    w = F.normalize(ex["w"].double(), dim=-1).to(dtype)
    for wd in {w, w.to(q.dtype)}:
        out = call(form, q, k, v, {**ex, "w": wd})
        assert torch.isfinite(out).all()


def test_the_tolerance():
    w = F.normalize(torch.randn(3, 200, 64, dtype=torch.float64), dim=-1)
    two = torch.full((3, 200), 2.0, dtype=torch.float64)
    excess = (2 * w.bfloat16().double().square().sum(-1) - 2).abs().max()
    assert excess < checks.TRANSITION_TOL / 2  # bfloat16's rounding of a unit vector, at beta = 2
    checks.require(checks.transition_condition(w.bfloat16(), two), checks.transition_condition(w.bfloat16().double(), two))
    checks.require(checks.transition_condition(0 * w, two))  # no transition
    with pytest.raises(ValueError, match=REFUSED):  # |w|^2 off by 2 tolerances
        checks.require(checks.transition_condition(w * (1 + checks.TRANSITION_TOL) ** 0.5 * (1 + 1e-3), two))
    with pytest.raises(ValueError, match="`w`"):
        checks.require(checks.transition_condition(torch.full((2, 4), float("nan")), torch.ones(2)))


def test_the_algebra_helpers_take_any_w():
    w = torch.randn(6, 4, dtype=torch.float64)
    beta = torch.rand(6, dtype=torch.float64)
    W, A = path.ut_transform(w, beta)
    eye = torch.eye(4, dtype=torch.float64)
    assert torch.allclose(eye - W.T @ A.T @ W, path.householder_product(w, beta))
    assert path.interval_product(w, beta, 1, 4).shape == (4, 4)


def test_reference_forms_read_every_value_check_at_once(monkeypatch):
    """The unit check joins the existing checks: one read of the device per call, as before."""
    reads = []
    original = checks._gathered
    monkeypatch.setattr(checks, "_gathered", lambda conditions: reads.append(len(conditions)) or original(conditions))
    form = next(f for f in W_FORMS if f.name == "path_matrix")
    (q, k, v), ex = _inputs(form)
    call(form, q, k, v, ex)
    assert reads == [4]  # w finite, beta finite, beta in [0, 2], beta |w|^2 <= 2


def test_triton_forms_count_it_in_the_launch_that_reads_w(monkeypatch):
    """No reduction of its own: ``|w_t|^2`` is the diagonal of the Gram matrix the preparation pass forms."""
    reductions = []
    original = checks.extremes
    monkeypatch.setattr(checks, "extremes", lambda x: reductions.append(tuple(x.shape)) or original(x))
    form = next(f for f in W_FORMS if f.name == "path_triton")
    (q, k, v), ex = _inputs(form)
    call(form, q, k, v, ex)
    assert reductions == []


def test_checked_after_holds_the_interpreters_warnings_back_until_the_check(monkeypatch):
    import pathedu._device

    monkeypatch.setattr(pathedu._device, "_MODE", "interpreter")
    bad = checks.range_condition(torch.tensor([3.0]), "x", 0, 1)
    good = checks.range_condition(torch.tensor([0.5]), "x", 0, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="`x`"):
            with checks.checked_after(bad):
                warnings.warn("overflow in the body", RuntimeWarning)
        assert not caught
        with checks.checked_after(good):
            warnings.warn("overflow in the body", RuntimeWarning)
    assert [str(c.message) for c in caught] == ["overflow in the body"]
