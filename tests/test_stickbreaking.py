"""Stick-breaking attention: every form against a float64 brute force, the chapter's claims (strict
causality, row sums as the broken stick, the log-space form where the linear one fails), the Triton
kernel in the interpreter (several key blocks, so that the carried stick crosses them), and the sympy
facts.  The shared checks (shapes, bad input, autograd, non-finite causality) are in test_contract.py."""

import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from helpers import N_FIXED, TOL_F64, TOL_TRITON, case_id, rand_qkv, random_shapes, rel_err

from pathedu import stickbreaking as sb
from pathedu.kernels._launch import prepare_qkv
from pathedu.kernels.stickbreaking import _softplus2, _stickbreaking_launch, stickbreaking_attention
from pathedu.symbolic import stickbreaking as sym

CASES = random_shapes(2, seed=13, max_T=40)
FORMS = [(sb.stickbreaking_naive, {}), (sb.stickbreaking_recurrent, {}), (sb.stickbreaking_recurrent, {"page": 3}),
         (sb.stickbreaking_matrix, {}), (sb.stickbreaking_blockwise, {}),
         (sb.stickbreaking_blockwise, {"block_m": 5, "block_n": 3}),
         (sb.stickbreaking_blockwise, {"block_m": 4, "block_n": 8})]


