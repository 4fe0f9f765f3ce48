"""Chapter 5 exercise checks: right answers pass, typical wrong answers fail, nothing raises."""
import torch

from pathedu import path
from pathedu.exercises import ch05


# --- right answers, written independently of the checkers' references ---------

def delta_step_ok(S, k, v, beta):
    # S (I - beta k k^T) + beta v k^T: the "gated recurrence" reading of the same step
    D = k.shape[-1]
    gate = torch.eye(D, dtype=S.dtype) - beta[..., None, None] * k[..., :, None] * k[..., None, :]
    return S @ gate + beta[..., None, None] * v[..., :, None] * k[..., None, :]


def H(w, beta, s):
    return torch.eye(w.shape[-1], dtype=w.dtype) - beta[s] * torch.outer(w[s], w[s])


def interval_ok(w, beta, j, i):
    P = torch.eye(w.shape[-1], dtype=w.dtype)
    for s in range(i, j, -1):  # build from the right: P <- H_s P, s = i, i-1, ..., j+1
        P = H(w, beta, s) @ P
    return P


def ut_ok(w, beta):
    # Forward substitution, row by row: (I + N) A = D_beta with N = strictLower(D_beta W W^T)
    L = w.shape[0]
    N = (beta[:, None] * (w @ w.T)).tril(-1)
    A = torch.zeros(L, L, dtype=w.dtype)
    for s in range(L):
        A[s] = torch.diag(beta)[s] - N[s] @ A
    return A


def path_ok(q, k, v, w, beta):
    T, D = q.shape
    out = torch.zeros(T, v.shape[1], dtype=q.dtype)
    for i in range(T):
        logits = []
        for j in range(i + 1):
            logits.append(k[j] @ interval_ok(w, beta, j, i) @ q[i] / D ** 0.5)
        out[i] = torch.softmax(torch.stack(logits), 0) @ v[: i + 1]
    return out


def hh_chunk_pieces(q, k, w, beta):
    # The UT form of the chunk (rows w_0 .. w_{C-1}): H_{C-1} ... H_0 = I - W^T A W, and a
    # contiguous run of rows/columns of A factors the product of that run of transitions.
    _, A = path.ut_transform(w, beta)
    qw = (q @ w.transpose(-1, -2)).tril()  # q_i . w_s for s <= i
    wk = (w @ k.transpose(-1, -2)).tril(-1)  # w_t . k_j for t > j
    q_tilde = q - qw @ A @ w  # H_0 ... H_i q_i
    k_tilde = k - (A @ wk).transpose(-1, -2) @ w  # H_{C-1} ... H_{j+1} k_j
    scores = (q @ k.transpose(-1, -2) - qw @ A @ wk).tril()  # k_j^T H_{j+1} ... H_i q_i, j <= i
    eye = torch.eye(q.shape[-1], dtype=q.dtype)
    P = eye - w.transpose(-1, -2) @ A.transpose(-1, -2) @ w  # H_0 ... H_{C-1}
    return q_tilde, scores, k_tilde, P


def hh_chunk_ok(q, k, v, w, beta, S):
    q_tilde, scores, k_tilde, P = hh_chunk_pieces(q, k, w, beta)
    o = q_tilde @ S.transpose(-1, -2) + scores @ v
    return o, S @ P + v.transpose(-1, -2) @ k_tilde


# --- wrong answers -------------------------------------------------------------

def P(w, beta, idx):
    M = torch.eye(w.shape[-1], dtype=w.dtype)
    for s in idx:
        M = M @ H(w, beta, s)
    return M


def outer(a, b):
    return a[..., :, None] * b[..., None, :]


def error(S, k, v):
    return (S @ k[..., :, None])[..., 0] - v


DELTA_WRONG = {
    "linear attention": lambda S, k, v, b: S + b[..., None, None] * outer(v, k),
    "ascent": lambda S, k, v, b: S + b[..., None, None] * outer(error(S, k, v), k),
    "no beta": lambda S, k, v, b: S - outer(error(S, k, v), k),
    "forgets the old memory": lambda S, k, v, b: b[..., None, None] * outer(v, k),
    "returns the error": lambda S, k, v, b: error(S, k, v),
}

INTERVAL_WRONG = {
    "reversed (seed snippet)": lambda w, b, j, i: P(w, b, range(i, j, -1)),
    "includes H_j": lambda w, b, j, i: P(w, b, range(max(j, 0), i + 1)),
    "stops before H_i": lambda w, b, j, i: P(w, b, range(j + 1, i)),
    "whole sequence": lambda w, b, j, i: P(w, b, range(w.shape[0])),
}

def inv_eye_plus(N):
    return torch.linalg.inv(torch.eye(3, dtype=N.dtype) + N)


UT_WRONG = {
    "upper": lambda w, b: inv_eye_plus((b[:, None] * (w @ w.T)).triu(1)) @ torch.diag(b),
    "no D_beta": lambda w, b: inv_eye_plus((b[:, None] * (w @ w.T)).tril(-1)),
    "columns scaled": lambda w, b: inv_eye_plus((w @ w.T * b[None, :]).tril(-1)) @ torch.diag(b),
    "transposed": lambda w, b: ut_ok(w, b).T,
    "identity plus gram": lambda w, b: torch.eye(3, dtype=w.dtype) + (b[:, None] * (w @ w.T)).tril(-1),
}


