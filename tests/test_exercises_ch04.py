"""Chapter 4 exercise checks: accept right answers, reject wrong ones without raising."""
import torch

from pathedu import rope
from pathedu.exercises import ch04


# --- Exercise 1: apply_rope with the half pairing ---------------------------

def rope_half(x):
    T, D = x.shape[-2:]
    h = D // 2
    theta = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(h, dtype=torch.float64) * 2 / D)
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * theta.cos() - b * theta.sin(), a * theta.sin() + b * theta.cos()], -1)


def test_apply_rope_half_accepts_right_answers(capsys):
    assert ch04.check_apply_rope_half(rope_half)
    assert ch04.check_apply_rope_half(lambda x: rope.apply_rope(x, pairing="half"))
    assert "Correct" in capsys.readouterr().out


def test_apply_rope_half_rejects_wrong_answers(capsys):
    wrong = [
        lambda x: rope.apply_rope(x, pairing="interleaved"),     # the other pairing
        lambda x: rope.apply_rope(x, pairing="half", offset=1),  # positions off by one
        lambda x: rope.apply_rope(x, pairing="half", base=100.0),
        lambda x: rope_half(x)[..., :-1],                        # wrong shape
        lambda x: x,                                             # no rotation
        lambda x: 1 / 0,                                         # raises
        lambda x: x.numpy(),                                     # not a tensor
    ]
    for fn in wrong:
        v = ch04.check_apply_rope_half(fn)
        assert not v
    out = capsys.readouterr().out
    assert "Not yet" in out and "ZeroDivisionError" in out


# --- Exercise 2: the logit depends on t - j only -----------------------------

def test_relative_logit_accepts_right_answers(capsys):
    def relative(q, k, delta):
        return (rope.apply_rope(q[:, None, :], offset=delta)[:, 0] * k).sum(-1)

    def via_matrix(q, k, delta):  # k^T R^delta q, batched
        return torch.einsum("bd,de,be->b", k, rope.rotation_matrix(delta, q.shape[-1]), q)

    assert ch04.check_relative_logit(relative)
    assert ch04.check_relative_logit(via_matrix)
    assert "Correct" in capsys.readouterr().out


def test_relative_logit_rejects_wrong_answers():
    wrong = [
        lambda q, k, delta: (rope.apply_rope(q[:, None, :], offset=-delta)[:, 0] * k).sum(-1),  # wrong direction
        lambda q, k, delta: (rope.apply_rope(k[:, None, :], offset=delta)[:, 0] * q).sum(-1),  # turns k, not q
        lambda q, k, delta: (q * k).sum(-1),                                                     # NoPE
        lambda q, k, delta: (rope.apply_rope(q[:, None, :], offset=delta)[:, 0] * k).sum(),     # wrong shape
        lambda q, k, delta: None,
    ]
    for fn in wrong:
        assert not ch04.check_relative_logit(fn)


def test_relative_logit_rejects_absolute_position_guesses():
    """An answer that works only for one query position (here t = delta, i.e. j = 0) fails at the others."""
    def j_is_zero(q, k, delta):
        return (rope.apply_rope(q[:, None, :], offset=delta)[:, 0] * k).sum(-1) * (1.0 if delta < 10 else 1.01)

    assert not ch04.check_relative_logit(j_is_zero)


# --- Exercise 3: one step of the complex recurrence -------------------------

def step(S, q_t, k_t, v_t, omega):
    S = S * torch.exp(1j * omega) + v_t[:, None] * k_t.conj()[None, :]
    return S, (S @ q_t).real


def test_complex_step_accepts_right_answers(capsys):
    assert ch04.check_complex_step(step)
    assert ch04.check_complex_step(lambda *a: (step(*a)[0], step(*a)[0] @ a[1]))  # complex o_t: real part taken
    assert "Correct" in capsys.readouterr().out


def test_complex_step_rejects_wrong_answers(capsys):
    def read_before_write(S, q_t, k_t, v_t, omega):
        o = (S @ q_t).real
        return S * torch.exp(1j * omega) + v_t[:, None] * k_t.conj()[None, :], o

    def no_conjugate(S, q_t, k_t, v_t, omega):
        S = S * torch.exp(1j * omega) + v_t[:, None] * k_t[None, :]
        return S, (S @ q_t).real

    def wrong_gate(S, q_t, k_t, v_t, omega):
        S = S * torch.exp(-1j * omega) + v_t[:, None] * k_t.conj()[None, :]
        return S, (S @ q_t).real

    def gate_after_write(S, q_t, k_t, v_t, omega):
        S = (S + v_t[:, None] * k_t.conj()[None, :]) * torch.exp(1j * omega)
        return S, (S @ q_t).real

    for fn in [read_before_write, no_conjugate, wrong_gate, gate_after_write,
               lambda *a: step(*a)[1],          # returns only o_t
               lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))]:
        assert not ch04.check_complex_step(fn)
    out = capsys.readouterr().out
    assert "Not yet" in out and "boom" in out
