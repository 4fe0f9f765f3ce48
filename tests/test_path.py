"""Chapter 5: every form of PaTH attention, the Householder RNN and DeltaNet against float64 references,
and the product-order conventions of the UT transform."""
import pytest
import torch
from helpers import TOL_F64, case_id, definition_scores, direct_product, rand_qkv, random_shapes, rel_err, rnn_scores

from pathedu import nope, path

CASES = random_shapes(5, seed=5, max_T=70)


PATH_FORMS = [path.path_naive, path.path_recurrent, path.path_matrix, path.path_blockwise]
HOUSEHOLDER_FORMS = [path.householder_naive, path.householder_recurrent, path.householder_matrix, path.householder_chunked]
DELTANET_FORMS = [path.deltanet_naive, path.deltanet_recurrent, path.deltanet_matrix, path.deltanet_chunked]


def form_cases(forms):
    """Every (form, case) pair, except the naive forms (O(T^2 D^3)) on cases longer than 40 tokens."""
    return [pytest.param(f, c, id=f"{f.__name__}-{case_id(c)}") for f in forms for c in CASES
            if not f.__name__.endswith("_naive") or c[1] <= 40]


# ---------------------------------------------------------------------------
# References, written independently of the module
# ---------------------------------------------------------------------------

def rand_w_beta(lead, T, D, *, seed=0, dtype=torch.float64):
    """Unit ``w: (*lead, T, D)`` and ``beta: (*lead, T)`` uniform in [0, 2], with a few exact 0 and 2."""
    g = torch.Generator().manual_seed(seed + 1000)
    w = torch.randn(*lead, T, D, generator=g, dtype=torch.float64)
    w = w / w.norm(dim=-1, keepdim=True)
    beta = 2 * torch.rand(*lead, T, generator=g, dtype=torch.float64)
    if T > 3:
        beta[..., 1], beta[..., 3] = 2.0, 0.0  # a reflection and an identity transition
    return w.to(dtype), beta.to(dtype)


