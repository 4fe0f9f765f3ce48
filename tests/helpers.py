"""Test utilities shared by every chapter's tests (one home, imported as `helpers`)."""
from __future__ import annotations

import contextlib
import functools
import math
import random

import torch

# Tolerances of the book's conventions: reference forms in float64 against a
# float64 reference; Triton forms in fp32 (interpreter: exact fp32 dots) and fp16.
TOL_F64 = 1e-8
TOL_TRITON = {torch.float32: 2e-3, torch.float16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error relative to the reference's scale (max |ref|), in float64."""
    if ref.numel() == 0:
        return 0.0
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "output has NaN or inf"
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def rand_qkv(lead, T, D, Dv=None, *, dtype=torch.float64, seed=0, device="cpu"):
    """Random ``q, k: (*lead, T, D)`` and ``v: (*lead, T, Dv)``."""
    g = torch.Generator().manual_seed(seed)
    Dv = D if Dv is None else Dv
    q = torch.randn(*lead, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(*lead, T, D, generator=g, dtype=torch.float64)
    v = torch.randn(*lead, T, Dv, generator=g, dtype=torch.float64)
    return tuple(x.to(dtype=dtype, device=device) for x in (q, k, v))


def _as(x: torch.Tensor, real: torch.dtype, cplx: torch.dtype) -> torch.Tensor:
    return x.to(cplx if x.is_complex() else real)


def gradient_errors(fn, ref, args: dict, *, initial_state=None, seed=0, **kw) -> dict:
    """A Triton form against float64 autograd, every gradient at once.

    ``ref`` runs on float64 leaves of ``args`` (name -> float64 tensor, passed positionally in order), ``fn`` on fp32
    copies of the same numbers, both with ``kw``; with ``initial_state`` (complex: complex128 / complex64) both also
    get it and ``return_state=True``.  The loss is ``<G, out> + Re <G_S, S>`` with the same random ``G`` (and ``G_S``
    for the final state ``S``) for both.  Returns ``{name: max |grad - ref| / max |ref|}`` for every argument (and
    ``"initial_state"``), and ``"out"`` / ``"state"`` for the values; asserts every gradient finite."""
    names = list(args) + ([] if initial_state is None else ["initial_state"])
    values = list(args.values()) + ([] if initial_state is None else [initial_state])
    gen = torch.Generator().manual_seed(seed)
    runs = {}
    cot = None
    for which, f, real, cplx in (("ref", ref, torch.float64, torch.complex128), ("fn", fn, torch.float32, torch.complex64)):
        leaves = [_as(x, real, cplx).detach().clone().requires_grad_() for x in values]
        if initial_state is None:
            out, state = f(*leaves, **kw), None
        else:
            out, state = f(*leaves[:-1], initial_state=leaves[-1], return_state=True, **kw)
        if cot is None:
            cot = [torch.randn(out.shape, generator=gen, dtype=torch.float64)]
            if state is not None:
                cot.append(torch.randn(state.shape, generator=gen, dtype=torch.float64) if not state.is_complex()
                           else torch.complex(*(torch.randn(state.shape, generator=gen, dtype=torch.float64)
                                                for _ in range(2))))
        loss = (out.double() * cot[0]).sum()
        if state is not None:
            loss = loss + (_as(state, torch.float64, torch.complex128) * cot[1].conj()).real.sum()
        grads = torch.autograd.grad(loss, leaves)
        runs[which] = (out.detach(), None if state is None else state.detach(), grads)
    errs = {}
    pairs = list(zip(names, runs["fn"][2], runs["ref"][2])) + [("out", runs["fn"][0], runs["ref"][0])]
    if initial_state is not None:
        pairs.append(("state", runs["fn"][1], runs["ref"][1]))
    for name, a, b in pairs:
        assert torch.isfinite(torch.view_as_real(a) if a.is_complex() else a).all(), f"{name}: not finite"
        a = _as(a, torch.float64, torch.complex128)
        errs[name] = ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()
    return errs


def run_in_pieces(kernel, decoder, q, k, v, extras_at, cuts, *, kernel_steps: int = 2):
    """A sequence run as a server runs it: prefill by ``kernel`` in pieces ``[0, cuts[0]), [cuts[0], cuts[1]), ...``,
    each starting from the state the last one returned, then decoding one token at a time from the last cut to the
    end: the first ``kernel_steps`` tokens by ``kernel`` itself (``T = 1``), the rest by ``decoder`` (a recurrent
    form).  ``extras_at(s, e)``: the extra positional arguments for tokens ``[s, e)``.  Returns the outputs
    concatenated and the final state."""
    T = q.shape[-2]
    bounds = [0, *cuts] + list(range(cuts[-1] + 1, T + 1))
    outs, state = [], None
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        f = kernel if n < len(cuts) + kernel_steps else decoder
        out, state = f(q[..., s:e, :], k[..., s:e, :], v[..., s:e, :], *extras_at(s, e), initial_state=state,
                       return_state=True)
        outs.append(out)
    return torch.cat(outs, -2), state


N_FIXED = 4  # random_shapes(...)[:N_FIXED]: the fixed cases, without the random ones (for the costly Triton tests)


def prepared_errors(fast, exact, q, k, T: int, block: int) -> dict:
    """How far a preparation pass (:class:`pathedu.kernels.ut_prepare.Prepared`) is from a more exact one made from the
    same ``q, k: (1, T, D)``: ``qt``, ``kt`` the worst row's distance relative to the row; ``ad`` the worst in-block
    score's distance relative to ``|q_i| |k_j|`` (``ad_above``: whether every entry above the diagonal is 0);
    ``g`` the relative error of every block's transition; ``qn`` the worst norm's relative distance (forward passes)."""
    def rows(name):
        a, b = (getattr(p, name)[0, :T].double() for p in (fast, exact))
        return ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-300)).max().item()

    qn, kn = (x[0].double().norm(dim=-1) for x in (q, k))
    i = torch.arange(T, device=q.device)
    cols = (i[:, None] // block) * block + torch.arange(block, device=q.device)[None, :]  # key of column c in row i
    seen = cols <= i[:, None]
    d_ad = (fast.ad[0, :T].double() - exact.ad[0, :T].double()).abs() / (qn[:, None] * kn[cols.clamp(max=T - 1)])
    out = dict(qt=rows("qt"), kt=rows("kt"), ad=d_ad[seen].max().item(), ad_above=bool((fast.ad[0, :T][~seen] == 0).all()),
               g=rel_err(fast.g, exact.g))
    if fast.qn is not fast.ad:  # made with norm_q
        out["qn"] = (fast.qn[0, :T].double() / exact.qn[0, :T].double() - 1).abs().max().item()
    return out


def ut_backward_case(T: int, D: int, block: int, *, seed: int, device, qk_dtype):
    """The UT backward's inputs with every block at its own magnitude: ``q``, ``k`` (``(1, T, D)``, bf16 values in
    ``qk_dtype``) from 1e-12 to 1e12 a block, ``dq~, dk~, dÃ, dG`` (fp32, in :class:`Prepared`'s layouts) from 1e-20
    to 1e20 a block, rows within a block spread over two decades, zero past ``T``; unit ``w``, ``beta`` in [0, 2).
    Returns ``q, k, w, beta, prep, grads``: ``prep`` made in exact fp32 ("ieee", "x3" on a GPU) with its inverse."""
    from pathedu.kernels.ut_prepare import Prepared

    g = torch.Generator(device=device).manual_seed(seed)
    nb = -(-T // block)

    def per_block(lo, hi, rows):  # a magnitude per block, spread over its rows
        mag = 10.0 ** torch.randint(lo, hi + 1, (nb + 2,), generator=g, device=device).float()
        return mag.repeat_interleave(block)[:rows] * 10.0 ** (2 * torch.rand(rows, generator=g, device=device) - 1)

    q, k = ((torch.randn(1, T, D, generator=g, device=device) * per_block(-12, 12, T)[None, :, None])
            .bfloat16().to(qk_dtype) for _ in range(2))
    w = torch.nn.functional.normalize(torch.randn(1, T, D, generator=g, device=device), dim=-1)
    beta = 2 * torch.rand(1, T, generator=g, device=device)
    f32 = dict(q_dtype=torch.float32, k_dtype=torch.float32, update_dtype=torch.float32)
    prep = Prepared(q.float(), k.float(), w, beta, T, block, keep_inverse=True,
                    precision="ieee" if device == "cpu" else "x3", **f32)
    Tp = prep.T_pad
    grads = [torch.randn(1, Tp, D, generator=g, device=device) * per_block(-20, 20, Tp)[None, :, None]
             for _ in range(2)]
    grads.append(torch.randn(1, Tp, block, generator=g, device=device) * per_block(-20, 20, Tp)[None, :, None])
    grads.append(torch.randn(1, Tp // block, D, D, generator=g, device=device)
                 * per_block(-20, 20, Tp)[::block][None, :, None, None])
    for x in grads[:3]:
        x[:, T:] = 0
    return q, k, w, beta, prep, grads


def ut_backward_in(precision: str, q, k, w, beta, prep, grads) -> tuple:
    """``ut_prepare_backward`` of ``prep`` as if the pass had been made in ``precision`` (the backward reads its
    products' precision from the pass: ``"tf32"`` for the GPU's fast path, ``"x3"`` or ``"ieee"`` for a reference)."""
    from pathedu.kernels.ut_prepare import ut_prepare_backward

    prep._flags["PRECISION"] = precision
    return ut_prepare_backward(q, k, w, beta, prep, *grads)


def blockwise_errors(outs, refs, T: int, block: int, names=("dq", "dk", "dw", "dbeta")) -> dict:
    """The worst block's distance of each output (``(1, T, ...)``) from its reference, relative to that block of the
    reference: the error measure for tensors whose blocks differ in size by many decades.  A block whose distance is
    not a number (a NaN or inf on either side) counts as infinitely far."""
    worst = {}
    for name, a, b in zip(names, outs, refs):
        for s in range(0, T, block):
            x, y = a[0, s:s + block].double(), b[0, s:s + block].double()
            d = 0.0 if torch.equal(x, y) else ((x - y).norm() / y.norm()).item()
            worst[name] = max(worst.get(name, 0.0), d if math.isfinite(d) else math.inf)
    return worst


def random_shapes(n: int, *, seed: int, max_T: int = 80, dims=(16, 32), extra=()):
    """Randomized (lead, T, D, Dv) cases, always including T = 1, a T that is no
    multiple of any block size, several leading dims and Dv != D: the first
    ``N_FIXED`` cases are those fixed ones, then ``extra``, then ``n`` random ones."""
    rng = random.Random(seed)
    cases = [((2, 3), 1, dims[0], dims[0]), ((1, 2), 37, dims[0], dims[-1] + 8), ((), 65, dims[-1], dims[0]),
             ((2, 1, 2), 19, dims[0], dims[0])] + list(extra)
    for _ in range(n):
        lead = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 3)))
        cases.append((lead, rng.randint(1, max_T), rng.choice(dims), rng.choice(dims + (24,))))
    return cases


