"""Figures of the slide decks, drawn from ``pathedu`` at build time (``python book/tools.py slides``).

A slide shows one with ``![alt text](fig:NAME)``; ``FIGURES[NAME](path)`` writes the PNG.
Nothing here is committed as an image.  Each figure also asserts the identity it
illustrates, so a deck cannot show a picture that the library contradicts.
Conventions as in the book: row = query ``i``, column = key ``j``, 0-based
positions, gates in log space, products over ``s = j+1 .. i``.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import torch  # noqa: E402

from pathedu import alibi, fox, path, pathfox, rope  # noqa: E402

DPI = 110


def _save(fig, out) -> None:
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


def _heat(ax, m: torch.Tensor, title: str, *, cmap="viridis", vmin=None, vmax=None, diverging=False) -> None:
    m = m.detach().to(torch.float64)
    finite = torch.where(torch.isfinite(m), m, torch.nan)
    if diverging:
        lim = float(torch.nan_to_num(finite.abs(), nan=0.0).max()) or 1.0
        vmin, vmax, cmap = -lim, lim, "RdBu_r"
    im = ax.imshow(finite.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("key $j$")
    ax.set_ylabel("query $i$")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def ch01_decay(out) -> None:
    """``e^{G_ij} = e^{-d(j, i)}`` for NoPE (every gate 1) and for random gates."""
    T = 24
    g = torch.Generator().manual_seed(0)
    log_f = -0.4 * torch.rand(T, generator=g, dtype=torch.float64)
    nope = fox.log_gate_matrix(torch.zeros(T, dtype=torch.float64)).exp()
    gated = fox.log_gate_matrix(log_f).exp()
    assert torch.equal(nope, torch.ones(T, T, dtype=torch.float64).tril())  # e^{G} = M' for NoPE
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    _heat(axes[0], nope, r"NoPE: $e^{G_{ij}}$ = causal mask $M'$", vmin=0, vmax=1)
    _heat(axes[1], gated, r"random gates: $e^{G_{ij}} = \prod_{s=j+1}^{i} f_s$", vmin=0, vmax=1)
    _save(fig, out)


def ch02_decay(out) -> None:
    """ALiBi's ``e^{G}`` for three slopes; asserted equal to RetNet's decay matrix."""
    T = 32
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.9))
    for ax, slope in zip(axes, (0.5, 0.125, 2.0 ** -5)):
        decay = alibi.alibi_bias(T, slope).exp()
        assert torch.allclose(decay, alibi.retnet_decay(T, math.exp(-slope)), rtol=1e-12, atol=0)
        _heat(ax, decay, rf"$\lambda = {slope:g}$: $\gamma^{{i-j}}$, half-life {math.log(2) / slope:.1f}",
              vmin=0, vmax=1)
    _save(fig, out)


def ch03_gates(out) -> None:
    """The chapter's example: f = 0.98, except token 10 (0.02) and token 17 (0.5)."""
    T = 24
    f = torch.full((T,), 0.98, dtype=torch.float64)
    f[10], f[17] = 0.02, 0.5
    G = fox.log_gate_matrix(f.log())
    assert abs(float(G[12, 5]) - float(f[6:13].log().sum())) < 1e-12  # s = j+1 .. i
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    _heat(axes[0], G.exp(), r"$e^{G_{ij}} = \prod_{s=j+1}^{i} f_s$", vmin=0, vmax=1)
    _heat(axes[1], torch.softmax(G, dim=-1), r"FoX attention with $q = k = 0$: softmax$_j(G_{ij})$",
          vmin=0, vmax=1, cmap="magma")
    _save(fig, out)


