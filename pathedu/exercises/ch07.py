"""Chapter 7 exercises: check functions for ``notebooks/07_pathfox_gdn_lab.ipynb``.

The checks run the student's functions on fresh random float64 inputs against :mod:`pathedu.pathfox`
and :mod:`pathedu.fox` and name the mistake when an answer matches a known wrong variant.
What a check takes, prints and returns, and what ``hint(n, level)`` prints: :mod:`pathedu.exercises`.

Exercises (``f = exp(log_f) <= 1`` is a forget gate, ``H_s = I - beta_s w_s w_s^T``):

1. :func:`check_gated_delta_step`: one step of Gated DeltaNet,
   ``S <- a S (I - beta k k^T) + beta v k^T``.
2. :func:`check_pathfox_logit`: the PaTH-FoX logit of one pair,
   ``D**-0.5 * k_j^T H_{j+1} ... H_i q_i + sum_{s=j+1..i} log_f[s]``.
3. :func:`check_gamma` and :func:`check_gated_deltanet_matrix`: the decay matrix
   ``exp(G)_ij = exp(sum_{s=j+1..i} log_f[s])`` and Gated DeltaNet's matrix form
   ``(Q K^T * exp(G) * M)(I + diag(beta)(K K^T * exp(G) * M^-))^{-1} diag(beta) V``.
4. :func:`check_gated_deltanet_chunk`: one chunk of the chunked Gated DeltaNet,
   from the state before the chunk to the chunk's outputs and the state after it.
5. :func:`check_decayed_trace` (predict, then run): what three gated steps with beta = 0 leave of a state.
6. :func:`check_bias_or_factor` (explain): why one gate is a bias on one side and a factor on the other.
7. :func:`check_gdn_bug` (find the bug): Gated DeltaNet's recurrence with one planted error.

"""
from __future__ import annotations

import torch

from .. import fox, pathfox
from ._grader import (Exercises, Verdict, check_function, check_parts, outer, rand64, randn64, seeded, switched_off,
                      unit, paragraph)

__all__ = ["check_gated_delta_step", "check_pathfox_logit", "check_gamma", "check_gated_deltanet_matrix",
           "check_gated_deltanet_chunk", "check_decayed_trace", "check_bias_or_factor", "check_gdn_bug", "hint"]

