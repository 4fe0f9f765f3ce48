"""Chapter 7: every form of PaTH-FoX, the gated Householder RNN and Gated DeltaNet against float64 references
written here from the definitions, the reductions to chapters 3 and 5, decoding precision, and the seeds' errors."""
import pytest
import torch
import torch.nn.functional as F
from helpers import TOL_F64, H, case_id, definition_scores, direct_product, rand_qkv, rel_err, rnn_scores

from pathedu import fox, path, pathfox

# T = 1, T no multiple of the block/chunk/page (4), leading dims (), (2,), (2, 3), Dv != D
CASES = [((), 1, 4, 4), ((2,), 7, 4, 6), ((2, 3), 10, 5, 3), ((), 13, 8, 5), ((2,), 17, 6, 6)]
TUNE = 4

PATHFOX_FORMS = [pathfox.pathfox_naive, pathfox.pathfox_recurrent, pathfox.pathfox_matrix, pathfox.pathfox_blockwise]
GATED_HOUSEHOLDER_FORMS = [pathfox.gated_householder_naive, pathfox.gated_householder_recurrent,
                           pathfox.gated_householder_matrix, pathfox.gated_householder_chunked]
GATED_DELTANET_FORMS = [pathfox.gated_deltanet_naive, pathfox.gated_deltanet_recurrent,
                        pathfox.gated_deltanet_matrix, pathfox.gated_deltanet_chunked]
ALL_FORMS = PATHFOX_FORMS + GATED_HOUSEHOLDER_FORMS + GATED_DELTANET_FORMS
TUNING = {"recurrent": "page", "blockwise": "block", "chunked": "chunk"}


def tuning_name(form):
    name = TUNING.get(form.__name__.rsplit("_", 1)[1])
    return None if form in GATED_HOUSEHOLDER_FORMS + GATED_DELTANET_FORMS and name == "page" else name


def call(form, q, k, v, w, beta, log_f, **kw):
    """Call any form with the common argument list (Gated DeltaNet takes no ``w``)."""
    if form in GATED_DELTANET_FORMS:
        return form(q, k, v, beta, log_f, **kw)
    return form(q, k, v, w, beta, log_f, **kw)


def tuned(form, size=TUNE):
    name = tuning_name(form)
    return {name: size} if name else {}


# ---------------------------------------------------------------------------
# Inputs and references, written independently of the module
# ---------------------------------------------------------------------------

