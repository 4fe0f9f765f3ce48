"""The PaTH paper's Appendix A constructions, run through the library's PaTH forms.

Swaps of five elements (one layer, two heads): every sequence of up to 6 swaps
and 10,000 random sequences of up to 64 swaps.  Flip-flop (two layers): every
sequence up to length 10 and random ones up to length 256.  All in float64,
vectorised over sequences as leading dims.
"""
import itertools

import pytest
import torch

from pathedu import constructions as C
from pathedu import path


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Batched small matrix ops run faster on one thread than fighting for two cores."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def with_start(body: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(body.shape[0], 1, dtype=torch.long), body], dim=1)


# ---------------------------------------------------------------------------
# Swaps
# ---------------------------------------------------------------------------

# Token ids of the 10 swaps with x < y; [y <-> x] has w = -w[x <-> y] and hence the same H.
UNORDERED = torch.tensor([C.swap_token(x, y) for x in range(1, 6) for y in range(x + 1, 6)])


def test_swap_transitions_are_the_permutation_matrices():
    """H = I - 2 w w^T for [x <-> y] exchanges e_x and e_y and fixes the rest; both orientations agree."""
    body = torch.arange(1, 21)[None, :]
    q, k, v, w, beta = C.swap_model_inputs(with_start(body))
    for n, (x, y) in enumerate(C.SWAP_PAIRS):
        H = path.interval_product(w[0, 0, n + 1 : n + 2], beta[0, 0, n + 1 : n + 2], -1, 0)
        perm = list(range(6))
        perm[x - 1], perm[y - 1] = perm[y - 1], perm[x - 1]
        assert torch.allclose(H, torch.eye(6, dtype=torch.float64)[perm], atol=1e-15, rtol=0)


def test_swap_logit_closed_form():
    """Head 0's logit on the start token is scale * (sum_c c list[c] - 54.5):
    0.5 for the identity, <= -0.5 otherwise."""
    g = torch.Generator().manual_seed(1)
    tokens = with_start(torch.randint(1, 21, (200, 12), generator=g))
    q, k, v, w, beta = C.swap_model_inputs(tokens)
    for i in range(tokens.shape[1]):
        logit = torch.einsum("nd,nde,ne->n", k[:, 0, 0], path.interval_product(w[:, 0], beta[:, 0], 0, i), q[:, 0, i])
        assert torch.allclose(logit, C.swap_start_logit(tokens)[:, i], atol=1e-12)
    closed = C.swap_start_logit(tokens)
    truth = C.swap_reference(tokens)
    assert torch.all(closed[truth] == 0.5) and torch.all(closed[~truth] <= -0.5)


def test_swaps_every_sequence_up_to_length_6():
    """All 10^6 sequences of 6 swaps over the 10 unordered pairs; every prefix is checked, so all
    shorter sequences too.  Orientation is irrelevant (same H, same q/k/v), which the next test checks."""
    idx = torch.tensor(list(itertools.product(range(10), repeat=6)))
    for chunk in idx.split(200_000):
        tokens = with_start(UNORDERED[chunk])
        decided = C.swap_is_identity(tokens, form=path.path_recurrent)
        assert torch.equal(decided, C.swap_reference(tokens))


def test_swaps_every_ordered_sequence_up_to_length_3():
    tokens = with_start(torch.tensor(list(itertools.product(range(1, 21), repeat=3))))
    margin = C.swap_forward(tokens)
    assert torch.equal(margin >= 0, C.swap_reference(tokens))
    assert torch.all(margin[:, 0] == 0)  # the start token alone: both heads give exactly 1


def test_swaps_orientation_does_not_matter():
    g = torch.Generator().manual_seed(2)
    body = UNORDERED[torch.randint(0, 10, (500, 8), generator=g)]
    flipped = body.clone()
    swap_back = {C.swap_token(x, y): C.swap_token(y, x) for x, y in C.SWAP_PAIRS}
    flip = torch.rand(body.shape, generator=g) < 0.5
    flipped[flip] = torch.tensor([swap_back[int(t)] for t in body[flip]])
    a, b = C.swap_forward(with_start(body)), C.swap_forward(with_start(flipped))
    assert torch.allclose(a, b, atol=1e-13, rtol=0)