EXERCISES = Exercises("ch07", {
    1: ("Gated DeltaNet does two things to the memory at each token: a weight decay by the gate, and chapter 5's "
        "delta-rule correction. In which order, and at which state is the correction's error measured?",
        "a = exp(log_f) (...), broadcast over (Dv, D), gives the decayed state S' (..., Dv, D); the error "
        "S' k - v is (..., Dv); the correction is beta times the outer product of the error with k, as in "
        "chapter 5's delta step.",
        "S' = exp(log_f) * S; error = S' k - v; return S' - beta * outer(error, k)."),
    2: ("PaTH-FoX's logit adds two things you have written before: PaTH's logit (chapter 5) and FoX's gate bias "
        "(chapter 3). Which part does the 1/sqrt(D) scale multiply?",
        "score = k_j^T (H_{j+1} ... H_i) q_i, a number from a (D, D) product; G = the sum of log_f over "
        "s = j+1 .. i; logit = D**-0.5 * score + G. Return one number (a 0-dim tensor or a float).",
        "P = I; for s in j+1 .. i: P = P @ H_s. logit = D**-0.5 * k[j] @ P @ q[i] + log_f[j+1 : i+1].sum()."),
    3: ("(a) exp(G) is the exponential of chapter 3's log-gate matrix G, with 0 where G is -inf. (b) Start "
        "from DeltaNet's matrix form and ask where the gates enter: where the query reads, and where each "
        "correction is made by the decayed memory.",
        "(a) c = the cumulative sum of log_f (T,); exp(G) (T, T) from differences of c: 1 on the diagonal, 0 above. "
        "(b) Two (T, T) matrices built with exp(G): the read weights Q K^T * exp(G) * M, and the strictly lower "
        "diag(beta) (K K^T * exp(G)) inside an inverse that turns diag(beta) V into the corrected values U "
        "(T, Dv); o = read weights @ U.",
        "(a) c = cumsum(log_f); G = c[:, None] - c[None, :]; E = exp(G) below and on the diagonal, 0 above "
        "(torch.where on the causal mask). (b) Gam = gamma(log_f); B = diag(beta) @ (k @ k.T * Gam).tril(-1); "
        "U = solve(I + B, beta[:, None] * v); o = (q @ k.T * Gam) @ U."),
    4: ("The same split as in the chunk exercises of chapters 1 and 5: the state from before the chunk, and the "
        "chunk's own tokens. New here: the gates also decay the carried state, and each correction inside the "
        "chunk corrects what S predicts too.",
        "With b = cumsum(log_f) (C,) and exp(G) (C, C) of exercise 3: a triangular factor L (C, C) from "
        "K K^T * exp(G); corrected values U (C, Dv) that also subtract what the decayed S predicts for each key; "
        "o (C, Dv) = the decayed S read by Q plus (Q K^T * exp(G)) U; S_new (Dv, D) = the decayed S plus the "
        "writes U^T K, each key decayed by the gates after it.",
        "b = cumsum(log_f); L = inv(I + diag(beta) (K K^T * exp(G) * M^-)); U = L diag(beta) V - L diag(beta e^b) "
        "K S^T; o = diag(e^b) Q S^T + (Q K^T * exp(G)) U; S_new = e^{b_last} S + U^T diag(e^{g~}) K, with "
        "g~_j = sum_{r=j+1..C-1} log_f[r]. Exponentiate only sums of gates (<= 0)."),
    5: ("With beta = 0 nothing is written or erased: only the gate acts. What does it do to S at each step?",
        "Each step multiplies the whole state by a_t = e^{log f_t}; the trace is linear.",
        "S_3 = a_1 a_2 a_3 S_0 = 0.5^3 I, so trace(S_3) = 4 * 0.5^3."),
    6: ("Write the weight of key j for query i on each side and put e^{G_ij} into it.",
        "The softmax side's weight is exp(logit) / normaliser; the linear side's weight is the score itself, "
        "with no exponential: where can a factor e^{G_ij} go in each?",
        "exp(l + G) = exp(l) e^G: a bias G on the logit is the factor e^G on the softmax weight (before "
        "normalising); the linear side has no exp, so the factor e^G multiplies the score directly, which the "
        "recurrence applies as a_t S_{t-1}. The same G_ij on both sides."),
    7: ("Step the planted form for T = 1 with beta = 0: what should S_0 be, and what is it?",
        "Order of one step: decay the old state with a_t, then erase and write token t; the token's own gate "
        "must not act on what the token writes.",
        "The planted form decays after writing, so token t's gate acts on its own write (bug kind \"self\"): "
        "decay S first, then apply the delta rule."),

})
hint = EXERCISES.hint


def _log_gates(g, *shape):
    """Log gates in [-1.1, -0.1]: gates between 0.33 and 0.9, far enough from 1 that a missing gate shows."""
    return -(0.1 + rand64(g, *shape))


# ---------------------------------------------------------------------------
# Exercise 1: one step of Gated DeltaNet
# ---------------------------------------------------------------------------

def _step_inputs(seed):
    g = seeded(1600 + seed)
    lead, D, Dv = [((3,), 5, 4), ((2, 2), 6, 3), ((), 4, 7)][seed % 3]
    S = randn64(g, *lead, Dv, D)
    k = unit(randn64(g, *lead, D))
    v = randn64(g, *lead, Dv)
    beta = 0.3 + 1.4 * rand64(g, *lead)
    return S, k, v, beta, _log_gates(g, *lead)


def _step_reference(S, k, v, beta, log_f):
    """Through the library: one token of :func:`pathedu.pathfox.gated_deltanet_recurrent` from state S."""
    _, S_new = pathfox.gated_deltanet_recurrent(k[..., None, :], k[..., None, :], v[..., None, :], beta[..., None],
                                                log_f[..., None], initial_state=S, return_state=True)
    return S_new


def _delta_transition(S, k, beta):
    """``S (I - beta k k^T)``."""
    return S - beta[..., None, None] * outer((S @ k[..., :, None])[..., 0], k)


def _gate(x, log_f):
    return torch.exp(log_f)[..., None, None] * x