def rand_inputs(lead, T, D, Dv, *, seed=0, dtype=torch.float64, gate_mean=1.0):
    """``q, k, v``; unit ``w``; ``beta`` in [0, 2] with an exact 0 and 2; ``log_f`` = logsigmoid(N(mean, 1.5^2))
    with an exact 0 (a gate of 1)."""
    q, k, v = rand_qkv(lead, T, D, Dv, seed=seed)
    g = torch.Generator().manual_seed(seed + 777)
    w = F.normalize(torch.randn(*lead, T, D, generator=g, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(*lead, T, generator=g, dtype=torch.float64)
    log_f = F.logsigmoid(gate_mean + 1.5 * torch.randn(*lead, T, generator=g, dtype=torch.float64))
    if T > 3:
        beta[..., 1], beta[..., 2], log_f[..., 3] = 2.0, 0.0, 0.0
    return tuple(x.to(dtype) for x in (q, k, v, w, beta, log_f))


def unit(k):
    return k / k.norm(dim=-1, keepdim=True)


def gate_sums(log_f):
    """``G[i, j] = sum_{s=j+1..i} log_f[s]`` (0 on the diagonal, -inf above), each row summed from the
    query backwards over exactly its own gates."""
    log_f = log_f.double()
    T = log_f.shape[-1]
    G = torch.full(log_f.shape[:-1] + (T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        G[..., i, i] = 0.0
        if i:
            G[..., i, :i] = log_f[..., 1 : i + 1].flip(-1).cumsum(-1).flip(-1)  # j = 0..i-1: s = j+1..i
    return G


def pathfox_reference(q, k, v, w, beta, log_f, scale=None, scores=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = rnn_scores(q, k, w, beta) if scores is None else scores
    return torch.softmax(scale * scores + gate_sums(log_f), -1) @ v.double()


def gated_householder_reference(q, k, v, w, beta, log_f):
    return (torch.exp(gate_sums(log_f)) * rnn_scores(q, k, w, beta)) @ v.double()


def gated_deltanet_reference(q, k, v, beta, log_f):
    """The gated delta rule with explicit D x D matrices: ``S_t = a_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``."""
    q, k, v, beta, log_f = (x.double() for x in (q, k, v, beta, log_f))
    S = torch.zeros(q.shape[:-2] + (v.shape[-1], q.shape[-1]), dtype=torch.float64)
    outs = []
    for t in range(q.shape[-2]):
        k_t = k[..., t, :]
        S = torch.exp(log_f[..., t, None, None]) * S @ H(k_t, beta[..., t]) \
            + beta[..., t, None, None] * v[..., t, :, None] * k_t[..., None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, -2)


def gated_householder_states(q, k, v, w, beta, log_f):
    """``S_t = a_t S_{t-1} H_t + v_t k_t^T`` with explicit D x D matrices; the outputs."""
    q, k, v, w, beta, log_f = (x.double() for x in (q, k, v, w, beta, log_f))
    S = torch.zeros(q.shape[:-2] + (v.shape[-1], q.shape[-1]), dtype=torch.float64)
    outs = []
    for t in range(q.shape[-2]):
        S = torch.exp(log_f[..., t, None, None]) * S @ H(w[..., t, :], beta[..., t]) + v[..., t, :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, -2)


def reference(form, q, k, v, w, beta, log_f):
    if form in PATHFOX_FORMS:
        return pathfox_reference(q, k, v, w, beta, log_f)
    if form in GATED_HOUSEHOLDER_FORMS:
        return gated_householder_reference(q, k, v, w, beta, log_f)
    return gated_deltanet_reference(q, k, v, beta, log_f)


def inputs_for(form, case, seed=None):
    lead, T, D, Dv = case
    q, k, v, w, beta, log_f = rand_inputs(lead, T, D, Dv, seed=hash(case) % 1000 if seed is None else seed)
    if form in GATED_DELTANET_FORMS:
        k = unit(k)  # Gated DeltaNet uses unit keys
    return q, k, v, w, beta, log_f


# ---------------------------------------------------------------------------
# The references themselves
# ---------------------------------------------------------------------------

def test_references_agree():
    q, k, v, w, beta, log_f = rand_inputs((2,), 9, 4, 3, seed=1)
    assert rel_err(rnn_scores(q, k, w, beta), definition_scores(q, k, w, beta)) <= 1e-12
    assert rel_err(gated_householder_reference(q, k, v, w, beta, log_f),
                   gated_householder_states(q, k, v, w, beta, log_f)) <= 1e-12
    kn = unit(k)
    assert rel_err(gated_deltanet_reference(q, kn, v, beta, log_f),
                   gated_householder_states(q, kn, beta[..., None] * v, kn, beta, log_f)) <= 1e-12
    G = gate_sums(log_f)
    assert G[0, 5, 2].item() == pytest.approx(log_f[0, 3:6].sum().item(), abs=1e-15) and G[0, 4, 4] == 0
    assert torch.isneginf(G[0, 2, 3])


# ---------------------------------------------------------------------------
# Every form against float64
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("form, case", [pytest.param(f, c, id=f"{f.__name__}-{case_id(c)}")
                                        for f in ALL_FORMS for c in CASES])
def test_forms_match_float64(form, case):
    q, k, v, w, beta, log_f = inputs_for(form, case)
    out = call(form, q, k, v, w, beta, log_f, **tuned(form))
    assert out.shape == v.shape and out.dtype == torch.float64
    assert rel_err(out, reference(form, q, k, v, w, beta, log_f)) <= TOL_F64


def test_naive_forms_are_the_definition():
    """On a small case, against the per-pair explicit products (not the recurrence)."""
    q, k, v, w, beta, log_f = rand_inputs((3,), 8, 4, 5, seed=2)
    S, G = definition_scores(q, k, w, beta), gate_sums(log_f)
    assert rel_err(pathfox.pathfox_naive(q, k, v, w, beta, log_f, scale=0.5),
                   torch.softmax(0.5 * S + G, -1) @ v) <= 1e-12
    assert rel_err(pathfox.gated_householder_naive(q, k, v, w, beta, log_f), (torch.exp(G) * S) @ v) <= 1e-12


@pytest.mark.parametrize("size", [1, 3, 16, 200])
def test_block_chunk_and_page_sizes(size):
    """T = 37 is no multiple of any of these; 200 > T is one partial block."""
    q, k, v, w, beta, log_f = rand_inputs((2,), 37, 8, 12, seed=3)
    kn = unit(k)
    ref = pathfox_reference(q, k, v, w, beta, log_f)
    assert rel_err(pathfox.pathfox_blockwise(q, k, v, w, beta, log_f, block=size), ref) <= TOL_F64
    assert rel_err(pathfox.pathfox_recurrent(q, k, v, w, beta, log_f, page=size), ref) <= TOL_F64
    assert rel_err(pathfox.gated_householder_chunked(q, k, v, w, beta, log_f, chunk=size),
                   gated_householder_reference(q, k, v, w, beta, log_f)) <= TOL_F64
    assert rel_err(pathfox.gated_deltanet_chunked(q, kn, v, beta, log_f, chunk=size),
                   gated_deltanet_reference(q, kn, v, beta, log_f)) <= TOL_F64


def test_gate_is_not_multiplied_by_scale():
    """As in FoX: ``scale * PaTH score + gate``.  fla's convention, ``scale * (score + gate)``, is another function."""
    q, k, v, w, beta, log_f = rand_inputs((2,), 13, 16, 8, seed=4)
    S = rnn_scores(q, k, w, beta)
    for form in PATHFOX_FORMS:
        out = form(q, k, v, w, beta, log_f, scale=0.3)
        assert rel_err(out, pathfox_reference(q, k, v, w, beta, log_f, scale=0.3, scores=S)) <= TOL_F64
        assert rel_err(out, pathfox_reference(q, k, v, w, beta, log_f, scores=S)) > 1e-2  # the default scale differs
        scaled_gate = torch.softmax(0.3 * (S + gate_sums(log_f)), -1) @ v
        assert rel_err(out, scaled_gate) > 1e-2


def test_empty_sequences():
    q, k, v, w, beta, log_f = rand_inputs((2,), 0, 4, 3)
    for form in ALL_FORMS:
        assert call(form, q, k, v, w, beta, log_f).shape == (2, 0, 3)
    assert pathfox.pathfox_logits(q, k, w, beta, log_f).shape == (2, 0, 0)
    S0 = torch.ones(2, 3, 4, dtype=torch.float64)
    for form in (pathfox.gated_householder_recurrent, pathfox.gated_householder_chunked,
                 pathfox.gated_deltanet_recurrent, pathfox.gated_deltanet_chunked):
        out, S = call(form, q, k, v, w, beta, log_f, initial_state=S0, return_state=True)
        assert out.shape == (2, 0, 3) and torch.equal(S, S0)


# ---------------------------------------------------------------------------
# The chapter's claims: reductions to chapters 3 and 5, the duality, Gated DeltaNet
# ---------------------------------------------------------------------------

def test_without_gates_the_linear_side_is_chapter_5():
    """log_f = 0 (every gate 1): the gated Householder RNN is the Householder RNN, Gated DeltaNet is DeltaNet."""
    q, k, v, w, beta, _ = rand_inputs((2,), 19, 8, 6, seed=5)
    zero = torch.zeros(2, 19, dtype=torch.float64)
    kn = unit(k)
    for form in GATED_HOUSEHOLDER_FORMS:
        assert rel_err(form(q, k, v, w, beta, zero, **tuned(form)), path.householder_matrix(q, k, v, w, beta)) <= TOL_F64
    for form in GATED_DELTANET_FORMS:
        assert rel_err(form(q, kn, v, beta, zero, **tuned(form)), path.deltanet_matrix(q, kn, v, beta)) <= TOL_F64


def test_pathfox_reduces_to_fox_and_to_path():
    """beta = 0 (every H = I): FoX; log_f = 0: PaTH; both: the gates really act otherwise."""
    q, k, v, w, beta, log_f = rand_inputs((2,), 19, 8, 6, seed=6)
    zero_beta, zero_gate = torch.zeros_like(beta), torch.zeros_like(log_f)
    for form in PATHFOX_FORMS:
        kw = tuned(form)
        assert rel_err(form(q, k, v, w, zero_beta, log_f, **kw), fox.fox_matrix(q, k, v, log_f)) <= TOL_F64
        assert rel_err(form(q, k, v, w, beta, zero_gate, **kw), path.path_matrix(q, k, v, w, beta)) <= TOL_F64
        both = form(q, k, v, w, beta, log_f, **kw)
        assert rel_err(both, fox.fox_matrix(q, k, v, log_f)) > 1e-2
        assert rel_err(both, path.path_matrix(q, k, v, w, beta)) > 1e-2


def test_gated_deltanet_is_the_gated_householder_rnn_with_w_equal_k():
    """Transition part: H_t = I - beta_t k_t k_t^T; input part: values beta_t v_t."""
    q, k, v, _, beta, log_f = rand_inputs((2,), 23, 8, 5, seed=7)
    k = unit(k)
    bv = beta[..., None] * v
    for gd, gh in zip(GATED_DELTANET_FORMS, GATED_HOUSEHOLDER_FORMS):
        assert rel_err(gd(q, k, v, beta, log_f, **tuned(gd)), gh(q, k, bv, k, beta, log_f, **tuned(gh))) <= TOL_F64
    for gd, gh in ((pathfox.gated_deltanet_recurrent, pathfox.gated_householder_recurrent),
                   (pathfox.gated_deltanet_chunked, pathfox.gated_householder_chunked)):
        kw = {"chunk": 5} if gd is pathfox.gated_deltanet_chunked else {}
        _, S_d = gd(q, k, v, beta, log_f, return_state=True, **kw)
        _, S_h = gh(q, k, bv, k, beta, log_f, return_state=True, **kw)
        assert rel_err(S_d, S_h) <= TOL_F64
    # with unscaled values the two differ: the input part matters
    assert rel_err(pathfox.gated_householder_matrix(q, k, v, k, beta, log_f),
                   pathfox.gated_deltanet_matrix(q, k, v, beta, log_f)) > 1e-2


def test_gated_deltanet_matrix_formula():
    """O = (Q K^T * Gamma * M)(I + diag(beta)(K K^T * Gamma * M^-))^{-1} diag(beta) V, with an explicit inverse;
    and (beta = 1) the notes' two matrix forms, which agree: Gamma_ij = e^{c_i} / e^{c_j} is a diagonal similarity."""
    q, k, v, _, beta, log_f = rand_inputs((), 12, 4, 3, seed=8)
    k = unit(k)
    T = 12
    Gam = torch.exp(gate_sums(log_f))
    ones_TT, eye = torch.ones(T, T, dtype=torch.float64), torch.eye(T, dtype=torch.float64)
    M, Mm = ones_TT.tril(), ones_TT.tril(-1)
    inverse = torch.linalg.inv(eye + torch.diag(beta) @ ((k @ k.T) * Gam * Mm))
    O = ((q @ k.T) * Gam * M) @ inverse @ torch.diag(beta) @ v
    assert rel_err(O, gated_deltanet_reference(q, k, v, beta, log_f)) <= 1e-12
    assert rel_err(pathfox.gated_deltanet_matrix(q, k, v, beta, log_f), O) <= TOL_F64
    ones = torch.ones(T, dtype=torch.float64)
    first = ((((q @ k.T) * M) @ torch.linalg.inv(eye + (k @ k.T) * Mm)) * Gam) @ v
    second = ((q @ k.T) * Gam) @ torch.linalg.inv(eye + (k @ k.T) * (Gam - eye)) @ v
    ref = gated_deltanet_reference(q, k, v, ones, log_f)
    assert rel_err(first, ref) <= 1e-12 and rel_err(second, ref) <= 1e-12


def test_gated_deltanet_step_is_weight_decay_then_a_gradient_step():
    """S_t = S' - beta_t grad l_t(S'), l_t(S) = |S k_t - v_t|^2 / 2, at the decayed state S' = a_t S_{t-1}
    (a gradient taken by autograd); evaluated at S_{t-1} instead it is another rule."""
    q, k, v, _, beta, log_f = rand_inputs((), 6, 4, 3, seed=9)
    S_prev = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for t in range(6):
        a, k_t, v_t, b_t = torch.exp(log_f[t]), k[t], v[t], beta[t]

        def grad_at(S):
            S = S.detach().requires_grad_()
            (0.5 * (S @ k_t - v_t).pow(2).sum()).backward()
            return S.grad

        S_dec = a * S_prev
        step = S_dec - b_t * grad_at(S_dec)
        _, S_next = pathfox.gated_deltanet_recurrent(q[t:t + 1], k[t:t + 1], v[t:t + 1], beta[t:t + 1], log_f[t:t + 1],
                                                     initial_state=S_prev, return_state=True)
        assert rel_err(S_next, step) <= 1e-14
        if b_t > 0.1 and a < 0.99:
            assert rel_err(S_next, S_dec - b_t * grad_at(S_prev)) > 1e-3
        S_prev = S_next


def test_logit_is_path_logit_plus_bias_and_the_linear_weight_is_their_product():
    """Softmax side: pathfox_logits - G = scale * PaTH logit.  Linear side: the gated recurrence read with one-hot
    values (V = I) gives the weights exp(G) * PaTH score: a bias in log space, a factor in the linear one."""
    q, k, _, w, beta, log_f = rand_inputs((2, 3), 11, 6, 6, seed=10)
    G = gate_sums(log_f)
    logits = pathfox.pathfox_logits(q, k, w, beta, log_f, scale=0.7)
    upper = torch.ones(11, 11, dtype=torch.bool).triu(1)
    assert logits.shape == (2, 3, 11, 11) and torch.isneginf(logits[..., upper]).all()
    path_part = (logits - G)[..., ~upper]
    assert rel_err(path_part, path.path_logits(q, k, w, beta, scale=0.7)[..., ~upper]) <= TOL_F64
    assert rel_err(path_part, 0.7 * rnn_scores(q, k, w, beta)[..., ~upper]) <= TOL_F64
    eye_v = torch.eye(11, dtype=torch.float64).expand(2, 3, 11, 11)
    weights = pathfox.gated_householder_recurrent(q, k, eye_v, w, beta, log_f)  # row i: the weights of query i
    assert rel_err(weights, torch.exp(G) * (logits - G).nan_to_num(0.0, posinf=0.0, neginf=0.0) / 0.7) <= TOL_F64
    # softmax of the logits = the linear weights with exp(scale * score) for the score, normalised
    p = torch.softmax(logits, -1)
    assert rel_err(p, torch.exp(G) * torch.exp(0.7 * rnn_scores(q, k, w, beta)).tril() /
                   (torch.exp(G) * torch.exp(0.7 * rnn_scores(q, k, w, beta)).tril()).sum(-1, keepdim=True)) <= TOL_F64


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("page", [1, 3, 64])
def test_decode_equals_prefill(page):
    q, k, v, w, beta, log_f = rand_inputs((2, 2), 21, 8, 5, seed=11)
    assert rel_err(pathfox.pathfox_recurrent(q, k, v, w, beta, log_f, page=page),
                   pathfox.pathfox_matrix(q, k, v, w, beta, log_f)) <= TOL_F64


def test_cache_holds_updated_keys_and_each_keys_gate_sum():
    q, k, v, w, beta, log_f = rand_inputs((2,), 10, 5, 3, seed=12)
    cache = pathfox.PathForgetKVCache((2,), 5, 3, 10, dtype=torch.float64, device="cpu", page=4)
    for t in range(10):
        cache.step(k[..., t, :], v[..., t, :], w[..., t, :], beta[..., t], log_f[..., t])
    G = gate_sums(log_f)
    assert rel_err(cache.G, G[..., 9, :]) <= 1e-14 and cache.G[..., 9].eq(0).all()
    for j in range(10):  # k^_j = H_9 ... H_{j+1} k_j
        want = (direct_product(w, beta, range(9, j, -1)) @ k[..., j, :, None])[..., 0]
        assert torch.allclose(cache.k[..., j, :], want, atol=1e-12)
    with pytest.raises(ValueError, match="full"):
        cache.step(k[..., 0, :], v[..., 0, :], w[..., 0, :], beta[..., 0], log_f[..., 0])


def fp32_prefix_bias(log_f):
    """What a float32 running prefix sum gives: c_t accumulated one float32 addition at a time, bias c_i - c_j."""
    c, cs = torch.zeros((), dtype=torch.float32), []
    for x in log_f.float():
        c = c + x
        cs.append(c)
    c = torch.stack(cs).double()
    return (c[:, None] - c[None, :]).masked_fill(torch.ones(len(cs), len(cs), dtype=torch.bool).triu(1), float("-inf"))


@pytest.mark.parametrize("big, n_big, small, n_small", [(-30.0, 1024, -1e-3, 64), (-2e5, 8, -0.05, 120)],
                         ids=["1024x-30_then_-1e-3", "8x-2e5_then_-0.05"])
def test_decoding_keeps_small_gates_after_large_ones(big, n_big, small, n_small):
    """Float32 decoding after a run of strong gates: the per-key gate sums stay exact where a float32 running
    prefix sum rounds the small gates away (1024 x -30: c = -30720, spacing 2e-3, each -1e-3 becomes -2e-3)."""
    T, D = n_big + n_small, 4
    q, k, v, w, beta, _ = rand_inputs((), T, D, D, seed=13)
    log_f = torch.cat([torch.full((n_big,), big), torch.full((n_small,), small)]).double()
    ref = pathfox.pathfox_matrix(q, k, v, w, beta, log_f)
    args32 = [x.float() for x in (q, k, v, w, beta, log_f)]
    out = pathfox.pathfox_recurrent(*args32, page=256)
    assert out.dtype == torch.float32 and rel_err(out, ref) <= 1e-5
    cache = pathfox.PathForgetKVCache((), D, D, T, dtype=torch.float32, device="cpu", page=256)
    for t in range(T):
        cache.step(*(x[..., t, :] for x in args32[1:4]), args32[4][t], args32[5][t])
    exact = gate_sums(log_f.float())[-1, n_big:]  # the float32 gates, summed in float64
    assert (cache.G[n_big:].double() - exact).abs().max() <= 2e-5  # float32 rounding of sums of size <= 6
    prefix = fp32_prefix_bias(log_f)
    assert (prefix[-1, n_big:] - exact).abs().max() > 0.05  # the float32 prefix sum is off by far more
    wrong = torch.softmax(path.path_logits(q, k, w, beta) + prefix, -1) @ v
    assert rel_err(wrong, ref) > 1e-3


# ---------------------------------------------------------------------------
# Precision: strong decay, 16-bit inputs
# ---------------------------------------------------------------------------

def test_strong_decay_stays_finite_and_exact():
    """log_f down to -20 at T = 200 (products of gates as small as e^-2000): every exponent is a sum of gates <= 0."""
    T, D = 200, 4
    q, k, v, w, beta, _ = rand_inputs((), T, D, 3, seed=14)
    log_f = -20 * torch.rand(T, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    log_f[::7] = 0.0
    kn = unit(k)
    S = rnn_scores(q, k, w, beta)
    refs = {"pathfox": pathfox_reference(q, k, v, w, beta, log_f, scores=S),
            "householder": gated_householder_reference(q, k, v, w, beta, log_f),
            "deltanet": gated_deltanet_reference(q, kn, v, beta, log_f)}
    for form in ALL_FORMS:
        family = "pathfox" if form in PATHFOX_FORMS else "householder" if form in GATED_HOUSEHOLDER_FORMS else "deltanet"
        n = 40 if form.__name__.endswith("_naive") else T  # the naive forms are O(T^2 D^3)
        kk = kn if family == "deltanet" else k
        out = call(form, q[:n], kk[:n], v[:n], w[:n], beta[:n], log_f[:n], **tuned(form, 16))
        assert torch.isfinite(out).all()
        assert rel_err(out, refs[family][:n]) <= TOL_F64, form.__name__
        out32 = call(form, *(x[:n].float() for x in (q, kk, v, w, beta, log_f)), **tuned(form, 16))
        assert torch.isfinite(out32).all() and rel_err(out32, refs[family][:n]) <= 1e-4, form.__name__


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 1e-2), (torch.bfloat16, 5e-2)], ids=["fp16", "bf16"])
def test_16bit_inputs(dtype, tol):
    """16-bit inputs are computed in float32 (gate sums, triangular solves) and returned in their dtype."""
    q, k, v, w, beta, log_f = rand_inputs((2,), 12, 8, 4, seed=15)
    kn = unit(k)
    for form in ALL_FORMS:
        kk = kn if form in GATED_DELTANET_FORMS else k
        out = call(form, *(x.to(dtype) for x in (q, kk, v, w, beta, log_f)), **tuned(form))
        assert out.dtype == dtype and torch.isfinite(out).all()
        ref = reference(form, *(x.to(dtype).double() for x in (q, kk, v, w, beta, log_f)))
        assert rel_err(out, ref) <= tol, form.__name__
    logits = pathfox.pathfox_logits(*(x.to(dtype) for x in (q, k, w, beta, log_f)))
    assert logits.dtype == dtype


# ---------------------------------------------------------------------------
# Resumable states
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("pair", [(pathfox.gated_householder_recurrent, pathfox.gated_householder_chunked),
                                  (pathfox.gated_deltanet_recurrent, pathfox.gated_deltanet_chunked)],
                         ids=lambda p: p[0].__name__)
def test_states_are_returned_and_resumable(pair):
    rec, chunked = pair
    q, k, v, w, beta, log_f = rand_inputs((2,), 30, 6, 4, seed=16)
    k = unit(k)
    cut = 13

    def run(form, sl, **kw):
        args = [x[..., sl, :] for x in (q, k, v)] + ([w[..., sl, :]] if form in GATED_HOUSEHOLDER_FORMS else []) \
            + [beta[..., sl], log_f[..., sl]]
        return form(*args, return_state=True, **kw)

    full, S_full = run(rec, slice(None))
    for form, kw in ((rec, {}), (chunked, {"chunk": 5})):
        o1, S = run(form, slice(None, cut), **kw)
        o2, S2 = run(form, slice(cut, None), initial_state=S, **kw)
        assert S.shape == (2, 4, 6)
        assert rel_err(torch.cat([o1, o2], -2), full) <= TOL_F64 and rel_err(S2, S_full) <= TOL_F64


# ---------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------

MATRIX = {"pathfox": pathfox.pathfox_matrix, "gated_householder": pathfox.gated_householder_matrix,
          "gated_deltanet": pathfox.gated_deltanet_matrix}


@pytest.mark.parametrize("form", [f for f in ALL_FORMS if not f.__name__.endswith("_matrix")], ids=lambda f: f.__name__)
def test_gradients_equal_the_matrix_forms(form):
    """Gradients with respect to every input (q, k, v, w, beta, log_f), T = 6 with blocks of 4."""
    q, k, v, w, beta, log_f = rand_inputs((2,), 6, 4, 3, seed=17)
    k = unit(k) if form in GATED_DELTANET_FORMS else k
    g_out = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    matrix = MATRIX[form.__name__.rsplit("_", 1)[0]]
    grads = []
    for f, kw in ((form, tuned(form)), (matrix, {})):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, w, beta, log_f)]
        out = call(f, *leaves, **kw)
        used = leaves if form not in GATED_DELTANET_FORMS else leaves[:3] + leaves[4:]
        grads.append(torch.autograd.grad((out * g_out).sum(), used))
    for got, want in zip(*grads):
        assert rel_err(got, want) <= 1e-10


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

def _set(x, value, index=(0, 3)):
    x = x.clone()
    x[index] = value
    return x


def bad_cases(form):
    """(id, (name, make, exception, needle)); ``make`` maps the good argument to the bad one."""
    cases = [
        ("log_f_positive", "log_f", lambda x: _set(x, 0.5), ValueError, "`log_f` must be <= 0"),
        ("log_f_neginf", "log_f", lambda x: _set(x, float("-inf")), ValueError, "`log_f` must be finite"),
        ("log_f_nan", "log_f", lambda x: _set(x, float("nan")), ValueError, "`log_f`"),
        ("log_f_short", "log_f", lambda x: x[..., :-1], ValueError, "`log_f`"),
        ("log_f_lead", "log_f", lambda x: x[0], ValueError, "`log_f`"),
        ("log_f_int", "log_f", lambda x: x.long(), TypeError, "`log_f`"),
        ("log_f_list", "log_f", lambda x: x.tolist(), TypeError, "`log_f`"),
        ("log_f_meta", "log_f", lambda x: x.to("meta"), ValueError, "`log_f`"),
        ("beta_above_2", "beta", lambda x: _set(x, 2.5), ValueError, r"`beta` must lie in [0, 2]"),
        ("beta_negative", "beta", lambda x: _set(x, -0.5), ValueError, "`beta`"),
        ("beta_nan", "beta", lambda x: _set(x, float("nan")), ValueError, "`beta` must be finite"),
        ("beta_short", "beta", lambda x: x[..., :-1], ValueError, "`beta`"),
        ("v_short", "v", lambda x: x[..., :-1, :], ValueError, "`v`"),
        ("q_list", "q", lambda x: x.tolist(), TypeError, "`q`"),
        ("k_meta", "k", lambda x: x.to("meta"), ValueError, "`k`"),
    ]
    if form not in GATED_DELTANET_FORMS:
        cases += [("w_nan", "w", lambda x: _set(x, float("nan"), (1, 2, 0)), ValueError, "`w` must be finite"),
                  ("w_inf", "w", lambda x: _set(x, float("inf"), (1, 2, 0)), ValueError, "`w` must be finite"),
                  ("w_wrong_D", "w", lambda x: x[..., :-1], ValueError, "`w`"),
                  ("w_int", "w", lambda x: x.int(), TypeError, "`w`")]
    if form in PATHFOX_FORMS:
        cases += [("scale_zero", "scale", 0.0, ValueError, "`scale`"), ("scale_str", "scale", "x", TypeError, "`scale`")]
    name = tuning_name(form)
    if name:
        cases += [(f"{name}={bad!r}", name, bad, exc, f"`{name}`")
                  for bad, exc in ((0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError))]
    if form.__name__.endswith(("_recurrent", "_chunked")) and form not in PATHFOX_FORMS:
        cases += [("initial_state_shape", "initial_state", torch.zeros(2, 4, 7, dtype=torch.float64), ValueError,
                   "`initial_state`"),
                  ("initial_state_float", "initial_state", 0.0, TypeError, "`initial_state`")]
    return [pytest.param(form, c[1:], id=f"{form.__name__}-{c[0]}") for c in cases]


@pytest.mark.parametrize("form, case", [p for f in ALL_FORMS for p in bad_cases(f)])
def test_bad_input_names_the_argument(form, case):
    name, make, exc, needle = case
    q, k, v, w, beta, log_f = rand_inputs((2,), 8, 5, 4, seed=18)
    args = {"q": q, "k": k, "v": v, "w": w, "beta": beta, "log_f": log_f}
    kw = {}
    if name in args:
        args[name] = make(args[name])
    else:
        kw[name] = make
    with pytest.raises(exc, match=needle.replace("[", r"\[").replace("]", r"\]")):
        call(form, *args.values(), **kw)


def test_bad_logits_input():
    q, k, _, w, beta, log_f = rand_inputs((2,), 8, 5, 4, seed=18)
    with pytest.raises(ValueError, match="`log_f`"):
        pathfox.pathfox_logits(q, k, w, beta, -log_f + 0.1)
    with pytest.raises(ValueError, match="`w`"):
        pathfox.pathfox_logits(q, k, w[..., :3], beta, log_f)


def test_every_value_check_of_a_call_is_one_host_sync(monkeypatch):
    """Each public call reads all its value conditions (w, beta, log_f) through one ``require``."""
    calls = []
    real = pathfox.require
    monkeypatch.setattr(pathfox, "require", lambda *c: (calls.append(len(c)), real(*c))[1])
    q, k, v, w, beta, log_f = rand_inputs((2,), 6, 4, 3, seed=19)
    for form in ALL_FORMS:
        calls.clear()
        call(form, q, unit(k), v, w, beta, log_f, **tuned(form))
        assert len(calls) == 1, form.__name__
    calls.clear()
    pathfox.pathfox_logits(q, k, w, beta, log_f)
    assert len(calls) == 1


# ---------------------------------------------------------------------------
# Non-finite causality
# ---------------------------------------------------------------------------

POISON = [("nan_v", "v", float("nan")), ("inf_v", "v", float("inf")), ("nan_k", "k", float("nan")),
          ("inf_k", "k", float("inf")), ("nan_q", "q", float("nan"))]


@pytest.mark.parametrize("form, case", [pytest.param(f, p[1:], id=f"{f.__name__}-{p[0]}") for f in ALL_FORMS for p in POISON])
def test_non_finite_input_never_reaches_earlier_outputs(form, case):
    which, value = case
    q, k, v, w, beta, log_f = rand_inputs((2,), 11, 4, 3, seed=20)
    k = unit(k)
    clean = call(form, q, k, v, w, beta, log_f, **tuned(form))
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which].clone()
    args[which][..., 5, :] = value
    out = call(form, args["q"], args["k"], args["v"], w, beta, log_f, **tuned(form))
    assert torch.isfinite(out[..., :5, :]).all()
    assert (out[..., :5, :] - clean[..., :5, :]).abs().max() <= 1e-12


