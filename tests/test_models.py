"""pathedu.models: every mixer's model on the PyTorch forms (CPU): shapes, gradients, causality, plumbing."""
import pytest
import torch
import torch.nn.functional as F

from pathedu import layers, models
from pathedu.models import LINEAR_MIXERS, MIXERS, build_model, parameter_count, select_form

SIZES = dict(vocab=11, d_model=32, n_layers=2, n_heads=2)


def _model(mixer, **kw):
    torch.manual_seed(0)
    return build_model(mixer, **{**SIZES, **kw})


@pytest.mark.parametrize("mixer", MIXERS)
def test_forward_backward(mixer):
    model = _model(mixer, out_vocab=7)
    tokens = torch.randint(0, 11, (3, 20), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    assert logits.shape == (3, 20, 7) and logits.dtype == torch.float32
    logits.square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    # the mixer's own projections (q, k, gates, w, beta) all receive signal
    mixer_grads = {n: p.grad.abs().sum().item() for n, p in model.named_parameters() if ".mixer." in n}
    assert all(g > 0 for g in mixer_grads.values()), mixer_grads
    assert model.num_parameters() == parameter_count(mixer, **SIZES, out_vocab=7)


@pytest.mark.parametrize("mixer", MIXERS)
def test_causal(mixer):
    model = _model(mixer).eval()
    g = torch.Generator().manual_seed(2)
    a = torch.randint(0, 11, (2, 24), generator=g)
    b = a.clone()
    b[:, 13] = (a[:, 13] + 1) % 11  # change one future token
    with torch.no_grad():
        la, lb = model(a), model(b)
    assert torch.allclose(la[:, :13], lb[:, :13], rtol=0, atol=1e-6)
    assert not torch.allclose(la[:, 13], lb[:, 13])  # ...which the model does see from position 13 on


@pytest.mark.parametrize("mixer", [m for m in MIXERS if "matrix" in models._FUNCS[m]])
def test_matrix_and_chunked_forms_agree(mixer):
    tokens = torch.randint(0, 11, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = _model(mixer, form="matrix")(tokens)
        b = _model(mixer, form="chunked")(tokens)
    assert torch.allclose(a, b, rtol=0, atol=2e-5)


def _record(monkeypatch, mixer):
    """Make ``mixer``'s matrix form record its arguments in the returned dict."""
    seen = {}
    fn = models._FUNCS[mixer]["matrix"]

    def spy(*args, **kwargs):
        seen["args"] = args
        return fn(*args, **kwargs)

    monkeypatch.setitem(models._FUNCS[mixer], "matrix", spy)
    return seen


def test_forget_gates_start_near_one():
    mix = build_model("fox", **{**SIZES, "n_heads": 4}).blocks[0].mixer
    f = torch.sigmoid(mix.f.bias)  # bias linspace(2, 6) over heads
    assert 0.85 < f.min() < 0.9 and 0.997 < f.max() < 1


@pytest.mark.parametrize("mixer, beta_max, want, beta_arg", [
    ("path", None, 2.0, 4), ("pathfox", None, 2.0, 4), ("deltanet", None, 1.0, 3), ("deltanet", 2.0, 2.0, 3),
    ("gated_deltanet", None, 1.0, 3), ("gated_deltanet", 2.0, 2.0, 3)])
def test_beta_range(monkeypatch, mixer, beta_max, want, beta_arg):
    """beta = beta_max * sigmoid(.): PaTH reaches reflections (beta -> 2), DeltaNet only with beta_max=2."""
    mix = build_model(mixer, **SIZES, beta_max=beta_max).blocks[0].mixer
    assert mix.beta_max == want
    seen = _record(monkeypatch, mixer)
    with torch.no_grad():
        mix.b.bias.fill_(30.0)
        mix(torch.randn(2, 9, 32))
    beta = seen["args"][beta_arg]
    assert beta.shape == (2, 2, 9)
    assert torch.allclose(beta, torch.full_like(beta, want))


def test_path_w_is_unit(monkeypatch):
    mix = _model("path").blocks[0].mixer
    seen = _record(monkeypatch, "path")
    with torch.no_grad():
        mix(torch.randn(2, 7, 32))
    w = seen["args"][3]
    assert w.shape == (2, 2, 7, 16)
    assert torch.allclose(w.norm(dim=-1), torch.ones(2, 2, 7))


def test_select_form():
    assert select_form("path", device="cpu", T=64) == "matrix"
    assert select_form("gla", device="cpu", T=64) == "chunked"
    assert select_form("deltanet", device="cpu", T=2048) == "chunked"
    assert select_form("path", device="cpu", T=2048) == "matrix"  # softmax side: never chunked by default
    assert select_form("rope", "triton") == "triton"
    with pytest.MonkeyPatch.context() as mp:  # a Triton form without a backward pass cannot train a model
        mp.setattr(layers, "TRITON_BACKWARD", layers.TRITON_BACKWARD - {"deltanet"})
        with pytest.raises(ValueError, match="`form`.*backward"):
            select_form("deltanet", "triton")
    assert select_form("deltanet", "triton") == "triton"
    for mixer in ("linear", "retnet", "gla"):  # the linear template's backward: Triton on a GPU, as before on a CPU
        assert select_form(mixer, "triton") == "triton"
        assert select_form(mixer, device="cpu", T=64) == ("chunked" if mixer == "gla" else "matrix")
    with pytest.raises(ValueError, match="`form`"):
        select_form("rope", "fast")


def test_errors():
    with pytest.raises(ValueError, match="`mixer`.*nope, alibi, fox, rope, path, pathfox, stickbreaking, cope, linear"):
        build_model("mamba", **SIZES)
    with pytest.raises(ValueError, match="`d_model`"):
        build_model("rope", vocab=5, d_model=30, n_layers=1, n_heads=4)
    with pytest.raises(ValueError, match="`head_dim`"):
        build_model("rope", vocab=5, d_model=30, n_layers=1, n_heads=2)  # head dim 15: odd
    with pytest.raises(ValueError, match="`beta_max`"):
        build_model("rope", **SIZES, beta_max=2.0)
    with pytest.raises(ValueError, match="`beta_max`"):
        build_model("deltanet", **SIZES, beta_max=3.0)
    with pytest.raises(ValueError, match="`n_layers`"):
        build_model("rope", vocab=5, d_model=32, n_layers=0, n_heads=2)
    model = _model("nope")
    with pytest.raises(ValueError, match="`tokens`"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match="`tokens`"):
        model(torch.zeros(2, 3, 4, dtype=torch.long))


def test_linear_side_normalises():
    assert set(LINEAR_MIXERS) == {m for m in MIXERS if _model(m).blocks[0].mixer.head_norm is not None}


@pytest.mark.parametrize("mixer", ["rope", "path", "stickbreaking", "cope", "linear", "retnet", "gla"])
def test_triton_form_matches_matrix(mixer):
    """The Triton forms (here in the interpreter) plugged in the same way as the matrix forms (GLA's chunked form:
    it has no matrix form in a model), the linear side's included."""
    tokens = torch.randint(0, 11, (1, 16), generator=torch.Generator().manual_seed(4))
    sizes = dict(SIZES, n_layers=1)
    torch.manual_seed(0)
    a = build_model(mixer, **sizes, form="chunked" if mixer == "gla" else "matrix")
    torch.manual_seed(0)
    b = build_model(mixer, **sizes, form="triton")
    la, lb = a(tokens), b(tokens)
    assert torch.allclose(la, lb, rtol=0, atol=1e-4)
    lb.square().mean().backward()  # the kernels' backward passes
    assert all(torch.isfinite(p.grad).all() for p in b.parameters())


def _causal_logits(model, t: int = 13):
    """``(a, logits(a), logits(b))`` for a random sequence ``a`` and ``b``, the same with token ``t`` changed,
    after checking that the logits before ``t`` do not move (no future token reaches them)."""
    a = torch.randint(0, 11, (2, 24), generator=torch.Generator().manual_seed(4))
    b = a.clone()
    b[:, t] = (a[:, t] + 1) % 11
    la, lb = model(a), model(b)
    assert torch.allclose(la[:, :t], lb[:, :t], rtol=0, atol=1e-6)
    return a, la, lb


@pytest.mark.parametrize("mixer", ["path", "pathfox"])
def test_w_short_convolution_is_causal_counted_and_changes_w(mixer):
    """``w_conv=3``: PaTH's short convolution on w's projection.  A future token must not reach earlier
    logits through it (padding on the left only), its weights are counted, and it changes the output."""
    torch.manual_seed(0)
    model = build_model(mixer, **SIZES, out_vocab=7, w_conv=3).eval()
    assert model.num_parameters() == parameter_count(mixer, **SIZES, out_vocab=7, w_conv=3)
    assert model.num_parameters() > parameter_count(mixer, **SIZES, out_vocab=7)
    with torch.no_grad():
        a, _, _ = _causal_logits(model)
        for blk in model.blocks:
            blk.mixer.w_conv.weight.zero_()
            blk.mixer.w_conv.weight[..., -1] = 1.0  # the identity filter: w as without the convolution
        plain = build_model(mixer, **SIZES, out_vocab=7)
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if "w_conv" not in k})
        assert torch.allclose(model(a), plain(a), rtol=0, atol=1e-6)


