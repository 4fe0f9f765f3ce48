"""Regression cases for the reliability of the PyTorch reference forms (the "seams" issue).

Each test pins one failure the reference forms used to have; the generic promises
(every form, every tuning argument, autograd against the matrix form, NaN in ``v``
or ``k``) live in ``tests/test_contract.py``.  Here:

1. tuning arguments are checked even when nothing is computed (T = 0), and by the cache;
2. ``fox_recurrent`` keeps small gates after strong ones in float32;
3. decoding (the paged caches) is differentiable and still reads the cache page by page;
4. the forms built on a triangular solve accept float16 and bfloat16;
5. ``initial_state`` and the helpers' tensors on the ``meta`` device are refused by name;
6. a non-finite ``q``, ``k`` or ``v`` at position t never reaches an earlier output
   (small blocks, every sign of inf), and :func:`pathedu.masks.causal_matmul` is IEEE
   where a weight is nonzero;
7. a public form validates its arguments once (one host read for every value check).

References are float64 and written from the definitions.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from forms import FORMS, call
from helpers import rand_qkv, rel_err

from pathedu import alibi, cope, fox, nope, path, pathfox, rope, stickbreaking
from pathedu.masks import causal_matmul

TORCH_FORMS = [f for f in FORMS if f.kind != "triton"]


def unit_w_beta(lead, T, D, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = F.normalize(torch.randn(*lead, T, D, generator=g, dtype=torch.float64), dim=-1)
    return w, 2 * torch.rand(*lead, T, generator=g, dtype=torch.float64)


# ---------------------------------------------------------------------------
# References from the definitions (float64, loops: small T)
# ---------------------------------------------------------------------------

def fox_definition(q, k, v, log_f, scale):
    """``o_i = sum_{j<=i} softmax_j(scale q_i.k_j + sum_{s=j+1..i} log_f[s]) v_j``; each gate sum
    as a difference of float64 prefix sums (exact to ~1e-16 relative to |c|, ample here)."""
    q, k, v, log_f = (x.double() for x in (q, k, v, log_f))
    c = torch.cumsum(log_f, -1)
    T = q.shape[-2]
    logits = scale * q @ k.mT + (c[..., :, None] - c[..., None, :])
    logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(logits, -1) @ v


def householder(w_s, b_s):
    return torch.eye(w_s.shape[-1], dtype=w_s.dtype) - b_s[..., None, None] * w_s[..., :, None] * w_s[..., None, :]


def transition_scores(q, k, w, beta):
    """``k_j^T H_{j+1} ... H_i q_i`` for j <= i, ``H_s = I - beta_s w_s w_s^T``; ``None`` above the diagonal."""
    T = q.shape[-2]
    scores = [[None] * T for _ in range(T)]
    for i in range(T):
        P = torch.eye(q.shape[-1], dtype=q.dtype).expand(q.shape[:-2] + (q.shape[-1],) * 2)
        for j in range(i, -1, -1):  # P = H_{j+1} ... H_i
            scores[i][j] = torch.einsum("...a,...ab,...b->...", k[..., j, :], P, q[..., i, :])
            P = householder(w[..., j, :], beta[..., j]) @ P
    return scores


def path_definition(q, k, v, w, beta, scale):
    s = transition_scores(q, k, w, beta)
    outs = []
    for i in range(q.shape[-2]):
        p = torch.softmax(scale * torch.stack(s[i][: i + 1], -1), -1)
        outs.append(torch.einsum("...j,...jd->...d", p, v[..., : i + 1, :]))
    return torch.stack(outs, -2)


def path_logits_definition(q, k, w, beta, scale):
    s = transition_scores(q, k, w, beta)
    T = q.shape[-2]
    out = torch.full(q.shape[:-2] + (T, T), float("-inf"), dtype=q.dtype)
    for i in range(T):
        for j in range(i + 1):
            out[..., i, j] = scale * s[i][j]
    return out


def householder_definition(q, k, v, w, beta):
    s = transition_scores(q, k, w, beta)
    return torch.stack([sum(s[i][j][..., None] * v[..., j, :] for j in range(i + 1)) for i in range(q.shape[-2])], -2)


def deltanet_definition(q, k, v, beta):
    """``o_i = sum_{j<=i} beta_j (k_j^T H_{j+1} ... H_i q_i) v_j``, ``H_s = I - beta_s k_s k_s^T``."""
    return householder_definition(q, k, beta[..., None] * v, k, beta)


# ---------------------------------------------------------------------------
# 1. Tuning arguments
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("form", [f for f in TORCH_FORMS if f.tuning], ids=lambda f: f.name)
def test_tuning_arguments_are_checked_for_an_empty_sequence_too(form):
    """``page=-1`` gave all-NaN outputs and ``chunk=-1`` never-written memory; with T = 0 a bad
    value went through unnoticed.  It is refused whatever the input, naming the argument."""
    q, k, v = rand_qkv((2,), 0, 4, 3)
    ex = form.extras(q, k, v, 0)
    for name in form.tuning:
        for bad, exc in [(-1, ValueError), (0, ValueError), (2.5, TypeError), ("4", TypeError)]:
            with pytest.raises(exc, match=f"`{name}`"):
                call(form, q, k, v, ex, **{name: bad})


def test_caches_check_their_page():
    for cache in (nope.KVCache, fox.ForgetKVCache, path.PathKVCache):
        for bad, exc in [(-1, ValueError), (0, ValueError), (4.0, TypeError)]:
            with pytest.raises(exc, match="`page`"):
                cache((2,), 4, 3, 8, dtype=torch.float64, device="cpu", page=bad)


def test_gla_chunk_none_is_still_the_kernels_choice():
    q, k, v = rand_qkv((2,), 20, 4, 3)
    log_f = F.logsigmoid(torch.randn(2, 20, dtype=torch.float64) + 2)
    assert torch.equal(fox.gla_chunked(q, k, v, log_f, chunk=None), fox.gla_chunked(q, k, v, log_f, chunk=64))


# ---------------------------------------------------------------------------
# 2. fox_recurrent in float32: small gates after strong ones
# ---------------------------------------------------------------------------

FOX_T = 1200  # the smallest round T at which the float32 running total failed (2.9e-2 off)


def strong_then_weak_gates(T):
    log_f = torch.full((1, T), -1e-3, dtype=torch.float64)
    log_f[:, : T // 2] = -30.0
    return log_f


def test_fox_recurrent_keeps_small_gates_after_strong_ones():
    """After 600 gates of -30, |c| = 1.8e4, where float32's spacing is 2e-3: a float32 running
    total rounds every later gate of -1e-3 to a multiple of it.  The cache now keeps the
    cumulative gates in float64; the output is as close to the definition as the matrix form."""
    q, k, v = rand_qkv((1,), FOX_T, 8, seed=3)
    log_f = strong_then_weak_gates(FOX_T)
    ref = fox_definition(q, k, v, log_f, 8 ** -0.5)
    args32 = [x.float() for x in (q, k, v, log_f)]
    assert rel_err(fox.fox_matrix(*args32), ref) <= 1e-6
    assert rel_err(fox.fox_recurrent(*args32, page=256), ref) <= 1e-6

    # What the float32 running total did (the old cache), on the same inputs: far off.
    c32, running = torch.empty(FOX_T, dtype=torch.float32), torch.zeros((), dtype=torch.float32)
    for t in range(FOX_T):
        running = running + args32[3][0, t]
        c32[t] = running
    assert abs((c32[FOX_T // 2 + 1] - c32[FOX_T // 2]).item() + 1e-3) > 5e-4  # a gate of -1e-3, stored as ~-2e-3
    logits = (8 ** -0.5) * args32[0] @ args32[1].mT + (c32[:, None] - c32[None, :])
    logits = logits.masked_fill(~torch.ones(FOX_T, FOX_T, dtype=torch.bool).tril(), float("-inf"))
    old = torch.softmax(logits, -1) @ args32[2]
    assert rel_err(old, ref) > 1e-2


# ---------------------------------------------------------------------------
# 3. Decoding is differentiable and still paged
# ---------------------------------------------------------------------------

def test_decoding_gradients_match_finite_differences():
    """``nope|fox|path_recurrent`` raised "modified by an inplace operation" in backward: the
    caches wrote into preallocated tensors, and PaTH's updated its keys in place."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 5, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    log_f = F.logsigmoid(torch.randn(1, 5, generator=g, dtype=torch.float64)).requires_grad_()
    w, beta = unit_w_beta((1,), 5, 3, seed=6)
    w, beta = w.requires_grad_(), (0.2 + 0.8 * beta).requires_grad_()  # away from the ends of [0, 2]
    assert torch.autograd.gradcheck(lambda *a: nope.nope_recurrent(*a, page=2), (q, k, v))
    assert torch.autograd.gradcheck(lambda *a: fox.fox_recurrent(*a, page=2), (q, k, v, log_f))
    assert torch.autograd.gradcheck(lambda *a: path.path_recurrent(*a, page=2), (q, k, v, w, beta))