def ch04_kernel(out) -> None:
    """RoPE's relative kernel kappa(Delta) and its envelope, for two bases."""
    delta = torch.arange(0, 8193)
    fig, ax = plt.subplots(figsize=(10, 4.0))
    for base, colour in ((1e4, "C0"), (5e5, "C3")):
        kappa = rope.relative_kernel(delta, 128, base=base)
        assert abs(float(kappa[0]) - 1.0) < 1e-12
        ax.plot(delta[1:], kappa[1:], color=colour, lw=0.5, alpha=0.45)
        ax.plot(delta[1:], rope.upper_envelope(kappa)[1:], color=colour, lw=2, label=f"base {base:g}: envelope")
    ax.axhline(1 / math.sqrt(128), color="k", ls=":", lw=1, label=r"$1/\sqrt{D}$")
    ax.set_xscale("log")
    ax.set_xlabel(r"distance $\Delta = t - j$")
    ax.set_ylabel(r"$\kappa(\Delta)$")
    ax.set_title(r"$\kappa(\Delta) = \frac{2}{D}\sum_n \cos(\Omega_n \Delta)$, $D = 128$")
    ax.legend(fontsize=9)
    _save(fig, out)


def ch05_rectangle(out) -> None:
    """Same q and k everywhere: RoPE's logits are constant along diagonals; PaTH's depend
    on the tokens between, and changing token s moves exactly the pairs j < s <= i."""
    T, Dh, s = 20, 8, 9
    g = torch.Generator().manual_seed(1)
    q = torch.randn(Dh, generator=g, dtype=torch.float64).expand(T, Dh)
    k = torch.randn(Dh, generator=g, dtype=torch.float64).expand(T, Dh)
    w = torch.nn.functional.normalize(torch.randn(T, Dh, generator=g, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(T, generator=g, dtype=torch.float64)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    r = rope.rope_logits(q, k, base=10.0).masked_fill(future, float("nan"))
    before = path.path_logits(q, k, w, beta)
    w2, beta2 = w.clone(), beta.clone()
    w2[s] = torch.nn.functional.normalize(torch.randn(Dh, generator=g, dtype=torch.float64), dim=-1)
    beta2[s] = 1.9
    moved = (path.path_logits(q, k, w2, beta2) - before).abs().nan_to_num(nan=0.0) > 1e-12
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    assert torch.equal(moved, (j < s) & (s <= i))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.1))
    _heat(axes[0], r, r"RoPE: $\tau\,k^\top R^{i-j} q$", diverging=True)
    _heat(axes[1], before.masked_fill(future, float("nan")), r"PaTH: $\tau\,k^\top H_{j+1}\cdots H_i\,q$",
          diverging=True)
    _heat(axes[2], moved.to(torch.float64).masked_fill(future, float("nan")),
          rf"PaTH logits that move when token {s} changes", vmin=0, vmax=1, cmap="Greys")
    _save(fig, out)


def _pair_inputs(T=16, Dh=8, seed=2):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(T, Dh, generator=g, dtype=torch.float64) for _ in range(2))
    w = torch.nn.functional.normalize(torch.randn(T, Dh, generator=g, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(T, generator=g, dtype=torch.float64)
    log_f = -0.5 * torch.rand(T, generator=g, dtype=torch.float64)
    return q, k, w, beta, log_f


def ch07_split(out) -> None:
    """PaTH-FoX's linear weight = FoX's factor e^G times PaTH's score."""
    q, k, w, beta, log_f = _pair_inputs()
    tau = q.shape[-1] ** -0.5
    G = fox.log_gate_matrix(log_f)
    score = path.path_logits(q, k, w, beta) / tau
    logits = pathfox.pathfox_logits(q, k, w, beta, log_f)
    low = torch.isfinite(G)
    assert torch.allclose(logits[low], (tau * score + G)[low], rtol=1e-10, atol=1e-10)
    W = torch.where(low, G.exp() * score, torch.nan)
    # the recurrence itself, read with one-hot values (V = I: output i is row i of the weights)
    eye = torch.eye(q.shape[0], dtype=torch.float64)
    assert torch.allclose(pathfox.gated_householder_recurrent(q, k, eye, w, beta, log_f), W.nan_to_num(nan=0.0),
                          rtol=1e-10, atol=1e-10)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.1))
    _heat(axes[0], G.exp(), r"FoX factor $e^{G_{ij}}$", vmin=0, vmax=1)
    _heat(axes[1], torch.where(low, score, torch.nan), r"PaTH score $k_j^\top H_{j+1}\cdots H_i q_i$",
          diverging=True)
    _heat(axes[2], W, r"gated Householder weight $e^{G_{ij}}\,Z_{ij}$", diverging=True)
    _save(fig, out)


