"""Chapter 5 kernels (PaTH attention, chunked Householder RNN / DeltaNet) against float64 definitions.

The references here are written from the definitions alone, independently of the
kernels and of :mod:`pathedu.path`: transitions ``H_s = I - beta_s w_s w_s^T``
are applied one at a time, in the order the recurrence ``S_t = S_{t-1} H_t``
produces (``k_j^T H_{j+1} ... H_i q_i``, smallest index on the left).  On a CPU
the kernels run in Triton's interpreter, so sizes stay small (T <= 130, <= 4 heads).
"""
import warnings

import pytest
import torch
import triton
import triton.language as tl
from helpers import (TOL_TRITON, blockwise_errors, case_id, prepared_errors, rand_qkv, rel_err, ut_backward_case,
                     ut_backward_in)

from pathedu import path, pathfox
from pathedu.kernels.delta_rule import chunked_delta_rule, chunked_householder
from pathedu.kernels._pieces import dot, dot_ready, quiet_for, quiet_nan, rn
from pathedu.kernels.path_attention import MAX_R, Prepared, path_attention

CASES = [((2, 3), 1, 16, 16), ((1, 2), 37, 16, 24), ((), 65, 64, 32), ((2, 1, 2), 19, 32, 16),
         ((1,), 130, 64, 64), ((4,), 100, 24, 40)]


def transitions(lead, T, D, *, seed, beta="uniform"):
    """Unit ``w: (*lead, T, D)`` and ``beta: (*lead, T)`` in float64: uniform in [0, 2], or near 0 / near 2."""
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.functional.normalize(torch.randn(*lead, T, D, generator=g, dtype=torch.float64), dim=-1)
    u = torch.rand(*lead, T, generator=g, dtype=torch.float64)
    b = {"uniform": 2 * u, "near0": 1e-4 * u, "near2": 2 - 1e-4 * u}[beta]
    return w, b


def scores_reference(q, k, w, beta):
    """``s_ij = k_j^T H_{j+1} H_{j+2} ... H_i q_i`` for ``j <= i`` (0 above the diagonal), float64.

    Columns are filled right to left: before column ``j`` is read, row ``i`` of ``U``
    holds ``H_{j+1} ... H_i q_i`` (row ``j`` still holds ``q_j``: a token's own
    transition never acts on itself); then ``H_j`` is applied to rows ``i >= j``.
    """
    q, k, w, beta = (x.double() for x in (q, k, w, beta))
    T = q.shape[-2]
    U = q.clone()
    s = torch.zeros(q.shape[:-1] + (T,), dtype=torch.float64)
    for j in range(T - 1, -1, -1):
        s[..., j:, j] = (U[..., j:, :] * k[..., j, None, :]).sum(-1)
        proj = (U[..., j:, :] * w[..., j, None, :]).sum(-1, keepdim=True)  # (w_j . u_i) for rows i >= j
        U[..., j:, :] -= beta[..., j, None, None] * proj * w[..., j, None, :]
    return s


