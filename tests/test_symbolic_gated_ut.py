"""Chapter 7: the sympy derivations behind PaTH-FoX, the gated Householder RNN and Gated DeltaNet hold exactly
(and the wrong variants do not), and they agree with the torch module."""
import time

import pytest
import sympy as sp
import torch

from pathedu import pathfox
from pathedu.symbolic import gated_ut as gut
from pathedu.symbolic import ut


@pytest.mark.parametrize("L, D", [(2, 2), (3, 2), (3, 3)])
def test_gated_ut_identity_holds_in_both_orders(L, D):
    assert gut.gated_ut_identity(L, D, variant="increasing")
    assert gut.gated_ut_identity(L, D, variant="decreasing")


def test_gated_ut_identity_fails_in_the_wrong_order():
    assert not gut.gated_ut_identity(3, 2, variant="wrong_order")
    assert gut.gated_ut_residual(3, 2, variant="wrong_order") != sp.zeros(2, 2)
    with pytest.raises(ValueError, match="`variant`"):
        gut.gated_ut_residual(3, 2, variant="reversed")


def test_the_gates_factor_out_of_the_product():
    """(a_0 H_0)(a_1 H_1)(a_2 H_2) = a_0 a_1 a_2 H_0 H_1 H_2: the UT factor needs no decay."""
    W, b, a = ut.vectors(3, 2), ut.betas(3), gut.gates(3)
    gated = gut.gated_product(W, b, a)
    assert (gated - a[0] * a[1] * a[2] * ut.product(W, b, order="increasing")).applyfunc(sp.expand) == sp.zeros(2, 2)


def test_gate_products():
    a = gut.gates(4)
    assert gut.gate_product(a, 2, 2) == 1 and gut.gate_product(a, 3, 1) == 0
    assert gut.gate_product(a, 0, 3) == a[1] * a[2] * a[3] and gut.gate_product(a, -1, 1) == a[0] * a[1]
    G = gut.gamma_matrix(a)
    assert G.is_lower and all(G[t, t] == 1 for t in range(4)) and G[3, 1] == a[2] * a[3]


@pytest.mark.parametrize("L, D, Dv", [(2, 2, 1), (3, 2, 1)])
def test_gated_chunk_pieces_are_the_unrolled_recurrence(L, D, Dv):
    assert gut.gated_chunk_identity(L, D, Dv)
    assert gut.gated_chunk_residual(L, D, Dv) == sp.zeros(Dv, L + D)


@pytest.mark.parametrize("L, D, Dv", [(2, 2, 1), (3, 2, 1), (3, 2, 2)])
def test_gated_deltanet_pseudo_values_from_the_unrolled_recurrence(L, D, Dv):
    assert gut.gated_deltanet_identity(L, D, Dv)
    assert gut.gated_deltanet_residual(L, D, Dv) == sp.zeros(Dv, D)


def test_gated_deltanet_without_the_delta_term_fails():
    """The notes' row S_t = a_t S_{t-1} + beta_t v_t k_t^T: off by a_1 beta_0 beta_1 (k_0 . k_1) v_0 k_1^T at L = 2."""
    assert not gut.gated_deltanet_identity(3, 2, 1, variant="no_delta")
    R = gut.gated_deltanet_residual(2, 2, 1, variant="no_delta")
    K, V, (b0, b1), (_, a1) = ut.vectors(2, 2, "k"), ut.vectors(2, 1, "v"), ut.betas(2), gut.gates(2)
    c = (K.row(0) * K.row(1).T)[0, 0]
    assert (R - a1 * b0 * b1 * c * V[0, 0] * K.row(1)).applyfunc(sp.expand) == sp.zeros(1, 2)
    with pytest.raises(ValueError, match="`variant`"):
        gut.gated_deltanet_identity(2, 2, 1, variant="delta")


def test_gated_deltanet_pseudo_value_of_the_second_token():
    """u_1 = beta_1 (v_1 - a_1 beta_0 (k_0 . k_1) v_0): the correction sees the *decayed* first write."""
    U = gut.gated_deltanet_pseudo_values(2, 2, 1)
    K, V, (b0, b1), (_, a1) = ut.vectors(2, 2, "k"), ut.vectors(2, 1, "v"), ut.betas(2), gut.gates(2)
    c = (K.row(0) * K.row(1).T)[0, 0]
    assert sp.expand(U[1, 0] - b1 * (V[1, 0] - a1 * b0 * c * V[0, 0])) == 0
    assert sp.expand(U[0, 0] - b0 * V[0, 0]) == 0


def test_gated_deltanet_chunk_from_a_state():
    assert gut.gated_deltanet_chunk_identity(3, 2, 1)


def test_gated_deltanet_is_weight_decay_then_a_gradient_step():
    assert gut.gated_deltanet_gradient_step(2, 2) == sp.zeros(2, 2)


def test_symbolic_pseudo_values_agree_with_the_torch_module():
    """Substitute numbers into U and compare the outputs O = (Q K^T * Gamma * M) U with gated_deltanet_matrix."""
    L, D, Dv = 3, 2, 2
    U = gut.gated_deltanet_pseudo_values(L, D, Dv)
    K, V, b, a = ut.vectors(L, D, "k"), ut.vectors(L, Dv, "v"), ut.betas(L), gut.gates(L)
    g = torch.Generator().manual_seed(0)
    q_n, k_n, v_n = (torch.randn(L, d, generator=g, dtype=torch.float64) for d in (D, D, Dv))
    b_n, a_n = 2 * torch.rand(L, generator=g, dtype=torch.float64), 0.2 + 0.8 * torch.rand(L, generator=g, dtype=torch.float64)
    subs = {K[t, d]: k_n[t, d].item() for t in range(L) for d in range(D)}
    subs |= {V[t, d]: v_n[t, d].item() for t in range(L) for d in range(Dv)}
    subs |= {b[t]: b_n[t].item() for t in range(L)} | {a[t]: a_n[t].item() for t in range(L)}
    U_n = torch.tensor(U.subs(subs).tolist(), dtype=torch.float64)
    Gam = torch.tensor(gut.gamma_matrix(a).subs(subs).tolist(), dtype=torch.float64)
    O = ((q_n @ k_n.T) * Gam) @ U_n
    assert torch.allclose(pathfox.gated_deltanet_matrix(q_n, k_n, v_n, b_n, torch.log(a_n)), O, atol=1e-12)


def test_each_derivation_is_fast():
    for f, args in [(gut.gated_ut_identity, (3, 3)), (gut.gated_chunk_identity, (3, 2, 1)),
                    (gut.gated_deltanet_identity, (3, 2, 2)), (gut.gated_deltanet_chunk_identity, (3, 2, 1))]:
        start = time.perf_counter()
        assert f(*args)
        assert time.perf_counter() - start < 5, f.__name__
