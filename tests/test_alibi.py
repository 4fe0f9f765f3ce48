"""Chapter 2: every form of ALiBi attention and RetNet's constant-decay linear attention against float64 references."""
import math

import pytest
import torch
from helpers import N_FIXED, TOL_F64, TOL_TRITON, case_id, gradient_errors, rand_qkv, random_shapes, rel_err, run_in_pieces

from pathedu import alibi, nope
from pathedu.nope import KVCache
from pathedu.kernels.flash_attention import attention
from pathedu.kernels.linear_attention import chunked_linear_attention, gated_linear_attention

CASES = random_shapes(6, seed=2)
SOFTMAX_FORMS = [alibi.alibi_naive, alibi.alibi_recurrent, alibi.alibi_matrix, alibi.alibi_blockwise]
LINEAR_FORMS = [alibi.retnet_naive, alibi.retnet_recurrent, alibi.retnet_matrix, alibi.retnet_chunked]


# ---------------------------------------------------------------------------
# References, written independently of the module
# ---------------------------------------------------------------------------

def _lead_values(x, lead):
    """A float or per-head tensor as float64 (*lead, 1, 1)."""
    return torch.broadcast_to(torch.as_tensor(x, dtype=torch.float64), lead)[..., None, None]


def alibi_reference(q, k, v, slope, scale=None):
    """Explicit float64 logits, bias -slope*(i-j), -inf above the diagonal, softmax."""
    T, D = q.shape[-2:]
    scale = D ** -0.5 if scale is None else scale
    i = torch.arange(T, dtype=torch.float64)
    dist = i[:, None] - i[None, :]
    logits = scale * torch.einsum("...id,...jd->...ij", q.double(), k.double())
    logits = logits - _lead_values(slope, q.shape[:-2]) * dist
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("...ij,...jd->...id", torch.softmax(logits, -1), v.double())


def retnet_reference(q, k, v, gamma):
    """Explicit float64 unrolled sum: o_i = sum_{j<=i} gamma^(i-j) (q_i.k_j) v_j."""
    T = q.shape[-2]
    i = torch.arange(T, dtype=torch.float64)
    dist = (i[:, None] - i[None, :]).clamp_min(0)
    w = _lead_values(gamma, q.shape[:-2]) ** dist * torch.ones(T, T, dtype=torch.float64).tril()
    scores = torch.einsum("...id,...jd->...ij", q.double(), k.double())
    return torch.einsum("...ij,...jd->...id", scores * w, v.double())


def fox_reference(q, k, v, log_f, scale=None):
    """Softmax attention with a per-token log forget gate: bias sum_{s=j+1..i} log_f[s] (chapter 3's FoX)."""
    T, D = q.shape[-2:]
    scale = D ** -0.5 if scale is None else scale
    c = torch.cumsum(log_f.double(), -1)
    logits = scale * torch.einsum("...id,...jd->...ij", q.double(), k.double()) + c[..., :, None] - c[..., None, :]
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("...ij,...jd->...id", torch.softmax(logits, -1), v.double())


def gla_reference(q, k, v, log_f):
    """Linear attention with a per-token scalar gate, as a recurrence: S_t = f_t S_{t-1} + v_t k_t^T."""
    S = torch.zeros(q.shape[:-2] + (v.shape[-1], q.shape[-1]), dtype=torch.float64)
    outs = []
    for t in range(q.shape[-2]):
        f_t = torch.exp(log_f[..., t, None, None].double())
        S = f_t * S + v[..., t, :, None].double() * k[..., t, None, :].double()
        outs.append((S @ q[..., t, :, None].double())[..., 0])
    return torch.stack(outs, -2)


def per_head_args(lead, seed):
    """A slope (float, or per-head tensor over the last leading dim) and the matching gamma."""
    g = torch.Generator().manual_seed(seed)
    if not lead:
        slope = 0.3
    else:
        slope = torch.rand(lead[-1], generator=g, dtype=torch.float64) * 0.5
        slope[0] = 0.0  # slope 0 (no decay) is a valid head
    return slope, alibi.slope_to_gamma(slope)


# ---------------------------------------------------------------------------
# Every form against the references
# ---------------------------------------------------------------------------

