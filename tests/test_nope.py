"""Chapter 1: every form of NoPE attention and linear attention against float64 references."""
import pytest
import torch
from helpers import N_FIXED, TOL_F64, TOL_TRITON, case_id, gradient_errors, rand_qkv, random_shapes, rel_err, run_in_pieces

from pathedu import nope

CASES = random_shapes(6, seed=1)
SOFTMAX_FORMS = [nope.nope_naive, nope.nope_recurrent, nope.nope_matrix, nope.nope_blockwise]
LINEAR_FORMS = [nope.linear_naive, nope.linear_recurrent, nope.linear_matrix, nope.linear_chunked]


def softmax_reference(q, k, v, scale=None):
    """Written independently of the module: explicit float64 logits, -inf mask, softmax."""
    T, D = q.shape[-2:]
    scale = D ** -0.5 if scale is None else scale
    logits = scale * torch.einsum("...id,...jd->...ij", q.double(), k.double())
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("...ij,...jd->...id", torch.softmax(logits, -1), v.double())


def linear_reference(q, k, v):
    T = q.shape[-2]
    w = torch.einsum("...id,...jd->...ij", q.double(), k.double()) * torch.ones(T, T, dtype=torch.float64).tril()
    return torch.einsum("...ij,...jd->...id", w, v.double())


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("form", SOFTMAX_FORMS, ids=lambda f: f.__name__)
def test_softmax_forms_match_float64(form, case):
    q, k, v = rand_qkv(*case, seed=hash(case) % 1000)
    assert rel_err(form(q, k, v), softmax_reference(q, k, v)) <= TOL_F64


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("form", LINEAR_FORMS, ids=lambda f: f.__name__)
def test_linear_forms_match_float64(form, case):
    q, k, v = rand_qkv(*case, seed=hash(case) % 1000)
    assert rel_err(form(q, k, v), linear_reference(q, k, v)) <= TOL_F64


def test_explicit_scale_is_used():
    q, k, v = rand_qkv((2,), 9, 16)
    for form in SOFTMAX_FORMS + [nope.nope_triton]:
        out = form(q.float() if form is nope.nope_triton else q, k.to(q.dtype if form is not nope.nope_triton else torch.float32),
                   v.to(q.dtype if form is not nope.nope_triton else torch.float32), scale=0.3)
        assert rel_err(out, softmax_reference(q, k, v, scale=0.3)) <= 2e-3
        assert rel_err(out, softmax_reference(q, k, v)) > 1e-2  # the default scale would differ


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES[:N_FIXED], ids=case_id)  # the interpreter is slow: fixed cases only
def test_triton_forms_match_float64(case, dtype):
    q, k, v = rand_qkv(*case, seed=7)
    tol = TOL_TRITON[dtype]
    out = nope.nope_triton(q.to(dtype), k.to(dtype), v.to(dtype))
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert rel_err(out, softmax_reference(q, k, v)) <= tol
    out = nope.linear_triton(q.to(dtype), k.to(dtype), v.to(dtype))
    assert out.dtype == dtype
    assert rel_err(out, linear_reference(q, k, v)) <= tol


def test_triton_accepts_bf16_on_cpu_via_fp32():
    q, k, v = rand_qkv((1, 2), 33, 16, dtype=torch.bfloat16)
    out = nope.nope_triton(q, k, v)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, softmax_reference(q, k, v)) <= 2e-2


def test_triton_non_power_of_two_head_dims():
    q, k, v = rand_qkv((2,), 45, 24, 40, seed=3)
    assert rel_err(nope.nope_triton(q.float(), k.float(), v.float()), softmax_reference(q, k, v)) <= 2e-3
    assert rel_err(nope.linear_triton(q.float(), k.float(), v.float()), linear_reference(q, k, v)) <= 2e-3


@pytest.mark.parametrize("form", SOFTMAX_FORMS + LINEAR_FORMS + [nope.nope_triton, nope.linear_triton],
                         ids=lambda f: f.__name__)