def test_path_cache_keeps_the_keys_autograd_needs():
    """A transition replaces each page of keys by its update; the page a query already read is
    left as it was (autograd needs it), and the cache holds H_t ... H_{j+1} k_j as before."""
    q, k, v = rand_qkv((2,), 6, 4, 3, seed=7)
    w, beta = unit_w_beta((2,), 6, 4, seed=8)
    cache = path.PathKVCache((2,), 4, 3, 6, dtype=torch.float64, device="cpu", page=4)
    for t in range(3):
        cache.step(k[..., t, :], v[..., t, :], w[..., t, :], beta[..., t])
    first_page, before = cache.k_pages[0], cache.k_pages[0].clone()
    cache.step(k[..., 3, :], v[..., 3, :], w[..., 3, :], beta[..., 3])
    assert torch.equal(first_page, before) and not torch.equal(cache.k_pages[0][..., :3, :], before)
    for j in range(4):
        P = torch.eye(4, dtype=torch.float64).expand(2, 4, 4)
        for s in range(j + 1, 4):  # H_{j+1} ... H_3
            P = P @ householder(w[..., s, :], beta[..., s])
        assert torch.allclose(cache.k[..., j, :], (P.mT @ k[..., j, :, None])[..., 0], atol=1e-12)


def test_decoding_reads_the_cache_page_by_page():
    q, k, v = rand_qkv((2,), 9, 4, 3, seed=9)
    cache = nope.KVCache((2,), 4, 3, 9, dtype=torch.float64, device="cpu", page=4)
    for t in range(9):
        cache.append(k[..., t, :], v[..., t, :])
    assert [p.shape[-2] for p in cache.k_pages] == [4, 4, 1] and torch.equal(cache.k, k) and torch.equal(cache.v, v)
    seen = []
    out = cache.attend(q[..., 8, :], 0.5, bias=lambda start, end: seen.append((start, end)) or 0.0)
    assert seen == [(0, 4), (4, 8), (8, 9)]
    ref = torch.softmax(0.5 * (k @ q[..., 8, :, None])[..., 0], -1)[..., None, :] @ v
    assert rel_err(out, ref[..., 0, :]) <= 1e-14
    with pytest.raises(ValueError, match="`T_max`"):
        cache.append(k[..., 0, :], v[..., 0, :])


