"""Chapter 3: FoX and GLA / Mamba2, every form against float64 references, the special cases
(ALiBi, RetNet), the per-channel kernel path, robustness under strong decay, and the sympy facts."""

import pytest
import torch
import torch.nn.functional as F
from helpers import N_FIXED, TOL_F64, TOL_TRITON, case_id, gradient_errors, rand_qkv, random_shapes, rel_err, run_in_pieces

from pathedu import fox
from pathedu.kernels.flash_attention import attention
from pathedu.kernels.linear_attention import chunked_linear_attention
from pathedu.symbolic import fox as sym

CASES = random_shapes(6, seed=3)
FOX_FORMS = [fox.fox_naive, fox.fox_recurrent, fox.fox_matrix, fox.fox_blockwise]
GLA_FORMS = [fox.gla_naive, fox.gla_recurrent, fox.gla_matrix, fox.gla_chunked]
GATES = ["token", "channel"]


def rand_log_f(shape, seed, dtype=torch.float64, mean=2.0):
    """Log gates of varied strength: logsigmoid of N(mean, 1.5^2) (gates from ~0.1 to ~0.999)."""
    g = torch.Generator().manual_seed(seed)
    return F.logsigmoid(mean + 1.5 * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def gate_for(q, kind, seed, dtype=torch.float64, mean=2.0):
    shape = q.shape[:-1] if kind == "token" else q.shape
    return rand_log_f(shape, seed, dtype, mean)


# ---------------------------------------------------------------------------
# References written independently of the module: the sum over s = j+1..i is an
# einsum with a 0/1 indicator, not a cumulative sum.
# ---------------------------------------------------------------------------

def gate_sums(g):
    """``g: (..., T, G)`` -> ``(..., T, T, G)`` with ``[i, j] = sum_{j < s <= i} g[s]`` (0 where j >= i)."""
    T = g.shape[-2]
    i, j, s = torch.meshgrid(torch.arange(T), torch.arange(T), torch.arange(T), indexing="ij")
    between = ((j < s) & (s <= i)).double()
    return torch.einsum("ijs,...sg->...ijg", between, g.double())


def fox_reference(q, k, v, log_f, scale=None):
    T, D = q.shape[-2:]
    scale = D ** -0.5 if scale is None else scale
    logits = scale * torch.einsum("...id,...jd->...ij", q.double(), k.double()) + gate_sums(log_f[..., None])[..., 0]
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("...ij,...jd->...id", torch.softmax(logits, -1), v.double())


def gla_reference(q, k, v, log_f):
    T = q.shape[-2]
    g = log_f[..., None] if log_f.dim() == q.dim() - 1 else log_f
    decay = torch.exp(gate_sums(g)) * torch.ones(T, T, dtype=torch.float64).tril()[..., None]
    qk = q.double()[..., :, None, :] * k.double()[..., None, :, :]  # (..., T, T, D)
    w = (qk * decay).sum(-1)
    return torch.einsum("...ij,...jd->...id", w, v.double())


# ---------------------------------------------------------------------------
# Every form against float64
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("form", FOX_FORMS, ids=lambda f: f.__name__)
def test_fox_forms_match_float64(form, case):
    q, k, v = rand_qkv(*case, seed=hash(case) % 1000)
    log_f = gate_for(q, "token", seed=1)
    out = form(q, k, v, log_f)
    assert out.dtype == q.dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert rel_err(out, fox_reference(q, k, v, log_f)) <= TOL_F64


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("form", GLA_FORMS, ids=lambda f: f.__name__)
def test_gla_forms_match_float64(form, case, gate):
    q, k, v = rand_qkv(*case, seed=hash(case) % 1000)
    log_f = gate_for(q, gate, seed=2)
    out = form(q, k, v, log_f)
    assert out.dtype == q.dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert rel_err(out, gla_reference(q, k, v, log_f)) <= TOL_F64


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
@pytest.mark.parametrize("gate", GATES)
def test_gla_chunked_any_chunk_length(gate, chunk):
    q, k, v = rand_qkv((2,), 37, 16, 8, seed=4)
    log_f = gate_for(q, gate, seed=5)
    assert rel_err(fox.gla_chunked(q, k, v, log_f, chunk=chunk), gla_reference(q, k, v, log_f)) <= TOL_F64


@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (64, 64), (7, 3)])
def test_fox_blockwise_any_block_sizes(blocks):
    q, k, v = rand_qkv((2,), 45, 16, 8, seed=6)
    log_f = gate_for(q, "token", seed=7)
    out = fox.fox_blockwise(q, k, v, log_f, block_m=blocks[0], block_n=blocks[1])
    assert rel_err(out, fox_reference(q, k, v, log_f)) <= TOL_F64


