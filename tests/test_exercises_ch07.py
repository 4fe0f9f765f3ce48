"""Chapter 7 exercise checks: right answers pass, typical wrong answers fail with their hint, nothing raises."""
import pytest
import torch

from pathedu.exercises import ch07


# --- right answers, written independently of the checkers' references ---------

def H(w_s, b_s):
    return torch.eye(w_s.shape[-1], dtype=w_s.dtype) - b_s[..., None, None] * w_s[..., :, None] * w_s[..., None, :]


def outer(a, b):
    return a[..., :, None] * b[..., None, :]


def step_ok(S, k, v, beta, log_f):
    # the "gated transition" reading: a S (I - beta k k^T) + beta v k^T
    return torch.exp(log_f)[..., None, None] * S @ H(k, beta) + beta[..., None, None] * outer(v, k)


def logit_ok(q, k, w, beta, log_f, i, j):
    # walk s = i, i-1, ..., j+1 building P = H_{j+1} ... H_i from the right, as a Python float
    P = torch.eye(q.shape[1], dtype=q.dtype)
    for s in range(i, j, -1):
        P = H(w[s], beta[s]) @ P
    gate = sum(log_f[s].item() for s in range(j + 1, i + 1))
    return (k[j] @ P @ q[i]).item() / q.shape[1] ** 0.5 + gate


def gamma_ok(log_f):
    T = log_f.shape[0]
    out = torch.zeros(T, T, dtype=log_f.dtype)
    for i in range(T):
        for j in range(i + 1):
            out[i, j] = torch.exp(log_f[j + 1 : i + 1].sum())
    return out


def gdn_matrix_ok(q, k, v, beta, log_f):
    # forward substitution for the corrected values u_t, then gated linear attention on them
    T = q.shape[0]
    Gam = gamma_ok(log_f)
    U = torch.zeros_like(v)
    for t in range(T):
        U[t] = beta[t] * (v[t] - sum((Gam[t, j] * (k[t] @ k[j]) * U[j] for j in range(t)), torch.zeros_like(v[t])))
    return (q @ k.T * Gam) @ U


def chunk_ok(q, k, v, beta, log_f, S):
    # token by token from S (the definition the chunk step must reproduce)
    outs = []
    for t in range(q.shape[0]):
        S = step_ok(S, k[t], v[t], beta[t], log_f[t])
        outs.append(S @ q[t])
    return torch.stack(outs), S


# --- wrong answers -------------------------------------------------------------

STEP_WRONG = {
    "gate after the write": lambda S, k, v, b, lf: torch.exp(lf)[..., None, None] * (
        S @ H(k, b) + b[..., None, None] * outer(v, k)),
    "no delta term": lambda S, k, v, b, lf: torch.exp(lf)[..., None, None] * S + b[..., None, None] * outer(v, k),
    "error at the undecayed state": lambda S, k, v, b, lf: (
        torch.exp(lf)[..., None, None] * S + b[..., None, None] * outer(v - (S @ k[..., :, None])[..., 0], k)),
    "no gate": lambda S, k, v, b, lf: S @ H(k, b) + b[..., None, None] * outer(v, k),
    "log_f as the gate": lambda S, k, v, b, lf: lf[..., None, None] * S @ H(k, b) + b[..., None, None] * outer(v, k),
    "no beta on the write": lambda S, k, v, b, lf: torch.exp(lf)[..., None, None] * S @ H(k, b) + outer(v, k),
}


def logit_variant(order="right", gate=lambda j, i: range(j + 1, i + 1), how="add"):
    def f(q, k, w, beta, log_f, i, j):
        idx = range(j + 1, i + 1) if order == "right" else range(i, j, -1)
        P = torch.eye(q.shape[1], dtype=q.dtype)
        for s in idx:
            P = P @ H(w[s], beta[s])
        score, g, scale = k[j] @ P @ q[i], log_f[list(gate(j, i))].sum(), q.shape[1] ** -0.5
        return {"add": scale * score + g, "scaled": scale * (score + g), "exp": torch.exp(scale * score) + g,
                "none": scale * score, "unscaled": score + g}[how]
    return f


LOGIT_WRONG = {
    "reversed order": logit_variant(order="reversed"),
    "own gate included": logit_variant(gate=lambda j, i: range(j, i + 1)),
    "query's gate left out": logit_variant(gate=lambda j, i: range(j + 1, i)),
    "gate times scale": logit_variant(how="scaled"),
    "gate on exp(score) (seed snippet)": logit_variant(how="exp"),
    "no gate (PaTH)": logit_variant(how="none"),
    "no scale": logit_variant(how="unscaled"),
}

GAMMA_WRONG = {
    "own gate included": lambda lf: torch.stack([torch.stack([torch.exp(lf[j : i + 1].sum()) if j <= i
                                                              else lf.new_zeros(()) for j in range(len(lf))])
                                                 for i in range(len(lf))]),
    "unmasked": lambda lf: torch.exp(lf.cumsum(0)[:, None] - lf.cumsum(0)[None, :]),
    "transposed": lambda lf: gamma_ok(lf).T,
    "log space": lambda lf: (lf.cumsum(0)[:, None] - lf.cumsum(0)[None, :]).tril(),
    "zero diagonal": lambda lf: gamma_ok(lf).tril(-1),
}