_STEP_WRONG = [
    (lambda S, k, v, b, lf: _gate(_delta_transition(S, k, b) + b[..., None, None] * outer(v, k), lf),
     "You applied the gate after the write: the new pair is then decayed by its own token's gate. Decay the old "
     "memory first, S' = a S, then take the delta step from S'."),
    (lambda S, k, v, b, lf: _gate(S, lf) + b[..., None, None] * outer(v, k),
     "Your step has no delta term: a S + beta v k^T is the scalar-gated linear attention of Mamba2 (the row the "
     "associative-memory notes give for Gated DeltaNet). Subtract what the decayed memory predicts: "
     "beta (a S k - v) k^T."),
    (lambda S, k, v, b, lf: _gate(S, lf) + b[..., None, None] * outer(v - (S @ k[..., :, None])[..., 0], k),
     "Your correction uses the prediction of the undecayed memory, S k: the regression step is taken at the "
     "decayed state S' = a S, so the error is S' k - v."),
    (lambda S, k, v, b, lf: _delta_transition(S, k, b) + b[..., None, None] * outer(v, k),
     "Your step ignores the gate: that is DeltaNet. Multiply the old memory by a = exp(log_f) first."),
    (lambda S, k, v, b, lf: lf[..., None, None] * _delta_transition(S, k, b) + b[..., None, None] * outer(v, k),
     "You used log_f itself as the gate: the gate is a = exp(log_f), a number in (0, 1]."),
    (lambda S, k, v, b, lf: _gate(_delta_transition(S, k, b), lf) + outer(v, k),
     "You wrote v k^T without beta: Gated DeltaNet writes beta v k^T (the gated Householder RNN with w = k and "
     "values beta v)."),
]


@EXERCISES.check(1)
def check_gated_delta_step(gated_delta_step) -> Verdict:
    """Exercise 1: ``gated_delta_step(S, k, v, beta, log_f) -> S_new``, one step of Gated DeltaNet.

    ``S: (..., Dv, D)`` (the memory), ``k: (..., D)`` (unit norm), ``v: (..., Dv)``,
    ``beta: (...)`` in [0, 2], ``log_f: (...)`` (<= 0; the gate is ``a = exp(log_f)``).
    ``S_new = a S (I - beta k k^T) + beta v k^T``: weight decay ``S' = a S``, then one
    gradient step of size beta on ``|S k - v|^2 / 2`` at ``S'``.
    """
    return check_function("gated delta step", gated_delta_step, _step_reference, _step_inputs, trials=3,
                          rtol=1e-10, wrong_variants=_STEP_WRONG)


# ---------------------------------------------------------------------------
# Exercise 2: the PaTH-FoX logit of one pair
# ---------------------------------------------------------------------------

def _logit_inputs(seed):
    g = seeded(1700 + seed)
    T, D, i, j = [(8, 4, 6, 2), (7, 5, 5, 0), (6, 3, 4, 4)][seed % 3]
    q, k = 2 * randn64(g, T, D), 2 * randn64(g, T, D)
    w = unit(randn64(g, T, D))
    beta = 0.3 + 1.7 * rand64(g, T)
    return q, k, w, beta, _log_gates(g, T), i, j


def _logit_reference(q, k, w, beta, log_f, i, j):
    return pathfox.pathfox_logits(q, k, w, beta, log_f)[i, j]


def _product(w, beta, idx):
    P = torch.eye(w.shape[-1], dtype=w.dtype)
    for s in idx:
        P = P @ (torch.eye(w.shape[-1], dtype=w.dtype) - beta[s] * torch.outer(w[s], w[s]))
    return P


def _logit_with(q, k, w, beta, log_f, i, j, *, order="right", gate=lambda j, i: range(j + 1, i + 1), how="add"):
    idx = range(j + 1, i + 1) if order == "right" else range(i, j, -1)
    score = k[j] @ _product(w, beta, idx) @ q[i]
    gsum = log_f[list(gate(j, i))].sum()
    scale = q.shape[-1] ** -0.5
    return {"add": scale * score + gsum, "scaled": scale * (score + gsum), "exp": torch.exp(scale * score) + gsum,
            "none": scale * score, "unscaled": score + gsum}[how]