def path_reference(q, k, v, w, beta, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    T = q.shape[-2]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    logits = (scale * scores_reference(q, k, w, beta)).masked_fill(future, float("-inf"))
    return torch.softmax(logits, dim=-1) @ v.double()


def householder_reference(q, k, v, w, beta):
    """The RNN itself, token by token: ``S_t = S_{t-1} H_t + v_t k_t^T``, ``o_t = S_t q_t`` (float64)."""
    q, k, v, w, beta = (x.double() for x in (q, k, v, w, beta))
    S = torch.zeros(q.shape[:-2] + (v.shape[-1], q.shape[-1]), dtype=torch.float64)
    outs = []
    for t in range(q.shape[-2]):
        S = S - beta[..., t, None, None] * (S @ w[..., t, :, None]) * w[..., t, None, :]
        S = S + v[..., t, :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, dim=-2)


def delta_reference(q, k, v, beta):
    """DeltaNet token by token: ``S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T`` (float64)."""
    q, k, v, beta = (x.double() for x in (q, k, v, beta))
    S = torch.zeros(q.shape[:-2] + (v.shape[-1], q.shape[-1]), dtype=torch.float64)
    outs = []
    for t in range(q.shape[-2]):
        err = v[..., t, :] - (S @ k[..., t, :, None])[..., 0]
        S = S + beta[..., t, None, None] * err[..., :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, dim=-2)


def unit(x):
    return torch.nn.functional.normalize(x, dim=-1)


# ---------------------------------------------------------------------------
# The references themselves
# ---------------------------------------------------------------------------

def test_reference_uses_the_recurrence_order():
    """The vector propagation equals explicit D x D products H_{j+1} ... H_i; the reverse order differs."""
    q, k, _ = rand_qkv((), 6, 4, seed=1)
    w, beta = transitions((), 6, 4, seed=2)
    H = [torch.eye(4, dtype=torch.float64) - beta[s] * torch.outer(w[s], w[s]) for s in range(6)]
    s = scores_reference(q, k, w, beta)
    i, j = 5, 1
    P = H[2] @ H[3] @ H[4] @ H[5]  # H_{j+1} ... H_i
    assert torch.allclose(s[i, j], k[j] @ P @ q[i])
    assert not torch.allclose(s[i, j], k[j] @ (H[5] @ H[4] @ H[3] @ H[2]) @ q[i])
    assert torch.allclose(s.diagonal(), (q * k).sum(-1))  # j = i: the empty product


def test_householder_reference_is_the_unrolled_scores():
    q, k, v = rand_qkv((2,), 9, 8, 5, seed=3)
    w, beta = transitions((2,), 9, 8, seed=4)
    assert torch.allclose(householder_reference(q, k, v, w, beta), scores_reference(q, k, w, beta) @ v)
    kn = unit(k)
    assert torch.allclose(delta_reference(q, kn, v, beta), householder_reference(q, kn, beta[..., None] * v, kn, beta))


# ---------------------------------------------------------------------------
# PaTH attention
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_path_matches_float64(case, dtype):
    lead, T, D, Dv = case
    q, k, v = rand_qkv(lead, T, D, Dv, seed=T)
    w, beta = transitions(lead, T, D, seed=T + 1)
    out = path_attention(q.to(dtype), k.to(dtype), v.to(dtype), w.float(), beta.float())
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (Dv,)
    assert rel_err(out, path_reference(q, k, v, w, beta)) <= TOL_TRITON[dtype]


# (block, R, update): UT block sizes, query blocks of R UT blocks (the diagonal region
# then holds R key blocks), and the two forms of the carried query's update.
VARIANTS = [(16, 2, "ut"), (32, 2, "dense"), (32, 1, "ut"), (64, 2, "dense"), (128, 1, "dense")]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda x: "block{}_R{}_{}".format(*x))
def test_path_tile_variants(variant):
    block, R, update = variant
    q, k, v = rand_qkv((2,), 130, 32, 16, seed=5)
    w, beta = transitions((2,), 130, 32, seed=6)
    out = path_attention(q.float(), k.float(), v.float(), w.float(), beta.float(), block=block,
                         _config=dict(R=R, update=update))
    assert rel_err(out, path_reference(q, k, v, w, beta)) <= TOL_TRITON[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("beta_kind", ["near0", "near2"])
def test_path_beta_near_the_ends(beta_kind, dtype):
    q, k, v = rand_qkv((1, 2), 100, 16, 16, seed=7)
    w, beta = transitions((1, 2), 100, 16, seed=8, beta=beta_kind)
    ref = path_reference(q, k, v, w, beta)
    assert rel_err(path_attention(q.to(dtype), k.to(dtype), v.to(dtype), w.float(), beta.float(), block=32,
                                  _config=dict(R=2)), ref) <= TOL_TRITON[dtype]
    if beta_kind == "near0":  # almost no rotation: almost NoPE softmax attention
        assert rel_err(ref, path_reference(q, k, v, w, 0 * beta)) < 1e-2


def test_path_reflections_of_nearly_parallel_w():
    """beta = 2 and nearly equal unit w: the worst case for the triangular inverse (stable here)."""
    q, k, v = rand_qkv((2,), 130, 16, 16, seed=9)
    g = torch.Generator().manual_seed(10)
    w = unit(1 + 1e-3 * torch.randn(2, 130, 16, generator=g, dtype=torch.float64))
    beta = torch.full((2, 130), 2.0, dtype=torch.float64)
    ref = path_reference(q, k, v, w, beta)
    for block in (16, 64):
        out = path_attention(q.float(), k.float(), v.float(), w.float(), beta.float(), block=block)
        assert rel_err(out, ref) <= TOL_TRITON[torch.float32]


def test_path_uses_scale_and_refuses_w_whose_transitions_expand():
    q, k, v = rand_qkv((2,), 40, 16, 16, seed=11)
    w, beta = transitions((2,), 40, 16, seed=12)
    out = path_attention(q.float(), k.float(), v.float(), w.float(), beta.float(), scale=0.3)
    assert rel_err(out, path_reference(q, k, v, w, beta, scale=0.3)) <= 2e-3
    assert rel_err(out, path_reference(q, k, v, w, beta)) > 1e-2  # the default scale would differ
    with pytest.raises(ValueError, match="`w` gives transitions"):  # beta |w|^2 = 8: H expands
        path_attention(q.float(), k.float(), v.float(), 2 * w.float(), torch.full_like(beta.float(), 2.0), scale=0.3)


def test_path_bf16_on_cpu_runs_in_fp32():
    q, k, v = rand_qkv((1, 2), 33, 16, dtype=torch.bfloat16)
    w, beta = transitions((1, 2), 33, 16, seed=13)
    out = path_attention(q, k, v, w.float(), beta.float())
    assert out.dtype == torch.bfloat16
    assert rel_err(out, path_reference(q, k, v, w, beta)) <= 2e-2


def test_prepared_factors_match_their_definitions():
    """The preparation pass's q~, k~, Ã and G_J = P_J^T - I, checked against explicit products."""
    T, D, block = 40, 16, 16
    q, k, _ = rand_qkv((1,), T, D, seed=14)
    w, beta = transitions((1,), T, D, seed=15)
    p = Prepared(q.float(), k.float(), w.float(), beta.float(), T, block, q_dtype=torch.float32,
                 k_dtype=torch.float32, update_dtype=torch.float32)
    assert p.T_pad % (MAX_R * block) == 0 and p.T_pad >= T
    H = [torch.eye(D, dtype=torch.float64) - beta[0, s] * torch.outer(w[0, s], w[0, s]) for s in range(T)]

    def prod(lo, hi):  # H_lo H_{lo+1} ... H_hi (identity when lo > hi)
        P = torch.eye(D, dtype=torch.float64)
        for s in range(lo, hi + 1):
            P = P @ H[s]
        return P

    J, s0, e0 = 1, 16, 31
    i, j = 20, 18
    assert torch.allclose(p.qt[0, i].double(), prod(s0, i) @ q[0, i], atol=1e-5)  # q~_i = H_s ... H_i q_i
    assert torch.allclose(p.kt[0, j].double(), k[0, j] @ prod(j + 1, e0), atol=1e-5)  # k~_j^T = k_j^T H_{j+1} ... H_e
    assert torch.allclose(p.ad[0, i, j - s0].double(), k[0, j] @ prod(j + 1, i) @ q[0, i], atol=1e-5)
    assert p.ad[0, j, i - s0] == 0  # above the diagonal
    assert torch.allclose(p.g[0, J].double(), prod(s0, e0).T - torch.eye(D, dtype=torch.float64), atol=1e-5)
    # The last block runs past T: H = I there, so its G covers tokens 32..39 only.
    assert torch.allclose(p.g[0, 2].double(), prod(32, T - 1).T - torch.eye(D, dtype=torch.float64), atol=1e-5)
    assert (p.kt[0, T:] == 0).all() and (p.ad[0, T:] == 0).all()


@pytest.mark.parametrize("norm_q", [True, False], ids=["forward", "backward"])
def test_fp16_products_of_the_main_pass_scale_the_rows_of_q_and_k(norm_q):
    """On a GPU the main pass multiplies in fp16 where it would round to tf32 (``main_pass_precision``), with the
    rows of q and k scaled by powers of two into fp16's range.  Rows from 1e-12 to 1e12 (bf16 values, which fp16
    would overflow or flush unscaled) give every factor within 10-bit rounding of the exact pass's, and a NaN or inf
    reaches the same entries in both."""
    from pathedu.kernels.ut_prepare import main_pass_precision

    assert main_pass_precision("tf32") == "fp16" and main_pass_precision("x3") == "x3"
    T, D, block = 100, 32, 32
    g = torch.Generator().manual_seed(27)
    scales = 10.0 ** torch.randint(-12, 13, (1, T, 1), generator=g).float()
    # bf16 values held in fp32: the pass's scaled path, exercised by the interpreter (which cannot multiply bf16)
    q = (torch.randn(1, T, D, generator=g) * scales).bfloat16().float()
    k = (torch.randn(1, T, D, generator=g) * scales.flip(1)).bfloat16().float()
    w, beta = transitions((1,), T, D, seed=28)
    f32 = dict(q_dtype=torch.float32, k_dtype=torch.float32, update_dtype=torch.float32)
    kinds = dict(norm_q=True) if norm_q else dict(keep_inverse=True)

    def passes():  # (exact, fast) from the current q and k
        return tuple(Prepared(q, k, w.float(), beta.float(), T, block, precision=p, **f32, **kinds)
                     for p in ("ieee", "tf32"))

    exact, fast = passes()
    err = prepared_errors(fast, exact, q, k, T, block)
    for name in ("qt", "kt"):
        assert torch.isfinite(getattr(fast, name)).all()
    assert err["qt"] <= 3e-3 and err["kt"] <= 3e-3 and err["ad"] <= 2e-3 and err["ad_above"] and err["g"] <= 2e-3, err
    assert err.get("qn", 0.0) <= 2e-3 and ("qn" in err) == norm_q, err
    # the power-of-two scale at work: without it, rows of 1e12 overflow fp16
    assert (q.abs().amax(dim=-1) > 65504).any() and (k.abs().amax(dim=-1) > 65504).any()

    # a NaN in one query, an inf in one key: the same entries are non-finite in both passes
    q[0, 40, 3], k[0, 70, 5] = float("nan"), float("inf")
    with warnings.catch_warnings():  # the interpreter's numpy meets the NaN and inf put there on purpose
        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        exact, fast = passes()
    for name in ("qt", "kt", "ad", "g"):
        bad = ~torch.isfinite(getattr(exact, name))
        assert bad.any() or name == "g"
        assert torch.equal(~torch.isfinite(getattr(fast, name)), bad), name


def test_fp16_products_of_the_ut_backward_scale_each_tile():
    """On a GPU the UT backward multiplies in fp16 where the pass does (``backward_precision``), each tile of
    gradients and of q, k scaled by one power of two into fp16's range (``_pieces.scaled``).  Blocks from 1e-12
    to 1e12 (q, k) and 1e-20 to 1e20 (gradients), far outside fp16's range unscaled: every block of dq, dk, dw and
    dbeta within 10-bit rounding of the exact backward's, relative to that block; a NaN in one gradient entry
    reaches the same entries in both."""
    from pathedu.kernels.ut_prepare import backward_precision

    assert backward_precision("tf32", 64) == "fp16" and backward_precision("x3", 64) == "x3n"
    assert backward_precision("ieee", 64) == "ieee" and backward_precision("tf32", 32) == "tf32n"
    assert backward_precision("tf32", 64, fp16=False) == "tf32n" and backward_precision("x3", 64, fp16=False) == "x3n"
    T, D, block = 100, 64, 32
    # bf16 values held in fp32: the scaled path, exercised by the interpreter (which cannot multiply bf16)
    case = ut_backward_case(T, D, block, seed=28, device="cpu", qk_dtype=torch.float32)
    q, grads = case[0], case[-1]  # grads: the list the case holds, changed in place below
    exact, fast = ut_backward_in("ieee", *case), ut_backward_in("tf32", *case)  # exact, and the GPU's fp16 products
    assert all(torch.isfinite(a).all() for a in fast)
    worst = blockwise_errors(fast, exact, T, block)
    assert all(v <= 2e-3 for v in worst.values()), worst
    # what the scaling is for: unscaled, these tiles leave fp16's range
    assert q.abs().max() > 65504 and max(x.abs().max() for x in grads) > 65504

    grads[0][0, 40, 3] = float("nan")  # dq~ of one query
    grads[2][0, 70, 5] = float("inf")  # dÃ of one score
    with warnings.catch_warnings():  # the interpreter's numpy meets the NaN and inf put there on purpose
        warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
        exact, fast = ut_backward_in("ieee", *case), ut_backward_in("tf32", *case)
    for name, a, b in zip(("dq", "dk", "dw", "dbeta"), fast, exact):
        bad = ~torch.isfinite(b)
        assert bad.any(), name
        assert torch.equal(~torch.isfinite(a), bad), name


def test_fp16_ut_backward_matches_tf32_products_where_a_sum_cancels():
    """A block of one token has one dbeta, ``-(q.w)(dq~.w) - w^T dG w``, a sum that cancels: its distance from the
    exact backward is that of ten-bit ``w`` and gradients (up to 3.7e-3 of itself in these cases, 9.6e-3 in a GPU run)
    and says little about the kernel.  The fp16 products (scaled per tile) and the tf32 products ("tf32n": the same
    ten bits, rounded the same way, fp32's range) must agree to far better than that: measured 0 to 5e-7 in these
    cases, 2e-5 at most over twelve others (an unscaled fp16 tile of these gradients overflows or flushes to zero:
    checked, the test then fails)."""
    from pathedu.kernels.ut_prepare import check_block

    D = 128
    block = check_block(None, D)
    for seed, out_of_range in enumerate((1e9, 1e-9, 1e9)):  # gradients beyond fp16's range, whatever the draw
        case = ut_backward_case(1, D, block, seed=seed, device="cpu", qk_dtype=torch.float32)
        for x in case[-1]:
            x.mul_(out_of_range)
        fast, tf32 = ut_backward_in("tf32", *case), ut_backward_in("tf32n", *case)
        apart = blockwise_errors(fast, tf32, 1, block)
        assert all(v <= 1e-3 for v in apart.values()), apart


# ---------------------------------------------------------------------------
# The linear side: chunked Householder RNN and DeltaNet
# ---------------------------------------------------------------------------

def _wy_reference(k, v, beta, log_f, block):
    """Float64 ``W = A diag(e^b) K``, ``U~ = A V`` block by block (``A = (I + N)^{-1} diag(beta)``, the gated ``N``
    formed directly), and the scales the kernel's errors are measured against: ``|W_i| <= e^{b_i} beta_i |k_i|``
    and ``|U~_i| <= sum_j |A_ij| |v_j|`` (``(T, D)``, ``(T, Dv)``, ``(T,)``, ``(T, Dv)``)."""
    T, f64 = k.shape[0], dict(dtype=torch.float64)
    W, U, w_scale, u_scale = (torch.zeros(T, k.shape[1], **f64), torch.zeros(T, v.shape[1], **f64),
                              torch.zeros(T, **f64), torch.zeros(T, v.shape[1], **f64))
    for s in range(0, T, block):
        e = min(s + block, T)
        kc, vc, bc = k[s:e], v[s:e], beta[s:e]
        b = log_f[s:e].cumsum(0) if log_f is not None else torch.zeros(e - s, dtype=torch.float64)
        gamma = torch.exp((b[:, None] - b[None, :]).tril(-1)).tril(-1)
        A = torch.linalg.inv(torch.eye(e - s, dtype=torch.float64) + bc[:, None] * (kc @ kc.T) * gamma) * bc
        W[s:e], U[s:e] = A @ (torch.exp(b)[:, None] * kc), A @ vc
        w_scale[s:e] = torch.exp(b) * bc * kc.norm(dim=1)
        u_scale[s:e] = A.abs() @ vc.abs()
    return W, U, w_scale, u_scale


@pytest.mark.parametrize("gated", [False, True], ids=["ungated", "gated"])
def test_wy_factors_match_their_definitions(gated):
    """DeltaNet's preparation pass: per chunk W = A diag(e^b) K and U~ = A V with A = (I + N)^{-1} diag(beta),
    N_ij = beta_i (k_i . k_j) e^{b_i - b_j} (j < i), b the chunk-local prefix sum of log_f; rows past T are zero;
    a NaN in v reaches the rows of U~ at or after it, in its channel only."""
    from pathedu.kernels.ut_prepare import WYPrepared

    T, D, Dv, block = 40, 16, 8, 16
    _, k, v = rand_qkv((1,), T, D, Dv, seed=20)
    k = unit(k)
    _, beta = transitions((1,), T, D, seed=21)
    log_f = -torch.rand(1, T, dtype=torch.float64, generator=torch.Generator().manual_seed(22)) * 3 if gated else None
    v = v.clone()
    v[0, 21, 3] = float("nan")
    f32 = lambda x: None if x is None else x.float().contiguous()  # noqa: E731
    p = WYPrepared(f32(k), f32(v), f32(beta), f32(log_f), T, block, dtype=torch.float32, precision="ieee")
    assert p.T_pad == 48 and p.w.shape == (1, 48, D) and p.u.shape == (1, 48, Dv)
    W, U, _, _ = _wy_reference(k[0], torch.nan_to_num(v[0], nan=0.0), beta[0], log_f[0] if gated else None, block)
    U[21:32, 3] = float("nan")  # from the NaN's row to the end of its chunk
    assert torch.allclose(p.w[0, :T].double(), W, atol=1e-5)
    assert torch.allclose(p.u[0, :T].double(), U, atol=1e-5, equal_nan=True)
    assert (p.w[0, T:] == 0).all() and (p.u[0, T:] == 0).all()
    assert torch.isnan(p.u[0, 21:32, 3]).all() and torch.isfinite(p.u[0, :21]).all()
    assert torch.isfinite(p.u[0, 32:T]).all()  # the next chunk does not inherit it: the state carries it there


@pytest.mark.parametrize("gated", [False, True], ids=["ungated", "gated"])
def test_wy_factors_in_fp16_products(gated):
    """The pass's fp16 products (16-bit inputs, :func:`main_pass_precision`) on a hard block: key lengths and value
    magnitudes spread over four decades (1e-2 to 1e2), ``beta_i |k_i|^2`` from 0 to 2 with every eleventh ``beta``
    1e-7, a zero key, gates down to -20 a token.  Each row of ``W`` within 3e-3 of its bound ``e^{b_i} beta_i |k_i|``
    (plus 1e-35: ``e^b`` leaves fp32's range at the end of a strongly gated block) and each entry of ``U~`` within
    1e-2 of ``sum_j |A_ij| |v_j|`` (on such blocks, worst of three seeds, the tf32 products this replaced measured
    6.3e-4 and 5.0e-3, the fp16 ones 7.0e-4 and 6.7e-3).  The conjugation by the keys' powers of two keeps every
    operand in fp16's range, and ``beta`` on the inverse's columns keeps a small ``beta_i`` out of the products:
    with ``beta`` on the rows (the first version) rows with ``beta_i |k_i|^2 < 1e-5`` were off by up to their own
    size."""
    from pathedu.kernels.ut_prepare import WYPrepared, main_pass_precision

    assert main_pass_precision("tf32") == "fp16"
    T, D, Dv, block = 128, 32, 16, 64
    g = torch.Generator().manual_seed(40)
    k = unit(torch.randn(T, D, generator=g, dtype=torch.float64)) * 10 ** (4 * torch.rand(T, 1, generator=g,
                                                                                                dtype=torch.float64) - 2)
    k[37] = 0.0
    beta = torch.rand(T, generator=g, dtype=torch.float64) ** 4 * (2 / k.pow(2).sum(1).clamp_min(1.0)).clamp(max=2.0)
    beta[5::11] = 1e-7
    v = torch.randn(T, Dv, generator=g, dtype=torch.float64) * 10 ** (4 * torch.rand(T, 1, generator=g,
                                                                                    dtype=torch.float64) - 2)
    log_f = None
    if gated:
        log_f = -torch.rand(T, generator=g, dtype=torch.float64)
        log_f[::7] = -20.0
    W, U, w_scale, u_scale = _wy_reference(k, v, beta, log_f, block)
    f32 = lambda x: None if x is None else x.float()[None].contiguous()  # noqa: E731
    p = WYPrepared(f32(k), f32(v), f32(beta[None])[0], f32(log_f), T, block, dtype=torch.float32, precision="tf32")
    assert torch.isfinite(p.w).all() and torch.isfinite(p.u).all()
    assert (p.w[0, 37] == 0).all()  # a zero key: W's row is exactly 0
    w_err = (p.w[0, :T].double() - W).norm(dim=1) / (w_scale + 1e-35)
    u_err = (p.u[0, :T].double() - U).abs() / u_scale
    assert w_err.max() <= 3e-3 and u_err.max() <= 1e-2, (w_err.max().item(), u_err.max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_householder_and_delta_match_float64(case, dtype):
    lead, T, D, Dv = case
    q, k, v = rand_qkv(lead, T, D, Dv, seed=T + 2)
    w, beta = transitions(lead, T, D, seed=T + 3)
    q, k = q / D ** 0.5, k / D ** 0.5  # keeps the state's growth (and fp16) in range
    out = chunked_householder(q.to(dtype), k.to(dtype), v.to(dtype), w.float(), beta.float())
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (Dv,)
    assert rel_err(out, householder_reference(q, k, v, w, beta)) <= TOL_TRITON[dtype]
    qn, kn = unit(q), unit(k)
    out = chunked_delta_rule(qn.to(dtype), kn.to(dtype), v.to(dtype), beta.float())
    assert out.dtype == dtype
    assert rel_err(out, delta_reference(qn, kn, v, beta)) <= TOL_TRITON[dtype]


@pytest.mark.parametrize("chunk", [16, 32, 128])
@pytest.mark.parametrize("beta_kind", ["near0", "near2"])
def test_linear_side_chunks_and_extreme_beta(chunk, beta_kind):
    q, k, v = rand_qkv((3,), 77, 16, 24, seed=16)
    w, beta = transitions((3,), 77, 16, seed=17, beta=beta_kind)
    q, k = q / 4, k / 4
    out = chunked_householder(q.float(), k.float(), v.float(), w.float(), beta.float(), chunk=chunk)
    assert rel_err(out, householder_reference(q, k, v, w, beta)) <= TOL_TRITON[torch.float32]
    kn = unit(k)
    out = chunked_delta_rule(q.float(), kn.float(), v.float(), beta.float(), chunk=chunk)
    assert rel_err(out, delta_reference(q, kn, v, beta)) <= TOL_TRITON[torch.float32]


def test_delta_rule_factor_dtype():
    """DeltaNet's stored WY factors: bf16 for bf16 inputs by default (fla's choice), fp32 for the others or on
    request; both stay within bf16's tolerance of float64, gated and not; anything else is refused by name."""
    from pathedu.kernels._launch import per_token, prepare_qkv
    from pathedu.kernels.delta_rule import _factor_dtype, _prepare

    q, k, v = rand_qkv((2,), 40, 16, 16, seed=20)
    _, beta = transitions((2,), 40, 16, seed=21)
    qn, kn = unit(q), unit(k)
    log_f = -torch.rand(2, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(22)) / 4
    bf = [t.to(torch.bfloat16) for t in (qn, kn, v)]
    for dtype, want in [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                        (torch.float32, torch.float32)]:
        assert _factor_dtype(None, dtype) == want
        x = prepare_qkv(*(t.to(dtype) for t in (qn, kn, v)))
        prep, _ = _prepare(x, x.k, per_token(beta, "beta", x), 16, delta=True, wy_dtype=_factor_dtype(None, dtype))
        assert prep.w.dtype == prep.u.dtype == want
    for gate in (None, log_f):
        ref = (delta_reference(qn, kn, v, beta) if gate is None
               else pathfox.gated_deltanet_recurrent(qn, kn, v, beta, gate))
        for factor_dtype in (None, torch.bfloat16, torch.float32):
            out = chunked_delta_rule(*bf, beta.float(), log_f=None if gate is None else gate.float(),
                                     factor_dtype=factor_dtype)
            assert out.dtype == torch.bfloat16
            assert rel_err(out, ref) <= 2e-2, (gate is None, factor_dtype)
    for bad in (torch.float16, "bf16"):
        with pytest.raises(ValueError, match="`factor_dtype`"):
            chunked_delta_rule(*bf, beta.float(), factor_dtype=bad)


def test_delta_rule_is_householder_with_w_equal_k():
    q, k, v = rand_qkv((2,), 50, 16, 16, seed=18)
    _, beta = transitions((2,), 50, 16, seed=19)
    kn = unit(k).float()
    a = chunked_delta_rule(q.float(), kn, v.float(), beta.float())
    b = chunked_householder(q.float(), kn, (beta[..., None] * v).float(), kn, beta.float())
    assert rel_err(a, b.double()) <= 1e-5


# ---------------------------------------------------------------------------
# Edges and bad input
# ---------------------------------------------------------------------------

KERNELS = {
    "path": lambda q, k, v, w, b, **kw: path_attention(q, k, v, w, b, **kw),
    "householder": lambda q, k, v, w, b, **kw: chunked_householder(q, k, v, w, b, **kw),
    "delta": lambda q, k, v, w, b, **kw: chunked_delta_rule(q, k, v, b, **kw),
}


@pytest.mark.parametrize("name", KERNELS)
def test_empty_sequence_returns_empty(name):
    q, k, v = (torch.zeros(2, 0, 16) for _ in range(3))
    out = KERNELS[name](q, k, v, torch.zeros(2, 0, 16), torch.zeros(2, 0))
    assert out.shape == (2, 0, 16)


@pytest.mark.parametrize("name", KERNELS)
def test_bad_input_names_the_argument(name):
    f = KERNELS[name]
    q, k, v = rand_qkv((2,), 8, 16, dtype=torch.float32)
    w, b = torch.ones(2, 8, 16) / 4, torch.ones(2, 8)
    with pytest.raises(TypeError, match="float64"):
        f(q.double(), k.double(), v.double(), w, b)
    with pytest.raises(TypeError, match="`q`"):
        f(q.long(), k, v, w, b)
    with pytest.raises(ValueError, match="head dims"):
        f(q[..., :8], k[..., :8], v, w[..., :8], b)
    with pytest.raises(ValueError, match="`v`"):
        f(q, k, torch.zeros(2, 8, 256), w, b)
    with pytest.raises(ValueError, match="`beta`"):
        f(q, k, v, w, b[..., :7])
    with pytest.raises(ValueError, match="`k`"):
        f(q, k[..., :7, :], v, w, b)
    kw = {"chunk": 48} if name != "path" else {"block": 48}
    with pytest.raises(ValueError, match="`chunk`" if name != "path" else "`block`"):
        f(q, k, v, w, b, **kw)
    if name != "delta":
        with pytest.raises(ValueError, match="`w`"):
            f(q, k, v, w[..., :15], b)


def test_path_rejects_bad_config():
    q, k, v = rand_qkv((2,), 8, 16, dtype=torch.float32)
    w, b = torch.ones(2, 8, 16) / 4, torch.ones(2, 8)
    with pytest.raises(ValueError, match="R"):
        path_attention(q, k, v, w, b, _config=dict(R=3))
    with pytest.raises(ValueError, match="update"):
        path_attention(q, k, v, w, b, _config=dict(update="qr"))
    with pytest.raises(TypeError, match="`save_factors`"):
        path_attention(q, k, v, w, b, save_factors=1)
    with pytest.raises(ValueError, match=r"`_config` keys \['R'\]"):  # the scan's tiles: no scan with gradients
        path_attention(q.requires_grad_(), k, v, w, b, _config=dict(R=1))


def test_backward_tiles_are_checked_at_the_call():
    """``_config['backward']`` fails where the call is made, naming the key, not later inside ``.backward()``."""
    q, k, v = rand_qkv((2,), 40, 16, dtype=torch.float32)
    w, b = torch.ones(2, 40, 16) / 4, torch.ones(2, 40)
    q.requires_grad_()
    with pytest.raises(ValueError, match=r"`_config\['backward'\]\['INNER'\]` must be at most the block \(16\)"):
        path_attention(q, k, v, w, b, block=16, _config=dict(backward=dict(INNER=32)))
    with pytest.raises(TypeError, match=r"`_config\['backward'\]` must be a dict"):
        path_attention(q, k, v, w, b, block=16, _config=dict(backward=32))


# ---------------------------------------------------------------------------
# The backward pass's schedule: every pair of blocks meets once, at a dyadic boundary
# ---------------------------------------------------------------------------

def _path_case(T, D=8, seed=0, lead=(2,)):
    g = torch.Generator().manual_seed(seed)
    q, k, v, w = (torch.randn(*lead, T, D, generator=g, dtype=torch.float64) for _ in range(4))
    beta = 2 * torch.rand(*lead, T, generator=g, dtype=torch.float64)
    return q, k, v, torch.nn.functional.normalize(w, dim=-1), beta


@pytest.mark.parametrize("T, block", [(1, 4), (4, 4), (5, 4), (37, 4), (64, 8), (150, 16)])
def test_dyadic_schedule_gives_the_matrix_forms_output_and_gradients(T, block):
    """``path_dyadic`` (pairs of blocks meet at the boundary of their smallest dyadic node) against ``path_matrix``,
    float64: the output and every argument's gradient, block counts that are and are not powers of two."""
    args = _path_case(T, seed=T)
    leaves_a = [x.clone().requires_grad_() for x in args]
    leaves_b = [x.clone().requires_grad_() for x in args]
    out_a, out_b = path.path_dyadic(*leaves_a, block=block), path.path_matrix(*leaves_b)
    assert rel_err(out_a, out_b) < 1e-12
    g = torch.randn_like(out_b)
    got = torch.autograd.grad(out_a, leaves_a, g, allow_unused=True)  # T = 1: w and beta unused
    want = torch.autograd.grad(out_b, leaves_b, g, allow_unused=True)
    for name, a, b, x in zip("q k v w beta".split(), got, want, args):
        a, b = (torch.zeros_like(x) if t is None else t for t in (a, b))
        assert (a - b).abs().max() <= 1e-10 * max(1.0, b.abs().max().item()), name


def test_dyadic_level_is_the_highest_differing_bit():
    for I in range(1, 40):
        for J in range(I):
            lvl = path.dyadic_level(I, J)
            assert I >> (lvl + 1) == J >> (lvl + 1) and (I >> lvl) & 1 == 1 and (J >> lvl) & 1 == 0


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 1e-3)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("nb, D, BT", [(2, 16, 16), (3, 16, 16), (5, 32, 16), (8, 16, 32), (7, 24, 16)])
def test_triton_carries_and_their_reverse_match_autograd(nb, D, BT, dtype, tol):
    """``carry_forward`` (queries and keys to their meeting points) against ``path._meeting_points``, and
    ``carry_backward`` against autograd through it (interpreter) vs float64: with fp32 factors, and with the
    fp16 factors of 16-bit inputs, whose carries are multiplied in fp16 (10 mantissa bits, as rounded tf32); keeping
    the carries leaves ``X`` as it was."""
    from pathedu.kernels.path_carry import carry_backward, carry_forward

    g = torch.Generator().manual_seed(nb * 100 + D)
    qt, kt = (torch.randn(2, nb, BT, D, generator=g, dtype=torch.float64) for _ in range(2))
    w = torch.nn.functional.normalize(torch.randn(2, nb, 4, D, generator=g, dtype=torch.float64), dim=-1)
    G = -1.5 * w.transpose(-1, -2) @ w / 4  # a contraction's G = Phi - I
    eye = torch.eye(D, dtype=torch.float64)
    leaves = [x.clone().requires_grad_() for x in (qt, kt, G)]
    X = path._meeting_points(leaves[0], leaves[1], eye + leaves[2])
    dX = torch.randn(X.shape, generator=g, dtype=torch.float64)
    want = torch.autograd.grad(X, leaves, dX, allow_unused=True)
    flat = [x.to(dtype).flatten(1, 2).contiguous() for x in (qt, kt)]
    Gd = G.to(dtype).contiguous()
    got_X, none = carry_forward(flat[0], flat[1], Gd, BT, dtype)
    assert none is None and got_X.dtype == dtype and rel_err(got_X.double(), X.flatten(-3, -2)) < tol
    kept_X, C = carry_forward(flat[0], flat[1], Gd, BT, dtype, keep_carries=True)
    assert torch.equal(kept_X, got_X) and C.shape == (X.shape[0] - 1, *Gd.shape) and C.dtype == dtype
    got = carry_backward(flat[0], flat[1], Gd, BT, dX.float().flatten(-3, -2).contiguous(), dtype, C)
    for name, a, b, like in zip(("dq~", "dk~", "dG"), got, want, leaves):
        b = torch.zeros_like(like) if b is None else b
        assert a.dtype == torch.float32 and rel_err(a.double().reshape(b.shape), b) < tol, name


def test_fp16_products_of_the_ut_backward_leave_fp16_inputs_as_they_are():
    """fp16 q and k need no scale to enter fp16 products, and a scale for the tile would push a small row under a
    large one into fp16's subnormals: a block whose only gradient is one score of a query of 1e-4, beside a query of
    6e4, gives the same dk as the exact backward (scaled by the tile's 2^-15, that query would flush to 0)."""
    from pathedu.kernels.ut_prepare import Prepared

    T, D, block = 64, 64, 64
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, T, D, generator=g) for _ in range(2))
    q[0, 0] *= 6e4 / q[0, 0].abs().max()  # the tile's largest entry 6e4
    q[0, 9] *= 1e-4
    q, k = q.half(), k.half()
    w = torch.nn.functional.normalize(torch.randn(1, T, D, generator=g), dim=-1)
    beta = 2 * torch.rand(1, T, generator=g)
    prep = Prepared(q.float(), k.float(), w, beta, T, block, q_dtype=torch.float32, k_dtype=torch.float32,
                    update_dtype=torch.float32, keep_inverse=True, precision="ieee")
    dqt, dkt = (torch.zeros(1, prep.T_pad, D) for _ in range(2))
    dad, dg = torch.zeros(1, prep.T_pad, block), torch.zeros(1, prep.T_pad // block, D, D)
    dad[0, 9, 4] = 1.0  # the score of query 9 (of 1e-4) and key 4
    case = (q, k, w, beta, prep, (dqt, dkt, dad, dg))
    (_, dk, _, _), (_, dk_exact, _, _) = ut_backward_in("tf32", *case), ut_backward_in("ieee", *case)
    assert dk_exact.float().norm() > 0
    assert rel_err(dk.double(), dk_exact.double()) < 2e-3


def _fp16_carries(nb: int, D: int, BT: int, *, seed: int):
    """fp16 factors of ``nb`` blocks of ``BT`` tokens (random ``q~``, ``k~``; each block's ``G`` from four unit
    reflections with beta = 1.5) and their carries: ``(generator, qt, kt, G, X, C)``, the generator left to draw
    the gradients from."""
    from pathedu.kernels.path_carry import carry_forward

    g = torch.Generator().manual_seed(seed)
    qt, kt = (torch.randn(1, nb * BT, D, generator=g).half() for _ in range(2))
    w = torch.nn.functional.normalize(torch.randn(1, nb, 4, D, generator=g, dtype=torch.float64), dim=-1)
    G = (-1.5 * w.transpose(-1, -2) @ w / 4).half().contiguous()
    X, C = carry_forward(qt, kt, G, BT, torch.float16, keep_carries=True)
    return g, qt, kt, G, X, C


def test_fp16_reversed_carries_scale_each_gradient_tile():
    """``carry_backward(..., precision="fp16")``, an option for fp16 factors: the products in fp16, each block's ``dX``
    tile and each trip's running sum scaled by a power of two.  With ``dX`` blocks from 1e-20 to 1e20 (fp16's range
    is 6e-5 to 65504), every block of ``dq~``, ``dk~`` and ``dG`` agrees with the default reverse, whose tf32 products
    round to the same ten bits, within 2e-4 of that block (the two roundings differ on ties); a NaN in ``dX``
    reaches the same entries; the option refuses fp32 factors."""
    from pathedu.kernels.path_carry import carry_backward

    nb, D, BT = 8, 32, 16
    g, qt, kt, G, X, C = _fp16_carries(nb, D, BT, seed=24)
    mag = 10.0 ** torch.randint(-20, 21, (1, 1, nb), generator=g).float()  # a block's rows alike at every level
    dX = torch.randn(X.shape, generator=g) * mag.repeat_interleave(BT, dim=-1)[..., None]
    exact = carry_backward(qt, kt, G, BT, dX, torch.float16, C)  # the default: rounded tf32 products
    fast = carry_backward(qt, kt, G, BT, dX, torch.float16, C, precision="fp16")
    assert dX.abs().max() > 1e15 and dX.abs()[dX != 0].min() < 1e-15  # far outside fp16's range unscaled
    worst = {}
    for name, a, b in zip(("dq~", "dk~", "dG"), fast, exact):
        assert torch.isfinite(a).all(), name
        blocks = [(a.view(nb, -1)[i], b.view(nb, -1)[i]) for i in range(nb)]  # each block's rows (or D x D tile)
        worst[name] = max(((x - y).norm() / y.norm()).item() for x, y in blocks if y.norm() > 0)
    assert all(v <= 2e-4 for v in worst.values()), worst

    dX[2, 0, 5 * BT + 3, 7] = float("nan")  # level 2, block 5
    exact = carry_backward(qt, kt, G, BT, dX, torch.float16, C)
    fast = carry_backward(qt, kt, G, BT, dX, torch.float16, C, precision="fp16")
    for name, a, b in zip(("dq~", "dk~", "dG"), fast, exact):
        assert torch.equal(a.isnan(), b.isnan()), name
    assert any(b.isnan().any() for b in exact)
    with pytest.raises(ValueError, match="fp16 factors"):
        carry_backward(qt.float(), kt.float(), G.float(), BT, dX, torch.float32, C.float(), precision="fp16")
    with pytest.raises(ValueError, match="precision"):
        carry_backward(qt, kt, G, BT, dX, torch.float16, C, precision="tf32")


@pytest.mark.parametrize("D", [32, 48])
def test_reversed_carries_default_to_fp16_products_above_32(D):
    """The reversed carries' default for fp16 factors: fp16 products for ``D > 32`` (measured faster), tf32 ones
    ("tf32n") for ``D <= 32``, as the UT backward; fp32 factors never take fp16."""
    from pathedu.kernels.path_carry import carry_backward

    nb, BT = 4, 16
    g, qt, kt, G, X, C = _fp16_carries(nb, D, BT, seed=D)
    # entries over ten decades within a tile: fp16's subnormals keep fewer bits of the smallest than tf32 does,
    # which tells the two precisions apart
    dX = torch.randn(X.shape, generator=g) * 10.0 ** torch.randint(-10, 1, X.shape, generator=g)
    default = carry_backward(qt, kt, G, BT, dX, torch.float16, C)
    expected = carry_backward(qt, kt, G, BT, dX, torch.float16, C, precision="fp16" if D > 32 else "tf32n")
    other = carry_backward(qt, kt, G, BT, dX, torch.float16, C, precision="tf32n" if D > 32 else "fp16")
    assert all(torch.equal(a, b) for a, b in zip(default, expected))
    assert not all(torch.equal(a, b) for a, b in zip(default, other))  # the two precisions differ here
    factors32 = (qt.float(), kt.float(), G.float(), BT, dX, torch.float16, C.float())
    assert all(torch.equal(a, b) for a, b in zip(carry_backward(*factors32),
                                                 carry_backward(*factors32, precision="tf32n")))


def test_kept_carries_are_the_products_of_the_transitions():
    """``carry_forward(..., keep_carries=True)``'s ``C[l - 1]`` holds, for every block ``b`` of a right half at level
    ``l``, ``C_b = Phi_{b-1} ... Phi_mid`` (the identity at ``mid``), and for a left half ``E_b = Phi_{b+1}^T ...
    Phi_{mid-1}^T``: what the reversed carries read (float64 products against the kernel, fp32, interpreter)."""
    from pathedu.kernels.path_carry import carry_forward

    nb, D, BT = 7, 16, 16  # three levels, a last node cut short
    g = torch.Generator().manual_seed(3)
    qt, kt = (torch.randn(1, nb * BT, D, generator=g) for _ in range(2))
    w = torch.nn.functional.normalize(torch.randn(1, nb, 2, D, generator=g, dtype=torch.float64), dim=-1)
    G = -0.7 * w.transpose(-1, -2) @ w
    _, C = carry_forward(qt, kt, G.float().contiguous(), BT, torch.float32, keep_carries=True)
    phi = torch.eye(D, dtype=torch.float64) + G[0]
    assert C.shape == (2, 1, nb, D, D)
    for lvl in (1, 2):
        h = 1 << lvl
        for mid in range(h, nb, 2 * h):
            want = torch.eye(D, dtype=torch.float64)
            for b in range(mid, min(mid + h, nb)):  # right half, left to right
                assert rel_err(C[lvl - 1, 0, b].double(), want) < 1e-5, (lvl, b)
                want = phi[b] @ want
            want = torch.eye(D, dtype=torch.float64)
            for b in range(mid - 1, mid - h - 1, -1):  # left half, right to left
                assert rel_err(C[lvl - 1, 0, b].double(), want) < 1e-5, (lvl, b)
                want = phi[b].T @ want


def test_backward_tiles_fit_the_schedule():
    """The backward kernel's (and its schedule's forward's) inner tiles never exceed a UT block (a level's half can
    be one block), and the UT backward never gets 8 warps below D = 64 (a miscompilation on the H100): the
    autotuners' pruning."""
    from pathedu.kernels.path_attention import _BWD_CONFIGS, _DYADIC_CONFIGS, _inner_within_block
    from pathedu.kernels.ut_prepare import _UT_BWD_CONFIGS, _warps_that_compile

    for bt in (16, 32, 64, 128):
        for configs in (_BWD_CONFIGS, _DYADIC_CONFIGS):  # the backward's and the forward's on its schedule
            kept = _inner_within_block(configs, {}, BT=bt)
            assert kept and all(c.kwargs["INNER"] <= bt for c in kept), bt
    assert [c.num_warps for c in _warps_that_compile(_UT_BWD_CONFIGS, {}, HEAD_DIM=16)] == [4]
    assert sorted(c.num_warps for c in _warps_that_compile(_UT_BWD_CONFIGS, {}, HEAD_DIM=64)) == [4, 8]


def test_backward_keeps_gradients_below_fp16s_range():
    """The backward's gradient products run in dO's dtype, not in the meeting-point rows': the rows are fp16 for
    16-bit inputs, and a trained layer's gradients can sit far below fp16's normal range (RMS 1.8e-7 measured,
    kernels/NOTES_path.md, "Meeting points in fp16, gradient products in dO's dtype").  Rows forced to fp16 beside gradients of 1e-7 (fp32 here: the CPU runs
    16-bit inputs in fp32): the gradients must match float64 as closely as with gradients of 1 (products of dz
    rounded to fp16 flushed most of them to zero)."""
    from pathedu.kernels.path_attention import meeting_point_dtype, path_attention

    torch.manual_seed(0)
    T, D = 100, 32
    q, k, v = (torch.randn(1, 2, T, D) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(1, 2, T, D), dim=-1)
    beta = 2 * torch.rand(1, 2, T)
    do = torch.randn(1, 2, T, D)
    l64 = [a.double().requires_grad_() for a in (q, k, v, w, beta)]
    want = torch.autograd.grad(path.path_matrix(*l64), l64, do.double())
    errs = {}
    for tiny in (1.0, 1e-7):
        leaves = [a.clone().requires_grad_() for a in (q, k, v, w, beta)]
        with meeting_point_dtype(torch.float16):
            got = torch.autograd.grad(path_attention(*leaves), leaves, do * tiny)
        errs[tiny] = [float((a.double() / tiny - b).norm() / b.norm()) for a, b in zip(got, want)]
    for name, e1, e_tiny in zip(("q", "k", "v", "w", "beta"), errs[1.0], errs[1e-7]):
        assert 0 < e1 < 5e-3 and e_tiny < 1.5 * e1 + 1e-6, (name, e1, e_tiny)


def test_backward_differentiates_the_forwards_own_logits():
    """A forward to be differentiated runs on the backward's schedule and saves the log-sum-exp of those logits.
    The backward once normalised its recomputed logits with the scan's statistics instead: exact in exact
    arithmetic, but with a trained model's sharp logits the rows no longer summed to one (gradients 20-180% off in
    one layer on the GPU; 2e-3 to 4e-3 here, with the scan's updates in fp16, kernels/NOTES_path.md, "The training forward runs on the
    backward's schedule").  Sharp logits: the output and every gradient match float64, and keeping the factors (``save_factors``, the
    default) or making them again in the backward gives the same bits."""
    torch.manual_seed(0)
    T, D = 200, 32
    q, k = torch.randn(1, 2, T, D) * 12, torch.randn(1, 2, T, D) * 3
    v, do = torch.randn(1, 2, T, D), torch.randn(1, 2, T, D)
    w = torch.nn.functional.normalize(torch.randn(1, 2, T, D), dim=-1)
    beta = 2 * torch.rand(1, 2, T)
    l64 = [a.double().requires_grad_() for a in (q, k, v, w, beta)]
    ref = path.path_matrix(*l64)
    want = torch.autograd.grad(ref, l64, do.double())
    runs = {}
    for save in (True, False):
        leaves = [a.clone().requires_grad_() for a in (q, k, v, w, beta)]
        out = path_attention(*leaves, save_factors=save)
        runs[save] = (out.detach(),) + torch.autograd.grad(out, leaves, do)
    assert rel_err(runs[True][0], ref) < 1e-5
    for name, a, b in zip(("q", "k", "v", "w", "beta"), runs[True][1:], want):
        assert (a.double() - b).norm() / b.norm() < 1e-4, name
    for a, b in zip(runs[True], runs[False]):
        assert torch.equal(a, b)


def test_saved_for_backward_is_what_the_docstring_says():
    """What a forward to be differentiated keeps, counted by a saved-tensor hook (fp16, D = 64, 64-token blocks,
    T = 256: two levels; 128: one): the inputs, the output and its log-sum-exp; with ``save_factors`` also
    ``q~, k~`` and ``G`` in fp16, ``Ã`` and the inverses in fp32, ``L`` levels of meeting points and ``L - 1`` of
    carries in fp16, as many bytes per token and head as :func:`path_attention`'s docstring says (read from it)."""
    import re

    fixed = int(re.search(r"``\((\d+) \+ 2 L\) \* 128`` more bytes per token", path_attention.__doc__).group(1))
    for T, levels in ((256, 2), (128, 1)):
        _check_saved_bytes(T, levels, (fixed + 2 * levels) * 128)


def _check_saved_bytes(T, levels, per_token, D=64, BH=1):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(BH, T, D, generator=g).half() for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(BH, T, D, generator=g), dim=-1)
    beta = 2 * torch.rand(BH, T, generator=g)
    inputs = q.nbytes + k.nbytes + v.nbytes + w.nbytes + beta.nbytes
    kept = {}
    for save in (True, False):
        leaves = [a.clone().requires_grad_() for a in (q, k, v, w, beta)]
        sizes = []

        def pack(t, sizes=sizes):
            sizes.append(t.nbytes)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = path_attention(*leaves, save_factors=save)
        kept[save] = sum(sizes)
        out.backward(torch.ones_like(out))  # the saved tensors are enough for the backward
    lean = inputs + out.nbytes + BH * T * 4  # + the fp32 log-sum-exp
    assert kept[False] == lean
    assert kept[True] - lean == BH * T * per_token