def test_no_order_signal_but_the_mask(form):
    """NoPE has no position signal besides the causal mask: the last output depends on the
    earlier tokens as a set, so shuffling tokens 0..T-2 (keys with their values) leaves it unchanged."""
    q, k, v = rand_qkv((2,), 12, 16, seed=5)
    perm = torch.cat([torch.randperm(11, generator=torch.Generator().manual_seed(0)), torch.tensor([11])])
    assert not torch.equal(perm, torch.arange(12))
    triton = form in (nope.nope_triton, nope.linear_triton)
    if triton:
        q, k, v = q.float(), k.float(), v.float()
    out = form(q, k, v)
    shuffled = form(q, k[..., perm, :], v[..., perm, :])
    assert rel_err(shuffled[..., -1, :], out[..., -1, :]) <= (1e-5 if triton else 1e-12)
    # ... while the earlier rows, which see other prefixes, do change: the shuffle is no no-op
    assert rel_err(shuffled[..., :-1, :], out[..., :-1, :]) > 1e-2


def test_recurrent_state_is_returned_and_resumable():
    q, k, v = rand_qkv((2,), 30, 16, 8)
    first, S = nope.linear_recurrent(q[..., :13, :], k[..., :13, :], v[..., :13, :], return_state=True)
    rest = nope.linear_recurrent(q[..., 13:, :], k[..., 13:, :], v[..., 13:, :], initial_state=S)
    assert rel_err(torch.cat([first, rest], -2), linear_reference(q, k, v)) <= TOL_F64
    assert S.shape == (2, 8, 16)


def test_bad_scale():
    q, k, v = rand_qkv((2,), 8, 16)
    with pytest.raises(ValueError, match="`scale`"):
        nope.nope_matrix(q, k, v, scale=-1.0)
    with pytest.raises(TypeError, match="`scale`"):
        nope.nope_matrix(q, k, v, scale="0.1")


# ---------------------------------------------------------------------------
# The linear template's backward pass, and runs in pieces (prefill, then decoding)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [16, 32, 64, 128])
def test_triton_gradients_at_every_chunk_length(chunk):
    """fp32 kernel gradients against float64 autograd through the independent reference, T = 130: several chunks
    and a partial last one at every chunk length (the contract test covers the default chunk)."""
    from pathedu.kernels.linear_attention import chunked_linear_attention

    q, k, v = rand_qkv((1, 2), 130, 16, 24, seed=31)
    errs = gradient_errors(lambda q, k, v: chunked_linear_attention(q, k, v, chunk=chunk), linear_reference,
                           dict(q=q, k=k, v=v))
    assert max(errs.values()) <= 2e-6, errs


def test_triton_state_in_and_out_is_differentiable():
    """``initial_state`` and the returned state against float64 autograd through ``linear_recurrent``: the gradient
    of every input and of the initial state, with a gradient flowing into the returned state too."""
    q, k, v = rand_qkv((2,), 75, 16, 24, seed=32)
    S0 = torch.randn(2, 24, 16, generator=torch.Generator().manual_seed(33), dtype=torch.float64)
    errs = gradient_errors(nope.linear_triton, nope.linear_recurrent, dict(q=q, k=k, v=v), initial_state=S0)
    assert max(errs.values()) <= 2e-6, errs


def test_triton_prefill_in_pieces_then_decoding_is_one_pass():
    q, k, v = (x.float() for x in rand_qkv((2,), 90, 16, 24, seed=34))
    full, S = nope.linear_triton(q, k, v, return_state=True)
    pieces, S_pieces = run_in_pieces(nope.linear_triton, nope.linear_recurrent, q, k, v, lambda s, e: (), (23, 70))
    assert rel_err(pieces, full) <= 1e-5 and rel_err(S_pieces, S) <= 1e-5
    ref_out, ref_S = nope.linear_recurrent(q.double(), k.double(), v.double(), return_state=True)
    assert rel_err(pieces, ref_out) <= 1e-5 and rel_err(S_pieces, ref_S) <= 1e-5
    assert S.dtype == torch.float32 and S.shape == (2, 24, 16)


def test_bench_module_lists_fla_linear_attention_beside_ours():
    """The chapter's benchmark ops (GPU only to run): flash-linear-attention's chunked linear attention is timed beside
    ``linear_triton`` and checked against it (forward, or forward + backward with ``--backward``)."""
    from pathedu.bench import nope as bench

    ops = {o.name: o for o in bench.ops()}
    assert {"sdpa", "nope_triton", "linear_triton", "fla_chunk_linear_attn", "fla_fused_chunk_linear_attn"} <= set(ops)
    for name in ("fla_chunk_linear_attn", "fla_fused_chunk_linear_attn"):
        assert ops[name].peer and ops[name].reference == "linear_triton" and callable(ops[name].setup)