# (form, reference, which of per_head_args' (slope, gamma) it takes, the seed of per_head_args)
FORMS_AND_REFERENCES = ([(f, alibi_reference, 0, 3) for f in SOFTMAX_FORMS]
                        + [(f, retnet_reference, 1, 4) for f in LINEAR_FORMS])


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("form, reference, which, arg_seed", FORMS_AND_REFERENCES,
                         ids=[f.__name__ for f, *_ in FORMS_AND_REFERENCES])
def test_forms_match_float64(form, reference, which, arg_seed, case):
    """Every ALiBi form against ``alibi_reference`` (with ``slope``), every RetNet form against
    ``retnet_reference`` (with ``gamma``)."""
    q, k, v = rand_qkv(*case, seed=hash(case) % 1000)
    arg = per_head_args(case[0], arg_seed)[which]
    assert rel_err(form(q, k, v, arg), reference(q, k, v, arg)) <= TOL_F64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES[:N_FIXED], ids=case_id)  # the interpreter is slow: fixed cases only
def test_triton_forms_match_float64(case, dtype):
    q, k, v = rand_qkv(*case, seed=7)
    slope, gamma = per_head_args(case[0], 5)
    tol = TOL_TRITON[dtype]
    out = alibi.alibi_triton(q.to(dtype), k.to(dtype), v.to(dtype), slope)
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert rel_err(out, alibi_reference(q, k, v, slope)) <= tol
    out = alibi.retnet_triton(q.to(dtype), k.to(dtype), v.to(dtype), gamma)
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert rel_err(out, retnet_reference(q, k, v, gamma)) <= tol


@pytest.mark.parametrize("chunk", [16, 64])
def test_retnet_gate_per_head_matches_the_gate_per_token(chunk):
    """RetNet's kernel makes its chunk decays once per head (``DECAY == "head"``); the per-token hook (Mamba2's)
    rebuilds them in every chunk from prefix sums.  Same gates, same outputs: T not a multiple of the chunk (the
    last chunk's padding), a gate so strong that ``e^{b}`` underflows inside a chunk, one that is exactly 1."""
    q, k, v = (x.float() for x in rand_qkv((2, 3), 77, 16, 24, seed=11))
    gamma = torch.tensor([[0.9, 1e-30, 1.0], [0.5, 0.999, 0.2]], dtype=torch.float64)
    per_head = gated_linear_attention(q, k, v, "gamma", gamma, chunk=chunk)
    log_f = torch.log(gamma).float()[..., None].expand(2, 3, 77)
    per_token = chunked_linear_attention(q, k, v, log_f=log_f, chunk=chunk)
    assert torch.isfinite(per_head).all()
    assert rel_err(per_head, per_token) <= 1e-6
    assert rel_err(per_head, retnet_reference(q, k, v, gamma)) <= 2e-3


def test_triton_accepts_bf16_on_cpu_via_fp32():
    q, k, v = rand_qkv((1, 2), 33, 16, dtype=torch.bfloat16)
    slope = torch.tensor([0.5, 0.0625])
    out = alibi.alibi_triton(q, k, v, slope)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, alibi_reference(q, k, v, slope)) <= 2e-2
    out = alibi.retnet_triton(q, k, v, alibi.slope_to_gamma(slope))
    assert out.dtype == torch.bfloat16
    assert rel_err(out, retnet_reference(q, k, v, alibi.slope_to_gamma(slope))) <= 2e-2


def test_odd_head_dims_are_fine():
    """ALiBi and RetNet never pair channels (RoPE does, chapter 4): odd head dims are valid."""
    q, k, v = rand_qkv((2,), 21, 17, 19, seed=8)
    for form in SOFTMAX_FORMS:
        assert rel_err(form(q, k, v, 0.25), alibi_reference(q, k, v, 0.25)) <= TOL_F64
    for form in LINEAR_FORMS:
        assert rel_err(form(q, k, v, 0.9), retnet_reference(q, k, v, 0.9)) <= TOL_F64
    qf, kf, vf = q.float(), k.float(), v.float()
    assert rel_err(alibi.alibi_triton(qf, kf, vf, 0.25), alibi_reference(q, k, v, 0.25)) <= 2e-3
    assert rel_err(alibi.retnet_triton(qf, kf, vf, 0.9), retnet_reference(q, k, v, 0.9)) <= 2e-3