# ---------------------------------------------------------------------------
# 4. float16 / bfloat16 in the forms built on a triangular solve
# ---------------------------------------------------------------------------

HALF_TOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2}
HALF_FORMS = [path.path_naive, path.path_recurrent, path.path_matrix, path.path_blockwise,
              path.householder_naive, path.householder_recurrent, path.householder_matrix, path.householder_chunked,
              path.deltanet_naive, path.deltanet_recurrent, path.deltanet_matrix, path.deltanet_chunked]


def half_inputs(dtype, T=9, D=8):
    """Inputs rounded to ``dtype``, and the same numbers in float64 (the reference sees what the form sees)."""
    q, k, v = rand_qkv((2,), T, D, seed=10)
    w, beta = unit_w_beta((2,), T, D, seed=11)
    beta_delta = beta / (k * k).sum(-1).clamp_min(1.0)  # DeltaNet: eigenvalues of I - beta k k^T in [-1, 1]
    low = [x.to(dtype) for x in (q, k, v, w, beta, beta_delta)]
    return low, [x.double() for x in low]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", HALF_FORMS, ids=lambda f: f.__name__)
def test_16_bit_inputs(form, dtype):
    """The UT/triangular-solve forms raised ``"triangular_solve_cpu" not implemented for 'Half'``;
    they now solve in float32 and return the input dtype."""
    (q, k, v, w, beta, bd), (q6, k6, v6, w6, beta6, bd6) = half_inputs(dtype)
    if form.__name__.startswith("deltanet"):
        out, ref = form(q, k, v, bd), deltanet_definition(q6, k6, v6, bd6)
    elif form.__name__.startswith("path"):
        out, ref = form(q, k, v, w, beta), path_definition(q6, k6, v6, w6, beta6, 8 ** -0.5)
    else:
        out, ref = form(q, k, v, w, beta), householder_definition(q6, k6, v6, w6, beta6)
    assert out.dtype == dtype
    assert rel_err(out, ref) <= HALF_TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16_bit_logits_and_ut_transform(dtype):
    (q, k, _, w, beta, _), (q6, k6, _, w6, beta6, _) = half_inputs(dtype)
    logits = path.path_logits(q, k, w, beta)
    ref = path_logits_definition(q6, k6, w6, beta6, 8 ** -0.5)
    assert logits.dtype == dtype
    lower = torch.ones(9, 9, dtype=torch.bool).tril()
    assert torch.isneginf(logits[..., ~lower]).all()
    assert rel_err(logits[..., lower], ref[..., lower]) <= HALF_TOL[dtype]
    W, A = path.ut_transform(w, beta)
    assert A.dtype == dtype
    product = torch.eye(8, dtype=torch.float64) - W.double().mT @ A.double() @ W.double()  # H_8 ... H_0
    want = torch.eye(8, dtype=torch.float64).expand(2, 8, 8)
    for s in range(9):
        want = householder(w6[..., s, :], beta6[..., s]) @ want
    assert (product - want).abs().max() <= 10 * HALF_TOL[dtype]


