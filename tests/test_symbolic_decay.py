"""Chapter 2's sympy derivations (pathedu.symbolic.decay) and the induced distance (pathedu.symbolic.metric)."""
import math

import pytest
import sympy as sp
import torch

from pathedu import alibi
from pathedu.symbolic import decay, metric


# ---------------------------------------------------------------------------
# decay: product -> power -> exponential -> additive bias
# ---------------------------------------------------------------------------

def test_gate_product_is_a_power():
    P, value = decay.gate_product()
    assert isinstance(P, sp.Product)
    assert value == decay.gamma ** (decay.t - decay.j)
    assert decay.product_is_power() is sp.true
    # numerically: 5 gates of 0.9 between j = 2 and t = 7
    assert math.isclose(float(P.subs({decay.gamma: 0.9, decay.j: 2, decay.t: 7}).doit()), 0.9 ** 5)


def test_power_is_exponential_and_log_is_the_bias():
    eq, holds = decay.power_is_exponential()
    assert holds is sp.true
    assert sp.simplify(eq.lhs - eq.rhs) == 0
    eq, holds = decay.log_product_is_sum()
    assert holds is sp.true and isinstance(eq.rhs, sp.Sum)
    eq, holds = decay.alibi_bias_from_gate()
    assert holds is sp.true
    assert eq.rhs == -decay.lam * (decay.i - decay.j)
    # the bias is negative for a key in the past (j < i): distance is penalised
    assert eq.rhs.subs({decay.i: 5, decay.j: 2}).is_negative


def test_softmax_ignores_row_constant():
    diffs, holds = decay.softmax_ignores_row_constant(4)
    assert holds is sp.true and diffs == [0, 0, 0, 0]


def test_half_life():
    in_gamma, in_lam = decay.half_life()
    assert sp.simplify(in_gamma - (-sp.log(2) / sp.log(decay.gamma))) == 0
    assert sp.simplify(in_lam - sp.log(2) / decay.lam) == 0
    for g in [0.5, 0.9, 0.999]:
        assert math.isclose(float(in_gamma.subs(decay.gamma, g)), alibi.half_life(g), rel_tol=1e-12)
    g100 = decay.gamma_for_half_life(100)
    assert math.isclose(float(g100), 2 ** (-1 / 100), rel_tol=1e-15)
    assert sp.simplify(g100 ** 100 - sp.Rational(1, 2)) == 0
    H = sp.Symbol("H", positive=True)
    assert sp.simplify(decay.gamma_for_half_life(H) - 2 ** (-1 / H)) == 0


@pytest.mark.parametrize("slope", [2.0 ** -8, 0.0625, 0.5, 2.0])
def test_mass_beyond_matches_attention(slope):
    """With equal content scores, ALiBi's attention row is the normalised decay; its mass
    beyond distance d is the sympy closed form."""
    T = 300
    assert decay.d is decay.Delta  # the threshold's second name
    finite = sp.lambdify((decay.lam, decay.Delta, decay.T), decay.mass_beyond())
    infinite = sp.lambdify((decay.lam, decay.Delta), decay.mass_beyond(finite=False))
    q = torch.zeros(1, T, 16, dtype=torch.float64)  # q . k = 0 for every key: only the bias speaks
    k = torch.randn(1, T, 16, dtype=torch.float64)
    # one-hot values read the attention weights off the output: row[j] is the last query's weight of key j
    row = alibi.alibi_matrix(q, k, torch.eye(T, dtype=torch.float64)[None], slope)[0, -1]
    dist = torch.arange(T - 1, -1, -1, dtype=torch.float64)  # distance of key j from the last query
    for dd in [0, 1, 10, 100, 250]:
        measured = row[dist > dd].sum().item()
        assert math.isclose(measured, finite(slope, dd, T), rel_tol=1e-9, abs_tol=1e-300)
        assert measured <= infinite(slope, dd) + 1e-15  # a finite context only removes far keys


def test_mean_distance():
    mean = decay.mean_distance()
    assert sp.simplify(mean - 1 / (sp.exp(decay.lam) - 1)) == 0
    for slope in [0.01, 0.5, 3.0]:
        delta = torch.arange(200000, dtype=torch.float64)
        w = torch.exp(-slope * delta)
        assert math.isclose((delta * w).sum().item() / w.sum().item(), float(mean.subs(decay.lam, slope)), rel_tol=1e-9)
    # about 1/lambda for small slopes
    assert sp.limit(mean * decay.lam, decay.lam, 0) == 1