# ---------------------------------------------------------------------------
# The seeds' errors
# ---------------------------------------------------------------------------

def test_seed_gated_deltanet_row_without_the_delta_term_is_another_model():
    """The associative-memory notes list Gated DeltaNet as S_t = a_t S_{t-1} + v_t k_t^T (here with beta_t v_t):
    that is Mamba2 / gated linear attention, without the delta term.  It differs by O(1)."""
    q, k, v, _, beta, log_f = rand_inputs((2,), 40, 8, 8, seed=21, gate_mean=3.0)
    k = unit(k)
    S = torch.zeros(2, 8, 8, dtype=torch.float64)
    outs = []
    for t in range(40):
        S = torch.exp(log_f[..., t, None, None]) * S + beta[..., t, None, None] * v[..., t, :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    no_delta = torch.stack(outs, -2)
    ref = gated_deltanet_reference(q, k, v, beta, log_f)
    assert rel_err(pathfox.gated_deltanet_matrix(q, k, v, beta, log_f), ref) <= TOL_F64
    assert rel_err(no_delta, fox.gla_matrix(q, k, beta[..., None] * v, log_f)) <= TOL_F64  # it is GLA / Mamba2
    assert rel_err(no_delta, ref) > 0.2


def test_seed_pathfox_snippet_adds_the_gate_to_exponentiated_scores():
    """The duality post's PaTH-FoX code takes PaTH's exponentiated scores exp(k_j^T P q_i) and adds the FoX bias
    to them, then (its formula) a softmax: softmax(exp(score) + G).  The gate belongs to the logit:
    softmax(score + G).  (Causal mask, scale and product order are set right here to isolate this one error.)"""
    q, k, v, w, beta, log_f = rand_inputs((2,), 24, 8, 8, seed=22)
    scale = 8 ** -0.5
    S, G = rnn_scores(q, k, w, beta), gate_sums(log_f)
    upper = torch.ones(24, 24, dtype=torch.bool).triu(1)
    wrong = torch.softmax((torch.exp(scale * S) + G).masked_fill(upper, float("-inf")), -1) @ v
    right = pathfox.pathfox_matrix(q, k, v, w, beta, log_f)
    assert rel_err(right, pathfox_reference(q, k, v, w, beta, log_f, scores=S)) <= TOL_F64
    assert rel_err(wrong, right) > 0.2


# ---------------------------------------------------------------------------
# The Triton form: the PaTH kernel with the FoX bias hook
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("config", [None, dict(R=2, num_warps=4)], ids=["default", "block16_R2"])
@pytest.mark.parametrize("gate_mean", [1.0, -3.0], ids=["gates~0.7", "strong_decay"])
def test_pathfox_triton_matches_float64_across_blocks(config, gate_mean):
    """Several key blocks (T = 70, blocks of 16 or 64) so that both the diagonal region and the
    right-to-left scan add the bias; the gate is not multiplied by the scale."""
    from pathedu.kernels.path_attention import path_attention

    q, k, v, w, beta, log_f = rand_inputs((1, 2), 70, 16, 24, seed=41, gate_mean=gate_mean)
    ref = pathfox.pathfox_matrix(q, k, v, w, beta, log_f, scale=0.3)
    args = [x.float() for x in (q, k, v, w, beta)]
    if config is None:
        out = pathfox.pathfox_triton(*args, log_f.float(), scale=0.3)
    else:
        out = path_attention(*args, scale=0.3, block=16, log_f=log_f.float(), _config=config)
    assert rel_err(out, ref) <= 2e-3
    assert rel_err(out, path.path_matrix(q, k, v, w, beta, scale=0.3)) > 1e-2  # the gate matters