def test_explicit_scale_is_used():
    q, k, v = rand_qkv((2,), 9, 16)
    for form in SOFTMAX_FORMS + [alibi.alibi_triton]:
        args = (q.float(), k.float(), v.float()) if form is alibi.alibi_triton else (q, k, v)
        out = form(*args, 0.2, scale=0.3)
        assert rel_err(out, alibi_reference(q, k, v, 0.2, scale=0.3)) <= 2e-3
        assert rel_err(out, alibi_reference(q, k, v, 0.2)) > 1e-2  # the default scale would differ


def test_bias_is_negative_and_not_the_seeds_sign():
    """The seed displays +slope*(i-j) and masks with 0: both are wrong, and would change the output."""
    B = alibi.alibi_bias(6, 0.5)
    assert B[3, 0] == -1.5 and B[3, 3] == 0 and torch.isinf(B[0, 1]) and B[0, 1] < 0
    q, k, v = rand_qkv((), 12, 16, seed=9)
    T = 12
    dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).double()
    logits = q @ k.T / 4
    seed_sign = torch.softmax((logits + 0.5 * dist).masked_fill(dist < 0, float("-inf")), -1) @ v
    seed_mask = torch.softmax(logits + (-0.5 * dist.abs()).tril(), -1) @ v  # future keys get logit bias 0
    ours = alibi.alibi_matrix(q, k, v, 0.5)
    assert rel_err(ours, alibi_reference(q, k, v, 0.5)) <= TOL_F64
    assert rel_err(seed_sign, ours) > 0.1 and rel_err(seed_mask, ours) > 0.1


def test_slope_broadcasts_over_leading_dims():
    """A (H,) slope with leading dims (B, H) means one slope per head, the same in every batch."""
    q, k, v = rand_qkv((2, 3), 20, 16, seed=10)
    slopes = alibi.alibi_slopes(3)
    for form in SOFTMAX_FORMS:
        out = form(q, k, v, slopes)
        for h in range(3):
            assert rel_err(out[:, h], alibi_reference(q[:, h], k[:, h], v[:, h], float(slopes[h]))) <= TOL_F64
    gammas = alibi.slope_to_gamma(slopes)
    for form in LINEAR_FORMS:
        out = form(q, k, v, gammas)
        for h in range(3):
            assert rel_err(out[:, h], retnet_reference(q[:, h], k[:, h], v[:, h], float(gammas[h]))) <= TOL_F64
    # a full (B, H) tensor also works
    full = torch.rand(2, 3, dtype=torch.float64)
    assert rel_err(alibi.alibi_matrix(q, k, v, full), alibi_reference(q, k, v, full)) <= TOL_F64


@pytest.mark.parametrize("blocks", [(7, 5), (16, 32), (8, 8), (64, 16)])
def test_blockwise_any_block_sizes(blocks):
    q, k, v = rand_qkv((2,), 45, 16, 8, seed=11)
    out = alibi.alibi_blockwise(q, k, v, 0.2, block_m=blocks[0], block_n=blocks[1])
    assert rel_err(out, alibi_reference(q, k, v, 0.2)) <= TOL_F64


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_any_chunk_size(chunk):
    q, k, v = rand_qkv((2,), 45, 16, 8, seed=12)
    assert rel_err(alibi.retnet_chunked(q, k, v, 0.93, chunk=chunk), retnet_reference(q, k, v, 0.93)) <= TOL_F64


@pytest.mark.parametrize("page", [1, 4, 64])
def test_recurrent_any_page_size(page):
    q, k, v = rand_qkv((2,), 23, 16, seed=13)
    assert rel_err(alibi.alibi_recurrent(q, k, v, 0.4, page=page), alibi_reference(q, k, v, 0.4)) <= TOL_F64