# ---------------------------------------------------------------------------
# 5. The meta device
# ---------------------------------------------------------------------------

STATE_FORMS = [(nope.linear_recurrent, ()), (alibi.retnet_recurrent, ("gamma",)), (fox.gla_recurrent, ("log_f",)),
               (rope.complex_recurrent, ()), (path.householder_recurrent, ("w", "beta")),
               (path.householder_chunked, ("w", "beta")), (path.deltanet_recurrent, ("beta",)),
               (path.deltanet_chunked, ("beta",))]


@pytest.mark.parametrize("form, extras", STATE_FORMS, ids=lambda x: getattr(x, "__name__", ""))
def test_initial_state_on_meta_is_refused(form, extras):
    q, k, v = rand_qkv((2,), 5, 4, 3)
    w, beta = unit_w_beta((2,), 5, 4)
    values = {"gamma": 0.9, "log_f": torch.full((2, 5), -0.1, dtype=torch.float64), "w": w, "beta": beta}
    D_state = 2 if form is rope.complex_recurrent else 4
    state = torch.zeros(2, 3, D_state, device="meta")
    with pytest.raises(ValueError, match="`initial_state`"):
        form(q, k, v, *(values[n] for n in extras), initial_state=state)


def test_helpers_refuse_meta_tensors():
    meta = lambda *shape: torch.full(shape, 0.5, device="meta")  # noqa: E731
    for fn, arg, name in [(lambda x: alibi.alibi_bias(4, x), meta(3), "slope"),
                          (lambda x: alibi.retnet_decay(4, x), meta(3), "gamma"),
                          (alibi.slope_to_gamma, meta(3), "slope"), (alibi.gamma_to_slope, meta(3), "gamma"),
                          (fox.log_gate_matrix, meta(2, 5), "log_f"),
                          (lambda x: path.ut_transform(x, meta(2, 5)), meta(2, 5, 4), "w"),
                          (lambda x: path.householder_product(x, meta(2, 5)), meta(2, 5, 4), "w")]:
        with pytest.raises(ValueError, match=f"`{name}`.*meta"):
            fn(arg)