_LOGIT_WRONG = [
    (lambda *a: _logit_with(*a, order="reversed"),
     "Your product runs H_i ... H_{j+1}: the reverse order. The logit is k_j^T H_{j+1} ... H_i q_i, smallest index "
     "next to the key."),
    (lambda *a: _logit_with(*a, gate=lambda j, i: range(j, i + 1)),
     "Your gate sum includes log_f[j]: a token's own gate never acts on its own key; sum s = j+1 .. i."),
    (lambda *a: _logit_with(*a, gate=lambda j, i: range(j + 1, i)),
     "Your gate sum stops before log_f[i]: the query's own gate acts on every earlier key; sum s = j+1 .. i."),
    (lambda *a: _logit_with(*a, how="scaled"),
     "You multiplied the gate sum by the scale too: as in FoX, the scale multiplies only the PaTH score, "
     "scale * score + G."),
    (lambda *a: _logit_with(*a, how="exp"),
     "You added the gate to the exponentiated score (the duality post's snippet): the bias belongs on the logit, "
     "scale * score + G, which the softmax then exponentiates."),
    (lambda *a: _logit_with(*a, how="none"),
     "Your logit has no gate: that is PaTH's logit. Add sum_{s=j+1..i} log_f[s]."),
    (lambda *a: _logit_with(*a, how="unscaled"),
     "You forgot the scale D**-0.5 on the PaTH score."),
]


def _as_scalar_tensor(fn):
    """Accept a Python number or a one-element tensor for a scalar answer."""
    def answer(*args):
        out = fn(*args)
        if isinstance(out, (int, float)) and not isinstance(out, bool):
            return torch.tensor(float(out), dtype=torch.float64)
        if isinstance(out, torch.Tensor) and out.numel() == 1:
            return out.reshape(())
        return out
    return answer


@EXERCISES.check(2)
def check_pathfox_logit(pathfox_logit) -> Verdict:
    """Exercise 2: ``pathfox_logit(q, k, w, beta, log_f, i, j) -> logit`` (a number), for ``j <= i``.

    ``q, k, w: (T, D)``, ``beta, log_f: (T,)``; the logit of query ``i`` on key ``j``::

        D**-0.5 * k_j^T H_{j+1} H_{j+2} ... H_i q_i + sum_{s=j+1..i} log_f[s]

    with ``H_s = I - beta_s w_s w_s^T`` (empty product and empty sum when ``j = i``).
    A 0-dim tensor, a one-element tensor or a Python float is accepted.
    """
    answer = _as_scalar_tensor(pathfox_logit)
    return check_function("PaTH-FoX logit", answer, _logit_reference, _logit_inputs, trials=3, rtol=1e-10,
                          wrong_variants=_LOGIT_WRONG)


# ---------------------------------------------------------------------------
# Exercise 3: exp(G) and the matrix form of Gated DeltaNet
# ---------------------------------------------------------------------------

def _gamma_inputs(seed):
    g = seeded(1800 + seed)
    T = (7, 5, 1)[seed % 3]
    return (_log_gates(g, T),)


def _gamma_reference(log_f):
    return torch.exp(fox.log_gate_matrix(log_f))


def _prefix_differences(log_f):
    c = torch.cumsum(log_f, -1)
    return c[:, None] - c[None, :]


_GAMMA_WRONG = [
    (lambda lf: (torch.exp(_prefix_differences(lf) + lf[None, :])).tril(),
     "Your product includes the key's own gate (s = j .. i), so the diagonal is a_i instead of 1: a token's own "
     "gate never acts on itself."),
    (lambda lf: torch.exp(_prefix_differences(lf)),
     "Your exp(G) is not masked: above the diagonal (j > i, the future) it must be 0."),
    (lambda lf: _gamma_reference(lf).T,
     "Your exp(G) is transposed: row i is the query, column j the key; exp(G)_ij = f_{j+1} ... f_i for j <= i."),
    (lambda lf: fox.log_gate_matrix(lf).nan_to_num(neginf=0.0),
     "You returned the log gates G_ij: exp(G) is their exponential, exp(G_ij)."),
    (lambda lf: _gamma_reference(lf).tril(-1),
     "Your diagonal is 0: exp(G)_ii is the empty product, 1 (a token sees its own key undecayed)."),
]