def _device():
    """Where the Triton form runs: the GPU when there is one, else the CPU (Triton's interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def form_id(entry):
    fn, kw = entry
    return fn.__name__ + "".join(f"-{k}{v}" for k, v in kw.items())


# ---------------------------------------------------------------------------
# A reference written independently of the module: the stick broken one key at a time, in float64,
# with Python floats' math.exp for the sigmoid (no torch.sigmoid, no logsigmoid, no cumulative sum).
# ---------------------------------------------------------------------------

def sigma(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def reference_weights(q, k, scale=None):
    """``A: (..., T, T)`` float64: for each query i, walk j = i-1 .. 0, key j taking sigma(z_ij) of the
    stick left by the keys after it (``A_ij = sigma(z_ij) prod_{j<m<i} (1 - sigma(z_im))``)."""
    T, D = q.shape[-2:]
    scale = D ** -0.5 if scale is None else scale
    z = (scale * q.double() @ k.double().transpose(-1, -2)).reshape(-1, T, T)
    A = torch.zeros_like(z)
    for b in range(z.shape[0]):
        for i in range(T):
            left = 1.0
            for j in range(i - 1, -1, -1):
                s = sigma(z[b, i, j].item())
                A[b, i, j] = s * left
                left *= 1 - s
    return A.reshape(q.shape[:-2] + (T, T))


def reference(q, k, v, scale=None):
    return reference_weights(q, k, scale) @ v.double()


# ---------------------------------------------------------------------------
# Every PyTorch form against the brute force
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("entry", FORMS, ids=form_id)
def test_forms_match_the_float64_brute_force(entry, case):
    fn, kw = entry
    q, k, v = rand_qkv(*case, seed=sum(case[1:]))
    out = fn(q, k, v, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert rel_err(out, reference(q, k, v)) <= TOL_F64


@pytest.mark.parametrize("entry", FORMS, ids=form_id)
def test_an_explicit_scale_is_used(entry):
    fn, kw = entry
    q, k, v = rand_qkv((2,), 9, 16, 8, seed=4)
    assert rel_err(fn(q, k, v, scale=0.7, **kw), reference(q, k, v, scale=0.7)) <= TOL_F64
    assert rel_err(fn(q, k, v, **kw), reference(q, k, v, scale=0.25)) <= TOL_F64  # None: D ** -0.5


def test_the_weights_match_the_brute_force_and_give_the_matrix_form():
    q, k, v = rand_qkv((2, 3), 17, 16, 24, seed=5)
    A = sb.stickbreaking_weights(q, k)
    assert rel_err(A, reference_weights(q, k)) <= TOL_F64
    assert rel_err(A @ v, sb.stickbreaking_matrix(q, k, v)) <= TOL_F64
    log_A = sb.stickbreaking_log_weights(q, k)
    hidden = torch.ones(17, 17, dtype=torch.bool).triu()  # j >= i: the diagonal too
    assert (log_A[..., hidden] == float("-inf")).all() and (A[..., hidden] == 0).all()
    assert (log_A[..., ~hidden] <= 0).all()


# ---------------------------------------------------------------------------
# The chapter's claims
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("entry", FORMS + [(sb.stickbreaking_triton, {})], ids=form_id)
def test_the_first_token_sees_nothing_and_no_token_sees_itself(entry):
    """o_0 = 0 exactly; and o_i does not depend on v_i (only keys j < i are attended)."""
    fn, kw = entry
    dt = torch.float32 if fn is sb.stickbreaking_triton else torch.float64
    q, k, v = rand_qkv((2,), 6, 16, 16, seed=6, dtype=dt, device=_device() if dt == torch.float32 else "cpu")
    out = fn(q, k, v, **kw)
    assert (out[..., 0, :] == 0).all()
    v2 = v.clone()
    v2[..., 3, :] += 100.0
    out2 = fn(q, k, v2, **kw)
    assert torch.equal(out2[..., :4, :], out[..., :4, :])  # rows 0..3 never read v_3
    assert not torch.allclose(out2[..., 4:, :], out[..., 4:, :])


STRICT_FORMS = [sb.stickbreaking_matrix, sb.stickbreaking_blockwise, sb.stickbreaking_recurrent, sb.stickbreaking_triton]


@pytest.mark.parametrize("fn", STRICT_FORMS, ids=lambda f: f.__name__)
def test_non_finite_input_reaches_only_strictly_later_rows(fn):
    """The strict mask with NaN/inf (the contract test checks rows before t): a value or key at t reaches
    rows > t and never row t itself; a query at t changes row t only.  A NaN value stays in its channel,
    and -inf arrives as -inf (a positive weight times -inf)."""
    dev = _device() if fn is sb.stickbreaking_triton else "cpu"
    q, k, v = rand_qkv((2,), 40, 16, 16, dtype=torch.float32, seed=18, device=dev)
    clean, t, d = fn(q, k, v), 17, 3
    for which, value in [("v", float("nan")), ("v", float("-inf")), ("k", float("nan")), ("q", float("nan"))]:
        x = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
        x[which][1, t, d] = value
        out = fn(x["q"], x["k"], x["v"])
        assert torch.equal(out[:, :t], clean[:, :t]) and torch.equal(out[0], clean[0]), which
        row, later = out[1, t], out[1, t + 1:]
        if which == "q":
            assert not torch.isfinite(row).any() and torch.equal(later, clean[1, t + 1:])
            continue
        assert torch.isfinite(row).all(), f"{which}[{t}] reached row {t}"
        if which == "k":
            assert not torch.isfinite(later).any()
        else:
            others = torch.cat([later[:, :d], later[:, d + 1:]], dim=1)
            assert torch.isfinite(others).all()
            assert later[:, d].isnan().all() if value != value else (later[:, d] == value).all()


def test_row_sums_are_the_broken_stick():
    """sum_j A_ij = 1 - prod_{j<i} (1 - sigma(z_ij)) <= 1, with the leftover computed here in float64."""
    q, k, _ = rand_qkv((3,), 25, 16, seed=7)
    q = 3 * q  # logits of a few units: rows that keep much of their stick and rows that spend it
    A = sb.stickbreaking_weights(q, k)
    z = 0.25 * q @ k.transpose(-1, -2)
    leftover = torch.stack([torch.prod(torch.sigmoid(-z[..., i, :i]), dim=-1) for i in range(25)], dim=-1)
    rows = A.sum(-1)
    assert (rows <= 1 + 1e-12).all() and (rows[..., 0] == 0).all()
    assert (rows - (1 - leftover)).abs().max() <= 1e-12
    assert (sb.stick_remainder(q, k) - leftover).abs().max() <= 1e-12
    assert rows.max() > 0.99 and rows[..., 1:].min() < 0.9  # the check saw both kinds of rows


def test_the_cache_reports_the_stick_left():
    """Decoding by hand with the cache: read before append; the log of the leftover is sum log sigma(-z)."""
    q, k, v = rand_qkv((2,), 10, 16, 8, seed=8)
    cache = sb.StickBreakingCache((2,), 16, 8, page=4, dtype=q.dtype, device=q.device)
    rest = []
    for t in range(10):
        o_t, log_rest = cache.read(q[..., t, :], 0.25)
        rest.append(log_rest)
        cache.append(k[..., t, :], v[..., t, :])
    assert torch.allclose(torch.exp(torch.stack(rest, -1)), sb.stick_remainder(q, k), rtol=1e-12, atol=0)
    assert (torch.stack(rest, -1)[..., 0] == 0).all()  # nothing before the first token: log 1


def _extreme_row(dtype):
    """T = 3, D = 2, Dv = 1, scale 1: query 2 sees key 1 with logit 20 and key 0 with logit 0;
    ``v_1 = 0``, ``v_0 = 1``, so ``o_2 = sigma(0) sigma(-20)``: half of what key 1 leaves to key 0."""
    q = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]], dtype=dtype)
    k = torch.tensor([[0.0, 1.0], [20.0, 0.0], [0.0, 0.0]], dtype=dtype)
    v = torch.tensor([[1.0], [0.0], [0.0]], dtype=dtype)
    return q, k, v


def test_linear_space_products_lose_what_the_log_space_forms_keep():
    """In float32, ``1 - sigmoid(20)`` is 0 (the true gate is 2.1e-9): the literal product form
    (``stickbreaking_naive``) gives o_2 = 0, the log-space forms give 0.5 sigma(-20) to float32
    accuracy.  And the log of the gate: ``log(sigmoid(-100))`` is -inf in float32, the
    log-space weights keep log A = log sigma(-100) - log 2 = -100.69..."""
    want = 0.5 * sigma(-20.0)
    q, k, v = _extreme_row(torch.float32)
    assert sb.stickbreaking_naive(q, k, v, scale=1.0)[2, 0].item() == 0.0  # the linear form's loss
    for fn in (sb.stickbreaking_matrix, sb.stickbreaking_blockwise, sb.stickbreaking_recurrent):
        got = fn(q, k, v, scale=1.0)[2, 0].item()
        assert abs(got - want) <= 1e-6 * want, fn.__name__
    # float64 rescues the literal form here, but not from z ~ 37 on (1 - sigmoid(37) = 0 in float64).
    assert abs(sb.stickbreaking_naive(*_extreme_row(torch.float64), scale=1.0)[2, 0].item() - want) <= 1e-6 * want
    # The log weights at z = 100: finite and exact in float32, where the log of the linear factor is -inf.
    k100 = k.clone()
    k100[1, 0] = 100.0
    assert torch.log(1 - torch.sigmoid(torch.tensor(100.0))).item() == float("-inf")
    assert torch.log(torch.sigmoid(torch.tensor(-100.0))).item() == float("-inf")
    log_A = sb.stickbreaking_log_weights(q, k100, scale=1.0)
    assert abs(log_A[2, 0].item() - (-100.0 - math.log(2))) <= 1e-5
    assert abs(log_A[2, 1].item() - (-math.log1p(math.exp(-100.0)))) <= 1e-7


def test_gradients_stay_finite_and_exact_at_large_logits():
    """Autograd through the log-space matrix form in float32, logits up to +-60: finite gradients that
    match float64 (the linear factor 1 - sigmoid(60) is 0 in float32 and its log has no gradient)."""
    q, k, v = rand_qkv((2,), 12, 16, 8, seed=9)
    q = 15 * q  # logits of tens
    grads = {}
    for dt in (torch.float32, torch.float64):
        leaves = [x.to(dt).requires_grad_() for x in (q, k, v)]
        out = sb.stickbreaking_matrix(*leaves)
        grads[dt] = torch.autograd.grad(out.square().sum(), leaves)
    assert (0.25 * q @ k.transpose(-1, -2)).abs().max() > 40
    for a, b in zip(grads[torch.float32], grads[torch.float64]):
        assert torch.isfinite(a).all() and rel_err(a, b) <= 1e-4


def test_a_recency_bias_without_positions():
    """Equal logits everywhere: A_ij = s (1 - s)^(i-1-j), a geometric decay with distance (the nearest
    key first), from content alone."""
    T, s_logit = 8, 0.3
    q = torch.ones(T, 1, dtype=torch.float64)
    k = torch.full((T, 1), s_logit, dtype=torch.float64)
    A = sb.stickbreaking_weights(q, k, scale=1.0)
    s = sigma(s_logit)
    for i in range(T):
        for j in range(i):
            assert abs(A[i, j].item() - s * (1 - s) ** (i - 1 - j)) <= 1e-15


def test_bad_input_of_the_chapter_helpers_names_the_argument():
    q, k, v = rand_qkv((2,), 5, 16, 16, seed=10)
    with pytest.raises(ValueError, match="`scale`"):
        sb.stickbreaking_weights(q, k, scale=0.0)
    with pytest.raises(TypeError, match="`scale`"):
        sb.stick_remainder(q, k, scale="big")
    with pytest.raises(ValueError, match="`k`"):
        sb.stickbreaking_log_weights(q, k[..., :3, :])
    with pytest.raises(TypeError, match="`q`"):
        sb.stickbreaking_weights(q.numpy(), k)
    with pytest.raises(ValueError, match="`scale`"):
        sb.stickbreaking_matrix(q, k, v, scale=float("nan"))
    x = prepare_qkv(*(t.to(device=_device(), dtype=torch.float32) for t in (q, k, v)))
    for bm, bn in ((32, 64), (24, 8)):
        with pytest.raises(ValueError, match="`block_m`"):
            _stickbreaking_launch(x, 0.25, block_m=bm, block_n=bn)


# ---------------------------------------------------------------------------
# The Triton kernel, in the interpreter on a CPU (or compiled on a GPU)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES[:N_FIXED], ids=case_id)
def test_triton_fp32_matches_float64(case):
    q, k, v = rand_qkv(*case, seed=11, dtype=torch.float32, device=_device())
    out = sb.stickbreaking_triton(q, k, v)
    assert out.dtype == torch.float32 and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert rel_err(out.cpu(), reference(q.cpu(), k.cpu(), v.cpu())) <= TOL_TRITON[torch.float32]


# Small tiles: several key blocks left of the diagonal (the carry crosses them) and, with
# block_m = 2 block_n, a diagonal region of two blocks visited right to left.
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16)], ids=lambda b: f"bm{b[0]}_bn{b[1]}")
def test_triton_carries_the_stick_across_key_blocks(blocks):
    q, k, v = rand_qkv((2,), 39, 16, 24, seed=12, dtype=torch.float32, device=_device())
    q = 4 * q  # logits of several units: much of the stick is spent before the far blocks
    x = prepare_qkv(q, k, v)
    out = x.result(_stickbreaking_launch(x, 0.25, block_m=blocks[0], block_n=blocks[1]))
    assert rel_err(out.cpu(), reference(q.cpu(), k.cpu(), v.cpu())) <= TOL_TRITON[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_triton_16_bit(dtype):
    """fp16 (and bf16, upcast to fp32 in the interpreter) against float64 on the same rounded inputs."""
    q, k, v = rand_qkv((1, 2), 37, 32, 16, seed=14, dtype=dtype, device=_device())
    out = stickbreaking_attention(q, k, v)
    assert out.dtype == dtype
    assert rel_err(out.cpu(), reference(q.cpu(), k.cpu(), v.cpu())) <= TOL_TRITON[torch.float16]


def test_triton_extreme_logits_stay_finite_and_exact():
    """Logits up to about +-100: no max to subtract, no overflow; weights that underflow are 0."""
    q, k, v = rand_qkv((2,), 33, 16, 16, seed=15, dtype=torch.float32, device=_device())
    q = 25 * q
    out = sb.stickbreaking_triton(q, k, v)
    assert torch.isfinite(out).all()
    assert rel_err(out.cpu(), reference(q.cpu(), k.cpu(), v.cpu())) <= TOL_TRITON[torch.float32]


@triton.jit
def _softplus2_kernel(S, OUT, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(OUT + offs, _softplus2(tl.load(S + offs), False))  # the accurate path (fp32 inputs)


def test_the_kernels_softplus_keeps_tiny_gates():
    """softplus2(s) = log2(1 + 2^s) in fp32 to a few ulps *relative* (down to fp32's smallest normal), also
    where it is tiny (s = -40: 2^-40 / ln 2, which a plain log2(1 + 2^s) rounds to 0), and 0 / inf at -inf / inf.
    It is the kernel's only transcendental step besides the weight's exp2: log2 sigma(-z) = -softplus2(z log2 e)."""
    s = torch.cat([torch.linspace(-43, 43, 121), torch.tensor([-140.0, 140.0, float("-inf"), float("inf"), -40.0]),
                   torch.zeros(2)]).to(_device())  # 128 entries
    out = torch.empty_like(s)
    _softplus2_kernel[(1,)](s, out, N=128)
    s64 = s.double()
    want = torch.where(s64 > 0, s64, 0.0) + torch.log1p(torch.exp2(-s64.abs())) / math.log(2)
    finite = torch.isfinite(want)
    assert torch.equal(out[~finite].cpu(), want[~finite].float().cpu())
    assert out[s == -float("inf")].item() == 0.0
    tiny = torch.finfo(torch.float32).tiny  # below it (softplus2(-140) = 1.0e-42) fp32 is subnormal
    normal = finite & (want >= tiny)
    assert ((out[normal].double() - want[normal]).abs() / want[normal]).max() <= 1e-6
    assert out[s == -40.0].item() > 0.0  # the gate a plain log2(1 + e) would lose


def test_triton_refuses_float64():
    q, k, v = rand_qkv((), 5, 16, 16, seed=16, dtype=torch.float32, device=_device())
    with pytest.raises(TypeError, match="`q`"):
        sb.stickbreaking_triton(q.detach().double(), k.double(), v.double())


# ---------------------------------------------------------------------------
# sympy
# ---------------------------------------------------------------------------

def test_sigmoid_identities():
    facts = sym.sigmoid_identities()
    assert facts["complement"] and facts["log_difference"] and facts["softplus"]


@pytest.mark.parametrize("T", [1, 2, 3, 4])
def test_product_and_log_forms_agree_symbolically(T):
    facts = sym.product_equals_log_form(T)
    assert facts["equal"]
    assert len(facts["log_form"]) == T * (T - 1) // 2
    if T == 4:  # the product runs over m = j+1 .. i-1 exactly
        s = facts["s"]
        assert sp.expand(facts["product"][3, 0] - s[3, 0] * (1 - s[3, 1]) * (1 - s[3, 2])) == 0
        assert facts["product"][3, 3] == 0 and facts["product"][0, 0] == 0


def test_row_sums_are_the_broken_stick_symbolically():
    facts = sym.row_sum_is_broken_stick(4)
    assert facts["equal"]
    assert facts["leftover"][0] == 1 and facts["row_sums"][0] == 0
    assert sp.expand(facts["row_sums"][3] - 1) != 0  # not a softmax: the row need not sum to 1


def test_symbolic_forms_match_the_numbers():
    """The symbolic product form, evaluated at the sigmoids of random logits, is the module's A."""
    q, k, _ = rand_qkv((), 4, 16, seed=17)
    A = sb.stickbreaking_weights(q, k)
    z = 0.25 * q @ k.T
    facts = sym.product_equals_log_form(4)
    values = {sym_: sigma(z[i, j].item()) for (i, j), sym_ in facts["s"].items()}
    A_sym = torch.tensor(facts["product"].subs(values).evalf().tolist(), dtype=torch.float64)
    assert (A_sym - A).abs().max() <= 1e-14


def test_symbolic_helpers_refuse_bad_T():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="`T`"):
            sym.product_form(bad)