def random_swap_sequences(n, max_len, seed):
    """Half uniformly random; half built to return to the identity somewhere (a word, then its reverse)."""
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(1, 21, (n, max_len), generator=g)
    half = torch.randint(1, max_len // 2 + 1, (n // 2,), generator=g)
    for r, m in enumerate(half.tolist()):
        body[r, m : 2 * m] = body[r, :m].flip(0)
    return body


def test_swaps_10000_random_sequences_up_to_length_64():
    body = random_swap_sequences(10_000, 64, seed=3)
    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(1, 65, (10_000,), generator=g)
    n_identity = 0
    for L in lengths.unique().tolist():  # sequences of one length share a batch
        tokens = with_start(body[lengths == L, :L])
        decided = C.swap_is_identity(tokens, form=path.path_blockwise)
        truth = C.swap_reference(tokens)
        assert torch.equal(decided, truth), f"length {L}"
        n_identity += int(truth[:, 1:].sum())
    assert n_identity > 5_000  # the test really contains many identities, not just "no"


def test_swap_margin_sign_at_any_positive_scale():
    tokens = with_start(random_swap_sequences(400, 32, seed=5))
    truth = C.swap_reference(tokens)
    for scale in (0.05, 1.0, 32.0):
        margin = C.swap_forward(tokens, scale=scale)
        assert torch.equal(margin >= 0, truth)
        assert torch.all(margin[:, 1:][truth[:, 1:]] > 0)  # strictly, once a swap has been read


def test_swap_forms_agree():
    tokens = with_start(random_swap_sequences(40, 20, seed=6))
    ref = C.swap_forward(tokens, form=path.path_naive)
    for form in (path.path_matrix, path.path_recurrent, path.path_blockwise):
        assert torch.allclose(C.swap_forward(tokens, form=form), ref, atol=1e-12, rtol=0)


def test_swap_bad_input():
    with pytest.raises(ValueError, match="`tokens`"):
        C.swap_forward(torch.tensor([[1, 2, 3]]))  # no start token
    with pytest.raises(ValueError, match="`tokens`"):
        C.swap_forward(torch.tensor([[0, 21]]))
    with pytest.raises(TypeError, match="`tokens`"):
        C.swap_forward(torch.tensor([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="`scale`"):
        C.swap_forward(torch.tensor([[0, 1]]), scale=0.0)
    with pytest.raises(ValueError, match="`x`"):
        C.swap_token(3, 3)


# ---------------------------------------------------------------------------
# Flip-flop
# ---------------------------------------------------------------------------

def check_flipflop(tokens, logits):
    """At every r: the written bit gets all but < 1e-9 of the probability.  Elsewhere the allowed next
    tokens (a bit after w/i, an instruction after a bit) share the probability evenly."""
    is_read, answer = C.flipflop_reference(tokens)
    p = torch.softmax(logits, -1)
    assert torch.all(p[is_read].gather(-1, answer[is_read][:, None]) > 1 - 1e-9)
    after_instr = (tokens == 0) | (tokens == 2)
    after_bit = tokens >= 3
    assert torch.allclose(p[after_instr][:, 3:], torch.full_like(p[after_instr][:, 3:], 0.5), atol=1e-9)
    assert torch.allclose(p[after_bit][:, :3], torch.full_like(p[after_bit][:, :3], 1 / 3), atol=1e-9)
    pred = logits.argmax(-1)
    assert torch.equal(pred[is_read], answer[is_read])


@pytest.mark.parametrize("T", range(1, 11))
def test_flipflop_every_sequence_up_to_length_10(T):
    tokens = C.all_flipflop_sequences(T)
    assert tokens.shape[0] == 2 ** (T // 2) * 3 ** ((T - 1) // 2)
    assert tokens.unique(dim=0).shape[0] == tokens.shape[0]
    check_flipflop(tokens, C.flipflop_forward(tokens))


def random_flipflop(n, T, p_ignore, seed):
    """FFLM-style sequences: w first; each instruction is i with probability p_ignore, else w or r evenly."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, T, generator=g)
    instr = torch.where(u < p_ignore, 2, torch.where(u < p_ignore + (1 - p_ignore) / 2, 0, 1))
    bits = torch.randint(3, 5, (n, T), generator=g)
    tokens = torch.where(torch.arange(T) % 2 == 0, instr, bits)
    tokens[:, 0] = 0
    return tokens


@pytest.mark.parametrize("p_ignore", [0.1, 0.5, 0.98], ids=["dense", "medium", "sparse"])
def test_flipflop_random_sequences_up_to_length_256(p_ignore):
    """The blockwise form: O(T^2 D) where the matrix form's triangular solve costs O(T^3)."""
    tokens = random_flipflop(200, 256, p_ignore, seed=int(p_ignore * 100))
    is_read, _ = C.flipflop_reference(tokens)
    assert is_read.sum() > 100
    check_flipflop(tokens, C.flipflop_forward(tokens, form=path.path_blockwise))
    # other lengths: truncations are sequences in their own right
    for T in (1, 2, 37, 100, 255):
        check_flipflop(tokens[:50, :T], C.flipflop_forward(tokens[:50, :T], form=path.path_blockwise))


def test_flipflop_paper_example():
    tokens = C.flipflop_encode("w 1 r 1 w 0 i 1 i 0 i 1 r")
    pred = C.flipflop_predict(tokens)
    assert C.FF_VOCAB[int(pred[-1])] == "0"
    assert C.FF_VOCAB[int(pred[2])] == "1"


def test_flipflop_attention_is_one_hot_where_the_proof_says():
    """Layer 1: a bit attends to the instruction right before it.  Layer 2: every token after the
    first write attends to the most recent written bit, whose value then sits in the state slots."""
    tokens = random_flipflop(20, 40, 0.5, seed=7)
    _, trace = C.flipflop_forward(tokens, return_trace=True)
    att1, att2 = trace["attention"]
    assert torch.allclose(att1.sum(-1), torch.ones(20, 40, dtype=torch.float64), atol=1e-12)
    for i in range(1, 40, 2):
        assert torch.all(att1[:, i, i - 1] > 1 - 1e-15)
    last_write = torch.full((20,), -1)
    for i in range(40):
        if i % 2 == 1:
            last_write = torch.where(tokens[:, i - 1] == 0, i, last_write)
        rows = last_write >= 0
        assert torch.all(att2[rows, i].gather(-1, last_write[rows, None]) > 1 - 1e-15)
    state, stream = C.flipflop_state(tokens), trace["stream"]
    s0, s1 = C.FF_SLOTS["state_0"], C.FF_SLOTS["state_1"]
    known = state >= 0
    assert torch.allclose(stream[..., s1][known], state[known].double(), atol=1e-12)
    assert torch.allclose(stream[..., s0][known], 1 - state[known].double(), atol=1e-12)


def test_flipflop_forms_agree():
    tokens = random_flipflop(10, 24, 0.5, seed=8)
    ref = C.flipflop_forward(tokens, form=path.path_naive)
    for form in (path.path_matrix, path.path_recurrent, path.path_blockwise):
        assert torch.allclose(C.flipflop_forward(tokens, form=form), ref, atol=1e-9, rtol=0)


def test_flipflop_needs_a_sharp_softmax():
    """At scale 1 the softmax is far from one-hot and the construction breaks (the paper's n matters)."""
    tokens = random_flipflop(200, 64, 0.5, seed=9)
    is_read, answer = C.flipflop_reference(tokens)
    p = torch.softmax(C.flipflop_forward(tokens, scale=1.0), -1)
    assert not torch.all(p[is_read].gather(-1, answer[is_read][:, None]) > 1 - 1e-9)


def test_flipflop_bad_input():
    with pytest.raises(ValueError, match="alternate"):
        C.flipflop_forward(C.flipflop_encode("w 1 0"))
    with pytest.raises(ValueError, match="`w`"):
        C.flipflop_forward(C.flipflop_encode("r 1 r 0"))
    with pytest.raises(ValueError, match="`text`"):
        C.flipflop_encode("w 2")
    with pytest.raises(ValueError, match="`layer`"):
        C.flipflop_layer_inputs(C.flipflop_embed(C.flipflop_encode("w 1")), 3)