@pytest.mark.parametrize("page", [1, 7, 64])
def test_fox_recurrent_any_page_size(page):
    q, k, v = rand_qkv((3,), 30, 16, seed=8)
    log_f = gate_for(q, "token", seed=9)
    assert rel_err(fox.fox_recurrent(q, k, v, log_f, page=page), fox_reference(q, k, v, log_f)) <= TOL_F64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES[:N_FIXED], ids=case_id)  # the interpreter is slow: fixed cases only
def test_triton_forms_match_float64(case, dtype):
    q, k, v = rand_qkv(*case, seed=7)
    tol = TOL_TRITON[dtype]
    lo = [x.to(dtype) for x in (q, k, v)]
    log_f = gate_for(q, "token", seed=10)
    out = fox.fox_triton(*lo, log_f.float())
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert rel_err(out, fox_reference(q, k, v, log_f)) <= tol
    for gate in GATES:
        log_f = gate_for(q, gate, seed=11)
        out = fox.gla_triton(*lo, log_f.to(dtype))
        assert out.dtype == dtype
        assert rel_err(out, gla_reference(q, k, v, log_f.to(dtype))) <= tol


def test_triton_odd_head_dims():
    """Head dims that are odd and no power of two (D = 17, Dv = 19): the kernels mask the padding."""
    q, k, v = rand_qkv((2,), 45, 17, 19, seed=33)
    lo = [x.float() for x in (q, k, v)]
    log_f = gate_for(q, "token", seed=34)
    assert rel_err(fox.fox_triton(*lo, log_f.float()), fox_reference(q, k, v, log_f)) <= 2e-3
    for gate in GATES:
        log_f = gate_for(q, gate, seed=35)
        assert rel_err(fox.gla_triton(*lo, log_f.float()), gla_reference(q, k, v, log_f)) <= 2e-3


def test_triton_accepts_bf16_on_cpu_via_fp32():
    q, k, v = rand_qkv((1, 2), 33, 16, dtype=torch.bfloat16)
    log_f = gate_for(q, "token", seed=12, dtype=torch.float32)
    out = fox.fox_triton(q, k, v, log_f)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, fox_reference(q, k, v, log_f)) <= 2e-2
    log_f = gate_for(q, "channel", seed=13, dtype=torch.float32)
    assert rel_err(fox.gla_triton(q, k, v, log_f), gla_reference(q, k, v, log_f)) <= 2e-2


def test_gate_is_not_multiplied_by_scale():
    q, k, v = rand_qkv((2,), 21, 16, seed=14)
    log_f = gate_for(q, "token", seed=15, mean=0.0)
    for form in FOX_FORMS + [fox.fox_triton]:
        args = [x.float() for x in (q, k, v, log_f)] if form is fox.fox_triton else (q, k, v, log_f)
        out = form(*args, scale=0.3)
        assert rel_err(out, fox_reference(q, k, v, log_f, scale=0.3)) <= 2e-3
        assert rel_err(out, fox_reference(q, k, v, 0.3 * log_f, scale=0.3)) > 1e-2  # a scaled gate would differ
        assert rel_err(out, fox_reference(q, k, v, log_f)) > 1e-2  # so would the default scale


def test_own_gate_never_acts():
    """log_f[0] multiplies nothing (no state, no earlier key): changing it changes no output."""
    q, k, v = rand_qkv((2,), 17, 16, seed=16)
    for gate in GATES:
        log_f = gate_for(q, gate, seed=17)
        other = log_f.clone()
        other[:, 0] = -5.0
        for form in GLA_FORMS:
            assert rel_err(form(q, k, v, other), form(q, k, v, log_f)) <= TOL_F64
    log_f = gate_for(q, "token", seed=18)
    other = log_f.clone()
    other[:, 0] = -5.0
    for form in FOX_FORMS:
        assert rel_err(form(q, k, v, other), form(q, k, v, log_f)) <= TOL_F64


