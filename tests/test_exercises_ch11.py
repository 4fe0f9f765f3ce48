"""Chapter 11 exercise checks: each accepts a right answer and rejects wrong ones without raising, with the
specific diagnosis of a typical mistake (forward cumsum, an end left out, future gates counted, interpolating
before clamping, the position term scaled)."""
import torch

from pathedu import cope
from pathedu.exercises import ch11


def _future(T):
    return torch.ones(T, T, dtype=torch.bool).triu(1)


def _rev(x):
    return x.flip(-1).cumsum(-1).flip(-1)


def _positions(g):  # written here, independently of the module
    T = g.shape[-1]
    p = torch.zeros_like(g)
    for i in range(T):
        for j in range(i + 1):
            p[..., i, j] = g[..., i, j : i + 1].sum(-1)
    return p


def _interp(qe, p):
    P = qe.shape[-1]
    pc = p.clamp(0, P - 1)
    lo, hi = pc.floor(), pc.ceil()
    rows = qe.expand(p.shape[:-1] + (P,))
    return (1 - (pc - lo)) * rows.gather(-1, lo.long()) + (pc - lo) * rows.gather(-1, hi.long())


def test_positions_from_gates_check(capsys):
    assert ch11.check_positions_from_gates(_positions)
    assert ch11.check_positions_from_gates(lambda g: _rev(g * torch.ones(g.shape[-1], g.shape[-1]).tril()))
    wrong = {
        "forward cumsum": lambda g: g.tril().cumsum(-1).tril(),
        "key excluded": lambda g: _positions(g) - g.tril(),
        "query excluded": lambda g: _positions(g) - torch.diagonal(g, dim1=-2, dim2=-1)[..., :, None] * torch.ones_like(g).tril(),
        "future counted": lambda g: _rev(g).tril(),
        "transposed": lambda g: _positions(g).transpose(-1, -2),
        "no batch dims": lambda g: _positions(g.reshape(-1, g.shape[-1])),
        "raises": lambda g: 1 / 0,
        "not a tensor": lambda g: _positions(g).tolist(),
    }
    for why, fn in wrong.items():
        assert not ch11.check_positions_from_gates(fn), why
    out = capsys.readouterr().out
    assert "from the left" in out and "key's own gate" in out and "query's own gate" in out and "future" in out


def test_position_logits_check(capsys):
    assert ch11.check_position_logits(_interp)
    assert ch11.check_position_logits(lambda qe, p: cope._position_logits(qe, p, qe.shape[-1]))

    def extrapolate(qe, p):  # interpolating before clamping
        P = qe.shape[-1]
        lo = p.floor().clamp(0, max(P - 2, 0))
        hi = (lo + 1).clamp(max=P - 1)
        rows = qe.expand(p.shape[:-1] + (P,))
        return (1 - (p - lo)) * rows.gather(-1, lo.long()) + (p - lo) * rows.gather(-1, hi.long())

    def unclamped(qe, p):  # no clamp at all: an index past the table
        rows = qe.expand(p.shape[:-1] + (qe.shape[-1],))
        lo, hi = p.floor(), p.ceil()
        return (1 - (p - lo)) * rows.gather(-1, lo.long()) + (p - lo) * rows.gather(-1, hi.long())

    def swapped(qe, p):  # w on the lower neighbour
        pc = p.clamp(0, qe.shape[-1] - 1)
        lo, hi = pc.floor(), pc.ceil()
        rows = qe.expand(p.shape[:-1] + (qe.shape[-1],))
        return (pc - lo) * rows.gather(-1, lo.long()) + (1 - (pc - lo)) * rows.gather(-1, hi.long())

    wrong = {
        "extrapolated": extrapolate,
        "swapped weights": swapped,
        "rounded": lambda qe, p: qe.expand(p.shape[:-1] + (qe.shape[-1],)).gather(-1, p.clamp(0, qe.shape[-1] - 1).round().long()),
        "no clamp": unclamped,
        "shifted by one": lambda qe, p: _interp(qe, p + 1),
    }
    for why, fn in wrong.items():
        assert not ch11.check_position_logits(fn), why
    out = capsys.readouterr().out
    assert "before clamping" in out and "swapped" in out and "rounded" in out and "raised" in out


def test_cope_matrix_check(capsys):
    assert ch11.check_cope_matrix(cope.cope_matrix)
    assert ch11.check_cope_matrix(cope.cope_naive)

    def mine(q, k, v, E, *, scale_pos=False, counts=_positions, mask_gates=True):
        z = q @ k.mT * q.shape[-1] ** -0.5
        g = torch.sigmoid(z)
        pos = _interp(q @ E.mT, counts(g) if mask_gates else _rev(g).tril())
        logits = z + (q.shape[-1] ** -0.5 * pos if scale_pos else pos)
        return torch.softmax(logits.masked_fill(_future(q.shape[-2]), -torch.inf), -1) @ v

    assert ch11.check_cope_matrix(mine)
    wrong = {
        "position scaled": lambda *a: mine(*a, scale_pos=True),
        "forward cumsum": lambda *a: mine(*a, counts=lambda g: g.tril().cumsum(-1).tril()),
        "future gates": lambda *a: mine(*a, mask_gates=False),
        "no position term": lambda q, k, v, E: mine(q, k, v, 0 * E),
        "no causal mask": lambda q, k, v, E: torch.softmax(q @ k.mT * q.shape[-1] ** -0.5, -1) @ v,
        "returns None": lambda *a: None,
    }
    for why, fn in wrong.items():
        assert not ch11.check_cope_matrix(fn), why
    out = capsys.readouterr().out
    assert "unscaled" in out and "from the left" in out and "future keys" in out


def test_stubs_are_not_attempted_and_hints_have_three_levels(capsys):
    def stub(*args):
        raise NotImplementedError("exercise")

    for check in (ch11.check_positions_from_gates, ch11.check_position_logits, ch11.check_cope_matrix):
        verdict = check(stub)
        assert not verdict and "not attempted yet" in verdict.message and "ch11.hint(" in verdict.message
    for n in (1, 2, 3):
        assert len({ch11.hint(n, level) for level in (1, 2, 3)}) == 3
