"""pathedu.tasks: the synthetic tasks' contracts, checked against brute-force loops written here."""
import itertools

import pytest
import torch

from pathedu import tasks
from pathedu.tasks import IGNORE, ONE, R, W, ZERO


# ---------------------------------------------------------------------------
# Flip-flop
# ---------------------------------------------------------------------------

def _brute_flipflop(tokens):
    """(mask, expected bit at reads) by walking each sequence."""
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    expect = torch.full_like(tokens, IGNORE)
    for b in range(tokens.shape[0]):
        last = None
        for t in range(0, tokens.shape[1], 2):
            ins, bit = int(tokens[b, t]), int(tokens[b, t + 1])
            if ins == R:
                mask[b, t + 1] = True
                expect[b, t + 1] = last
            if ins == W:
                last = bit
    return mask, expect


def test_flipflop_layout_and_read_rule():
    tokens, mask = tasks.flipflop(64, 40, p_ignore=0.5, seed=3)
    assert tokens.shape == mask.shape == (64, 40) and tokens.dtype == torch.long and mask.dtype == torch.bool
    assert (tokens[:, 0] == W).all()
    assert set(tokens[:, 0::2].unique().tolist()) <= {0, 1, 2}
    assert set(tokens[:, 1::2].unique().tolist()) <= {ZERO, ONE}
    bf_mask, expect = _brute_flipflop(tokens)
    assert torch.equal(mask, bf_mask) and mask.any()
    assert torch.equal(tokens[mask], expect[mask])
    assert torch.equal(tasks.flipflop_reads(tokens), expect)


def test_flipflop_statistics():
    p = 0.8
    tokens, mask = tasks.flipflop(400, 500, p_ignore=p, seed=0)
    instr = tokens[:, 2::2].flatten()  # the first instruction is always a write
    n = instr.numel()  # 99,800 draws: 4 standard deviations of a frequency are < 0.006
    assert abs((instr == 2).sum().item() / n - p) < 0.006
    assert abs((instr == W).sum().item() / n - (1 - p) / 2) < 0.005
    assert abs((instr == R).sum().item() / n - (1 - p) / 2) < 0.005
    free_bits = tokens[:, 1::2][~mask[:, 1::2]]  # bits not determined by a read: uniform
    assert abs((free_bits == ONE).float().mean().item() - 0.5) < 0.01
    # the sparse and dense splits change the read rate as asked
    for q in (0.98, 0.1):
        _, m = tasks.flipflop(200, 500, p_ignore=q, seed=1)
        rate = m[:, 3::2].float().mean().item()  # reads among instructions after the first
        assert abs(rate - (1 - q) / 2) < 0.01


def test_flipflop_reproducible():
    a = tasks.flipflop(8, 32, seed=5)
    b = tasks.flipflop(8, 32, seed=5)
    c = tasks.flipflop(8, 32, seed=6)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


@pytest.mark.parametrize("kwargs, name", [
    (dict(n=2, length=7), "`length`"), (dict(n=2, length=0), "`length`"), (dict(n=0, length=8), "`n`"),
    (dict(n=2, length=8, p_ignore=1.5), "`p_ignore`"), (dict(n=2, length=8, seed=-1), "`seed`"),
])
def test_flipflop_errors(kwargs, name):
    with pytest.raises(ValueError, match=name):
        tasks.flipflop(**kwargs)


# ---------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------

def _compose(p, q):
    """p o q: apply q first."""
    return tuple(p[q[i]] for i in range(len(q)))


def _inversions(p):
    return sum(p[a] > p[b] for a in range(len(p)) for b in range(a + 1, len(p)))


@pytest.mark.parametrize("group, size", [("S5", 120), ("A5", 60), ("S3", 6), ("Z5", 5), ("A4", 12)])
def test_group_sizes_closure_identity(group, size):
    els = tasks.group_elements(group)
    assert len(els) == size == len(set(els))
    m = len(els[0])
    assert els[0] == tuple(range(m))
    assert all(sorted(p) == list(range(m)) for p in els)
    s = set(els)
    assert all(_compose(p, q) in s for p in els for q in els)
    table = tasks.compose_table(group)
    for a, b in itertools.product(range(size), repeat=2):
        assert els[table[a, b]] == _compose(els[a], els[b])
    inv = tasks.inverse_indices(group)
    assert all(_compose(els[a], els[int(inv[a])]) == els[0] for a in range(size))


def test_alternating_groups_are_even_and_symmetric_are_not():
    assert all(_inversions(p) % 2 == 0 for p in tasks.group_elements("A5"))
    assert sum(_inversions(p) % 2 for p in tasks.group_elements("S5")) == 60


def test_cycles_to_perm():
    assert tasks.cycles_to_perm("(1 2 3)", 5) == (1, 2, 0, 3, 4)  # 1->2->3->1, 0-based images
    assert tasks.cycles_to_perm("(1 2 5)", 5) == (1, 4, 2, 3, 0)
    assert tasks.cycles_to_perm("()", 3) == (0, 1, 2)
    # right to left: (2 3) first, then (1 2): 1->1->2, 2->3->3, 3->2->1
    assert tasks.cycles_to_perm("(1 2)(2 3)", 3) == (1, 2, 0)
    with pytest.raises(ValueError, match="`cycles`"):
        tasks.cycles_to_perm("(1 6)", 5)
    with pytest.raises(ValueError, match="`cycles`"):
        tasks.cycles_to_perm("1 2", 5)


def test_unknown_group():
    with pytest.raises(ValueError, match="`group`.*S5"):
        tasks.group_elements("S9")
    with pytest.raises(ValueError, match="`group`"):
        tasks.word_problem("Q8", 2, 4)