def test_retnet_state_is_returned_and_resumable():
    q, k, v = rand_qkv((2,), 30, 16, 8)
    first, S = alibi.retnet_recurrent(q[..., :13, :], k[..., :13, :], v[..., :13, :], 0.9, return_state=True)
    rest = alibi.retnet_recurrent(q[..., 13:, :], k[..., 13:, :], v[..., 13:, :], 0.9, initial_state=S)
    assert rel_err(torch.cat([first, rest], -2), retnet_reference(q, k, v, 0.9)) <= TOL_F64
    assert S.shape == (2, 8, 16)


def test_alibi_cache_decodes_one_token_at_a_time():
    """The cache holds plain keys; a query read at step t sees the bias -slope*(t-j)."""
    q, k, v = rand_qkv((3,), 17, 16, 8, seed=14)
    slope = torch.tensor([0.0, 0.3, 2.0], dtype=torch.float64)
    cache = KVCache((3,), 16, 8, 17, dtype=q.dtype, device=q.device, page=4)
    ref = alibi_reference(q, k, v, slope, scale=0.25)
    for t in range(17):
        cache.append(k[..., t, :], v[..., t, :])
        bias = lambda start, end: -slope[..., None] * (t - torch.arange(start, end, dtype=q.dtype))  # noqa: E731
        assert rel_err(cache.attend(q[..., t, :], 0.25, bias=bias), ref[..., t, :]) <= TOL_F64
    assert torch.equal(cache.k[..., :17, :], k)  # no bias was baked into the stored keys


# ---------------------------------------------------------------------------
# The duality: ALiBi = FoX with a constant gate, RetNet = GLA with a constant gate
# ---------------------------------------------------------------------------

def test_decay_matrix_is_exp_of_bias():
    slopes = alibi.alibi_slopes(4)
    D = alibi.retnet_decay(9, alibi.slope_to_gamma(slopes))
    assert D.shape == (4, 9, 9)
    assert torch.allclose(D, torch.exp(alibi.alibi_bias(9, slopes)), rtol=1e-14, atol=0)


def test_alibi_is_fox_with_constant_gate_float64():
    q, k, v = rand_qkv((2, 3), 26, 16, seed=15)
    slope = alibi.alibi_slopes(3)
    log_f = (-slope[:, None]).expand(2, 3, 26)  # the same gate -slope at every step
    assert rel_err(alibi.alibi_matrix(q, k, v, slope), fox_reference(q, k, v, log_f)) <= TOL_F64


def test_retnet_is_gla_with_constant_gate_float64():
    q, k, v = rand_qkv((2, 3), 26, 16, seed=16)
    gamma = alibi.retnet_gammas(3)
    log_f = torch.log(gamma)[:, None].expand(2, 3, 26)
    assert rel_err(alibi.retnet_matrix(q, k, v, gamma), gla_reference(q, k, v, log_f)) <= TOL_F64


@pytest.mark.parametrize("lead,T", [((2, 3), 70), ((1,), 33), ((), 1)])
def test_alibi_equals_kernel_loggate_hook(lead, T):
    """attention(log_f = -slope at every step) is ALiBi: the two kernel hooks agree, and with the reference."""
    q, k, v = rand_qkv(lead, T, 16, 32, seed=17, dtype=torch.float32)
    slope = alibi.alibi_slopes(lead[-1]) if lead else 0.25
    log_f = torch.broadcast_to(-torch.as_tensor(slope, dtype=torch.float32)[..., None], lead + (T,))
    via_gate = attention(q, k, v, log_f=log_f)
    ref = alibi_reference(q, k, v, slope)
    assert rel_err(via_gate, ref) <= 2e-3
    assert rel_err(via_gate, alibi.alibi_triton(q, k, v, slope)) <= 2e-3


@pytest.mark.parametrize("lead,T", [((2, 3), 70), ((1,), 33), ((), 1)])
def test_retnet_equals_kernel_scalar_gate_hook(lead, T):
    """chunked_linear_attention(log_f = log gamma at every step) is RetNet."""
    q, k, v = rand_qkv(lead, T, 16, 32, seed=18, dtype=torch.float32)
    gamma = alibi.retnet_gammas(lead[-1]) if lead else 0.9
    log_f = torch.broadcast_to(torch.log(torch.as_tensor(gamma, dtype=torch.float64))[..., None], lead + (T,)).float()
    out = chunked_linear_attention(q, k, v, log_f=log_f)
    assert rel_err(out, retnet_reference(q, k, v, gamma)) <= 2e-3
    assert rel_err(out, gla_reference(q, k, v, log_f)) <= 2e-3