@EXERCISES.check(3, label="3a")
def check_gamma(gamma) -> Verdict:
    """Exercise 3a: ``gamma(log_f) -> exp(G)``, ``log_f: (T,)`` -> ``(T, T)``.

    ``exp(G)_ij = exp(sum_{s=j+1..i} log_f[s]) = f_{j+1} ... f_i`` for ``j <= i`` (1 on the
    diagonal), 0 for ``j > i``.
    """
    return check_function("exp(G)", gamma, _gamma_reference, _gamma_inputs, trials=3, rtol=1e-10,
                          wrong_variants=_GAMMA_WRONG)


def _gdn_inputs(seed):
    g = seeded(1900 + seed)
    T, D, Dv = [(7, 4, 3), (9, 3, 5), (1, 4, 2)][seed % 3]
    q, k, v = randn64(g, T, D), unit(randn64(g, T, D)), randn64(g, T, Dv)
    beta = 0.3 + 1.4 * rand64(g, T)
    return q, k, v, beta, _log_gates(g, T)


def _gdn_reference(q, k, v, beta, log_f):
    return pathfox.gated_deltanet_matrix(q, k, v, beta, log_f)


def _gdn_with(q, k, v, beta, log_f, *, gate_out=True, gate_in=True, strict=True, beta_right=True, rows=True):
    T = q.shape[0]
    Gam = _gamma_reference(log_f)
    M = torch.ones(T, T, dtype=q.dtype).tril()
    inner = k @ k.T * (Gam if gate_in else M)
    inner = inner.tril(-1) if strict else inner.tril()
    inner = torch.diag(beta) @ inner if rows else inner @ torch.diag(beta)
    U = torch.linalg.inv(torch.eye(T, dtype=q.dtype) + inner) @ (beta[:, None] * v if beta_right else v)
    return (q @ k.T * (Gam if gate_out else M)) @ U


_GDN_WRONG = [
    (lambda q, k, v, b, lf: (q @ k.T * _gamma_reference(lf)) @ (b[:, None] * v),
     "Your output has no inverse: (Q K^T * exp(G) * M) diag(beta) V is gated linear attention (Mamba2) without the "
     "delta term. The corrected values are U = (I + diag(beta)(K K^T * exp(G) * M^-))^{-1} diag(beta) V."),
] + switched_off(_gdn_with, [
    ("gate_in",
     "Your inverse has no exp(G): each correction is made by the *decayed* memory, so the gates between j and t "
     "also multiply k_t . k_j inside the inverse."),
    ("gate_out",
     "Your output weights Q K^T * M have no exp(G): the query reads the state after the gates, so "
     "use Q K^T * exp(G) * M."),
    ("strict",
     "Your inverse keeps the diagonal: the correction of u_t uses only earlier tokens, so mask with the strictly "
     "lower M^-."),
    ("beta_right",
     "You forgot the final diag(beta): token t writes beta_t times its corrected value."),
    ("rows",
     "You scaled the columns of K K^T * exp(G) * M^- by beta: the row of token t is scaled by beta_t, "
     "diag(beta) on the left."),
])


@EXERCISES.check(3, label="3b", allow=("pathedu.fox.log_gate_matrix",))
def check_gated_deltanet_matrix(gated_deltanet_matrix) -> Verdict:
    """Exercise 3b: ``gated_deltanet_matrix(q, k, v, beta, log_f) -> o``, Gated DeltaNet in matrix form.

    ``q, k: (T, D)`` (unit keys), ``v: (T, Dv)``, ``beta, log_f: (T,)``; with ``M`` the
    causal mask (diagonal kept), ``M^-`` its strictly lower part and ``exp(G)`` of exercise 3a::

        U = (I + diag(beta) (K K^T * exp(G) * M^-))^{-1} diag(beta) V,     o = (Q K^T * exp(G) * M) U
    """
    return check_function("Gated DeltaNet matrix form", gated_deltanet_matrix, _gdn_reference, _gdn_inputs,
                          trials=3, rtol=1e-10, wrong_variants=_GDN_WRONG)


# ---------------------------------------------------------------------------
# Exercise 4: one chunk of the chunked Gated DeltaNet
# ---------------------------------------------------------------------------