# ---------------------------------------------------------------------------
# 6. Non-finite inputs stay causal
# ---------------------------------------------------------------------------

POISONS = [("v", float("nan")), ("v", float("inf")), ("v", float("-inf")), ("k", float("nan")),
           ("k", float("inf")), ("k", float("-inf")), ("q", float("nan")), ("q", float("inf"))]
AT, BLOCK = 5, 4  # position 5 sits in the block [4, 8): row 4 shares a diagonal block with it


@pytest.mark.parametrize("which, value", POISONS, ids=lambda x: str(x))
@pytest.mark.parametrize("form", TORCH_FORMS, ids=lambda f: f.name)
def test_non_finite_input_reaches_no_earlier_output(form, which, value):
    """Masked weights used to multiply the values (0 * NaN = NaN, 0 * inf = NaN), and the
    linear side masked ``Q K^T`` by a multiplication: a NaN or inf at t spoiled every output."""
    q, k, v = rand_qkv((2,), 9, 4, 3, seed=12)
    ex = form.extras(q, k, v, 0)
    kw = {name: BLOCK for name in form.tuning}
    clean = call(form, q, k, v, ex, **kw)
    inputs = {"q": q, "k": k, "v": v}
    inputs[which] = inputs[which].clone()
    inputs[which][..., AT, :] = value
    out = call(form, inputs["q"], inputs["k"], inputs["v"], ex, **kw)
    assert torch.isfinite(out[..., :AT, :]).all()
    assert (out[..., :AT, :] - clean[..., :AT, :]).abs().max().item() <= 1e-12
    if which == "v" and math.isnan(value):
        # The NaN does reach its own position; stick-breaking's weights are strictly causal (o_t reads v_j for
        # j < t only), so there it first reaches the next one.
        own = AT + 1 if form.family == "stickbreaking" else AT
        assert torch.isnan(out[..., own, :]).any()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=str)
def test_path_logits_stay_causal(value):
    q, k, _ = rand_qkv((2,), 9, 4, seed=13)
    w, beta = unit_w_beta((2,), 9, 4, seed=14)
    clean = path.path_logits(q, k, w, beta)
    k = k.clone()
    k[..., AT, :] = value
    out = path.path_logits(q, k, w, beta)
    assert torch.equal(out[..., :AT, :], clean[..., :AT, :])


