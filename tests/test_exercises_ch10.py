"""Chapter 10 exercise checks: each accepts a right answer and rejects wrong ones without raising, naming the
typical mistake (inclusive range, linear-space product, the first token's empty row) when it sees one."""
import torch
import torch.nn.functional as F

from pathedu import stickbreaking as sb
from pathedu.exercises import ch10

NEG_INF = float("-inf")


def _seen(T):
    return torch.ones(T, T, dtype=torch.bool).tril(-1)


def _log_weights(z, *, own=False, through_query=False, linear=False, future=NEG_INF, diag=NEG_INF):
    """A student's log weights written from the definition, with switches for the typical mistakes."""
    T = z.shape[-1]
    seen = _seen(T)
    g = torch.log(1 - torch.sigmoid(z)) if linear else F.logsigmoid(-z)
    g = g.masked_fill(~seen, 0.0)
    after = g.flip(-1).cumsum(-1).flip(-1) - (0 if own else g)
    if through_query:
        after = after + torch.diagonal(F.logsigmoid(-z), dim1=-2, dim2=-1)[..., :, None]
    log_p = torch.log(torch.sigmoid(z)) if linear else F.logsigmoid(z)
    out = (log_p + after).masked_fill(~seen, NEG_INF)
    out = out.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), future)
    return out.masked_fill(torch.eye(T, dtype=torch.bool), diag)


def test_log_weights_check(capsys):
    assert ch10.check_stick_log_weights(_log_weights)
    assert ch10.check_stick_log_weights(lambda z: torch.log(torch.exp(sb._log_weights(z))))  # same numbers
    # the library's function of q and k, with q = z and k = I (scale 1), gives the same log weights
    assert ch10.check_stick_log_weights(
        lambda z: sb.stickbreaking_log_weights(z, torch.eye(z.shape[-1], dtype=z.dtype).expand_as(z), scale=1.0))
    wrong = {
        "own gate (inclusive range)": lambda z: _log_weights(z, own=True),
        "query's token as a gate": lambda z: _log_weights(z, through_query=True),
        "linear space": lambda z: _log_weights(z, linear=True),
        "0 in the future": lambda z: _log_weights(z, future=0.0),
        "query sees itself": lambda z: _log_weights(z, diag=F.logsigmoid(z).diagonal(dim1=-2, dim2=-1)[0, 0].item()),
        "sign flipped": lambda z: (-_log_weights(z)).masked_fill(~_seen(z.shape[-1]), NEG_INF),
        "NaN": lambda z: _log_weights(z) - _log_weights(z),
        "transposed": lambda z: _log_weights(z).transpose(-1, -2),
        "weights, not logs": lambda z: torch.exp(_log_weights(z)),
        "wrong shape": lambda z: _log_weights(z)[..., 0],
        "raises": lambda z: 1 / 0,
        "not a tensor": lambda z: _log_weights(z).tolist(),
    }
    for why, fn in wrong.items():
        assert not ch10.check_stick_log_weights(fn), why
    out = capsys.readouterr().out
    for phrase in ("own gate", "query's own token", "logsigmoid(-ell)", "not 0", "diagonal must be -inf", "sign",
                   "NaN"):
        assert phrase in out, phrase


def test_log_weights_stub_is_not_attempted(capsys):
    def stub(z):
        raise NotImplementedError("exercise 1")

    verdict = ch10.check_stick_log_weights(stub)
    assert not verdict and "not attempted yet" in verdict.message and "ch10.hint(1)" in verdict.message


def _remainder(z, *, incl=False, first=None, complement=True):
    T = z.shape[-1]
    keep = torch.ones(T, T, dtype=torch.bool).tril(0 if incl else -1)
    g = F.logsigmoid(-z if complement else z).masked_fill(~keep, 0.0)
    r = torch.exp(g.sum(-1))
    if first is not None:
        r = r.clone()
        r[..., 0] = first
    return r


def test_remainder_check(capsys):
    assert ch10.check_stick_remainder(_remainder)
    assert ch10.check_stick_remainder(  # 1 - row sum of the weights, in float64: the same number
        lambda z: 1 - torch.exp(sb._log_weights(z)).sum(-1))
    wrong = {
        "diagonal included": lambda z: _remainder(z, incl=True),
        "first token 0": lambda z: _remainder(z, first=0.0),
        "broken, not left": lambda z: 1 - _remainder(z),
        "sigma, not 1 - sigma": lambda z: _remainder(z, complement=False),
        "keepdim": lambda z: _remainder(z)[..., None],
        "raises": lambda z: 1 / 0,
    }
    for why, fn in wrong.items():
        assert not ch10.check_stick_remainder(fn), why
    out = capsys.readouterr().out
    for phrase in ("diagonal j = i", "r_0 = 1", "broken off", "sigma(-l_ij)"):
        assert phrase in out, phrase


def _block_step(z, v, carry, acc, *, carry_in_w=True, own=False, carry_sign=-1, linear_carry=False, ltr=False):
    g = F.logsigmoid(-z)
    if ltr:
        neighbours = g.cumsum(-1) - g
    else:
        neighbours = g.flip(-1).cumsum(-1).flip(-1) - (0 if own else g)
    log_w = F.logsigmoid(z) + neighbours + (carry[..., None] if carry_in_w else 0)
    new_carry = carry + F.logsigmoid(carry_sign * z).sum(-1)
    return acc + torch.exp(log_w) @ v, torch.exp(new_carry) if linear_carry else new_carry


def test_block_step_check(capsys):
    assert ch10.check_stick_block_step(_block_step)

    # The step, used as a scan over blocks right to left, gives the library's last rows: a whole-form check of
    # the reference the grader compares with.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    rows = slice(8, 12)                                   # queries 8..11; keys 0..7 lie left of all of them
    z = 0.5 * q[rows] @ k.T
    acc, carry = torch.zeros(4, 4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    # keys inside the query block first (masked by hand here), then blocks [4, 8) and [0, 4)
    log_w_diag = sb._log_weights(0.5 * q @ k.T)[rows, 8:12]
    acc = acc + torch.exp(log_w_diag) @ v[8:12]
    carry = carry + F.logsigmoid(-z[:, 8:12]).masked_fill(~(torch.arange(8, 12)[None, :] < torch.arange(8, 12)[:, None]),
                                                          0.0).sum(-1)
    for s in (4, 0):
        acc, carry = _block_step(z[:, s:s + 4], v[s:s + 4], carry, acc)
    assert torch.allclose(acc, sb.stickbreaking_matrix(q, k, v, scale=0.5)[rows], atol=1e-12)
    assert torch.allclose(torch.exp(carry), sb.stick_remainder(q, k, scale=0.5)[rows])

    wrong = {
        "no carry in the weights": lambda *a: _block_step(*a, carry_in_w=False),
        "own gate": lambda *a: _block_step(*a, own=True),
        "carry adds sigma(z)": lambda *a: _block_step(*a, carry_sign=1),
        "carry in linear space": lambda *a: _block_step(*a, linear_carry=True),
        "left to right": lambda *a: _block_step(*a, ltr=True),
        "one part": lambda *a: _block_step(*a)[0],
        "raises": lambda *a: 1 / 0,
    }
    for why, fn in wrong.items():
        assert not ch10.check_stick_block_step(fn), why
    out = capsys.readouterr().out
    for phrase in ("multiplied by exp(carry)", "strictly right of c", "not what it takes", "log space",
                   "from the query backwards"):
        assert phrase in out, phrase