# ---------------------------------------------------------------------------
# metric: the induced distance is a quasi-metric
# ---------------------------------------------------------------------------

def test_distance_definition_and_conventions():
    cs = metric.step_costs(4)
    assert metric.distance(1, 3, cs) == cs[1] + cs[2]  # steps s = 2, 3
    assert metric.distance(2, 2, cs) == 0
    assert metric.distance(3, 1, cs) == sp.oo
    D = metric.distance_matrix(cs)
    assert D.shape == (5, 5)
    assert D[1, 3] == metric.distance(1, 3, cs)  # entry (j, i) is d(j, i): row = key j, column = query i
    assert all(D[key, query] == sp.oo for query in range(5) for key in range(query + 1, 5))
    # the book's letters: the cost of step s is -log f_s, a log gate named \log f_s
    assert [str(-x) for x in cs] == [rf"\log f_{{{k}}}" for k in range(1, 5)]
    assert all((-x).is_nonpositive for x in cs)


def test_axioms_with_symbolic_nonnegative_costs():
    p = metric.properties(metric.step_costs(4))
    assert p["nonnegative"] is sp.true
    assert p["zero on the diagonal"] is sp.true
    assert p["triangle inequality"] is sp.true
    assert p["equality along the line"] is sp.true
    assert p["symmetric"] is sp.false
    # with costs that may be zero, positivity is a condition on the costs, not a theorem
    assert p["positive off the diagonal"] not in (sp.true, sp.false)
    assert p["positive off the diagonal"].subs({x: -1 for x in metric.log_gates(4)}) is sp.true
    assert p["positive off the diagonal"].subs({metric.log_gates(4)[2]: 0}) is sp.false


def test_axioms_with_gates_below_one():
    p = metric.properties(metric.step_costs(4, positive=True))
    assert all(p[name] is sp.true for name in p if name != "symmetric")
    assert p["symmetric"] is sp.false


def test_axioms_for_constant_and_unit_gates():
    p = metric.properties(metric.constant_costs(4))  # ALiBi / RetNet
    assert p["positive off the diagonal"] is sp.true and p["symmetric"] is sp.false
    p = metric.properties(metric.costs_from_gates([1, 1, 1]))  # NoPE / plain linear attention
    assert p["positive off the diagonal"] is sp.false  # a pseudo-quasi-metric
    assert p["triangle inequality"] is sp.true and p["zero on the diagonal"] is sp.true
    p = metric.properties(metric.costs_from_gates([2, sp.Rational(1, 2)]))  # a gate > 1 is not a forget gate
    assert p["nonnegative"] is sp.false


def test_line_additivity_general_indices():
    eq, holds = metric.line_additivity()
    assert holds is sp.true
    assert eq.rhs == -sp.Sum(sp.log(metric.f[metric.s]), (metric.s, metric.j + 1, metric.i))
    assert "c" not in {str(x) for x in eq.free_symbols}  # no cumulative gate c in a sum of steps
    assert metric.distance_sum(metric.i, metric.i).doit() == 0
    assert sp.simplify(metric.distance_sum(cost=metric.lam).doit() - metric.lam * (metric.i - metric.j)) == 0


def test_distance_is_alibi_bias_and_decay():
    """-d(j, i) is ALiBi's bias G_ij, exp(-d) RetNet's decay matrix, for constant costs lambda."""
    slope = 0.375
    D = metric.distance_matrix(metric.constant_costs(6, slope))
    neg = -torch.tensor([[float(x) for x in D.row(r)] for r in range(7)], dtype=torch.float64).T
    assert torch.equal(torch.isinf(neg), torch.isinf(alibi.alibi_bias(7, slope)))
    assert torch.allclose(neg, alibi.alibi_bias(7, slope), rtol=1e-15, atol=0)
    assert torch.allclose(torch.exp(neg), alibi.retnet_decay(7, alibi.slope_to_gamma(slope)), rtol=1e-14, atol=0)


def test_metric_bad_input():
    cs = metric.step_costs(3)
    with pytest.raises(ValueError, match="`i`"):
        metric.distance(0, 4, cs)
    with pytest.raises(ValueError, match="`j`"):
        metric.distance(-1, 2, cs)
    with pytest.raises(TypeError, match="`j`"):
        metric.distance(1.0, 2, cs)
    with pytest.raises(ValueError, match="`n`"):
        metric.step_costs(-1)
    with pytest.raises(TypeError, match="`n`"):
        metric.constant_costs(2.5)
