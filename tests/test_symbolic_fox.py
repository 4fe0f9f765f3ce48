"""Chapter 3's sympy derivations (pathedu.symbolic.fox): the book's letters, 0-based positions."""
import math

import pytest
import sympy as sp
import torch

from pathedu.symbolic import fox as sym


def names(expr) -> set[str]:
    return {str(x) for x in expr.free_symbols}


def test_gate_product_is_the_exponential_of_the_log_sum():
    for n in (1, 2, 5):
        r = sym.gate_product_log_sum(n)
        assert r["equal"]
        assert names(r["product"]) == {f"f_{s}" for s in range(1, n + 1)}  # the gates s = 1 .. n


def test_fox_readings_in_the_books_letters():
    r = sym.gated_softmax_is_biased_softmax(3)
    assert r["equal"] and r["query"] == 2
    # query i = 2 and keys j = 0, 1, 2: scores Z_ij, the scale tau and log gates G_ij, G_ii = 0
    want = {"tau", "Z_{2,0}", "Z_{2,1}", "Z_{2,2}", "G_{2,0}", "G_{2,1}"}
    for side in ("multiplicative", "additive"):
        assert all(names(w) == want for w in r[side])
    assert r["log_gates"][-1] == 0
    # the additive side's numerators are one exponential each, e^{tau Z_ij + G_ij}
    assert r["additive"][0].args[0] == sp.exp(sym.tau * r["scores"][0] + r["log_gates"][0])
    for n in (1, 4):
        assert sym.gated_softmax_is_biased_softmax(n)["equal"]


def test_fox_readings_agree_with_numbers():
    r = sym.gated_softmax_is_biased_softmax(3)
    g = torch.Generator().manual_seed(0)
    values = {s: float(torch.randn((), generator=g)) for s in r["scores"] + r["log_gates"][:-1]}
    values[sym.tau] = 0.35
    Z = torch.tensor([values[s] for s in r["scores"]], dtype=torch.float64)
    G = torch.tensor([values[s] for s in r["log_gates"][:-1]] + [0.0], dtype=torch.float64)
    want = torch.softmax(0.35 * Z + G, -1)
    for side in ("multiplicative", "additive"):
        got = [float(w.subs(values).doit()) for w in r[side]]
        assert torch.allclose(torch.tensor(got, dtype=torch.float64), want, rtol=1e-12, atol=0)


def test_per_channel_gate_in_the_books_letters():
    r = sym.per_channel_gate_reading(2)
    assert r["rescaled_equal"] and r["shared_is_scalar"] and not r["per_channel_is_scalar"]
    assert names(r["weight"]) == {"q_{i,0}", "q_{i,1}", "k_{j,0}", "k_{j,1}",
                                  "c_{i,0}", "c_{i,1}", "c_{j,0}", "c_{j,1}"}
    c_i, c_j = sp.symbols("c_i c_j", real=True)
    assert sp.simplify(r["shared_factor"] - sp.exp(c_i - c_j)) == 0
    assert sym.per_channel_gate_reading(3)["rescaled_equal"]


def test_rescaling_overflow_is_0_based():
    o = sym.rescaling_overflow(6, -20.0)
    assert o["bias_nonpositive"] and o["key_nonnegative"]
    assert set(o["bias_exponents"]) == {(i, j) for i in range(6) for j in range(i + 1)}
    assert names(o["cumulative"][0]) == {r"\log f_{0}"}  # c_0 = log f_0
    t = o["overflow_position"]
    assert t == 4 and o["gates_at_overflow"] == 5
    # the claim, in float32, with c_t = (t + 1) log f: e^{-c_{t-1}} is finite, e^{-c_t} is not
    c = torch.cumsum(torch.full((6,), -20.0, dtype=torch.float32), 0)
    overflows = torch.isinf(torch.exp(-c))
    assert not overflows[:t].any() and overflows[t:].all()
    assert math.isclose(o["max_exponent"], 88.7228, abs_tol=1e-4)


def test_bad_input():
    with pytest.raises(ValueError, match="`n`"):
        sym.gate_product_log_sum(0)
    with pytest.raises(ValueError, match="`n`"):
        sym.gated_softmax_is_biased_softmax(0)
    with pytest.raises(ValueError, match="`D`"):
        sym.per_channel_gate_reading(1)
    with pytest.raises(ValueError, match="`log_f`"):
        sym.rescaling_overflow(4, 0.5)