def test_gla_recurrent_state_is_returned_and_resumable():
    q, k, v = rand_qkv((2,), 30, 16, 8)
    log_f = gate_for(q, "channel", seed=19)
    first, S = fox.gla_recurrent(q[..., :13, :], k[..., :13, :], v[..., :13, :], log_f[..., :13, :], return_state=True)
    rest = fox.gla_recurrent(q[..., 13:, :], k[..., 13:, :], v[..., 13:, :], log_f[..., 13:, :], initial_state=S)
    assert rel_err(torch.cat([first, rest], -2), gla_reference(q, k, v, log_f)) <= TOL_F64
    assert S.shape == (2, 8, 16)
    with pytest.raises(ValueError, match="`initial_state`"):
        fox.gla_recurrent(q, k, v, log_f, initial_state=S[..., :4])


# ---------------------------------------------------------------------------
# Special cases: constant gates are ALiBi and RetNet
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("slopes", [[0.0, 0.25], [1.0, 8.0]], ids=str)
def test_fox_with_constant_gate_is_alibi(slopes):
    """log_f = -lambda for every token: sum_{s=j+1..i} log_f = -lambda (i - j), ALiBi's bias.
    Checked against the kernel's ALiBi hook (pathedu.alibi is chapter 2's)."""
    q, k, v = rand_qkv((3, 2), 50, 16, seed=20, dtype=torch.float32)
    lam = torch.tensor(slopes)
    log_f = (-lam)[:, None].expand(3, 2, 50).contiguous()
    alibi = attention(q, k, v, alibi_slope=lam)
    for form in FOX_FORMS + [fox.fox_triton]:
        assert rel_err(form(q, k, v, log_f), alibi) <= 2e-3
    # and in float64 with an explicit -lambda (i - j) bias
    i = torch.arange(50)
    bias = -lam.double()[:, None, None] * (i[:, None] - i[None, :]).double()
    assert torch.allclose(fox.log_gate_matrix(log_f.double())[0].tril(), bias.tril())


@pytest.mark.parametrize("gammas", [[1.0, 0.9], [0.5, 2e-9]], ids=str)
def test_gla_with_constant_gate_is_retnet(gammas):
    """log_f = log gamma: S_t = gamma S_{t-1} + v_t k_t^T, RetNet; o_i = sum_j gamma^(i-j) (q_i.k_j) v_j."""
    q, k, v = rand_qkv((3, 2), 45, 16, 24, seed=21)
    gam = torch.tensor(gammas, dtype=torch.float64)
    i = torch.arange(45)
    powers = gam[:, None, None] ** (i[:, None] - i[None, :]).clamp_min(0).double() * torch.ones(45, 45).tril()
    retnet = (torch.einsum("...id,...jd->...ij", q, k) * powers) @ v
    per_token = torch.log(gam)[:, None].expand(3, 2, 45).contiguous()
    per_channel = per_token[..., None].expand(3, 2, 45, 16).contiguous()
    for form in GLA_FORMS:
        assert rel_err(form(q, k, v, per_token), retnet) <= TOL_F64
        assert rel_err(form(q, k, v, per_channel), retnet) <= TOL_F64
    lo = [x.float() for x in (q, k, v)]
    assert rel_err(chunked_linear_attention(*lo, log_f=per_token.float()), retnet) <= 2e-3  # the scalar path
    assert rel_err(chunked_linear_attention(*lo, log_f=per_channel.float()), retnet) <= 2e-3  # the channel path


def test_scalar_and_channel_paths_agree():
    """A per-channel gate that is constant across channels is the per-token gate, in every form."""
    q, k, v = rand_qkv((2, 3), 70, 32, 16, seed=22)
    log_f = gate_for(q, "token", seed=23)
    wide = log_f[..., None].expand(q.shape).contiguous()
    for form in GLA_FORMS:
        assert rel_err(form(q, k, v, wide), form(q, k, v, log_f)) <= TOL_F64
    lo = [x.float() for x in (q, k, v)]
    assert rel_err(fox.gla_triton(*lo, wide.float()), fox.gla_triton(*lo, log_f.float())) <= 2e-6


