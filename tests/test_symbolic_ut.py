"""Chapter 5: the sympy derivations behind PaTH and DeltaNet hold exactly (and the wrong variants do not)."""
import time

import pytest
import sympy as sp
import torch

from pathedu import path
from pathedu.symbolic import ut


@pytest.mark.parametrize("C, D", [(2, 2), (3, 2), (3, 3), (4, 2)])
def test_ut_identity_holds_in_both_orders(C, D):
    assert ut.ut_identity(C, D, variant="correct")
    assert ut.ut_identity(C, D, variant="transposed")


@pytest.mark.parametrize("C, D", [(2, 2), (3, 2), (4, 3)])
def test_ut_identity_fails_in_the_wrong_order(C, D):
    assert not ut.ut_identity(C, D, variant="wrong_order")
    assert ut.ut_residual(C, D, variant="wrong_order") != sp.zeros(D, D)


def test_paper_typing_fails():
    with pytest.raises(sp.ShapeError):  # W D W^T with W (3 x 2), D (3 x 3)
        ut.ut_identity(3, 2, variant="paper")
    assert not ut.ut_identity(3, 3, variant="paper")  # type-checks when D = C, but is false
    assert not ut.ut_identity(2, 2, variant="paper")


def test_residual_is_the_zero_matrix():
    R = ut.ut_residual(3, 2)
    assert R == sp.zeros(2, 2)
    with pytest.raises(ValueError, match="`variant`"):
        ut.ut_residual(3, 2, variant="reversed")


def test_gram_factor_entries():
    """L is lower triangular with beta on the diagonal; L_10 = -beta_0 beta_1 g_01."""
    L = ut.gram_ut_factor(3)
    b0, b1, b2 = ut.betas(3)
    g01 = sp.Symbol("g_{01}", real=True)
    assert L.is_lower and [L[t, t] for t in range(3)] == [b0, b1, b2]
    assert sp.expand(L[1, 0] + b0 * b1 * g01) == 0
    assert str(L[2, 0]) == "beta_0*beta_2*(beta_1*g_{01}*g_{12} - g_{02})"  # deterministic printing


def test_gram_factor_matches_the_vector_factor():
    """Substituting g_st = w_s . w_t into the Gram form gives the factor built from the vectors."""
    W, b = ut.vectors(3, 2), ut.betas(3)
    L = ut.ut_factor(W, b)
    subs = {sp.Symbol(f"g_{{{s}{t}}}", real=True): (W.row(s) * W.row(t).T)[0, 0] for s in range(3) for t in range(s, 3)}
    assert (ut.gram_ut_factor(3).subs(subs) - L).applyfunc(sp.expand) == sp.zeros(3, 3)


def test_symbolic_factor_agrees_with_the_torch_module():
    W, b = ut.vectors(4, 3), ut.betas(4)
    L = ut.ut_factor(W, b)
    g = torch.Generator().manual_seed(0)
    w_num, b_num = torch.randn(4, 3, generator=g, dtype=torch.float64), 2 * torch.rand(4, generator=g, dtype=torch.float64)
    subs = {W[t, d]: w_num[t, d].item() for t in range(4) for d in range(3)} | {b[t]: b_num[t].item() for t in range(4)}
    L_num = torch.tensor(L.subs(subs).tolist(), dtype=torch.float64)
    assert torch.allclose(L_num, path.ut_transform(w_num, b_num)[1], atol=1e-12)


@pytest.mark.parametrize("C, D", [(3, 2), (4, 2)])
def test_masked_sub_interval_identity(C, D):
    assert ut.masked_interval_identity(C, D)


def test_masked_sub_interval_needs_the_global_factor_restricted():
    """H_1 H_0 from the global factor; with L^T (the other order inside the interval) it fails."""
    W, b = ut.vectors(3, 2), ut.betas(3)
    L = ut.ut_factor(W, b)
    P = ut.product(W, b, order="decreasing", start=0, stop=2)  # H_1 H_0
    assert (P - ut.interval_from_factor(W, L, -1, 1)).applyfunc(sp.expand) == sp.zeros(2, 2)
    wrong = ut.interval_from_factor(W, L.T, -1, 1)  # the other order inside the interval
    assert (P - wrong).applyfunc(sp.expand) != sp.zeros(2, 2)


@pytest.mark.parametrize("C, D, Dv", [(2, 2, 1), (3, 2, 1), (3, 2, 2)])
def test_deltanet_pseudo_values_from_the_unrolled_recurrence(C, D, Dv):
    assert ut.deltanet_identity(C, D, Dv)


def test_deltanet_pseudo_value_of_the_second_token():
    """u_1 = beta_1 (v_1 - beta_0 (k_0 . k_1) v_0): what token 1 writes after correcting for token 0."""
    U = ut.deltanet_pseudo_values(2, 2, 1)
    K, V, (b0, b1) = ut.vectors(2, 2, "k"), ut.vectors(2, 1, "v"), ut.betas(2)
    c = (K.row(0) * K.row(1).T)[0, 0]
    assert sp.expand(U[1, 0] - b1 * (V[1, 0] - b0 * c * V[0, 0])) == 0
    assert sp.expand(U[0, 0] - b0 * V[0, 0]) == 0


@pytest.mark.parametrize("T, block", [(4, 2), (5, 2), (6, 2), (5, 3)])
def test_blockwise_query_update_identity(T, block):
    assert ut.blockwise_identity(T, 2, block)


def test_blockwise_query_update_in_the_wrong_order_fails():
    assert not ut.blockwise_identity(6, 2, 2, transpose_update=True)  # the middle block {2, 3}
    assert ut.blockwise_identity(4, 2, 2, transpose_update=True)  # no middle block: the update is never used


def test_each_derivation_is_fast():
    for f, args in [(ut.ut_identity, (4, 3)), (ut.masked_interval_identity, (4, 3)),
                    (ut.deltanet_identity, (4, 2, 2)), (ut.blockwise_identity, (6, 2, 2))]:
        start = time.perf_counter()
        assert f(*args)
        assert time.perf_counter() - start < 10, f.__name__


def test_the_ut_form_by_induction():
    """The induction step holds for a generic lower-triangular L (free symbols), fails with the other sign, and
    appends exactly the closed form's last row (forward substitution)."""
    assert ut.ut_induction_step(1, 2) and ut.ut_induction_step(2, 3)
    assert not ut.ut_induction_step(2, 3, sign=+1)
    assert ut.ut_recurrence_is_forward_substitution(1, 2) and ut.ut_recurrence_is_forward_substitution(3, 2)