def test_w_conv_is_refused_where_there_is_no_w():
    with pytest.raises(ValueError, match="`w_conv` only applies"):
        build_model("rope", **SIZES, w_conv=3)
    with pytest.raises(ValueError, match="`w_conv` must be >= 0"):
        build_model("path", **SIZES, w_conv=-1)


@pytest.mark.parametrize("mixer", ["deltanet", "gla", "rope"])
def test_qkv_short_convolution_is_causal_counted_and_silu_of_a_filter(mixer):
    """``short_conv=4``: a causal depthwise convolution and SiLU on q, k, v (any mixer).  A future token must not
    reach earlier logits through it, its weights are counted, and with the identity filter each projection is
    SiLU of itself: the mixer sees exactly ``silu(q), silu(k), silu(v)``."""
    torch.manual_seed(0)
    model = build_model(mixer, **SIZES, out_vocab=7, short_conv=4).eval()
    assert model.num_parameters() == parameter_count(mixer, **SIZES, out_vocab=7, short_conv=4)
    assert model.num_parameters() - parameter_count(mixer, **SIZES, out_vocab=7) == (
        SIZES["n_layers"] * 3 * SIZES["d_model"] * 4)  # 3 HD K per layer (HD = d_model here)
    with torch.no_grad():
        _, la, lb = _causal_logits(model)
        assert not torch.allclose(la[:, 13:], lb[:, 13:], rtol=0, atol=1e-6)
        mixer_mod = model.blocks[0].mixer
        mixer_mod.qkv_conv.weight.zero_()
        mixer_mod.qkv_conv.weight[..., -1] = 1.0  # the identity filter
        x = torch.randn(2, 24, SIZES["d_model"])
        seen = {}
        mixer_mod._core = lambda form, q, k, v, extra: seen.update(q=q, k=k, v=v) or v
        mixer_mod(x)
        heads = {n: mixer_mod._heads(F.silu(getattr(mixer_mod, n)(x)), 2, 24) for n in "qkv"}
        if mixer in models.LINEAR_MIXERS:  # the linear side normalises q and k after the convolution
            heads["q"], heads["k"] = F.normalize(heads["q"], dim=-1), F.normalize(heads["k"], dim=-1)
        for n in "qkv":
            assert torch.allclose(seen[n].float(), heads[n], rtol=0, atol=1e-6), n