def test_channel_gates_differ_from_any_scalar_gate():
    """Distinct per-channel gates are not a per-token gate in disguise (the test could fail)."""
    q, k, v = rand_qkv((2,), 20, 16, seed=24)
    log_f = gate_for(q, "channel", seed=25)
    mean_gate = log_f.mean(-1)
    assert rel_err(fox.gla_matrix(q, k, v, mean_gate), gla_reference(q, k, v, log_f)) > 1e-2


@pytest.mark.parametrize("kind", ["smooth", "uniform", "jumps"])
def test_channel_kernel_error_under_strong_decay(kind):
    """The per-channel kernel path against float64 (the numbers quoted in kernels/linear_attention.py)."""
    q, k, v = rand_qkv((2,), 70, 32, 24, seed=26)
    g = torch.Generator().manual_seed(27)
    u = torch.rand(q.shape, generator=g, dtype=torch.float64)
    log_f = {"smooth": gate_for(q, "channel", seed=28), "uniform": -20 * u,
             "jumps": torch.where(u < 0.5, -20.0, -0.01).double()}[kind]
    err = rel_err(fox.gla_triton(q.float(), k.float(), v.float(), log_f.float()), gla_reference(q, k, v, log_f))
    assert err <= {"smooth": 1e-6, "uniform": 1e-5, "jumps": 5e-5}[kind]


# ---------------------------------------------------------------------------
# Gates, log space, and robustness
# ---------------------------------------------------------------------------

def test_forget_gate_logits_to_log_f():
    x = torch.linspace(-30, 30, 61, dtype=torch.float64)
    log_f = fox.forget_gate_logits_to_log_f(x)
    assert torch.allclose(log_f, torch.log(torch.sigmoid(x)))
    assert (log_f <= 0).all()
    far = fox.forget_gate_logits_to_log_f(torch.tensor([-200.0]))
    assert torch.isfinite(far).all() and abs(far.item() + 200) < 1e-4
    with pytest.raises(TypeError, match="`x`"):
        fox.forget_gate_logits_to_log_f([1.0])
    with pytest.raises(TypeError, match="`x`"):
        fox.forget_gate_logits_to_log_f(torch.ones(3, dtype=torch.long))


def test_log_gate_matrix():
    log_f = rand_log_f((2, 9), seed=31)
    D = fox.log_gate_matrix(log_f)
    assert D.shape == (2, 9, 9)
    assert torch.isneginf(D[..., torch.ones(9, 9, dtype=torch.bool).triu(1)]).all()
    low = torch.ones(9, 9, dtype=torch.bool).tril()
    assert torch.allclose(D[..., low], gate_sums(log_f[..., None])[..., 0][..., low])
    assert (D.diagonal(dim1=-2, dim2=-1) == 0).all()


def test_log_gate_matrix_sums_each_interval_itself():
    """D_ij is summed over its own gates, never as a difference c_i - c_j of long prefix sums: deep in
    a float32 sequence (c_i ~ -277 at i = 400) short intervals keep every digit, where the difference
    of prefix sums would lose ~|c_i| * 2^-24 (a relative error ~2e-5 for one gate)."""
    T = 400
    log_f = torch.full((T,), -0.6931472, dtype=torch.float32)  # gates of 1/2
    D = fox.log_gate_matrix(log_f)
    assert D.dtype == torch.float32
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    exact = (i - j).double() * float(log_f[0])
    near = (i - j >= 1) & (i - j <= 4)  # intervals of 1..4 gates, anywhere in the sequence
    assert ((D.double() - exact).abs()[near] / exact.abs()[near]).max() <= 1e-6
    # every interval, however long, is within float32 rounding of its length's sum, and e^D in [0, 1]
    low = i >= j
    assert ((D.double() - exact).abs()[low] / exact.abs()[low].clamp_min(1)).max() <= T * 2.0 ** -24
    assert ((torch.exp(D)[low] >= 0) & (torch.exp(D)[low] <= 1)).all()