# ---------------------------------------------------------------------------
# The Triton backward (two sweeps), in the interpreter: what the contract test does not cover
# ---------------------------------------------------------------------------

def _grads(fn, q, k, v, g):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    return torch.autograd.grad(fn(*leaves), leaves, g)


def _bwd_kernel(block_m, block_n, scan):
    """The kernels' gradients with fixed tiles and a fixed way of summing inside a tile."""
    from pathedu.kernels.stickbreaking import _stickbreaking_bwd_launch

    def grads(q, k, v, g):
        x = prepare_qkv(q, k, v)
        return tuple(x.result(d) for d in _stickbreaking_bwd_launch(x, g, 0.25, block_m=block_m, block_n=block_n,
                                                                     scan=scan))
    return grads


@pytest.mark.parametrize("scan", ["cumsum", "dot"])
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16)], ids=lambda b: f"bm{b[0]}_bn{b[1]}")
def test_triton_gradients_at_extreme_logits(blocks, scan):
    """Queries and keys scaled so that the logits reach +-30 (gates of 1e-13 and of 1 - 1e-13, sticks spent by one
    key): both sweeps, several key blocks (carries and snapshots across them), both ways of summing inside a tile
    (products with a triangular matrix, as 16-bit inputs take on a GPU, and tl.cumsum), against float64."""
    q, k, v = rand_qkv((2,), 45, 16, 24, seed=21)
    q, k = 3.5 * q, 2.5 * k
    assert (0.25 * q @ k.transpose(-1, -2)).abs().max() > 30
    g = torch.randn(2, 45, 24, generator=torch.Generator().manual_seed(22), dtype=torch.float64)
    want = _grads(sb.stickbreaking_matrix, q, k, v, g)
    got = _bwd_kernel(*blocks, scan)(q.float(), k.float(), v.float(), g.float())
    for name, a, b in zip("qkv", got, want):
        assert torch.isfinite(a).all() and rel_err(a, b) <= 2e-4, name