def test_zero_slope_is_nope_and_unit_gamma_is_linear_attention():
    q, k, v = rand_qkv((2,), 19, 16, seed=19)
    assert rel_err(alibi.alibi_matrix(q, k, v, 0.0), nope.nope_matrix(q, k, v)) <= TOL_F64
    assert rel_err(alibi.retnet_chunked(q, k, v, 1.0, chunk=8), nope.linear_matrix(q, k, v)) <= TOL_F64
    assert alibi.slope_to_gamma(0.0) == 1.0


# ---------------------------------------------------------------------------
# Slopes, gammas, conversions
# ---------------------------------------------------------------------------

def test_slope_gamma_round_trip():
    for s in [0.0, 1e-6, 0.0625, 0.5, 1.0, 8.0, 20.0]:
        g = alibi.slope_to_gamma(s)
        assert isinstance(g, float) and 0 < g <= 1
        assert math.isclose(alibi.gamma_to_slope(g), s, rel_tol=1e-12, abs_tol=1e-15)
    slopes = alibi.alibi_slopes(12)
    assert torch.allclose(alibi.gamma_to_slope(alibi.slope_to_gamma(slopes)), slopes, rtol=1e-13, atol=0)
    gammas = alibi.retnet_gammas(8)
    assert torch.allclose(alibi.slope_to_gamma(alibi.gamma_to_slope(gammas)), gammas, rtol=1e-14, atol=0)
    assert math.isclose(alibi.slope_to_gamma(math.log(2)), 0.5)


def _paper_rule(n):
    """The ALiBi code's rule, written from its description: geometric for powers of two, else
    the closest smaller power of two followed by every other slope of twice as many heads."""
    def pow2(m):
        start = 2 ** (-8 / m)
        return [start ** (h + 1) for h in range(m)]

    if math.log2(n).is_integer():
        return pow2(n)
    p = 2 ** math.floor(math.log2(n))
    return pow2(p) + _paper_rule(2 * p)[0::2][: n - p]


def test_alibi_slopes_8_heads_exact():
    assert alibi.alibi_slopes(8).tolist() == [2.0 ** -h for h in range(1, 9)]
    assert alibi.alibi_slopes(16).tolist()[1::2] == [2.0 ** -h for h in range(1, 9)]  # 16 heads interleave 8's
    assert alibi.alibi_slopes(1).tolist() == [2.0 ** -8]


def test_alibi_slopes_non_power_of_two_rule():
    s12 = alibi.alibi_slopes(12)
    assert s12[:8].tolist() == alibi.alibi_slopes(8).tolist()
    assert s12[8:].tolist() == alibi.alibi_slopes(16)[0::2][:4].tolist()
    assert torch.allclose(s12[8:], torch.tensor([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5], dtype=torch.float64))
    for n in range(1, 70):
        assert torch.allclose(alibi.alibi_slopes(n), torch.tensor(_paper_rule(n), dtype=torch.float64),
                              rtol=1e-14, atol=0), n
        assert len(set(alibi.alibi_slopes(n).tolist())) == n  # every head gets its own range


def test_retnet_gammas_and_half_life():
    g = alibi.retnet_gammas(4)
    assert torch.allclose(g, torch.tensor([1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128, 1 - 1 / 256], dtype=torch.float64))
    for gamma in [0.5, 0.9, float(g[0]), 2 ** (-1 / 100)]:
        h = alibi.half_life(gamma)
        assert math.isclose(gamma ** h, 0.5, rel_tol=1e-12)
    assert math.isclose(alibi.half_life(2 ** (-1 / 100)), 100.0, rel_tol=1e-12)
    assert alibi.half_life(1.0) == math.inf


# ---------------------------------------------------------------------------
# Numerical robustness: long sequences, strong decay
# ---------------------------------------------------------------------------

LONG_T = 4096