def test_robustness_strong_decay_all_forms():
    """T = 1024, log_f = -20 per step, fp32, one head, D = 16: no NaN or inf anywhere, and every
    form still agrees with float64 (each output is essentially its own token's value).  The
    cumulative log gates reach -20,000: far past float32's exp range (e^-104 is 0, and e^{20 j} would
    overflow from j = 5), so a longer T adds nothing but interpreter time (the GPU checks run 4096)."""
    T = 1024
    q, k, v = rand_qkv((1,), T, 16, seed=32)
    token = torch.full((1, T), -20.0, dtype=torch.float64)
    channel = torch.full((1, T, 16), -20.0, dtype=torch.float64)
    lo = [x.float() for x in (q, k, v)]
    ref = fox.fox_matrix(q, k, v, token)
    for form, kw in [(fox.fox_naive, {}), (fox.fox_recurrent, dict(page=512)), (fox.fox_matrix, {}),
                     (fox.fox_blockwise, dict(block_m=512, block_n=512)), (fox.fox_triton, {})]:
        out = form(*lo, token.float(), **kw)
        assert torch.isfinite(out).all(), form.__name__
        assert rel_err(out, ref) <= 2e-3, form.__name__
    for log_f in (token, channel):
        ref = fox.gla_chunked(q, k, v, log_f)
        for form in GLA_FORMS + [fox.gla_triton]:
            out = form(*lo, log_f.float())
            assert torch.isfinite(out).all(), form.__name__
            assert rel_err(out, ref) <= 2e-3, form.__name__


# ---------------------------------------------------------------------------
# Bad gates (the checks every form shares are in tests/test_contract.py)
# ---------------------------------------------------------------------------

ALL_FOX = FOX_FORMS + [fox.fox_triton]
ALL_GLA = GLA_FORMS + [fox.gla_triton]


@pytest.mark.parametrize("form", ALL_FOX + ALL_GLA, ids=lambda f: f.__name__)
def test_bad_log_f_names_it(form):
    """Every wrong gate shape of this chapter (per token, per channel), non-tensors, and the messages."""
    q, k, v = rand_qkv((2,), 8, 16, dtype=torch.float32)
    good = torch.full((2, 8), -0.1)
    bad = [
        (good.abs(), ValueError, "`log_f`.*<= 0"),
        (good.masked_fill(good < 0, float("-inf")), ValueError, "`log_f`.*finite"),
        (good[:, :7], ValueError, "`log_f`"),
        (good[:1], ValueError, "`log_f`"),
        (good[None], ValueError, "`log_f`"),
        (good[..., None].expand(2, 8, 15), ValueError, "`log_f`"),
        (good[..., None, None], ValueError, "`log_f`"),
        (-1.0, TypeError, "`log_f`"),
        (-torch.ones(2, 8, dtype=torch.long), TypeError, "`log_f`"),
    ]
    if form in ALL_FOX:
        bad.append((good[..., None].expand(2, 8, 16), ValueError, "`log_f`"))  # FoX has no channel gate
    for log_f, exc, needle in bad:
        with pytest.raises(exc, match=needle):
            form(q, k, v, log_f)


@pytest.mark.parametrize("T", [1, 77, 3000])  # 3000: two steps of the program's walk (MAX_BLOCK_T = 2048)
def test_gate_prefix_sums_round_once_and_count_bad_gates(T):
    """The kernels' prologue (:func:`pathedu.kernels.gates.cumulative_log_gates`): the prefix sums of the log gates
    summed in float64 and rounded once to fp32 (within half an ulp of the float64 sums); the gradient is the reversed
    cumulative sum, made the same way; a gate that breaks ``-inf < log_f <= 0`` (positive, -inf, NaN) anywhere, in
    any row, raises the chapter's error naming the argument, read from the launch's own count."""
    from pathedu.checks import checked_after
    from pathedu.kernels.gates import MAX_BLOCK_T, cumulative_log_gates

    assert 2048 == MAX_BLOCK_T
    log_f = rand_log_f((3, T), seed=T, dtype=torch.float32)
    exact = log_f.double().cumsum(-1)
    c = cumulative_log_gates(log_f)
    assert c.dtype == torch.float32 and c.shape == (3, T)
    ulp = torch.finfo(torch.float32).eps * exact.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert ((c.double() - exact).abs() <= 0.5 * ulp).all()
    leaf = log_f.clone().requires_grad_()
    dc = torch.randn(3, T, generator=torch.Generator().manual_seed(T))
    (cumulative_log_gates(leaf) * dc).sum().backward()
    exact = dc.double().flip(-1).cumsum(-1).flip(-1)  # d log_f[s] = sum_{t >= s} dc_t, rounded once
    ulp = torch.finfo(torch.float32).eps * exact.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert leaf.grad.dtype == torch.float32 and ((leaf.grad.double() - exact).abs() <= 0.5 * ulp).all()
    for value, needle in [(0.25, "<= 0"), (float("-inf"), "finite"), (float("nan"), "<= 0")]:
        bad = log_f.clone()
        bad[2, T - 1] = value
        with pytest.raises(ValueError, match="`gate`.*" + needle):
            with checked_after() as check:
                cumulative_log_gates(bad, "gate", check)
    with checked_after() as check:  # good gates: nothing raised
        cumulative_log_gates(log_f, "gate", check)
    assert cumulative_log_gates(torch.zeros(0, T)).shape == (0, T)