def test_triton_forward_sums_inside_a_tile_as_products():
    """The forward with the tile's sums as products (the GPU's path for 16-bit inputs) at logits up to +-30."""
    q, k, v = rand_qkv((2,), 39, 16, 24, seed=23)
    q = 6 * q
    x = prepare_qkv(q.float(), k.float(), v.float())
    for blocks in ((16, 16), (32, 16)):
        out = x.result(_stickbreaking_launch(x, 0.25, block_m=blocks[0], block_n=blocks[1], scan="dot"))
        assert rel_err(out, reference(q, k, v)) <= 1e-5


GRAD_POISON = [("v", float("nan")), ("v", float("inf")), ("k", float("nan")), ("q", float("nan"))]


@pytest.mark.parametrize("scan", ["cumsum", "dot"])
@pytest.mark.parametrize("case", GRAD_POISON, ids=lambda c: f"{c[0]}_{c[1]}")
def test_triton_gradients_keep_non_finite_inputs_confined(case, scan):
    """A NaN/inf at position t leaves every gradient that does not depend on it finite and unchanged, and reaches
    some that do.  q_i, k_j, v_j reach o_i only for j < i, so: a value v_t reaches dq_i (i > t) and dk_m (m >= t),
    never dv; a key k_t reaches dq_i (i > t), every dk_m (the gates of every later row) and dv_j (j <= t), never
    dv_j (j > t); a query q_t reaches dq_t, dk_m and dv_m (m < t) only."""
    which, value = case
    T, t = 40, 21
    q, k, v = rand_qkv((1,), T, 16, 16, dtype=torch.float32, seed=24)
    g = torch.randn(1, T, 16, generator=torch.Generator().manual_seed(25))
    grads = _bwd_kernel(16, 16, scan)
    clean = grads(q, k, v, g)
    x = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
    x[which][0, t, 3] = value
    dq, dk, dv = grads(x["q"], x["k"], x["v"], g)
    keep = {"v": (slice(0, t + 1), slice(0, t), slice(0, T)), "k": (slice(0, t + 1), slice(0, 0), slice(t + 1, T)),
            "q": (None, slice(t, T), slice(t, T))}[which]
    for name, got, ref, rows in zip("qkv", (dq, dk, dv), clean, keep):
        if rows is None:  # dq of q_t's poison: every row but t
            rows = torch.arange(T) != t
        assert torch.isfinite(got[0, rows]).all(), f"d{name} got the NaN/inf of {which}[{t}]"
        assert torch.equal(got[0, rows], ref[0, rows]), name
    assert not torch.isfinite(dq[0, t + 1 if which != "q" else t]).all()
