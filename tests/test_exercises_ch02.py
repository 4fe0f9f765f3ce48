"""Chapter 2's exercise checks: accept right answers, reject wrong ones (with a hint), never raise."""
import math

import pytest
import torch

from pathedu import alibi
from pathedu.exercises import ch02


def _slopes(n):
    p = 2 ** int(math.floor(math.log2(n)))
    base = [2 ** (-8 * h / p) for h in range(1, p + 1)]
    return base + [2 ** (-8 * (2 * h - 1) / (2 * p)) for h in range(1, n - p + 1)]


def test_alibi_slopes_accepts_right_answers(capsys):
    assert ch02.check_alibi_slopes(_slopes)
    assert ch02.check_alibi_slopes(_slopes(12))
    assert ch02.check_alibi_slopes(torch.tensor(_slopes(12)))
    assert "Correct" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [
    lambda n: [2 ** (-8 * h / n) for h in range(1, n + 1)],  # geometric for every n: wrong for 12 heads
    lambda n: sorted(_slopes(n), reverse=True),  # right values, wrong order
    lambda n: _slopes(n)[:-1],  # one head short
    lambda n: 1 / 0,  # raises
    lambda n: "slopes",  # not numbers
    _slopes(8),  # a list for the wrong number of heads
    [2 ** (-8 * h / 12) for h in range(1, 13)],
])
def test_alibi_slopes_rejects_wrong_answers(wrong, capsys):
    v = ch02.check_alibi_slopes(wrong)
    assert not v
    out = capsys.readouterr().out
    assert "Not yet" in out and "[ALiBi slopes]" in out


def test_alibi_slopes_order_hint(capsys):
    ch02.check_alibi_slopes(lambda n: sorted(_slopes(n), reverse=True))
    assert "another order" in capsys.readouterr().out


def _bias(T, slope):
    i = torch.arange(T)
    dist = (i[:, None] - i[None, :]).double()
    return (-slope * dist).masked_fill(dist < 0, float("-inf"))


def test_alibi_bias_accepts_right_answers():
    assert ch02.check_alibi_bias(_bias)
    assert ch02.check_alibi_bias(lambda T, s: alibi.alibi_bias(T, s).float())


@pytest.mark.parametrize("wrong,needle", [
    (lambda T, s: (s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).double()).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")), "sign"),  # the seed's displayed sign
    # the seed's code: -slope*|i-j| with tril(), so the future gets 0
    (lambda T, s: (-s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().double()).tril(), "-inf"),
    (lambda T, s: _bias(T, 2 * s), "wrong values"),
    (lambda T, s: _bias(T + 1, s), "shape"),
    (lambda T, s: _bias(T, s).tolist(), "torch.Tensor"),
    (lambda T, s: {}["bias"], "KeyError"),  # the student's code raises
])
def test_alibi_bias_rejects_wrong_answers(wrong, needle, capsys):
    assert not ch02.check_alibi_bias(wrong)
    assert needle in capsys.readouterr().out


def _retnet_recurrent(q, k, v, gamma):
    S = torch.zeros(q.shape[:-2] + (v.shape[-1], q.shape[-1]), dtype=q.dtype)
    outs = []
    for t in range(q.shape[-2]):
        S = gamma * S + v[..., t, :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, -2)


def test_retnet_recurrent_accepts_right_answers():
    assert ch02.check_retnet_recurrent(_retnet_recurrent)
    assert ch02.check_retnet_recurrent(alibi.retnet_chunked)


@pytest.mark.parametrize("wrong", [
    lambda q, k, v, g: _retnet_recurrent(q, k, v, 1.0),  # forgot the gate
    lambda q, k, v, g: _retnet_recurrent(q, k, v, g) * g,  # gate applied once too often
    lambda q, k, v, g: _retnet_recurrent(q, k, v, g)[..., :-1, :],  # wrong shape
    lambda q, k, v, g: None,  # the stub
    lambda q, k, v, g: q @ k,  # raises (shapes)
])
def test_retnet_recurrent_rejects_wrong_answers(wrong, capsys):
    assert not ch02.check_retnet_recurrent(wrong)
    assert "Not yet" in capsys.readouterr().out


def test_half_life_gamma():
    assert ch02.check_half_life_gamma(2 ** (-1 / 100))
    assert ch02.check_half_life_gamma(torch.tensor(0.5 ** 0.01, dtype=torch.float64))
    assert ch02.check_half_life_gamma(alibi.slope_to_gamma(math.log(2) / 100))


@pytest.mark.parametrize("wrong,needle", [
    (math.exp(-1 / 100), "1/e"),
    (0.99, "solve"),
    (0.5 ** 100, "solve"),
    (0.9, "halves after 6.6 tokens"),
    (1.0, "halves after inf"),
    (1.5, "(0, 1]"),
    (-0.2, "(0, 1]"),
    (float("nan"), "(0, 1]"),
    ("0.993", "number"),
    (None, "number"),
    (torch.ones(3), "number"),
])
def test_half_life_gamma_rejects_wrong_answers(wrong, needle, capsys):
    assert not ch02.check_half_life_gamma(wrong)
    assert needle in capsys.readouterr().out