@pytest.mark.parametrize("form", FOX_FORMS + [fox.fox_triton], ids=lambda f: f.__name__)
def test_bad_scale(form):
    q, k, v = rand_qkv((2,), 8, 16, dtype=torch.float32)
    with pytest.raises(ValueError, match="`scale`"):
        form(q, k, v, torch.full((2, 8), -0.1), scale=-1.0)


def test_kernel_checks_the_gate_shape():
    q, k, v = rand_qkv((2,), 8, 16, 24, dtype=torch.float32)
    for bad in (torch.zeros(2, 7), torch.zeros(2, 8, 24), torch.zeros(16)):
        with pytest.raises(ValueError, match="`log_f`"):
            chunked_linear_attention(q, k, v, log_f=bad)
    with pytest.raises(TypeError, match="`log_f`"):
        chunked_linear_attention(q, k, v, log_f=-0.1)


# ---------------------------------------------------------------------------
# The sympy facts and the benchmark module
# ---------------------------------------------------------------------------

def test_symbolic_facts():
    for n in (1, 2, 5):
        assert sym.gate_product_log_sum(n)["equal"]
        assert sym.gated_softmax_is_biased_softmax(n)["equal"]
    r = sym.per_channel_gate_reading(2)
    assert r["rescaled_equal"] and r["shared_is_scalar"] and not r["per_channel_is_scalar"]
    assert sym.per_channel_gate_reading(3)["rescaled_equal"]
    o = sym.rescaling_overflow(6, -20.0)
    assert o["bias_nonpositive"] and o["key_nonnegative"]
    t = o["overflow_position"]
    # the claim, in float32: e^{-c_t} = e^{20 (t + 1)} (t + 1 gates summed, 0-based) is finite at t - 1 and overflows at t
    assert torch.isfinite(torch.exp(torch.tensor(20.0 * t))) and torch.isinf(torch.exp(torch.tensor(20.0 * (t + 1))))
    with pytest.raises(ValueError, match="`n`"):
        sym.gate_product_log_sum(0)
    with pytest.raises(ValueError, match="`log_f`"):
        sym.rescaling_overflow(4, 0.5)


def test_bench_module_imports_and_lists_ops_on_cpu():
    from pathedu.bench import CHAPTERS
    from pathedu.bench import fox as bench

    assert "fox" in CHAPTERS
    ops = bench.ops()
    names = [o.name for o in ops]
    assert len(names) == len(set(names))
    assert {"sdpa", "fla_fox", "fox_triton", "gla_scalar_triton", "gla_channel_triton"} <= set(names)
    for o in ops:
        assert o.reference is None or o.reference in names
        assert callable(o.setup)
    assert dict((o.name, o.reference) for o in ops)["fox_triton"] == "fla_fox"
    from pathedu.bench.checks import CHECKS

    assert {"robust", "channel", "fp32"} <= set(CHECKS["fox"])  # the GPU checks: tests/test_gpu_checks_cpu.py


# ---------------------------------------------------------------------------
# GLA / Mamba2's backward pass in the linear template, and runs in pieces
# ---------------------------------------------------------------------------

def extreme_gates(q, gate, kind, seed):
    """Log gates per token or per channel: ``smooth`` (logsigmoid of N(2, 1.5^2)), ``uniform`` in [-20, 0],
    ``jumps`` between -20 and -0.01 (each with probability 1/2), ``strong`` (-20 everywhere: every pair but the
    diagonal weighs e^{-20} or less, so the gates' gradient is tiny beside every term that makes it)."""
    shape = q.shape[:-1] if gate == "token" else q.shape
    u = torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return {"smooth": rand_log_f(shape, seed), "uniform": -20 * u, "strong": torch.full(shape, -20.0, dtype=torch.float64),
            "jumps": torch.where(u < 0.5, -20.0, -0.01).double()}[kind]