def test_long_sequence_strong_decay_reference_forms():
    """T = 4096, slopes up to 8 (log gates down to -20 per step), fp32: no NaN/inf, close to float64."""
    q, k, v = rand_qkv((3,), LONG_T, 16, seed=20, dtype=torch.float32)
    slopes = torch.tensor([0.0, 2.0 ** -8, 8.0])
    gammas = torch.tensor([1.0, math.exp(-20.0), 0.99])  # log gamma = 0, -20, log 0.99
    q64, k64, v64 = q.double(), k.double(), v.double()
    ref_a = alibi.alibi_matrix(q64, k64, v64, slopes.double())
    ref_r = alibi.retnet_chunked(q64, k64, v64, gammas.double(), chunk=256)
    outs_a = [alibi.alibi_naive(q, k, v, slopes), alibi.alibi_recurrent(q, k, v, slopes, page=1024),
              alibi.alibi_matrix(q, k, v, slopes), alibi.alibi_blockwise(q, k, v, slopes, block_m=512, block_n=512)]
    outs_r = [alibi.retnet_naive(q, k, v, gammas), alibi.retnet_recurrent(q, k, v, gammas),
              alibi.retnet_matrix(q, k, v, gammas), alibi.retnet_chunked(q, k, v, gammas)]
    for out in outs_a:
        assert torch.isfinite(out).all()
        assert rel_err(out, ref_a) <= 1e-4
    for out in outs_r:
        assert torch.isfinite(out).all()
        for h in range(3):  # per head: the undecayed head's outputs grow like T
            assert rel_err(out[h], ref_r[h]) <= 1e-4


def test_long_sequence_strong_decay_triton_forms():
    """The same in the Triton interpreter, kept to 1 head and D = 16."""
    q, k, v = rand_qkv((1,), LONG_T, 16, seed=21, dtype=torch.float32)
    q64, k64, v64 = q.double(), k.double(), v.double()
    out = alibi.alibi_triton(q, k, v, 8.0)
    assert torch.isfinite(out).all()
    assert rel_err(out, alibi.alibi_blockwise(q64, k64, v64, 8.0, block_m=1024, block_n=1024)) <= 2e-3
    gamma = math.exp(-20.0)
    out = alibi.retnet_triton(q, k, v, gamma)
    assert torch.isfinite(out).all()
    assert rel_err(out, alibi.retnet_chunked(q64, k64, v64, gamma, chunk=256)) <= 2e-3


# ---------------------------------------------------------------------------
# Bad slopes and gammas (the shared checks of every form are in tests/test_contract.py)
# ---------------------------------------------------------------------------

SOFTMAX_ALL = SOFTMAX_FORMS + [alibi.alibi_triton]
LINEAR_ALL = LINEAR_FORMS + [alibi.retnet_triton]


@pytest.mark.parametrize("form", SOFTMAX_ALL, ids=lambda f: f.__name__)
def test_bad_slope_is_refused(form):
    q, k, v = rand_qkv((2, 3), 8, 16, dtype=torch.float32)
    for slope in [-0.1, float("nan"), float("inf"), torch.tensor([0.5, -1.0, 0.2])]:
        with pytest.raises(ValueError, match="`slope`"):
            form(q, k, v, slope)
    for slope in [torch.ones(2), torch.ones(3, 2), torch.ones(4, 2, 3)]:  # does not broadcast to (2, 3)
        with pytest.raises(ValueError, match="`slope`.*broadcast"):
            form(q, k, v, slope)
    for slope in ["0.5", None, True, torch.ones(3, dtype=torch.complex64), torch.ones(3, dtype=torch.bool)]:
        with pytest.raises(TypeError, match="`slope`"):
            form(q, k, v, slope)


@pytest.mark.parametrize("form", LINEAR_ALL, ids=lambda f: f.__name__)
def test_bad_gamma_is_refused(form):
    q, k, v = rand_qkv((2, 3), 8, 16, dtype=torch.float32)
    for gamma in [0.0, -0.5, 1.0001, 2.0, float("nan"), float("inf"), torch.tensor([0.9, 1.5, 0.9])]:
        with pytest.raises(ValueError, match="`gamma`"):
            form(q, k, v, gamma)
    for gamma in [torch.full((2,), 0.9), torch.full((5, 2, 3), 0.9)]:
        with pytest.raises(ValueError, match="`gamma`.*broadcast"):
            form(q, k, v, gamma)
    for gamma in ["0.9", None, False]:
        with pytest.raises(TypeError, match="`gamma`"):
            form(q, k, v, gamma)