def _chunk_inputs(seed):
    g = seeded(2000 + seed)
    C, D, Dv = [(6, 4, 3), (5, 3, 5), (1, 4, 2)][seed % 3]
    q, k, v = randn64(g, C, D), unit(randn64(g, C, D)), randn64(g, C, Dv)
    beta = 0.3 + 1.4 * rand64(g, C)
    S = randn64(g, Dv, D)
    return q, k, v, beta, _log_gates(g, C), S


def _chunk_reference(q, k, v, beta, log_f, S):
    return pathfox.gated_deltanet_chunked(q, k, v, beta, log_f, chunk=q.shape[0], initial_state=S,
                                          return_state=True)


def _chunk_with(q, k, v, beta, log_f, S, *, decay_out=True, decay_state=True, correct_state=True,
                gate_inside=True, decay_keys=True):
    C = q.shape[0]
    b = torch.cumsum(log_f, 0)
    Gam = _gamma_reference(log_f)
    g_after = torch.cat([log_f.flip(0).cumsum(0).flip(0)[1:], log_f.new_zeros(1)])
    eye = torch.eye(C, dtype=q.dtype)
    inner = k @ k.T * (Gam if gate_inside else torch.ones_like(Gam))
    Tc = torch.linalg.inv(eye + torch.diag(beta) @ inner.tril(-1))
    W = Tc @ ((beta * torch.exp(b))[:, None] * k)
    U = Tc @ (beta[:, None] * v) - (W @ S.T if correct_state else 0)
    o = (torch.exp(b)[:, None] if decay_out else 1) * (q @ S.T) + (q @ k.T * Gam) @ U
    keys = (torch.exp(g_after)[:, None] if decay_keys else 1) * k
    S_new = (torch.exp(b[-1]) if decay_state else 1) * S + U.T @ keys
    return o, S_new


_CHUNK_WRONG = switched_off(_chunk_with, [
    ("decay_out",
     "Your outputs read the carried state undecayed: the state from before the chunk reaches token i through the "
     "gates b_i = log_f[0] + ... + log_f[i], so the inter-chunk term is diag(e^b) Q S^T."),
    ("decay_state",
     "Your new state keeps S undecayed: the whole chunk's gates act on it, S_new = e^{b_last} S + ..."),
    ("correct_state",
     "Your corrected values ignore the carried state: each u_t corrects what the whole decayed memory predicts, "
     "including S, so U = T (diag(beta) V - diag(beta e^b) K S^T)."),
    ("gate_inside",
     "Your triangular factor has no exp(G): inside the chunk the corrections are made by the decayed memory, so "
     "use K K^T * exp(G) * M^- in the inverse."),
    ("decay_keys",
     "Your new state writes every key of the chunk undecayed: key j is decayed by the gates after it, "
     "exp(sum_{r=j+1..last} log_f[r])."),
])


@EXERCISES.check(4, allow=("pathedu.fox.log_gate_matrix",))
def check_gated_deltanet_chunk(chunk_step) -> Verdict:
    """Exercise 4: ``chunk_step(q, k, v, beta, log_f, S) -> (o, S_new)``, one chunk of chunked Gated DeltaNet.

    ``q, k: (C, D)`` (unit keys), ``v: (C, Dv)``, ``beta, log_f: (C,)``: one chunk of C
    tokens; ``S: (Dv, D)``: the state after every earlier token.  Must return the chunk's
    outputs ``o: (C, Dv)`` and the state after the chunk ``S_new: (Dv, D)``, equal to running
    ``S_t = f_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t`` token by
    token from ``S``.  With ``b = cumsum(log_f)``, ``exp(G)`` of exercise 3a and
    ``g~_j = sum_{r=j+1..C-1} log_f[r]``::

        L = (I + diag(beta) (K K^T * exp(G) * M^-))^{-1}
        Y = L diag(beta e^b) K,   U = L diag(beta) V - Y S^T
        o = diag(e^b) Q S^T + (Q K^T * exp(G) * M) U
        S_new = e^{b_last} S + U^T diag(e^{g~}) K
    """
    return check_parts("Gated DeltaNet chunk step", chunk_step, _chunk_reference, _chunk_inputs, ("o", "S_new"),
                       rtol=1e-10, wrong_variants=_CHUNK_WRONG)