@triton.jit
def _tf32_rounded(X, Y, N: tl.constexpr, QUIET: tl.constexpr, PRECISION: tl.constexpr = "tf32"):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    if QUIET:
        x = quiet_nan(x)
    tl.store(Y + offs, rn(x, PRECISION))


def test_rounding_to_tf32_and_its_nans():
    """``_pieces.rn`` rounds an fp32 operand to the nearest tf32 value by integer arithmetic on its bits.  It keeps
    infinities and PyTorch's quiet NaN, rounds finite values to nearest (ties away), turns a NaN with only its
    low 13 mantissa bits set into an infinity (still not finite), and a NaN whose top mantissa bits are set (NVIDIA's canonical NaN, what GPU arithmetic on a NaN returns) into -0.0: the GPU test
    of non-finite values found DeltaNet's fast chunk loop losing a NaN that way.  ``quiet_nan`` first keeps it."""
    bits = torch.tensor([0x7FC00000, 0x7F800001, 0x7F800000, 0xFF800000 - 2**32, 0x3F800FFF, 0x3F801000,
                         0x00000001, 0x7F7FFFFF, 0x7FFFFFFF, 0xFFFFFFFF - 2**32, 0, 0], dtype=torch.int32)
    xp = torch.cat([bits.view(torch.float32), torch.zeros(4)])  # a tile's length is a power of two
    y, yq = torch.empty_like(xp), torch.empty_like(xp)
    _tf32_rounded[(1,)](xp, y, 16, False)
    _tf32_rounded[(1,)](xp, yq, 16, True)
    assert torch.isnan(y[0]) and y[1] == float("inf")  # a NaN with only low mantissa bits becomes an infinity
    assert y[2] == float("inf") and y[3] == -float("inf")
    assert y[4].item() == 1.0 and y[5].view(torch.int32).item() == 0x3F802000  # 0x...0FFF down, 0x...1000 up
    assert y[6].item() == 0.0 and y[7].view(torch.int32).item() == 0x7F800000  # the largest float rounds to inf
    assert not torch.isnan(y[8:10]).any()  # the documented loss: canonical NaNs come out as zeros
    assert torch.isnan(yq[:2]).all() and torch.isnan(yq[8:10]).all()  # quieted first, every NaN survives
    assert torch.equal(yq[2:8], y[2:8])
    yn = torch.empty_like(xp)
    _tf32_rounded[(1,)](xp, yn, 16, False, "tf32n")  # the backward kernels' rounding: a select keeps every NaN
    assert torch.isnan(yn[:2]).all() and torch.isnan(yn[8:10]).all() and torch.equal(yn[2:8], y[2:8])