def gdn_variant(gate_in=True, gate_out=True, strict=True, beta_right=True, rows=True, inverse=True):
    def f(q, k, v, beta, log_f):
        T = q.shape[0]
        Gam, M = gamma_ok(log_f), torch.ones(T, T, dtype=q.dtype).tril()
        inner = (k @ k.T * (Gam if gate_in else M)).tril(-1 if strict else 0)
        inner = torch.diag(beta) @ inner if rows else inner @ torch.diag(beta)
        rhs = beta[:, None] * v if beta_right else v
        U = torch.linalg.solve(torch.eye(T, dtype=q.dtype) + inner, rhs) if inverse else rhs
        return (q @ k.T * (Gam if gate_out else M)) @ U
    return f


def switched_off(variant, flags):
    """The wrong answers of a variant builder: each named option turned off, one at a time."""
    return {name: variant(**{flag: False}) for name, flag in flags.items()}


GDN_WRONG = switched_off(gdn_variant, {
    "no inverse (Mamba2)": "inverse",
    "no Gamma in the inverse": "gate_in",
    "no Gamma on the output": "gate_out",
    "diagonal kept in the inverse": "strict",
    "no final diag(beta)": "beta_right",
    "columns scaled by beta": "rows",
})


def chunk_variant(decay_out=True, decay_state=True, correct_state=True, gate_inside=True, decay_keys=True):
    def f(q, k, v, beta, log_f, S):
        C = q.shape[0]
        b, Gam = log_f.cumsum(0), gamma_ok(log_f)
        after = torch.stack([log_f[j + 1 :].sum() for j in range(C)])
        inner = (k @ k.T * (Gam if gate_inside else 1.0)).tril(-1)
        Tc = torch.linalg.inv(torch.eye(C, dtype=q.dtype) + beta[:, None] * inner)
        U = Tc @ (beta[:, None] * v)
        if correct_state:
            U = U - Tc @ ((beta * b.exp())[:, None] * k) @ S.T
        o = (b.exp()[:, None] if decay_out else 1.0) * (q @ S.T) + (q @ k.T * Gam) @ U
        S_new = (b[-1].exp() if decay_state else 1.0) * S + U.T @ ((after.exp()[:, None] if decay_keys else 1.0) * k)
        return o, S_new
    return f


CHUNK_WRONG = switched_off(chunk_variant, {
    "inter-chunk output undecayed": "decay_out",
    "state undecayed": "decay_state",
    "corrections ignore the state": "correct_state",
    "no Gamma in the factor": "gate_inside",
    "keys undecayed in the state": "decay_keys",
})
CHUNK_WRONG.update({
    "outputs only": lambda q, k, v, beta, log_f, S: chunk_ok(q, k, v, beta, log_f, S)[0],
    "state transposed": lambda q, k, v, beta, log_f, S: (chunk_ok(q, k, v, beta, log_f, S)[0],
                                                         chunk_ok(q, k, v, beta, log_f, S)[1].T),
})

CASES = [
    (ch07.check_gated_delta_step, step_ok, STEP_WRONG),
    (ch07.check_pathfox_logit, logit_ok, LOGIT_WRONG),
    (ch07.check_gamma, gamma_ok, GAMMA_WRONG),
    (ch07.check_gated_deltanet_matrix, gdn_matrix_ok, GDN_WRONG),
    (ch07.check_gated_deltanet_chunk, chunk_ok, CHUNK_WRONG),
]
IDS = [c.__name__ for c, _, _ in CASES]


HINTS = [
    (ch07.check_gated_delta_step, STEP_WRONG, {
        "gate after the write": "after the write", "no delta term": "delta term",
        "error at the undecayed state": "undecayed", "no gate": "DeltaNet", "log_f as the gate": "exp(log_f)",
        "no beta on the write": "without beta"}),
    (ch07.check_pathfox_logit, LOGIT_WRONG, {
        "reversed order": "reverse order", "own gate included": "own gate",
        "query's gate left out": "stops before", "gate times scale": "scale too",
        "gate on exp(score) (seed snippet)": "exponentiated", "no gate (PaTH)": "no gate", "no scale": "scale"}),
    (ch07.check_gamma, GAMMA_WRONG, {
        "own gate included": "own gate", "unmasked": "not masked", "transposed": "transposed",
        "log space": "log gates", "zero diagonal": "diagonal is 0"}),
    (ch07.check_gated_deltanet_matrix, GDN_WRONG, {
        "no inverse (Mamba2)": "delta term", "no Gamma in the inverse": "inverse has no exp(G)",
        "no Gamma on the output": "output weights", "diagonal kept in the inverse": "strictly",
        "no final diag(beta)": "final diag(beta)", "columns scaled by beta": "columns"}),
    (ch07.check_gated_deltanet_chunk, CHUNK_WRONG, {
        "inter-chunk output undecayed": "outputs read the carried state undecayed",
        "state undecayed": "keeps S undecayed", "corrections ignore the state": "ignore the carried state",
        "no Gamma in the factor": "factor has no exp(G)", "keys undecayed in the state": "key j is decayed"}),
]


@pytest.mark.parametrize("check, wrong, expected", HINTS, ids=IDS)
def test_hints_name_the_mistake(check, wrong, expected, capsys):
    for name, phrase in expected.items():
        verdict = check(wrong[name])
        assert not verdict and phrase in verdict.message, (name, verdict.message)


def test_logit_accepts_a_python_float_or_a_one_element_tensor(capsys):
    assert ch07.check_pathfox_logit(logit_ok)  # returns a float
    assert ch07.check_pathfox_logit(lambda *a: torch.tensor([logit_ok(*a)], dtype=torch.float64))