def test_bad_scale_and_helpers():
    q, k, v = rand_qkv((2,), 8, 16)
    with pytest.raises(ValueError, match="`scale`"):
        alibi.alibi_matrix(q, k, v, 0.5, scale=-1.0)
    with pytest.raises(ValueError, match="`slope`"):
        alibi.slope_to_gamma(-1.0)
    with pytest.raises(ValueError, match="`gamma`"):
        alibi.gamma_to_slope(0.0)
    with pytest.raises(ValueError, match="`gamma`"):
        alibi.half_life(1.5)
    with pytest.raises(ValueError, match="`slope`"):
        alibi.alibi_bias(4, -2.0)
    with pytest.raises(ValueError, match="`gamma`"):
        alibi.retnet_decay(4, torch.tensor([0.5, 0.0]))
    for bad, exc in [(0, ValueError), (-3, ValueError), (2.0, TypeError), ("8", TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="`n_heads`"):
            alibi.alibi_slopes(bad)
        with pytest.raises(exc, match="`n_heads`"):
            alibi.retnet_gammas(bad)


# ---------------------------------------------------------------------------
# RetNet's backward pass in the linear template, and runs in pieces
# ---------------------------------------------------------------------------

EXTREME_GAMMAS = [[1e-6, 0.01], [0.999999, 1.0]]  # per (batch, head): near 0 and near 1, and 1 itself


@pytest.mark.parametrize("chunk", [16, 64])
def test_retnet_triton_gradients_for_gammas_near_0_and_1(chunk):
    """fp32 kernel gradients of q, k, v and of a gamma tensor against float64 autograd through the independent
    reference, T = 100 (a partial last chunk at both lengths)."""
    q, k, v = rand_qkv((2, 2), 100, 16, 24, seed=35)
    gamma = torch.tensor(EXTREME_GAMMAS, dtype=torch.float64)
    errs = gradient_errors(lambda q, k, v, g: gated_linear_attention(q, k, v, "gamma", g, chunk=chunk),
                           retnet_reference, dict(q=q, k=k, v=v, gamma=gamma))
    assert max(errs.values()) <= 2e-5, errs


def test_retnet_triton_state_in_and_out_is_differentiable():
    """``initial_state`` and the returned state against float64 autograd through ``retnet_recurrent``, a gamma
    tensor's gradient included (the final state's factor gamma^T is part of it)."""
    q, k, v = rand_qkv((2, 2), 75, 16, 24, seed=36)
    gamma = torch.tensor([[0.5, 0.9], [0.99, 1.0]], dtype=torch.float64)
    S0 = torch.randn(2, 2, 24, 16, generator=torch.Generator().manual_seed(37), dtype=torch.float64)
    errs = gradient_errors(alibi.retnet_triton, alibi.retnet_recurrent, dict(q=q, k=k, v=v, gamma=gamma),
                           initial_state=S0)
    assert max(errs.values()) <= 2e-5, errs


def test_retnet_triton_prefill_in_pieces_then_decoding_is_one_pass():
    q, k, v = (x.float() for x in rand_qkv((2, 2), 90, 16, 24, seed=38))
    gamma = torch.tensor([[0.5, 0.9], [0.99, 1.0]])
    full, S = alibi.retnet_triton(q, k, v, gamma, return_state=True)
    pieces, S_pieces = run_in_pieces(alibi.retnet_triton, alibi.retnet_recurrent, q, k, v, lambda s, e: (gamma,),
                                     (23, 70))
    assert rel_err(pieces, full) <= 1e-5 and rel_err(S_pieces, S) <= 1e-5
    ref_out, ref_S = alibi.retnet_recurrent(q.double(), k.double(), v.double(), gamma.double(), return_state=True)
    assert rel_err(pieces, ref_out) <= 1e-5 and rel_err(S_pieces, ref_S) <= 1e-5