def ch08_six(out) -> None:
    """The linear side's weight omega = e^G (l - G) / tau, read off each softmax side's logits."""
    q, k, w, beta, log_f = _pair_inputs()
    T, Dh = q.shape
    tau = Dh ** -0.5
    mask = fox.log_gate_matrix(torch.zeros(T, dtype=torch.float64))  # 0 on and below the diagonal, -inf above
    lam = 0.3
    G_alibi = alibi.alibi_bias(T, lam)
    Gf = fox.log_gate_matrix(log_f)
    dot = tau * q @ k.T
    pairs = [
        ("NoPE / linear attention", dot + mask, mask),
        ("ALiBi / RetNet", dot + G_alibi, G_alibi),
        ("FoX / Mamba2", dot + Gf, Gf),
        ("RoPE / complex recurrence", rope.rope_logits(q, k, base=10.0) + mask, mask),
        ("PaTH / Householder RNN", path.path_logits(q, k, w, beta), mask),
        ("PaTH-FoX / gated Householder", pathfox.pathfox_logits(q, k, w, beta, log_f), Gf),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 6.6))
    for ax, (name, logit, G) in zip(axes.flat, pairs):
        low = torch.isfinite(G)
        assert torch.equal(low, torch.isfinite(logit))  # the same causal mask on both sides
        omega = torch.where(low, G.exp() * (logit - G) / tau, torch.nan)
        _heat(ax, omega, name, diverging=True)
    _save(fig, out)


def ch09_word_problem(out) -> None:
    """A5 at length 20 from the committed GPU records: accuracy against depth, every run a dot; RoPE from the first
    series, PaTH with the fixed backward, FoX and DeltaNet from a third call (as chapter 9's last word-problem
    figure, both seeds where two ran)."""
    from pathedu.experiments import plots

    record = plots.load("word_problem")
    assert record is not None and record["device_type"] == "cuda"  # the committed GPU runs, not a tiny one
    data = Path(plots.__file__).parents[1] / "data"
    fixed = plots.load("word_problem", path=data / "exp_word_problem_path_fixed.json")
    fox_delta = plots.load("word_problem", path=data / "exp_word_problem_fox_deltanet.json")
    four = plots.combine([record, fixed, fox_delta], select=[lambda r: r["mixer"] == "rope", None, None])
    least = {m: e["20"]["min_layers_by_seed"] for m, e in four["summary"]["groups"]["A5"].items()}
    assert least == {"rope": {"0": None, "1": None}, "path": {"0": 3, "1": 4}, "fox": {"0": None},
                     "deltanet": {"0": 3}}  # the slide's bullets
    fig = plt.figure(figsize=(8, 3.6))
    plots.plot_word_problem(four, fig=fig)
    _save(fig, out)


def ch09_min_layers(out) -> None:
    """The fewest layers reaching 90% (all positions) against the word length, A5 and S5, seed 0 (chapter 9's
    Fig. 2 reading): :func:`pathedu.experiments.plots.word_problem_grid`."""
    from pathedu.experiments import plots

    grid = plots.word_problem_grid()
    least = {k: v["seeds"][0] for k, v in plots.min_layers(grid).items()}
    assert [least["A5", m, n] for m in ("path", "rope", "fox", "deltanet") for n in (10, 20)] == \
        [2, 3, 3, None, 3, None, 3, 3]  # the slide's bullets
    assert all(least["S5", m, 10] == 2 for m in ("rope", "fox", "path", "deltanet"))
    fig = plt.figure(figsize=(8, 3.6))
    plots.plot_min_layers(grid, fig=fig)
    _save(fig, out)