# The fp32 kernels' gradients against float64: the forward's own accuracy under each kind of gate
# (test_channel_kernel_error_under_strong_decay), with room for the backward's sums.
GRAD_TOL = {"smooth": 3e-6, "uniform": 5e-5, "jumps": 1e-4, "strong": 5e-6}


@pytest.mark.parametrize("kind", list(GRAD_TOL))
@pytest.mark.parametrize("gate, chunk", [("token", 16), ("token", 64), ("channel", None)])
def test_gla_triton_gradients_under_extreme_gates(gate, chunk, kind):
    """fp32 kernel gradients of q, k, v and log_f against float64 autograd through the independent reference, at
    T = 70 (a partial last chunk at every chunk length)."""
    q, k, v = rand_qkv((1, 2), 70, 16, 24, seed=40)
    log_f = extreme_gates(q, gate, kind, seed=41)
    kw = {} if chunk is None else dict(chunk=chunk)
    errs = gradient_errors(lambda q, k, v, f: chunked_linear_attention(q, k, v, log_f=f, **kw), gla_reference,
                           dict(q=q, k=k, v=v, log_f=log_f))
    assert max(errs.values()) <= GRAD_TOL[kind], errs


@pytest.mark.parametrize("kind", ["smooth", "strong"])
@pytest.mark.parametrize("gate", GATES)
def test_gla_triton_state_in_and_out_is_differentiable(gate, kind):
    """``initial_state`` and the returned state against float64 autograd through ``gla_recurrent``, the gates'
    gradient included: the final state's factor e^{c_{T-1}} adds <dS, S> to it, less the last token's own write,
    which cancels (with strong gates it is far larger than the gradient itself)."""
    q, k, v = rand_qkv((2,), 75, 16, 24, seed=42)
    log_f = extreme_gates(q, gate, kind, seed=43)
    S0 = torch.randn(2, 24, 16, generator=torch.Generator().manual_seed(44), dtype=torch.float64)
    errs = gradient_errors(fox.gla_triton, fox.gla_recurrent, dict(q=q, k=k, v=v, log_f=log_f), initial_state=S0)
    assert max(errs.values()) <= 5e-6, errs


@pytest.mark.parametrize("gate", GATES)
def test_gla_triton_prefill_in_pieces_then_decoding_is_one_pass(gate):
    q, k, v = (x.float() for x in rand_qkv((2,), 90, 16, 24, seed=45))
    log_f = gate_for(q, gate, seed=46, dtype=torch.float32)
    full, S = fox.gla_triton(q, k, v, log_f, return_state=True)

    def gates(s, e):
        return (log_f[..., s:e] if gate == "token" else log_f[..., s:e, :],)

    pieces, S_pieces = run_in_pieces(fox.gla_triton, fox.gla_recurrent, q, k, v, gates, (23, 70))
    assert rel_err(pieces, full) <= 1e-5 and rel_err(S_pieces, S) <= 1e-5
    ref_out, ref_S = fox.gla_recurrent(q.double(), k.double(), v.double(), log_f.double(), return_state=True)
    assert rel_err(pieces, ref_out) <= 1e-5 and rel_err(S_pieces, ref_S) <= 1e-5


@pytest.mark.parametrize("layout", ["transposed", "expanded"])
def test_fox_triton_reads_log_f_in_any_layout_when_batch_times_heads_equals_T(layout):
    """The square case ``B * H == T``: a ``log_f`` of shape ``(B, H, T)`` whose strides are those of a transposed
    ``(T, B * H)`` tensor (or one broadcast over heads) holds the same values as a contiguous one, and the kernel reads
    the values, not the memory order: its output equals the float64 reference of the same values."""
    torch.manual_seed(3)
    B, H, T, D = 2, 4, 8, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    if layout == "transposed":
        log_f = torch.nn.functional.logsigmoid(torch.randn(T, B * H)).t().reshape(B, H, T)
        assert log_f.stride()[-1] != 1
    else:
        log_f = torch.nn.functional.logsigmoid(torch.randn(B, 1, T)).expand(B, H, T)
        assert log_f.stride()[1] == 0
    got = fox.fox_triton(q, k, v, log_f)
    want = fox.fox_matrix(q.double(), k.double(), v.double(), log_f.double())
    assert (got.double() - want).abs().max() < 1e-5