def path_variant(idx_fn, scale_fn=lambda D: D ** -0.5):
    def f(q, k, v, w, beta):
        T, D = q.shape
        logits = torch.full((T, T), float("-inf"), dtype=q.dtype)
        for i in range(T):
            for j in range(i + 1):
                logits[i, j] = scale_fn(D) * k[j] @ P(w, beta, idx_fn(j, i)) @ q[i]
        return torch.softmax(logits, -1) @ v
    return f


PATH_WRONG = {
    "reversed order": path_variant(lambda j, i: range(i, j, -1)),
    "includes H_j": path_variant(lambda j, i: range(j, i + 1)),
    "no scale": path_variant(lambda j, i: range(j + 1, i + 1), lambda D: 1.0),
    "no products (plain attention)": path_variant(lambda j, i: range(0)),
    "linear instead of softmax": lambda q, k, v, w, beta: torch.stack([
        sum((k[j] @ P(w, beta, range(j + 1, i + 1)) @ q[i]) * v[j] for j in range(i + 1))
        for i in range(q.shape[0])]),
}



def hh_chunk_variant(carry=True, tilde_k=True, tilde_q=True, read_new=False, reversed_P=False):
    def f(q, k, v, w, beta, S):
        q_tilde, scores, k_tilde, P = hh_chunk_pieces(q, k, w, beta)
        S_new = (S @ (P.transpose(-1, -2) if reversed_P else P) if carry else S) \
            + v.transpose(-1, -2) @ (k_tilde if tilde_k else k)
        o = (q_tilde if tilde_q else q) @ (S_new if read_new else S).transpose(-1, -2) + scores @ v
        return o, S_new
    return f


HH_CHUNK_WRONG = {
    "state not carried through the chunk": hh_chunk_variant(carry=False),
    "raw keys in the state update": hh_chunk_variant(tilde_k=False),
    "updated state for the chunk's outputs": hh_chunk_variant(read_new=True),
    "raw queries in the inter-chunk term": hh_chunk_variant(tilde_q=False),
    "reversed carry product": hh_chunk_variant(reversed_P=True),
    "no prefix at all": lambda q, k, v, w, beta, S: path.householder_recurrent(q, k, v, w, beta, return_state=True),
    "transposed state (D x Dv)": lambda q, k, v, w, beta, S: (hh_chunk_ok(q, k, v, w, beta, S)[0],
                                                              hh_chunk_ok(q, k, v, w, beta, S)[1].transpose(-1, -2)),
    "output only": lambda q, k, v, w, beta, S: hh_chunk_ok(q, k, v, w, beta, S)[0],
}

CASES = [
    (ch05.check_delta_step, delta_step_ok, DELTA_WRONG),
    (ch05.check_interval_product, interval_ok, INTERVAL_WRONG),
    (ch05.check_ut_factor, ut_ok, UT_WRONG),
    (ch05.check_path_attention, path_ok, PATH_WRONG),
    (ch05.check_householder_chunk_step, hh_chunk_ok, HH_CHUNK_WRONG),
]


def test_hints_name_the_mistake(capsys):
    assert "reverse" in ch05.check_interval_product(INTERVAL_WRONG["reversed (seed snippet)"]).message
    assert "H_j" in ch05.check_interval_product(INTERVAL_WRONG["includes H_j"]).message
    assert "linear attention" in ch05.check_delta_step(DELTA_WRONG["linear attention"]).message
    assert "uphill" in ch05.check_delta_step(DELTA_WRONG["ascent"]).message
    assert "D_beta" in ch05.check_ut_factor(UT_WRONG["no D_beta"]).message
    assert "reverse order" in ch05.check_path_attention(PATH_WRONG["reversed order"]).message
    assert "scale" in ch05.check_path_attention(PATH_WRONG["no scale"]).message
    assert "S H_s ... H_e" in ch05.check_householder_chunk_step(
        HH_CHUNK_WRONG["state not carried through the chunk"]).message
    assert "raw keys" in ch05.check_householder_chunk_step(HH_CHUNK_WRONG["raw keys in the state update"]).message
    assert "*after* the chunk" in ch05.check_householder_chunk_step(
        HH_CHUNK_WRONG["updated state for the chunk's outputs"]).message
    assert "raw queries" in ch05.check_householder_chunk_step(
        HH_CHUNK_WRONG["raw queries in the inter-chunk term"]).message
    assert "`S_new` should have shape" in ch05.check_householder_chunk_step(
        HH_CHUNK_WRONG["transposed state (D x Dv)"]).message


def test_householder_chunk_step_library_forms_pass(capsys):
    # the library's chunked form with one chunk, and a plain loop over the tokens: any right answer passes
    assert ch05.check_householder_chunk_step(
        lambda q, k, v, w, b, S: path.householder_chunked(q, k, v, w, b, chunk=q.shape[-2], initial_state=S,
                                                          return_state=True))

    def token_loop(q, k, v, w, beta, S):
        outs = []
        for t in range(q.shape[-2]):
            w_t = w[..., t, :]
            S = S - beta[..., t, None, None] * (S @ w_t[..., :, None]) * w_t[..., None, :]
            S = S + v[..., t, :, None] * k[..., t, None, :]
            outs.append((S @ q[..., t, :, None])[..., 0])
        return torch.stack(outs, -2), S

    assert ch05.check_householder_chunk_step(token_loop)


def test_householder_chunk_step_stub_gets_not_yet(capsys):
    def stub(q_c, k_c, v_c, w_c, beta_c, S):
        raise NotImplementedError("exercise 5")

    verdict = ch05.check_householder_chunk_step(stub)
    assert not verdict
    out = capsys.readouterr().out
    assert out.startswith("Not yet") and "NotImplementedError" in out