@triton.jit
def _product(A, B, C, N: tl.constexpr, PRECISION: tl.constexpr):
    offs = tl.arange(0, N)
    tile = offs[:, None] * N + offs[None, :]
    tl.store(C + tile, dot(tl.load(A + tile), tl.load(B + tile), PRECISION))


@pytest.mark.parametrize("precision", ["tf32", "x3"])
def test_backward_products_keep_the_gpus_nans(precision):
    """A gradient's fp32 tile can hold NVIDIA's canonical NaN (``0x7FFFFFFF``: what GPU arithmetic on a NaN
    returns, e.g. from a NaN or inf in ``dO``).  ``_pieces.dot`` in ``"tf32"`` or ``"x3"`` rounds it to -0.0 and
    the product row comes out finite; on the H100 PaTH's ``dq`` stayed finite under a NaN in ``dO`` that way
    (``tests/gpu/test_backward.py``).  The backward kernels' versions (``_launch.keeping_nans``: ``"tf32n"``,
    ``"x3n"``) give that row NaNs, and the same numbers as the plain ones elsewhere."""
    from pathedu.kernels._launch import keeping_nans

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    a.view(torch.int32)[5, 2] = 0x7FFFFFFF
    plain, kept = torch.empty(16, 16), torch.empty(16, 16)
    _product[(1,)](a, b, plain, 16, precision)
    _product[(1,)](a, b, kept, 16, keeping_nans(precision))
    assert torch.isfinite(plain).all()  # the documented loss
    assert torch.isnan(kept[5]).all() and torch.isfinite(kept[torch.arange(16) != 5]).all()
    assert torch.equal(kept[torch.arange(16) != 5], plain[torch.arange(16) != 5])


