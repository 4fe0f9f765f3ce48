"""Chapter 1 exercise checks: right answers pass, typical wrong answers fail, nothing raises."""
import pytest
import torch

from pathedu import nope
from pathedu.exercises import ch01


# --- right answers, written independently of the checkers' references ---------

def linear_matrix_ok(q, k, v):
    T = q.shape[-2]
    return torch.einsum("...ij,...jd->...id", torch.einsum("...id,...jd->...ij", q, k) * torch.ones(T, T).tril(), v)


def merge_ok(m1, l1, acc1, m2, l2, acc2):
    m = torch.where(m1 > m2, m1, m2)
    w1, w2 = (m1 - m).exp(), (m2 - m).exp()
    return m, w1 * l1 + w2 * l2, w1.unsqueeze(-1) * acc1 + w2.unsqueeze(-1) * acc2


def chunk_step_ok(q, k, v, S):
    # Token by token, a different route from the matrix formula the hint suggests.
    outs = []
    for t in range(q.shape[-2]):
        S = S + v[..., t, :, None] * k[..., t, None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, -2), S


# --- wrong answers -------------------------------------------------------------

def _tri(T, offset=0):
    return torch.ones(T, T, dtype=torch.float64).tril(offset)


LINEAR_WRONG = {
    "strict mask (off by one)": lambda q, k, v: ((q @ k.transpose(-1, -2)) * _tri(q.shape[-2], -1)) @ v,
    "no mask": lambda q, k, v: (q @ k.transpose(-1, -2)) @ v,
    "extra scale": lambda q, k, v: ((q @ k.transpose(-1, -2)) * _tri(q.shape[-2]) / q.shape[-1] ** 0.5) @ v,
    "softmax instead of linear": lambda q, k, v: nope.nope_matrix(q, k, v),
    "upper triangle": lambda q, k, v: ((q @ k.transpose(-1, -2)) * _tri(q.shape[-2]).T) @ v,
    "returns the state's shape": lambda q, k, v: q.new_zeros(q.shape[:-1] + (q.shape[-1],)) + 1,
}

MERGE_WRONG = {
    "no rescale": lambda m1, l1, a1, m2, l2, a2: (torch.maximum(m1, m2), l1 + l2, a1 + a2),
    "rescale the wrong way": lambda m1, l1, a1, m2, l2, a2: (
        torch.maximum(m1, m2), (torch.maximum(m1, m2) - m1).exp() * l1 + (torch.maximum(m1, m2) - m2).exp() * l2,
        (torch.maximum(m1, m2) - m1).exp()[..., None] * a1 + (torch.maximum(m1, m2) - m2).exp()[..., None] * a2),
    "min instead of max": lambda m1, l1, a1, m2, l2, a2: (
        torch.minimum(m1, m2), (m1 - torch.minimum(m1, m2)).exp() * l1 + (m2 - torch.minimum(m1, m2)).exp() * l2,
        (m1 - torch.minimum(m1, m2)).exp()[..., None] * a1 + (m2 - torch.minimum(m1, m2)).exp()[..., None] * a2),
    "acc not rescaled": lambda m1, l1, a1, m2, l2, a2: (
        merge_ok(m1, l1, a1, m2, l2, a2)[0], merge_ok(m1, l1, a1, m2, l2, a2)[1], a1 + a2),
    "returns the normalised output": lambda m1, l1, a1, m2, l2, a2: (
        merge_ok(m1, l1, a1, m2, l2, a2)[2] / merge_ok(m1, l1, a1, m2, l2, a2)[1][..., None]),
    "two outputs": lambda m1, l1, a1, m2, l2, a2: merge_ok(m1, l1, a1, m2, l2, a2)[1:],
}

CHUNK_WRONG = {
    "no prefix term": lambda q, k, v, S: (((q @ k.transpose(-1, -2)) * _tri(q.shape[-2])) @ v,
                                          S + v.transpose(-1, -2) @ k),
    "state after the chunk in the prefix term": lambda q, k, v, S: (
        q @ (S + v.transpose(-1, -2) @ k).transpose(-1, -2) + ((q @ k.transpose(-1, -2)) * _tri(q.shape[-2])) @ v,
        S + v.transpose(-1, -2) @ k),
    "strict intra-chunk mask": lambda q, k, v, S: (
        q @ S.transpose(-1, -2) + ((q @ k.transpose(-1, -2)) * _tri(q.shape[-2], -1)) @ v, S + v.transpose(-1, -2) @ k),
    "transposed state (D x Dv)": lambda q, k, v, S: (
        chunk_step_ok(q, k, v, S)[0], S.transpose(-1, -2) + k.transpose(-1, -2) @ v),
    "state not updated": lambda q, k, v, S: (chunk_step_ok(q, k, v, S)[0], S),
    "output only": lambda q, k, v, S: chunk_step_ok(q, k, v, S)[0],
}

CHECKS = [
    (ch01.check_linear_matrix, linear_matrix_ok, LINEAR_WRONG),
    (ch01.check_online_softmax_merge, merge_ok, MERGE_WRONG),
    (ch01.check_chunk_step, chunk_step_ok, CHUNK_WRONG),
]


def test_library_forms_pass_the_checks():
    assert ch01.check_linear_matrix(nope.linear_matrix)
    assert ch01.check_chunk_step(lambda q, k, v, S: nope.linear_recurrent(q, k, v, initial_state=S, return_state=True))


HINTS = [  # (check, wrong answer, what its verdict must say)
    (ch01.check_linear_matrix, LINEAR_WRONG["strict mask (off by one)"], "diagonal"),
    (ch01.check_linear_matrix, LINEAR_WRONG["extra scale"], "no scale"),
    (ch01.check_online_softmax_merge, MERGE_WRONG["no rescale"], "rescale it by exp(m_a - m)"),
    (ch01.check_chunk_step, CHUNK_WRONG["no prefix term"], "ignores the prefix"),
    # a wrong part of a tuple answer is named
    (ch01.check_online_softmax_merge, MERGE_WRONG["acc not rescaled"], "`acc`"),
    (ch01.check_chunk_step, CHUNK_WRONG["state not updated"], "`S_new`"),
    (ch01.check_chunk_step, CHUNK_WRONG["transposed state (D x Dv)"], "`S_new` should have shape"),
]


@pytest.mark.parametrize("check, wrong, phrase", HINTS, ids=[p for _, _, p in HINTS])
def test_known_mistakes_get_a_specific_hint(check, wrong, phrase, capsys):
    check(wrong)
    assert phrase in capsys.readouterr().out