def test_short_conv_refuses_a_negative_size():
    with pytest.raises(ValueError, match="`short_conv` must be >= 0"):
        build_model("deltanet", **SIZES, short_conv=-1)


def test_per_token_quantities_reads_what_each_layer_chose():
    model = _model("pathfox")
    tokens = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(5))
    layers = models.per_token_quantities(model, tokens)
    assert len(layers) == SIZES["n_layers"] and model.training  # the mode is put back
    for q in layers:
        assert set(q) == {"beta", "w", "log_f"}
        assert q["beta"].shape == (2, 2, 9) and q["w"].shape == (2, 2, 9, 16) and q["log_f"].shape == (2, 2, 9)
        assert (0 < q["beta"]).all() and (q["beta"] < 2).all() and (q["log_f"] <= 0).all()
        assert torch.allclose(q["w"].norm(dim=-1), torch.ones(2, 2, 9))
    assert models.per_token_quantities(_model("rope"), tokens) == [{}, {}]
    assert all(not blk.mixer.keep_extra and not blk.mixer.kept for blk in model.blocks)
    with pytest.raises(TypeError, match="`model`"):
        models.per_token_quantities(object(), tokens)


def test_mixers_are_the_layer_classes():
    """The registry names layer classes: each block's mixer is an instance of pathedu.layers.LAYERS[name]."""
    from pathedu.layers import LAYERS, TokenMixer

    assert MIXERS == tuple(LAYERS)
    for mixer in MIXERS:
        mod = _model(mixer).blocks[0].mixer
        assert type(mod) is LAYERS[mixer] and isinstance(mod, TokenMixer) and mod.mixer == mixer
    assert {"stickbreaking", "cope"} <= set(models.SOFTMAX_MIXERS)