# ---------------------------------------------------------------------------
# Exercise 5 (predict, then run): what three gated steps with beta = 0 leave
# ---------------------------------------------------------------------------

TRACE_D, TRACE_GATE, TRACE_STEPS = 4, 0.5, 3


def _decayed_trace() -> float:
    T, D = TRACE_STEPS, TRACE_D
    zeros = torch.zeros(T, D, dtype=torch.float64)
    log_f = torch.full((T,), TRACE_GATE, dtype=torch.float64).log()
    _, S = pathfox.gated_deltanet_recurrent(zeros, unit(torch.ones(T, D, dtype=torch.float64)), zeros,
                                            torch.zeros(T, dtype=torch.float64), log_f,
                                            initial_state=torch.eye(D, dtype=torch.float64), return_state=True)
    return S.trace().item()


@EXERCISES.prediction(5, "predict: a decayed state", _decayed_trace, rtol=1e-6)
def check_decayed_trace(trace) -> Verdict:
    """Exercise 5: the trace of Gated DeltaNet's state after :data:`TRACE_STEPS` tokens with ``beta = 0`` and
    gates :data:`TRACE_GATE`, from ``S = I`` (``D =`` :data:`TRACE_D`); a number."""


# ---------------------------------------------------------------------------
# Exercise 6 (explain): a bias on one side, a factor on the other
# ---------------------------------------------------------------------------

BIAS_FACTOR_RUBRIC = paragraph("""2 points. 1: on the softmax side the weight is exp(logit) normalised, and exp(l +
    G) = exp(l) e^G, so adding G_ij to the logit multiplies the unnormalised weight by the gate product e^{G_ij}. 1:
    the linear side has no exponential: the score itself is the weight, so the same e^{G_ij} multiplies it directly,
    which the recurrence applies step by step as a_t S_{t-1}; one G_ij (sum of log f_s, s = j+1..i) serves both.
    Half a point for 'log and exp are inverse' without the softmax.""")


@EXERCISES.explanation(6, "explain: a bias or a factor", rubric=BIAS_FACTOR_RUBRIC)
def check_bias_or_factor(text) -> Verdict:
    """Exercise 6: why one forget gate is a logit bias on the softmax side and a factor on the linear side."""


# ---------------------------------------------------------------------------
# Exercise 7 (find the bug): Gated DeltaNet with one planted error
# ---------------------------------------------------------------------------

def _gdn_planted(q, k, v, beta, log_f):
    """The lab's planted form: the gate decays the state after token t has written to it."""
    S = torch.zeros(*q.shape[:-2], v.shape[-1], q.shape[-1], dtype=q.dtype)
    outs = []
    for t in range(q.shape[-2]):
        k_t, b_t = k[..., t, :], beta[..., t, None, None]
        S = S + b_t * (v[..., t, :, None] - S @ k_t[..., :, None]) * k_t[..., None, :]
        S = torch.exp(log_f[..., t, None, None]) * S
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, -2)


def _gdn_bug_inputs(seed):
    g = seeded(900 + seed)
    lead, T, D, Dv = [((2,), 8, 6, 4), ((2, 2), 5, 4, 7), ((), 11, 8, 3)][seed % 3]
    q, k = randn64(g, *lead, T, D), unit(randn64(g, *lead, T, D))
    return q, k, randn64(g, *lead, T, Dv), 2 * rand64(g, *lead, T), _log_gates(g, *lead, T)


@EXERCISES.planted_bug(7, "find the bug: Gated DeltaNet", bug="self", reference=pathfox.gated_deltanet_recurrent,
                       make_inputs=_gdn_bug_inputs, buggy=_gdn_planted)
def check_gdn_bug(bug, gated_deltanet_fixed) -> Verdict:
    """Exercise 7: ``bug`` names the planted error of the lab's ``gated_deltanet_planted`` (a key of
    :data:`pathedu.exercises.BUG_KINDS`); ``gated_deltanet_fixed(q, k, v, beta, log_f) -> (..., T, Dv)`` is
    the recurrence fixed, compared with :func:`pathedu.pathfox.gated_deltanet_recurrent`."""
