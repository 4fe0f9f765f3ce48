"""Chapter 3 exercise checks: each accepts a right answer and rejects wrong ones without raising."""
import pytest
import torch

from pathedu import fox
from pathedu.exercises import ch03


def _future(T):
    return torch.ones(T, T, dtype=torch.bool).triu(1)


def _c_diff(log_f):
    c = log_f.cumsum(-1)
    return c[..., :, None] - c[..., None, :]


def test_log_gate_matrix_check(capsys):
    # right: the library's segment sums, and the prefix-sum difference with a -inf future
    assert ch03.check_log_gate_matrix(fox.log_gate_matrix)
    assert ch03.check_log_gate_matrix(lambda lf: _c_diff(lf).masked_fill(_future(lf.shape[-1]), float("-inf")))
    wrong = {
        "seed's 0 future": lambda lf: _c_diff(lf).tril(),
        "own gate included": lambda lf: (_c_diff(lf) + lf[..., None, :]).masked_fill(_future(lf.shape[-1]), float("-inf")),
        "sign flipped": lambda lf: (-_c_diff(lf)).masked_fill(_future(lf.shape[-1]), float("-inf")),
        "transposed": lambda lf: _c_diff(lf).transpose(-1, -2).masked_fill(_future(lf.shape[-1]), float("-inf")),
        "no batch dims": lambda lf: fox.log_gate_matrix(lf.reshape(-1)),
        "raises": lambda lf: 1 / 0,
        "not a tensor": lambda lf: lf.tolist(),
    }
    for why, fn in wrong.items():
        assert not ch03.check_log_gate_matrix(fn), why
    out = capsys.readouterr().out
    assert "-inf, not 0" in out and "own gate" in out and "sign" in out


def test_fox_matrix_check():
    assert ch03.check_fox_matrix(fox.fox_matrix)
    assert ch03.check_fox_matrix(lambda q, k, v, lf: fox.fox_naive(q, k, v, lf))

    def with_gate(gate_fn, scale_gate=False):
        def fn(q, k, v, lf):
            scale = q.shape[-1] ** -0.5
            gate = gate_fn(lf)
            return torch.softmax(scale * (q @ k.transpose(-1, -2)) + (scale * gate if scale_gate else gate), -1) @ v
        return fn

    wrong = [
        with_gate(lambda lf: _c_diff(lf).tril()),  # the seed: the future gets logit bias 0, not -inf
        with_gate(fox.log_gate_matrix, scale_gate=True),  # gate multiplied by the scale
        lambda q, k, v, lf: fox.fox_matrix(q, k, v, torch.zeros_like(lf)),  # no gate
        lambda q, k, v, lf: fox.fox_matrix(q, k, v, lf, scale=1.0),  # no scale
        lambda q, k, v, lf: None,
    ]
    for fn in wrong:
        assert not ch03.check_fox_matrix(fn)


def test_gla_recurrent_check():
    assert ch03.check_gla_recurrent(fox.gla_recurrent)
    assert ch03.check_gla_recurrent(fox.gla_chunked)

    def recurrent(rule):
        def fn(q, k, v, lf):
            S = q.new_zeros(q.shape[:-2] + (v.shape[-1], q.shape[-1]))
            outs = []
            for t in range(q.shape[-2]):
                S = rule(S, torch.exp(lf[..., t, :]), v[..., t, :, None] * k[..., t, None, :])
                outs.append((S @ q[..., t, :, None])[..., 0])
            return torch.stack(outs, -2)
        return fn

    assert ch03.check_gla_recurrent(recurrent(lambda S, a, kv: S * a[..., None, :] + kv))
    wrong = [
        recurrent(lambda S, a, kv: a[..., :, None] * S + kv),  # gate on the value rows
        recurrent(lambda S, a, kv: (S + kv) * a[..., None, :]),  # the token's own gate acts on itself
        recurrent(lambda S, a, kv: S * a.mean(-1)[..., None, None] + kv),  # one scalar gate
        recurrent(lambda S, a, kv: S + kv),  # no gate
        lambda q, k, v, lf: 1 / 0,
    ]
    for fn in wrong:
        assert not ch03.check_gla_recurrent(fn)


def test_stuck_product_check():
    p = fox.running_product(0.9, 2000)
    assert p.dtype == torch.float32 and (p > 0).all()            # step by step, it never reaches 0
    n = int(torch.nonzero(p[1:] == p[:-1])[0, 0]) + 1
    value = p[n - 1].item()
    assert value == 4 * 2.0 ** -149                              # stuck at a subnormal
    assert ch03.check_stuck_product(n, value)
    assert ch03.check_stuck_product(torch.tensor(n), torch.tensor(value))
    cumprod = torch.cumprod(torch.full((2000,), 0.9, dtype=torch.float32), 0)
    n_zero = int(torch.nonzero(cumprod == 0)[0, 0]) + 1             # cumprod: double accumulation, reaches 0
    for wrong_n, wrong_value in ((n - 10, value), (n + 10, value), (n_zero, 0.0), (n, 2.0 ** -149), ("964", value),
                                 (964.5, value), (None, value), (True, value), (n, None)):
        assert not ch03.check_stuck_product(wrong_n, wrong_value)


def test_running_product_validates():
    with pytest.raises(ValueError, match="`n`"):
        fox.running_product(0.9, -1)
    with pytest.raises(ValueError, match="`f`"):
        fox.running_product(1.5, 3)