@triton.jit
def _ready_product(A, B, C, N: tl.constexpr, PRECISION: tl.constexpr):
    offs = tl.arange(0, N)
    tile = offs[:, None] * N + offs[None, :]
    a = rn(tl.load(A + tile), PRECISION)  # rounded once where it is made, as the UT backward's tiles are
    tl.store(C + tile, dot_ready(a, tl.load(B + tile), True, False, PRECISION))


@pytest.mark.parametrize("precision", ["tf32n", "x3n", "ieee"])
def test_an_operand_rounded_once_gives_the_same_product(precision):
    """``_pieces.dot_ready`` skips the rounding of an operand that already went through ``rn`` (the UT factors'
    backward rounds each tile that only products read once, where it is made; ``kernels/NOTES_path.md``,
    "Rounding to nearest before tf32 products"): the rounding is idempotent, so the product is ``dot``'s bit for bit, NaNs included; with ``"x3n"`` or
    ``"ieee"`` it is ``dot`` itself (``rn`` leaves those operands alone)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    a.view(torch.int32)[3, 7] = 0x7FFFFFFF  # NVIDIA's canonical NaN
    a[0, 0] = 1 + 2.0 ** -12  # a value the rounding moves
    plain, ready = torch.empty(16, 16), torch.empty(16, 16)
    _product[(1,)](a, b, plain, 16, precision)
    _ready_product[(1,)](a, b, ready, 16, precision)
    assert torch.equal(ready.nan_to_num(), plain.nan_to_num()) and torch.equal(ready.isnan(), plain.isnan())
    assert torch.isnan(ready[3]).all()


@triton.jit
def _stored_and_rounded(X, Y, Z, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    tl.store(Y + offs, rn(quiet_for(Y, x), "tf32"))  # an fp32 factor, rounded as the next pass's product would
    tl.store(Z + offs, quiet_for(Z, x))  # a 16-bit factor: stored as it is


def test_factors_are_stored_with_quiet_nans():
    """The preparation passes store fp32 factors that a later pass rounds to tf32 (the Householder RNN's q~, k~, Ã,
    G); rounding NVIDIA's canonical NaN, what GPU arithmetic returns, gives -0.0, and on the H100 a NaN key vanished
    that way from the Householder RNN's output (session 18).  ``quiet_for`` stores fp32 tiles with quiet NaNs,
    which the rounding keeps, and leaves 16-bit stores alone (the conversion keeps a NaN)."""
    bits = torch.tensor([0x7FFFFFFF, 0xFFFFFFFF - 2**32, 0x7FC00000, 0x3F801000], dtype=torch.int32)
    x = bits.view(torch.float32)
    y, z = torch.empty(4), torch.empty(4, dtype=torch.bfloat16)
    _stored_and_rounded[(1,)](x, y, z, 4)
    assert torch.isnan(y[:3]).all() and y[3].view(torch.int32).item() == 0x3F802000
    assert torch.isnan(z[:3]).all() and z[3].item() == 1.0