def ch09_mqrar(out) -> None:
    """MQRAR-N from the committed GPU record: accuracy against N, every run a dot."""
    from pathedu.experiments import plots

    record = plots.load("mqrar")
    assert record is not None and record["device_type"] == "cuda"
    acc = plots.mqrar_accuracies(record)
    assert min(acc["fox", 1] + acc["pathfox", 1] + acc["pathfox", 2]) > 0.95 and acc["fox", 2][0] > 0.85
    assert max(acc["rope", 1] + acc["rope", 2]) < 0.1 and max(acc["path", 2]) < 0.2 and len(acc["path", 2]) == 3
    assert max(a for (m, n), v in acc.items() if n >= 3 for a in v) < 0.1  # the series before the fix
    fixed = plots.load("mqrar", path=Path(plots.__file__).parents[1] / "data" / "exp_mqrar_fixed.json")
    after = plots.mqrar_accuracies(fixed)
    assert min(after["path", 1] + after["pathfox", 1]) > 0.95 and min(after["path", 2]) > 0.5  # the slide's bullets
    assert min(after["path", 3]) > 0.1 and max(after["path", 4] + after["pathfox", 4]) < 0.1
    fig, ax = plt.subplots(figsize=(6, 3.6))
    plots.plot_mqrar(record, ax=ax, mixers=["rope", "fox"])
    plots.plot_mqrar(fixed, ax=ax, tag=", fixed")
    _save(fig, out)


def ch09_mqrar_conv(out) -> None:
    """MQRAR-N with the short convolution on q, k, v, every mixer (seed 0), from the committed GPU records."""
    from pathedu.experiments import plots

    data = Path(plots.__file__).parents[1] / "data"
    soft = plots.load("mqrar", path=data / "exp_mqrar_softmax_conv.json")
    lin = plots.load("mqrar", path=data / "exp_mqrar_linear_conv.json")
    acc = {**plots.mqrar_accuracies(soft), **plots.mqrar_accuracies(lin)}
    assert round(acc["rope", 3][0], 2) == 0.63 and round(acc["fox", 3][0], 2) == 0.75  # the slide's bullets
    assert round(acc["path", 3][0], 2) == 1.0 and round(acc["deltanet", 3][0], 2) == 0.98
    assert round(acc["path", 4][0], 3) == 0.996 and round(acc["deltanet", 4][0], 2) == 0.41
    assert min(acc[m, n][0] for m in ("rope", "fox", "path", "pathfox", "deltanet", "gated_deltanet")
               for n in (1, 2)) > 0.99
    fig, ax = plt.subplots(figsize=(6, 3.6))
    plots.plot_mqrar(soft, ax=ax)
    plots.plot_mqrar(lin, ax=ax)
    _save(fig, out)



def ch09_mqrar_paper(out) -> None:
    """MQRAR-N at the PaTH paper's settings, three seeds (RoPE, stick-breaking, FoX, PaTH and PaTH-FoX with the
    paper's w), from the committed GPU record."""
    from pathedu.experiments import plots

    record = plots.load("mqrar", path=Path(plots.__file__).parents[1] / "data" / "exp_mqrar_paper.json")
    acc = plots.mqrar_accuracies(record)
    upto = lambda m, ns: [a for n in ns for a in acc[m, n]]
    with_w = upto("path", (1, 2, 3, 4)) + upto("pathfox", (1, 2, 3, 4))
    assert sum(a >= 0.97 for a in with_w) == 23 and round(min(with_w), 2) == 0.69  # the slide's bullets
    assert min(upto("fox", (1,)) + upto("stickbreaking", (1,))) > 0.999
    assert 0.88 < min(upto("fox", (2,))) and max(upto("fox", (2,))) < 0.91 and max(upto("fox", (3, 4))) < 0.02
    assert max(upto("stickbreaking", (2, 3, 4))) < 0.01 and max(upto("rope", (1, 2, 3, 4))) < 0.04
    soft = plots.load("mqrar", path=Path(plots.__file__).parents[1] / "data" / "exp_mqrar_softmax_conv.json")
    rope_conv = [plots.mqrar_accuracies(soft)["rope", n][0] for n in (1, 2, 3, 4)]
    assert [round(a, 3) for a in rope_conv[1:]] == [0.995, 0.629, 0.297] and rope_conv[0] > 0.9995  # the note
    fig, ax = plt.subplots(figsize=(7, 3.2))
    plots.plot_mqrar(record, ax=ax, mixers=["rope", "stickbreaking", "fox", "path", "pathfox"])
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(fig, out)

FIGURES = {f.__name__: f for f in (ch01_decay, ch02_decay, ch03_gates, ch04_kernel, ch05_rectangle,
                                    ch07_split, ch08_six, ch09_word_problem, ch09_min_layers, ch09_mqrar,
                                    ch09_mqrar_conv, ch09_mqrar_paper)}