def test_stickbreaking_and_cope_mixers():
    """Stick-breaking adds no parameter to q, k, v, o; CoPE adds its table (npos_max x head_dim, zeros at the
    start, shared by the heads), counted; npos_max is CoPE's only."""
    plain = parameter_count("nope", **SIZES)
    assert _model("stickbreaking").num_parameters() == parameter_count("stickbreaking", **SIZES) == plain
    model = _model("cope", npos_max=10)
    assert model.num_parameters() == parameter_count("cope", **SIZES, npos_max=10) == plain + 2 * 10 * 16
    assert model.config["npos_max"] == 10 and "npos_max" not in _model("rope").config
    table = model.blocks[0].mixer.pos_emb
    assert table.shape == (10, 16) and not table.any()
    assert parameter_count("cope", **SIZES) == plain + 2 * 64 * 16  # npos_max = 64 by default
    with pytest.raises(ValueError, match="`npos_max`"):
        build_model("rope", **SIZES, npos_max=10)
    with pytest.raises(ValueError, match="`npos_max`"):
        build_model("cope", **SIZES, npos_max=0)
    for mixer in ("stickbreaking", "cope"):
        assert select_form(mixer, device="cpu", T=64) == "matrix" and select_form(mixer, "triton") == "triton"


@pytest.mark.parametrize("mixer", ["path", "pathfox"])
def test_w_rank_makes_w_low_rank_and_is_counted(mixer):
    """``w_rank=r``: w's projection d -> r -> HD (the PaTH paper's is of rank 32), counted, PaTH's only."""
    model = _model(mixer, w_rank=4, w_conv=3)
    mix = model.blocks[0].mixer
    assert (mix.w_down.weight.shape, mix.w.weight.shape) == ((4, 32), (32, 4))
    assert model.num_parameters() == parameter_count(mixer, **SIZES, w_rank=4, w_conv=3)
    assert model.config["w_rank"] == 4 and "w_rank" not in _model(mixer).config
    model(torch.randint(0, 11, (2, 9))).sum().backward()
    assert mix.w_down.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="`w_rank`"):
        build_model("rope", **SIZES, w_rank=4)