def test_causal_matmul_is_ieee_where_a_weight_is_nonzero():
    g = torch.Generator().manual_seed(15)
    weights = torch.randn(3, 6, 5, generator=g, dtype=torch.float64)
    weights[weights.abs() < 0.5] = 0.0
    weights[..., 0, :] = 0.0  # a row that sees nothing
    values = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    values[0, 1, 0], values[0, 2, 1], values[0, 3, 1] = float("nan"), float("inf"), float("-inf")
    values[1, 0, 2], values[2, 4, 3], values[2, 1, 3] = float("inf"), float("inf"), float("inf")
    want = torch.zeros(3, 6, 4, dtype=torch.float64)
    for b in range(3):
        for i in range(6):
            for d in range(4):
                total = 0.0
                for j in range(5):
                    if weights[b, i, j] != 0:  # zero weights contribute nothing, whatever the value
                        total = total + weights[b, i, j].item() * values[b, j, d].item()
                want[b, i, d] = total
    got = causal_matmul(weights, values)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got) & (got > 0), torch.isinf(want) & (want > 0))
    assert torch.equal(torch.isinf(got) & (got < 0), torch.isinf(want) & (want < 0))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], rtol=1e-13, atol=1e-13)
    clean = values.nan_to_num(0.0, 0.0, 0.0)
    assert torch.equal(causal_matmul(weights, clean), weights @ clean)
    assert torch.equal(causal_matmul(weights, clean, finite=True), weights @ clean)


# ---------------------------------------------------------------------------
# 7. Validate once
# ---------------------------------------------------------------------------

VALIDATORS = {  # module attribute -> modules whose namespace holds it
    "check_qkv": (nope, alibi, fox, rope, path, pathfox, cope, stickbreaking),
    "check_scale": (nope, alibi, fox, rope, path, pathfox, cope, stickbreaking),
    "require": (alibi, fox, path, pathfox, cope), "check_per_token": (fox, path, pathfox), "check_base": (rope,),
    "check_pairing": (rope,), "check_offset": (rope,), "_as_tensor": (alibi,),
}


@pytest.mark.parametrize("form", TORCH_FORMS, ids=lambda f: f.name)
def test_a_public_form_validates_once(form, monkeypatch):
    """``rope_matrix`` validated its inputs three times (its own check, ``apply_rope`` twice,
    ``nope_matrix``), ``alibi_matrix`` and ``retnet_chunked`` converted and checked ``slope`` /
    ``gamma`` once more per call or per chunk."""
    calls: dict[tuple, int] = {}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            arg = args[1] if name in ("check_per_token", "_as_tensor") else None  # the argument's name
            calls[(name, arg)] = calls.get((name, arg), 0) + 1
            return fn(*args, **kwargs)
        return wrapper

    for name, modules in VALIDATORS.items():
        for module in modules:
            monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    q, k, v = rand_qkv((2,), 9, 4, 3, seed=16)
    ex = form.extras(q, k, v, 0)
    call(form, q, k, v, ex, **{name: BLOCK for name in form.tuning})
    assert calls.get(("check_qkv", None)) == 1
    assert all(n <= 1 for n in calls.values()), calls


def host_reads(fn, monkeypatch):
    """How often ``fn()`` reads a tensor's value on the host (``bool``, ``item``, ``tolist``)."""
    count = [0]
    for method in ("__bool__", "item", "tolist"):
        original = getattr(torch.Tensor, method)

        def wrapper(self, *a, original=original, **kw):
            count[0] += 1
            return original(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, method, wrapper)
    try:
        fn()
    finally:
        monkeypatch.undo()
    return count[0]


def test_value_checks_read_the_device_once(monkeypatch):
    """``_check_w_beta`` read ``w`` and ``beta`` three times (finite, finite, in range); every
    value check of a call is now one condition of a single ``require``: one host read."""
    q, k, v = rand_qkv((2,), 9, 4, 3, seed=17)
    w, beta = unit_w_beta((2,), 9, 4, seed=18)
    n = nope.check_qkv(q, k, v)
    log_f = torch.full((2, 9), -0.1, dtype=torch.float64)
    checks = [lambda: path._check_w_beta(w, beta, n, q), lambda: path._check_beta(beta, n, q),
              lambda: fox._prepare_fox(q, k, v, log_f, None), lambda: fox._prepare_gla(q, k, v, log_f),
              lambda: alibi._slope(torch.tensor([0.1, 0.2]), n, q), lambda: alibi._gamma(0.9, n, q)]
    for check in checks:
        assert host_reads(check, monkeypatch) == 1