def path_reference(q, k, v, w, beta, scale=None):
    T, D = q.shape[-2:]
    scale = D ** -0.5 if scale is None else scale
    logits = (scale * rnn_scores(q, k, w, beta)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(logits, -1) @ v.double()


def householder_reference(q, k, v, w, beta):
    return rnn_scores(q, k, w, beta) @ v.double()


def deltanet_reference(q, k, v, beta):
    return rnn_scores(q, k, k, beta) @ (beta.double()[..., None] * v.double())


def inputs(case, seed=None):
    lead, T, D, Dv = case
    seed = hash(case) % 1000 if seed is None else seed
    q, k, v = rand_qkv(lead, T, D, Dv, seed=seed)
    w, beta = rand_w_beta(lead, T, D, seed=seed)
    return q, k, v, w, beta


# ---------------------------------------------------------------------------
# The references themselves
# ---------------------------------------------------------------------------

def test_recurrence_scores_are_the_definition():
    q, k, v, w, beta = inputs(((2,), 11, 5, 3), seed=1)
    ref = definition_scores(q, k, w, beta)
    assert rel_err(rnn_scores(q, k, w, beta), ref) <= 1e-12
    # the seed snippet's order, P = H_s P (i.e. H_i ... H_{j+1}), gives other numbers
    reverse = torch.zeros_like(ref)
    for i in range(11):
        for j in range(i + 1):
            P = direct_product(w, beta, range(i, j, -1))
            reverse[..., i, j] = torch.einsum("...a,...ab,...b->...", k[..., j, :], P, q[..., i, :])
    assert rel_err(reverse, ref) > 1e-2


# ---------------------------------------------------------------------------
# Every form against float64
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("form, case", form_cases(PATH_FORMS))
def test_path_forms_match_float64(form, case):
    q, k, v, w, beta = inputs(case)
    assert rel_err(form(q, k, v, w, beta), path_reference(q, k, v, w, beta)) <= TOL_F64


@pytest.mark.parametrize("form, case", form_cases(HOUSEHOLDER_FORMS))
def test_householder_forms_match_float64(form, case):
    q, k, v, w, beta = inputs(case)
    assert rel_err(form(q, k, v, w, beta), householder_reference(q, k, v, w, beta)) <= TOL_F64


@pytest.mark.parametrize("form, case", form_cases(DELTANET_FORMS))
def test_deltanet_forms_match_float64(form, case):
    q, k, v, _, beta = inputs(case)
    k = k / k.norm(dim=-1, keepdim=True)  # DeltaNet uses unit keys
    assert rel_err(form(q, k, v, beta), deltanet_reference(q, k, v, beta)) <= TOL_F64


def test_naive_forms_are_the_definition():
    """On a small case, against the per-pair explicit products (not the recurrence)."""
    q, k, v, w, beta = inputs(((3,), 9, 4, 6), seed=2)
    S = definition_scores(q, k, w, beta)
    logits = (0.5 * S).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    assert rel_err(path.path_naive(q, k, v, w, beta, scale=0.5), torch.softmax(logits, -1) @ v) <= 1e-12
    assert rel_err(path.householder_naive(q, k, v, w, beta), S @ v) <= 1e-12


@pytest.mark.parametrize("size", [1, 3, 16, 29, 200])
def test_block_and_chunk_sizes(size):
    """T = 61 is no multiple of any of these; 200 > T is one partial block."""
    q, k, v, w, beta = inputs(((2,), 61, 16, 24), seed=3)
    kn = k / k.norm(dim=-1, keepdim=True)
    assert rel_err(path.path_blockwise(q, k, v, w, beta, block=size), path_reference(q, k, v, w, beta)) <= TOL_F64
    assert rel_err(path.householder_chunked(q, k, v, w, beta, chunk=size), householder_reference(q, k, v, w, beta)) <= TOL_F64
    assert rel_err(path.deltanet_chunked(q, kn, v, beta, chunk=size), deltanet_reference(q, kn, v, beta)) <= TOL_F64


def test_explicit_scale_is_used():
    q, k, v, w, beta = inputs(((2,), 13, 16, 8), seed=4)
    for form in PATH_FORMS:
        out = form(q, k, v, w, beta, scale=0.3)
        assert rel_err(out, path_reference(q, k, v, w, beta, scale=0.3)) <= TOL_F64
        assert rel_err(out, path_reference(q, k, v, w, beta)) > 1e-2


def test_float32_inputs_with_float64_gates():
    q, k, v, w, beta = inputs(((2, 2), 20, 16, 16), seed=5)
    for form in PATH_FORMS[1:] + HOUSEHOLDER_FORMS[1:]:
        out = form(q.float(), k.float(), v.float(), w, beta)
        assert out.dtype == torch.float32
        ref = path_reference(q, k, v, w, beta) if form in PATH_FORMS else householder_reference(q, k, v, w, beta)
        assert rel_err(out, ref) <= 1e-4


def test_reduces_to_nope_and_linear_attention_when_beta_is_zero():
    q, k, v, w, _ = inputs(((2,), 25, 16, 8), seed=6)
    beta = torch.zeros(2, 25, dtype=torch.float64)
    assert rel_err(path.path_blockwise(q, k, v, w, beta, block=8), nope.nope_matrix(q, k, v)) <= TOL_F64
    assert rel_err(path.householder_chunked(q, k, v, w, beta, chunk=8), nope.linear_matrix(q, k, v)) <= TOL_F64


# ---------------------------------------------------------------------------
# UT transform and products of transitions
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("reflect", [False, True], ids=["beta_random", "beta_2"])
@pytest.mark.parametrize("L", [1, 2, 7, 33, 128])
def test_ut_transform_identity_and_order(L, reflect):
    """With random beta long products shrink towards 0; with beta = 2 (reflections) they stay orthogonal,
    so the identity and the order are tested on matrices of norm 1 even at L = 128."""
    w, beta = rand_w_beta((2,), L, 4, seed=L)  # D = 4: vectors overlap, so order matters visibly
    if reflect:
        beta = torch.full_like(beta, 2.0)
    W, A = path.ut_transform(w, beta)
    eye = torch.eye(4, dtype=torch.float64)
    decreasing = direct_product(w, beta, range(L - 1, -1, -1))  # H_{L-1} ... H_0
    increasing = direct_product(w, beta, range(L))  # H_0 ... H_{L-1}
    assert torch.equal(W, w) and A.shape == (2, L, L)
    assert torch.equal(A, A.tril()) and torch.allclose(A.diagonal(dim1=-2, dim2=-1), beta)
    assert (decreasing - (eye - W.mT @ A @ W)).abs().max() <= 1e-10
    assert (increasing - (eye - W.mT @ A.mT @ W)).abs().max() <= 1e-10
    assert torch.allclose(path.householder_product(w, beta, order="decreasing"), decreasing, atol=1e-12)
    assert torch.allclose(path.householder_product(w, beta, order="increasing"), increasing, atol=1e-12)
    if L > 1 and (reflect or L < 30):  # the other order is a different matrix
        assert (increasing - (eye - W.mT @ A @ W)).abs().max() > 1e-2


def test_paper_typing_of_the_ut_transform_fails():
    """``W D W^T`` with W (L x D) and D = diag(beta) (L x L) does not type-check, and where it happens to
    (D = L) the identity is false; ``D W W^T`` (ours) is right."""
    w, beta = rand_w_beta((), 6, 4, seed=7)
    with pytest.raises(RuntimeError):
        w @ torch.diag(beta) @ w.mT
    w, beta = rand_w_beta((), 5, 5, seed=8)
    eye = torch.eye(5, dtype=torch.float64)
    paper = torch.linalg.inv(eye + (w @ torch.diag(beta) @ w.mT).tril(-1)) @ torch.diag(beta)
    decreasing = direct_product(w, beta, range(4, -1, -1))
    assert (decreasing - (eye - w.mT @ paper @ w)).abs().max() > 1e-2
    assert (direct_product(w, beta, range(5)) - (eye - w.mT @ paper @ w)).abs().max() > 1e-2
    _, A = path.ut_transform(w, beta)
    assert (decreasing - (eye - w.mT @ A @ w)).abs().max() <= 1e-12


def test_masked_sub_interval_uses_the_global_factor():
    """``H_{j+1} ... H_i = I - W_(j,i]^T A_(j,i],(j,i]^T W_(j,i]`` with A from the whole sequence."""
    w, beta = rand_w_beta((3,), 40, 8, seed=9)
    _, A = path.ut_transform(w, beta)
    g = torch.Generator().manual_seed(0)
    eye = torch.eye(8, dtype=torch.float64)
    for _ in range(20):
        j, i = sorted(torch.randint(-1, 40, (2,), generator=g).tolist())
        P = path.interval_product(w, beta, j, i)
        assert torch.allclose(P, direct_product(w, beta, range(j + 1, i + 1)), atol=1e-12)
        Ws, As = w[..., j + 1 : i + 1, :], A[..., j + 1 : i + 1, j + 1 : i + 1]
        assert (P - (eye - Ws.mT @ As.mT @ Ws)).abs().max() <= 1e-10


def test_interval_product_is_the_logit_product():
    q, k, _, w, beta = inputs(((2,), 12, 6, 6), seed=10)
    S = rnn_scores(q, k, w, beta)
    for j, i in [(0, 11), (3, 7), (5, 5), (10, 11)]:
        P = path.interval_product(w, beta, j, i)
        assert torch.allclose(torch.einsum("...a,...ab,...b->...", k[..., j, :], P, q[..., i, :]), S[..., i, j])
    assert torch.equal(path.interval_product(w, beta, 4, 4), torch.eye(6, dtype=torch.float64).expand(2, 6, 6))
    assert torch.allclose(path.interval_product(w, beta, -1, 11), path.householder_product(w, beta))


def test_path_logits():
    q, k, _, w, beta = inputs(((2, 3), 17, 8, 8), seed=19)
    logits = path.path_logits(q, k, w, beta, scale=0.7)
    upper = torch.ones(17, 17, dtype=torch.bool).triu(1)
    assert logits.shape == (2, 3, 17, 17) and torch.isneginf(logits[..., upper]).all()
    assert rel_err(logits[..., ~upper], 0.7 * rnn_scores(q, k, w, beta)[..., ~upper]) <= TOL_F64
    assert path.path_logits(q[..., :0, :], k[..., :0, :], w[..., :0, :], beta[..., :0]).shape == (2, 3, 0, 0)
    with pytest.raises(ValueError, match="`beta`"):
        path.path_logits(q, k, w, -beta)


def test_reflections_preserve_norms():
    """beta = 2 with unit w: each H is a reflection (orthogonal, det -1); products stay orthogonal."""
    w, _ = rand_w_beta((), 9, 5, seed=11)
    beta = torch.full((9,), 2.0, dtype=torch.float64)
    P = path.householder_product(w, beta)
    assert torch.allclose(P.mT @ P, torch.eye(5, dtype=torch.float64), atol=1e-12)
    assert torch.linalg.det(P).item() == pytest.approx(-1.0)  # 9 reflections


# ---------------------------------------------------------------------------
# Decoding, DeltaNet = Householder RNN, resumable states
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("page", [1, 4, 64])
def test_decode_equals_prefill(page):
    q, k, v, w, beta = inputs(((2, 2), 33, 16, 8), seed=12)
    assert rel_err(path.path_recurrent(q, k, v, w, beta, page=page), path.path_matrix(q, k, v, w, beta)) <= TOL_F64


def test_cache_holds_keys_multiplied_by_every_later_transition():
    q, k, v, w, beta = inputs(((2,), 10, 6, 3), seed=13)
    cache = path.PathKVCache((2,), 6, 3, 10, dtype=torch.float64, device="cpu")
    for t in range(10):
        cache.step(k[..., t, :], v[..., t, :], w[..., t, :], beta[..., t])
    for j in range(10):  # k^_j = (H_{j+1} ... H_9)^T k_j
        want = (path.interval_product(w, beta, j, 9).mT @ k[..., j, :, None])[..., 0]
        assert torch.allclose(cache.k[..., j, :], want, atol=1e-12)


def test_deltanet_is_the_householder_rnn_with_w_equal_k():
    """Transition part: H_t = I - beta_t k_t k_t^T; input part: values beta_t v_t."""
    q, k, v, _, beta = inputs(((2,), 30, 16, 8), seed=14)
    k = k / k.norm(dim=-1, keepdim=True)
    bv = beta[..., None] * v
    o_h, S_h = path.householder_recurrent(q, k, bv, k, beta, return_state=True)
    o_d, S_d = path.deltanet_recurrent(q, k, v, beta, return_state=True)
    assert rel_err(o_d, o_h) <= TOL_F64 and rel_err(S_d, S_h) <= TOL_F64
    assert rel_err(path.deltanet_matrix(q, k, v, beta), path.householder_matrix(q, k, bv, k, beta)) <= TOL_F64
    assert rel_err(path.deltanet_chunked(q, k, v, beta, chunk=8), path.householder_chunked(q, k, bv, k, beta, chunk=8)) <= TOL_F64
    # with the same beta but unscaled values the two differ: the input part matters
    assert rel_err(path.householder_recurrent(q, k, v, k, beta), o_d) > 1e-2


def test_deltanet_pseudo_values_are_the_ut_factor_times_v():
    """U = (I + B)^{-1} (beta * V) = A V, with A the UT factor of the transitions (w = k)."""
    q, k, v, _, beta = inputs(((), 20, 8, 4), seed=15)
    k = k / k.norm(dim=-1, keepdim=True)
    _, A = path.ut_transform(k, beta)
    O = ((q @ k.mT) * torch.ones(20, 20, dtype=torch.float64).tril()) @ (A @ v)
    assert rel_err(path.deltanet_matrix(q, k, v, beta), O) <= TOL_F64


@pytest.mark.parametrize("pair", [(path.householder_recurrent, path.householder_chunked),
                                  (path.deltanet_recurrent, path.deltanet_chunked)], ids=lambda p: p[0].__name__)
def test_states_are_returned_and_resumable(pair):
    rec, chunked = pair
    q, k, v, w, beta = inputs(((2,), 40, 16, 8), seed=16)
    k = k / k.norm(dim=-1, keepdim=True)
    gates = (w, beta) if rec is path.householder_recurrent else (beta,)
    first = lambda x: x[..., :17, :] if x.dim() == 3 else x[..., :17]  # noqa: E731
    rest = lambda x: x[..., 17:, :] if x.dim() == 3 else x[..., 17:]  # noqa: E731
    full, S_full = rec(q, k, v, *gates, return_state=True)
    for form, kw in ((rec, {}), (chunked, {"chunk": 5})):
        o1, S = form(*map(first, (q, k, v) + gates), return_state=True, **kw)
        o2, S2 = form(*map(rest, (q, k, v) + gates), initial_state=S, return_state=True, **kw)
        assert S.shape == (2, 8, 16)
        assert rel_err(torch.cat([o1, o2], -2), full) <= TOL_F64 and rel_err(S2, S_full) <= TOL_F64


# ---------------------------------------------------------------------------
# Edge cases and bad input
# ---------------------------------------------------------------------------

ALL_FORMS = PATH_FORMS + HOUSEHOLDER_FORMS + DELTANET_FORMS


def call(form, q, k, v, w, beta):
    return form(q, k, v, beta) if form in DELTANET_FORMS else form(q, k, v, w, beta)


def test_empty_products():
    W, A = path.ut_transform(torch.zeros(3, 0, 4), torch.zeros(3, 0))
    assert W.shape == (3, 0, 4) and A.shape == (3, 0, 0)
    assert torch.equal(path.householder_product(torch.zeros(0, 4), torch.zeros(0)), torch.eye(4))
    assert torch.equal(path.interval_product(torch.zeros(0, 4), torch.zeros(0), -1, -1), torch.eye(4))


@pytest.mark.parametrize("form", ALL_FORMS, ids=lambda f: f.__name__)
def test_bad_w_and_beta_name_them(form):
    """Shapes, types and messages of this chapter's extras (the checks every form shares,
    out-of-range values included, are in tests/test_contract.py)."""
    q, k, v, w, beta = inputs(((2,), 8, 16, 16), seed=17)
    nan = beta.clone()
    nan[0, 3] = float("nan")
    bad_beta = [
        (beta + 2.5, ValueError, r"`beta` must lie in \[0, 2\]"),
        (nan, ValueError, "`beta` must be finite"),
        (beta[..., :7], ValueError, "`beta`"),
        (beta[0], ValueError, "`beta`"),
        (beta.long(), TypeError, "`beta`"),
        (beta.tolist(), TypeError, "`beta`"),
    ]
    for b, exc, needle in bad_beta:
        with pytest.raises(exc, match=needle):
            call(form, q, k, v, w, b)
    if form in DELTANET_FORMS:
        return
    nan_w = w.clone()
    nan_w[1, 2, 0] = float("nan")
    for bad_w, exc, needle in [(w[..., :15], ValueError, "`w`"), (w[..., :7, :], ValueError, "`w`"),
                               (w[0], ValueError, "`w`"), (nan_w, ValueError, "`w` must be finite"),
                               (w.int(), TypeError, "`w`"), (w.numpy(), TypeError, "`w`")]:
        with pytest.raises(exc, match=needle):
            form(q, k, v, bad_w, beta)


def test_bad_orders_states_and_intervals():
    q, k, v, w, beta = inputs(((2,), 8, 16, 16), seed=18)
    with pytest.raises(ValueError, match="`order`"):
        path.householder_product(w, beta, order="left")
    with pytest.raises(ValueError, match="`beta`"):
        path.ut_transform(w, beta * 3)
    with pytest.raises(ValueError, match="`beta`"):
        path.ut_transform(w, beta[..., :5])
    with pytest.raises(ValueError, match="`w`"):
        path.ut_transform(w[0, 0], beta)
    with pytest.raises(TypeError, match="`w`"):
        path.householder_product(w.tolist(), beta)
    for j, i in [(3, 2), (-2, 4), (0, 8)]:
        with pytest.raises(ValueError, match="`j`"):
            path.interval_product(w, beta, j, i)
    for form in (path.householder_recurrent, path.householder_chunked):
        with pytest.raises(ValueError, match="`initial_state`"):
            form(q, k, v, w, beta, initial_state=torch.zeros(2, 16, 15))
    with pytest.raises(TypeError, match="`initial_state`"):
        path.deltanet_chunked(q, k, v, beta, initial_state=0.0)
    with pytest.raises(TypeError, match="`i`"):
        path.interval_product(w, beta, 0, 2.0)
