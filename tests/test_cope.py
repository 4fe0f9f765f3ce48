"""CoPE: every form against a brute-force float64 reference, the chapter's claims about the
positions (the diagonal is one gate, counts grow right to left, open gates count tokens like
relative positions, selective gates count selected tokens), clamping, the Triton kernel in the
interpreter, ``pos_emb``'s own errors, and the sympy facts.  (Shapes, T = 0, autograd and
non-finite causality of every form are the contract test's: tests/test_contract.py.)"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from helpers import TOL_F64, TOL_TRITON, rand_qkv, rel_err

from pathedu import cope
from pathedu.kernels.cope import cope_attention
from pathedu.symbolic import cope as sym

D = 16


# ---------------------------------------------------------------------------
# The reference, written independently of the module: loops over (head, i, j), each count summed
# gate by gate over m = j..i, the vector e(p) interpolated with math.floor / math.ceil.
# ---------------------------------------------------------------------------

def reference(q, k, v, pos_emb, scale=None):
    q, k, v, pos_emb = (x.detach().double() for x in (q, k, v, pos_emb))
    lead, T, Dq = q.shape[:-2], q.shape[-2], q.shape[-1]
    scale = Dq ** -0.5 if scale is None else scale
    P = pos_emb.shape[-2]
    E = pos_emb.expand(lead + pos_emb.shape[-2:]).reshape(-1, P, Dq).numpy()
    Q, K, V = (x.reshape((-1,) + x.shape[-2:]).numpy() for x in (q, k, v))
    out = np.zeros(V.shape)
    for b in range(Q.shape[0]):
        for i in range(T):
            z = [scale * float(Q[b, i] @ K[b, m]) for m in range(i + 1)]
            gate = [1 / (1 + math.exp(-x)) for x in z]
            logits = []
            for j in range(i + 1):
                p = min(max(sum(gate[m] for m in range(j, i + 1)), 0.0), P - 1.0)
                lo, hi = math.floor(p), math.ceil(p)
                w = p - lo
                e = (1 - w) * E[b, lo] + w * E[b, hi]
                logits.append(z[j] + float(Q[b, i] @ e))
            a = np.exp(np.array(logits) - max(logits))
            out[b, i] = (a / a.sum()) @ V[b, : i + 1]
    return torch.from_numpy(out).reshape(lead + (T, V.shape[-1]))


def table(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64)


# (id, lead, T, Dv, pos_emb's leading dims, P, scale)
CASES = [
    ("T1", (), 1, 16, (), 5, None),
    ("per_head_clamped", (2,), 13, 24, (2,), 4, None),          # P < T: far keys are clamped to E[P-1]
    ("broadcast_P1", (2, 3), 9, 16, (3,), 1, None),             # one table per head of the last dim; P = 1
    ("many_lead_P_large", (1, 2), 17, 8, (1, 2), 40, 0.3),       # no clamping; an explicit scale
]
FORMS = {
    "naive": cope.cope_naive,
    "recurrent_page4": lambda *a, **kw: cope.cope_recurrent(*a, page=4, **kw),
    "matrix": cope.cope_matrix,
    "blockwise_4x3": lambda *a, **kw: cope.cope_blockwise(*a, block_m=4, block_n=3, **kw),
    "blockwise_3x8": lambda *a, **kw: cope.cope_blockwise(*a, block_m=3, block_n=8, **kw),
    "blockwise": cope.cope_blockwise,
}
_REFS = {}


def case_inputs(case, seed=0):
    cid, lead, T, Dv, pe_lead, P, scale = case
    q, k, v = rand_qkv(lead, T, D, Dv, seed=seed + T)
    return q, k, v, table(pe_lead + (P, D), seed + T), scale


def case_reference(case):
    if case[0] not in _REFS:
        q, k, v, E, scale = case_inputs(case)
        _REFS[case[0]] = reference(q, k, v, E, scale)
    return _REFS[case[0]]


@pytest.mark.parametrize("name", FORMS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_every_form_matches_the_brute_force_reference(case, name):
    q, k, v, E, scale = case_inputs(case)
    out = FORMS[name](q, k, v, E, scale=scale)
    assert out.shape == q.shape[:-1] + (v.shape[-1],) and out.dtype == torch.float64
    assert rel_err(out, case_reference(case)) <= TOL_F64


def test_clamping_happens_in_the_clamped_case_and_matters():
    """The case with P < T really clamps (counts beyond P - 1), and the reference without the clamp
    (a larger table whose extra rows differ) gives other numbers: the clamp is exercised."""
    case = CASES[1]
    q, k, v, E, _ = case_inputs(case)
    P = E.shape[-2]
    assert cope.cope_positions(q, k).max() > P - 1
    bigger = torch.cat([E, table(E.shape[:-2] + (20, D), 9)], dim=-2)
    assert rel_err(cope.cope_matrix(q, k, v, bigger), case_reference(case)) > 1e-3


def test_reduced_precision_inputs_compute_in_float32():
    q, k, v, E, _ = case_inputs(CASES[1])
    ref = case_reference(CASES[1])
    for dt in (torch.float32, torch.float16):
        out = cope.cope_matrix(q.to(dt), k.to(dt), v.to(dt), E.to(dt))
        assert out.dtype == dt and rel_err(out, ref) <= (1e-5 if dt == torch.float32 else 1e-2)


# ---------------------------------------------------------------------------
# The positions
# ---------------------------------------------------------------------------

def test_positions_the_diagonal_is_one_gate_and_counts_grow_right_to_left():
    q, k, _ = rand_qkv((2,), 12, D, seed=3)
    z = D ** -0.5 * q @ k.transpose(-1, -2)
    p = cope.cope_positions(q, k)
    assert p.shape == (2, 12, 12) and p.dtype == torch.float64
    assert torch.allclose(p.diagonal(dim1=-2, dim2=-1), torch.sigmoid(z.diagonal(dim1=-2, dim2=-1)), atol=1e-15)
    for i in range(12):
        for j in range(i):
            # one more gate each step to the left: p_ij - p_i,j+1 = sigmoid(z_ij) > 0
            assert p[..., i, j].sub(p[..., i, j + 1]).sub(torch.sigmoid(z[..., i, j])).abs().max() < 1e-13
            assert (p[..., i, j] > p[..., i, j + 1]).all()
    assert (p.triu(1) == 0).all()
    clamped = cope.cope_positions(q, k, P=3)
    assert torch.equal(clamped, p.clamp(max=2.0))


def _open_gates(lead, T, seed, Dv=D):
    """Queries and keys whose every logit is >= 40 (gates 1 to within 5e-18): a shared large channel."""
    q, k, v = rand_qkv(lead, T, D, Dv, seed=seed)
    q, k = q.clone(), k.clone()
    q[..., 0], k[..., 0] = 20.0, 20.0  # scale * 400 = 100 from channel 0 alone
    return q, k, v


def test_open_gates_count_tokens_like_relative_positions():
    """All gates -> 1: ``p_ij = i - j + 1``, and CoPE is softmax attention with the relative-position
    term ``q_i . E[min(i - j + 1, P - 1)]``."""
    T, P = 10, 6
    q, k, v = _open_gates((2,), T, seed=4, Dv=24)
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    relative = (i - j + 1).double().tril()
    assert (cope.cope_positions(q, k) - relative).abs().max() < 1e-12
    E = table((2, P, D), 4)
    logits = D ** -0.5 * q @ k.transpose(-1, -2)
    logits = logits + torch.einsum("...id,...ijd->...ij", q, E[:, (i - j + 1).clamp(0, P - 1)])
    logits = logits.masked_fill(j > i, float("-inf"))
    want = torch.softmax(logits, -1) @ v
    for form in FORMS.values():
        assert rel_err(form(q, k, v, E), want) <= 1e-10


def test_selective_gates_count_only_the_selected_tokens():
    """Gates open on marked keys only (a sentence end, a chosen word): the position counts the marked
    keys between key and query (both included), whatever the distance."""
    T = 14
    q, k, _ = rand_qkv((), T, D, seed=5)
    marked = torch.zeros(T, dtype=torch.bool)
    marked[[2, 3, 7, 12]] = True
    q, k = q.clone() * 0.01, k.clone() * 0.01
    q[..., 0] = 20.0
    k[..., 0] = torch.where(marked, 20.0, -20.0)  # logits +-100: gates 1 or 0 (to 4e-44)
    count = torch.tensor([[marked[j:i + 1].sum().item() if j <= i else 0 for j in range(T)] for i in range(T)])
    assert (cope.cope_positions(q, k) - count.double()).abs().max() < 1e-12


# ---------------------------------------------------------------------------
# The Triton kernel in the interpreter (small sizes)
# ---------------------------------------------------------------------------

TRITON_CASES = [  # (id, lead, T, Dv, pos_emb's leading dims, P, block)
    ("T1", (), 1, 16, (), 5, None),
    ("three_tiles_per_head_clamped", (2,), 40, 24, (2,), 4, 16),  # carries across tiles; T no multiple of 16
    ("P1_one_tile", (1,), 37, 16, (), 1, None),
]


@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: c[0])
def test_triton_fp32_matches_the_float64_reference(case):
    _, lead, T, Dv, pe_lead, P, block = case
    q, k, v = rand_qkv(lead, T, D, Dv, seed=T)
    E = table(pe_lead + (P, D), T)
    ref = cope.cope_matrix(q, k, v, E)
    out = cope_attention(q.float(), k.float(), v.float(), E.float(), block=block)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert rel_err(out, ref) <= TOL_TRITON[torch.float32]
    if case[0] == "three_tiles_per_head_clamped":
        assert rel_err(out, reference(q, k, v, E)) <= TOL_TRITON[torch.float32]
        assert rel_err(cope.cope_triton(q.float(), k.float(), v.float(), E.float()), ref) <= TOL_TRITON[torch.float32]


def test_triton_16_bit_inputs():
    q, k, v = rand_qkv((2,), 21, D, 24, seed=6)
    E = table((P := 5, D), 6)
    for dt in (torch.float16, torch.bfloat16):
        args = [x.to(dt) for x in (q, k, v, E)]
        out = cope.cope_triton(*args)
        assert out.dtype == dt
        assert rel_err(out, cope.cope_matrix(*(x.double() for x in args))) <= 1e-2, (dt, P)


def test_triton_checks_its_block():
    q, k, v = rand_qkv((), 5, D, seed=7, dtype=torch.float32)
    E = torch.randn(3, D)
    for block, exc in [(24, ValueError), (8, ValueError), (256, ValueError), (16.0, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="`block`"):
            cope_attention(q, k, v, E, block=block)


# ---------------------------------------------------------------------------
# Bad input: pos_emb's own errors (the generic ones are the contract test's)
# ---------------------------------------------------------------------------

BAD_POS_EMB = [  # (id, make(E) from a valid (2, 3, P, D) table, exception, message fragment)
    ("not_a_tensor", lambda E: E.numpy(), TypeError, "`pos_emb` must be a torch.Tensor"),
    ("integer", lambda E: E.long(), TypeError, "`pos_emb` must have a floating dtype"),
    ("one_dim", lambda E: E[0, 0, 0], ValueError, "`pos_emb` must have shape"),
    ("head_dim", lambda E: E[..., :8], ValueError, "head dim of `pos_emb` (8)"),
    ("P_zero", lambda E: E[..., :0, :], ValueError, "`pos_emb` must hold at least one position (P >= 1)"),
    ("lead_mismatch", lambda E: E[:, :2], ValueError, "`pos_emb` of shape (2, 2, 5, 16) does not broadcast"),
    ("more_lead_than_q", lambda E: E[None, None], ValueError, "does not broadcast"),
    ("nan", lambda E: E.index_put((torch.tensor(1),), torch.tensor(float("nan"), dtype=E.dtype)), ValueError,
     "`pos_emb` must be finite"),
    ("inf", lambda E: E.index_put((torch.tensor(0),), torch.tensor(float("inf"), dtype=E.dtype)), ValueError,
     "`pos_emb` must be finite"),
    ("meta", lambda E: E.to("meta"), ValueError, "`pos_emb` is on the meta device"),
]
ALL_FORMS = [cope.cope_naive, cope.cope_recurrent, cope.cope_matrix, cope.cope_blockwise, cope.cope_triton]


@pytest.mark.parametrize("form", ALL_FORMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", BAD_POS_EMB, ids=lambda b: b[0])
def test_bad_pos_emb_names_the_argument(bad, form):
    _, make, exc, needle = bad
    q, k, v = rand_qkv((2, 3), 4, D, seed=8, dtype=torch.float32)
    E = torch.randn(2, 3, 5, D)
    with pytest.raises(exc, match=re.escape(needle)):
        form(q, k, v, make(E))


def test_good_pos_emb_layouts_are_accepted():
    q, k, v = rand_qkv((2, 3), 4, D, seed=8)
    E = table((2, 3, 5, D), 8)
    want = cope.cope_matrix(q, k, v, E)
    one = cope.cope_matrix(q, k, v, E[0, 0])  # one (P, D) table shared by every head
    assert rel_err(cope.cope_matrix(q, k, v, E[:1, :1].expand(2, 3, 5, D)), one) <= 1e-14
    assert rel_err(cope.cope_matrix(q, k, v, E[None, 0, 0]), one) <= 1e-14
    assert rel_err(cope.cope_naive(q, k, v, E.float()), want) <= 1e-6  # another float dtype than q: fine


def test_positions_refuse_a_bad_P():
    q, k, _ = rand_qkv((), 4, D, seed=9)
    for P, exc in [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="`P`"):
            cope.cope_positions(q, k, P=P)


# ---------------------------------------------------------------------------
# sympy
# ---------------------------------------------------------------------------

def test_symbolic_interpolation_is_the_piecewise_linear_function_through_the_rows():
    r = sym.interpolation(4)
    for key in ("at_integers", "continuous", "linear", "kinks", "clamped", "floor_ceil_agrees"):
        assert r[key] is True, key
    e0, e1, e2 = r["rows"][:3]
    assert r["slopes"][:2] == [e1 - e0, e2 - e1]


def test_symbolic_scalars_first_equals_vector_first():
    r = sym.scalar_interpolation(D=3, P=3)
    assert r["equal_on_pieces"] is True and r["equal_with_weight"] is True
    assert sym.open_gates_count()["equal"] is True
    with pytest.raises(ValueError, match="`P`"):
        sym.interpolation(1)


# ---------------------------------------------------------------------------
# The Triton backward (two sweeps), in the interpreter: what the contract test does not cover
# ---------------------------------------------------------------------------

def _all_grads(fn, q, k, v, E, g, **kw):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, E)]
    return torch.autograd.grad(fn(*leaves, **kw), leaves, g)


def _fractional_distance(q, k, P):
    """How far the unclamped counts below P - 1 are from the nearest integer (where floor and ceil jump)."""
    p = cope.cope_positions(q, k)
    inside = (p > 0) & (p < P - 1)
    return (p[inside] - p[inside].round()).abs().min().item()


@pytest.mark.parametrize("scan", ["cumsum", "dot"])
@pytest.mark.parametrize("P", [3, 40])
def test_triton_gradients_away_from_integer_counts(P, scan):
    """Every gradient, ``pos_emb``'s included (one table per head), against float64 autograd through
    ``cope_matrix``, with counts that stay away from integers (the interpolation's kinks, where the kernel takes
    the right-hand slope and autograd 0): P = 3 clamps most keys, P = 40 none; tiles of 16 (several key blocks,
    carries and snapshots across them), both ways of summing inside a tile."""
    from pathedu.kernels import cope as kcope

    T = 37
    q, k, v = rand_qkv((2,), T, D, 24, seed=31)
    E = table((2, P, D), 31)
    assert _fractional_distance(q, k, P) > 1e-4
    g = torch.randn(2, T, 24, generator=torch.Generator().manual_seed(32), dtype=torch.float64)
    want = _all_grads(cope.cope_matrix, q, k, v, E, g)
    old = kcope._scan_mode
    kcope._scan_mode = lambda x: scan
    try:
        got = _all_grads(cope_attention, q.float(), k.float(), v.float(), E.float(), g.float(), block=16)
    finally:
        kcope._scan_mode = old
    if P == 3:
        assert cope.cope_positions(q, k).max() > P - 1  # clamped counts
    for name, a, b in zip(["q", "k", "v", "pos_emb"], got, want):
        assert a.shape == b.shape and torch.isfinite(a).all()
        assert rel_err(a, b) <= 1e-4, name


def test_triton_pos_emb_gradient_of_a_shared_table():
    """One ``(P, D)`` table for every head: its gradient sums over the heads (autograd through the pre-pass)."""
    q, k, v = rand_qkv((2, 2), 21, D, 16, seed=33)
    E = table((6, D), 33)
    g = torch.randn(2, 2, 21, 16, generator=torch.Generator().manual_seed(34), dtype=torch.float64)
    want = _all_grads(cope.cope_matrix, q, k, v, E, g)[3]
    got = _all_grads(cope.cope_triton, q.float(), k.float(), v.float(), E.float(), g.float())[3]
    assert got.shape == (6, D) and rel_err(got, want) <= 1e-4


@pytest.mark.parametrize("case", [("v", float("nan")), ("v", float("inf")), ("k", float("nan"))],
                         ids=lambda c: f"{c[0]}_{c[1]}")
def test_triton_gradients_keep_non_finite_inputs_confined(case):
    """A NaN/inf at position t leaves the gradients that do not depend on it finite and unchanged: dq_i for
    i < t (q_i reaches o_i only, which sees keys j <= i), and for a value every dv (no output's gradient with
    respect to a value reads the values); the rows that see it get a non-finite dq."""
    which, value = case
    T, t = 40, 21
    q, k, v = rand_qkv((1,), T, D, 16, dtype=torch.float32, seed=35)
    E = table((4, D), 35).float()
    g = torch.randn(1, T, 16, generator=torch.Generator().manual_seed(36))
    clean = _all_grads(cope_attention, q, k, v, E, g, block=16)
    x = {"k": k.clone(), "v": v.clone()}
    x[which][0, t, 3] = value
    dq, dk, dv, dE = _all_grads(cope_attention, q, x["k"], x["v"], E, g, block=16)
    assert torch.isfinite(dq[0, :t]).all() and torch.equal(dq[0, :t], clean[0][0, :t])
    if which == "v":
        assert torch.isfinite(dv).all() and torch.equal(dv, clean[2])
    assert not torch.isfinite(dq[0, t:]).all(-1).any()


@pytest.mark.parametrize("dtype, backward, block", [(torch.bfloat16, False, 32), (torch.bfloat16, True, 16),
                                                    (torch.float16, True, 16), (torch.float32, True, 32)])
def test_gpu_tiles_of_the_backward(monkeypatch, dtype, backward, block):
    """On a GPU the backward's sweeps of 16-bit inputs take 16-row tiles (32-row tiles gave wrong dk and dv on an
    H200 with triton 3.6: kernels/cope.py, ``_GPU_BWD_BLOCK_16BIT``); fp32 and the forward keep 32."""
    from types import SimpleNamespace

    import pathedu.kernels.cope as kc

    monkeypatch.setattr(kc, "interpreting", lambda: False)
    x = SimpleNamespace(dtype=dtype, n=SimpleNamespace(T=300))
    assert kc._tiles(x, backward=backward)["BLOCK"] == block
    assert kc._tiles(x, 64, backward=backward)["BLOCK"] == 64  # an explicit tile wins