def case_id(case) -> str:
    lead, T, D, Dv = case[:4]
    return f"lead{'x'.join(map(str, lead)) or '-'}_T{T}_D{D}_Dv{Dv}"


# ---------------------------------------------------------------------------
# Float64 references of the Householder products (chapters 5 and 7), written independently of the modules
# ---------------------------------------------------------------------------

def H(w_s, b_s):
    """``I - b w w^T`` for one token: ``w_s: (..., D)``, ``b_s: (...)``."""
    return torch.eye(w_s.shape[-1], dtype=w_s.dtype) - b_s[..., None, None] * torch.einsum("...a,...b->...ab", w_s, w_s)


def direct_product(w, beta, indices):
    """``H_{s_0} H_{s_1} ...`` for the listed indices, left to right, by explicit matrix products."""
    eye = torch.eye(w.shape[-1], dtype=w.dtype).expand(w.shape[:-2] + (w.shape[-1],) * 2)
    return functools.reduce(torch.matmul, [H(w[..., s, :], beta[..., s]) for s in indices], eye)


def definition_scores(q, k, w, beta):
    """``k_j^T H_{j+1} ... H_i q_i`` for j <= i (0 above), one explicit product per pair: small T only."""
    q, k, w, beta = (x.double() for x in (q, k, w, beta))
    T = q.shape[-2]
    out = torch.zeros(q.shape[:-2] + (T, T), dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            P = direct_product(w, beta, range(j + 1, i + 1))
            out[..., i, j] = torch.einsum("...a,...ab,...b->...", k[..., j, :], P, q[..., i, :])
    return out


def rnn_scores(q, k, w, beta):
    """The same scores from the recurrence ``S_t = S_{t-1} H_t + e_t k_t^T`` with one-hot values:
    row j of ``S_t`` is ``k_j^T H_{j+1} ... H_t``, so ``(S_t q_t)_j`` is the score of (t, j)."""
    q, k, w, beta = (x.double() for x in (q, k, w, beta))
    T = q.shape[-2]
    R = torch.zeros(q.shape[:-2] + (T, q.shape[-1]), dtype=torch.float64)
    out = torch.zeros(q.shape[:-2] + (T, T), dtype=torch.float64)
    for t in range(T):
        w_t = w[..., t, :]
        R = R - beta[..., t, None, None] * (R @ w_t[..., :, None]) * w_t[..., None, :]
        R[..., t, :] = k[..., t, :]
        out[..., t, :] = (R @ q[..., t, :, None])[..., 0]
    return out


# Headless Chromium for the tests that look at built pages (the book, the slide decks).  Debian's package
# (`apt-get install -y chromium`, done by .ci/setup); background networking off: this machine has no network.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    """The Chromium binary; fails (never skips) with the install command when there is none."""
    import shutil
    from pathlib import Path

    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    raise AssertionError("headless Chromium is needed to look at built pages: `apt-get install -y chromium` "
                         "(Debian; .ci/setup does it)")


@contextlib.contextmanager
def browser_page(width: int = 1280, height: int = 900):
    """A Playwright page in headless Chromium with a ``width`` x ``height`` window."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def load_book_tools():
    """``book/tools.py`` (not a package module) loaded as a module, for the book and slide tests."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("book_tools", Path(__file__).resolve().parent.parent / "book" / "tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exercise_modules() -> dict:
    """Every chapter's check module, ``{"ch01": pathedu.exercises.ch01, ...}``, found on disk (a new chapter's
    module is picked up without editing the tests)."""
    import importlib
    import pkgutil
    import re

    import pathedu.exercises as exercises

    names = sorted(m.name for m in pkgutil.iter_modules(exercises.__path__) if re.fullmatch(r"ch\d\d", m.name))
    return {name: importlib.import_module(f"pathedu.exercises.{name}") for name in names}