# ---------------------------------------------------------------------------
# Word problems
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("group", ["S5", "A5", "S3"])
def test_word_problem_labels_brute_force(group):
    els = tasks.group_elements(group)
    tokens, labels = tasks.word_problem(group, 6, 12, seed=2)
    assert tokens.shape == labels.shape == (6, 12) and tokens.dtype == labels.dtype == torch.long
    for b in range(6):
        cur = els[0]
        for t in range(12):
            g = els[tokens[b, t]]
            cur = tuple(g[cur[i]] for i in range(len(cur)))  # labels[t][i] = g_t[labels[t-1][i]]
            assert els[labels[b, t]] == cur
    # identity words: exactly where labels == 0
    ident = torch.tensor([[els[l] == els[0] for l in row] for row in labels.tolist()])
    assert torch.equal(ident, labels == 0)


def test_word_problem_applies_first_token_first():
    # S3, g_0 = (1 2), g_1 = (2 3) (1-based cycles): the product g_1 o g_0 sends 1 -> 2 -> 3
    els = tasks.group_elements("S3")
    a, b = els.index(tasks.cycles_to_perm("(1 2)", 3)), els.index(tasks.cycles_to_perm("(2 3)", 3))
    labels = tasks.word_problem_labels("S3", torch.tensor([[a, b]]))
    assert els[labels[0, 1]][0] == 2  # point 1 (0-based 0) ends at 3 (0-based 2)
    assert els[labels[0, 1]] != _compose(els[a], els[b])  # the other order differs here


def test_word_problem_uniform_and_reproducible():
    tokens, _ = tasks.word_problem("S3", 3000, 10, seed=0)
    counts = torch.bincount(tokens.flatten(), minlength=6).float() / tokens.numel()
    assert (counts - 1 / 6).abs().max() < 0.01
    assert torch.equal(tasks.word_problem("A5", 4, 8, seed=1)[0], tasks.word_problem("A5", 4, 8, seed=1)[0])


def test_word_problem_generators():
    els = tasks.group_elements("A5")
    tokens, labels = tasks.word_problem("A5", 200, 30, seed=0, generators=tasks.A5_PAPER_GENERATORS)
    gens = [tasks.cycles_to_perm(c, 5) for c in ("(1 2 3)", "(1 2 4)", "(1 2 5)")]
    invs = [tasks.cycles_to_perm(c, 5) for c in ("(3 2 1)", "(4 2 1)", "(5 2 1)")]
    allowed = {els.index(p) for p in gens + invs}
    assert len(allowed) == 6
    assert set(tokens.unique().tolist()) == allowed
    assert torch.equal(labels, tasks.word_problem_labels("A5", tokens))
    # tuples work too, and a single generator gives it and its inverse
    t2, _ = tasks.word_problem("A5", 50, 10, seed=0, generators=[(1, 2, 0, 3, 4)])
    assert set(t2.unique().tolist()) == {els.index(gens[0]), els.index(invs[0])}
    with pytest.raises(ValueError, match="`generators`"):
        tasks.word_problem("A5", 2, 4, generators=["(1 2)"])  # odd: not in A5
    with pytest.raises(ValueError, match="`generators`"):
        tasks.word_problem("A5", 2, 4, generators=[])


# ---------------------------------------------------------------------------
# MQRAR-N
# ---------------------------------------------------------------------------

def test_mqrar_paper_example():
    A, B, C, D = 0, 1, 2, 3
    v = {i: 10 + i for i in range(1, 8)}  # value ids for "1".."7"
    seq = torch.tensor([[A, v[1], B, v[2], C, v[3], D, v[4], A, v[5], B, v[6], A, v[7]]])
    t2 = tasks.mqrar_targets(seq, n_keys=4, n_back=2)
    expect = torch.full_like(seq, IGNORE)
    expect[0, 12] = v[1]  # the third A recalls the value two assignments back
    assert torch.equal(t2, expect)
    t1 = tasks.mqrar_targets(seq, n_keys=4, n_back=1)
    expect1 = torch.full_like(seq, IGNORE)
    expect1[0, 8], expect1[0, 10], expect1[0, 12] = v[1], v[2], v[5]
    assert torch.equal(t1, expect1)
    assert (tasks.mqrar_targets(seq, n_keys=4, n_back=3) == IGNORE).all()


@pytest.mark.parametrize("n_back, n_keys", [(1, 3), (2, 3), (4, 3), (3, 7), (40, 3)])
def test_mqrar_brute_force(n_back, n_keys):
    tokens, targets = tasks.mqrar(5, 60, n_keys=n_keys, n_back=n_back, vocab=20, seed=n_back)
    assert tokens.shape == targets.shape == (5, 60)
    assert (tokens[:, 0::2] < n_keys).all() and (tokens[:, 1::2] >= n_keys).all() and (tokens[:, 1::2] < 20).all()
    for b in range(5):
        history = {}
        for t in range(0, 60, 2):
            key, val = int(tokens[b, t]), int(tokens[b, t + 1])
            past = history.setdefault(key, [])
            want = past[-n_back] if len(past) >= n_back else IGNORE
            assert int(targets[b, t]) == want
            assert int(targets[b, t + 1]) == IGNORE
            past.append(val)
    assert (targets != IGNORE).any() == (n_back < 30)


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_keys=8, vocab=8), "`n_keys`"), (dict(n_keys=4, vocab=8, n_back=0), "`n_back`"),
    (dict(n_keys=4, vocab=8, length=11), "`length`"),
])
def test_mqrar_errors(kwargs, name):
    args = dict(n_keys=4, n_back=1, vocab=8, length=12)
    args.update(kwargs)
    length = args.pop("length")
    with pytest.raises(ValueError, match=name):
        tasks.mqrar(2, length, **args)
