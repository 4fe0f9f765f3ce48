"""pathedu.layers: every layer's shapes, gradients, decoding against the full forward (float64), parametrisation,
forms and bad input.  Tiny sizes; the Triton forms of a few layers run in the interpreter."""
import pytest
import torch

from pathedu import layers
from pathedu.alibi import alibi_slopes, retnet_gammas
from pathedu.layers import LAYERS, choose_form

NAMES = list(LAYERS)
D_MODEL, H, DH = 24, 2, 8


def _layer(name, dtype=torch.float32, seed=0, **kw):
    """A layer with every optional piece switched on (short convolutions) and non-trivial gates and table."""
    torch.manual_seed(seed)
    if name not in ("path", "pathfox"):
        kw.setdefault("short_conv", 3)
    layer = LAYERS[name](D_MODEL, H, DH, **kw).to(dtype)
    with torch.no_grad():
        for p in (layer.f, layer.b, layer.f_up):
            if p is not None:
                p.bias.normal_()
        if name == "cope":
            layer.pos_emb.normal_()  # zeros at the start: give the positions something to say
    return layer


def _x(B=2, T=11, dtype=torch.float32, seed=1):
    return torch.randn(B, T, D_MODEL, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_backward(name):
    layer = _layer(name)
    x = _x().requires_grad_()
    y = layer(x)
    assert y.shape == x.shape and y.dtype == torch.float32
    y.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    for pname, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname  # every parameter reaches the output
    assert layer(_x(T=0)).shape == (2, 0, D_MODEL)


@pytest.mark.parametrize("name", NAMES)
def test_decoding_equals_the_full_forward(name):
    """Token by token from the cache (KV cache with PaTH's key updates, or the recurrent state, and the short
    convolutions' windows) equals the parallel form, in float64."""
    layer = _layer(name, torch.float64)
    x = _x(T=13, dtype=torch.float64)
    full = layer(x)
    cache, outs = None, []
    for t in range(x.shape[1]):
        y, cache = layer.step(x[:, t], cache)
        assert y.shape == (2, D_MODEL)
        outs.append(y)
    assert cache.t == x.shape[1]
    dec = torch.stack(outs, dim=1)
    assert (dec - full).abs().max() <= 1e-10 * full.abs().max()
    # a second sequence from a fresh cache gives its own outputs (nothing kept in the layer)
    y0, _ = layer.step(x[:, 0] * 2)
    assert torch.allclose(y0, layer(x[:, :1] * 2)[:, 0], rtol=0, atol=1e-12)


def test_path_decoding_updates_cached_keys_in_place():
    """PaTH's cache holds H_t ... H_{j+1} k_j after token t: the first key, updated twice, is no longer k_0."""
    layer = _layer("path", torch.float64)
    x = _x(T=3, dtype=torch.float64)
    cache = None
    for t in range(3):
        _, cache = layer.step(x[:, t], cache)
    k0 = layer._heads(layer.k(x[:, :1]), 2, 1)[:, :, 0]
    assert cache.kv.len == 3
    assert not torch.allclose(cache.kv.k[:, :, 0], k0)
    extra = layer.extras(x, torch.float64)
    w, beta = extra["w"], extra["beta"]
    want = k0
    for s in (1, 2):  # k^_0 = H_2 H_1 k_0
        ws, bs = w[:, :, s], beta[:, :, s]
        want = want - bs[..., None] * (want * ws).sum(-1, keepdim=True) * ws
    assert torch.allclose(cache.kv.k[:, :, 0], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_forms_agree(name):
    """``form=`` overrides the choice: the chunked (blockwise) and recurrent forms equal the matrix form."""
    ref = _layer(name, torch.float64, form="matrix")
    x = _x(T=9, dtype=torch.float64)
    want = ref(x)
    for form in ("chunked", "recurrent"):
        other = _layer(name, torch.float64, form=form)
        other.load_state_dict(ref.state_dict())
        assert other.select(x) == form
        assert torch.allclose(other(x), want, rtol=0, atol=1e-10), form


@pytest.mark.parametrize("name", ["path", "stickbreaking"])
def test_triton_form_in_the_interpreter(name):
    """The Triton form (here in Triton's interpreter) agrees with the matrix form, and trains."""
    torch.manual_seed(0)
    a = LAYERS[name](32, 2, 16, form="matrix")
    b = LAYERS[name](32, 2, 16, form="triton")
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 16, 32)
    ya, yb = a(x), b(x)
    assert torch.allclose(ya, yb, rtol=0, atol=1e-4)
    yb.square().sum().backward()
    ya.square().sum().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, rtol=0, atol=1e-3 * pa.grad.abs().max()), n


def test_choose_form(monkeypatch):
    assert choose_form("path", device="cpu", T=64) == "matrix"
    assert choose_form("gla", device="cpu", T=64) == "chunked"  # GLA's matrix form holds T x T x D
    assert choose_form("deltanet", device="cpu", T=2048) == "chunked"
    assert choose_form("path", device="cpu", T=2048) == "matrix"  # the softmax side is never chunked by default
    assert choose_form("deltanet", "triton") == "triton" and choose_form("cope", "recurrent") == "recurrent"
    monkeypatch.setattr(layers, "triton_mode", lambda: "gpu")  # as on a GPU
    for delta_rule_trains in (False, True):  # with the delta rule's Triton backward left out of the table, and in it
        monkeypatch.setattr(layers, "TRITON_BACKWARD", layers.TRITON_BACKWARD | {"deltanet", "gated_deltanet"}
                            if delta_rule_trains else layers.TRITON_BACKWARD - {"deltanet", "gated_deltanet"})
        for name in NAMES:
            trains = delta_rule_trains or name not in ("deltanet", "gated_deltanet")
            assert choose_form(name, device="cuda", T=64) == ("triton" if trains else "matrix"), name
            assert choose_form(name, device="cuda", T=64, needs_grad=False) == "triton", name
            assert choose_form(name, device="cuda", T=64, needs_grad=False, triton_without_grad=False) == (
                "triton" if trains else "matrix"), name
            assert choose_form(name, device="cpu", T=64) != "triton"
        assert choose_form("deltanet", device="cuda", T=4096) == ("triton" if delta_rule_trains else "chunked")
    monkeypatch.setattr(layers, "triton_mode", lambda: "interpreter")  # a CUDA device Triton does not compile for
    assert choose_form("path", device="cuda", T=64) == "matrix"
    with pytest.raises(ValueError, match="`form`"):
        choose_form("path", "fast")
    with pytest.raises(ValueError, match="`mixer`"):
        choose_form("mamba")


def test_every_mixer_trains_through_its_triton_form():
    """Every mechanism's Triton form has a backward pass (the contract test checks the forms); DeltaNet's, trained
    through the layer here in the interpreter, gives the matrix form's gradients."""
    assert layers.TRITON_BACKWARD == set(layers.FUNCS) and all(layers.triton_trains(m) for m in layers.FUNCS)
    torch.manual_seed(0)
    a = LAYERS["deltanet"](32, 2, 16, form="matrix")
    b = LAYERS["deltanet"](32, 2, 16, form="triton")
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 16, 32)
    b(x).square().sum().backward()
    a(x).square().sum().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, rtol=0, atol=1e-3 * pa.grad.abs().max()), n
    with pytest.raises(ValueError, match="`mixer`"):
        layers.triton_trains("mamba")


def test_layer_asks_for_the_backward_it_needs(monkeypatch):
    """A layer whose parameters need gradients reports that to the choice; under no_grad it does not."""
    seen = []

    def spy(mixer, form, **kw):
        seen.append(kw["needs_grad"])
        return "matrix"

    layer = _layer("deltanet")
    monkeypatch.setattr(layers, "choose_form", spy)
    layer(_x())
    with torch.no_grad():
        layer(_x())
    layer.requires_grad_(False)
    layer(_x())
    layer(_x().requires_grad_())
    assert seen == [True, False, False, True]


def test_parametrisation():
    """What the papers say: ALiBi's and RetNet's fixed per-head constants, gates from log-sigmoids with biases
    from linspace(2, 6), PaTH's w unit after a short convolution and beta = 2 sigmoid, DeltaNet's beta in (0, 1),
    CoPE's table of zeros shared by the heads."""
    assert torch.equal(LAYERS["alibi"](16, 4).slopes, alibi_slopes(4).float())
    assert torch.equal(LAYERS["retnet"](16, 4).gammas, retnet_gammas(4).float())
    for name in ("fox", "pathfox", "gated_deltanet"):
        assert torch.allclose(LAYERS[name](16, 4).f.bias, torch.linspace(2, 6, 4))
    path = LAYERS["path"](16, 2)
    assert path.w_conv.kernel_size == (3,) and path.beta_max == 2.0 and path.head_dim == 8
    assert (path.w_down.in_features, path.w_down.out_features, path.w.out_features) == (16, 32, 16)  # rank 32
    plain = LAYERS["path"](16, 2, w_conv=0, w_rank=None)
    assert plain.w_conv is None and plain.w_down is None and plain.w.in_features == 16
    assert LAYERS["deltanet"](16, 2).beta_max == 1.0 and LAYERS["deltanet"](16, 2, beta_max=2.0).beta_max == 2.0
    for name in NAMES:  # the delta rule's papers convolve q, k, v over 4 tokens; the others' layers do not
        conv = LAYERS[name](16, 2).qkv_conv
        assert (conv.kernel_size == (4,)) if name in ("deltanet", "gated_deltanet") else conv is None, name
    cope = LAYERS["cope"](16, 2, npos_max=5)
    assert cope.pos_emb.shape == (5, 8) and not cope.pos_emb.any()
    for name in ("path", "pathfox", "deltanet"):
        layer = _layer(name)
        layer.keep_extra = True
        with torch.no_grad():
            layer.b.bias.fill_(30.0)
            layer(_x())
        beta, top = layer.kept["beta"], layer.beta_max
        assert beta.shape == (2, H, 11) and torch.allclose(beta, torch.full_like(beta, top))
        if "w" in layer.kept:
            assert torch.allclose(layer.kept["w"].norm(dim=-1), torch.ones(2, H, 11))
    layer = _layer("gla")
    layer.keep_extra = True
    layer(_x())
    log_f = layer.kept["log_f"]
    assert log_f.shape == (2, H, 11, DH) and (log_f <= 0).all()
    for name in layers.LINEAR_SIDE:
        assert LAYERS[name](16, 2).head_norm is not None
    assert all(LAYERS[n](16, 2).head_norm is None for n in NAMES if n not in layers.LINEAR_SIDE)


def test_stickbreaking_first_token_sees_nothing():
    """Stick-breaking's first token has no key before it: its mixer output is o(0) = 0, so the layer gives 0."""
    layer = _layer("stickbreaking")
    with torch.no_grad():
        y = layer(_x())
    assert torch.equal(y[:, 0], torch.zeros_like(y[:, 0])) and y[:, 1].abs().sum() > 0


def test_stickbreaking_remainder_to_self():
    """``remainder_to_self=True``: the weight nobody took goes to the token's own value, so the first token's output
    is its own value (r_0 = 1); decoding agrees with the full forward, and a Triton form (interpreter) too."""
    layer = _layer("stickbreaking", torch.float64, remainder_to_self=True, short_conv=0)
    x = _x(T=9, dtype=torch.float64)
    full = layer(x)
    v0 = layer._heads(layer.v(x[:, :1]), 2, 1)[:, :, 0]  # (B, H, Dh)
    assert torch.allclose(full[:, 0], layer.o(v0.reshape(2, -1)), rtol=0, atol=1e-12)
    cache, outs = None, []
    for t in range(9):
        y, cache = layer.step(x[:, t], cache)
        outs.append(y)
    assert torch.allclose(torch.stack(outs, 1), full, rtol=0, atol=1e-12)
    plain = _layer("stickbreaking", torch.float64, short_conv=0)
    assert not torch.allclose(plain(x), full)
    torch.manual_seed(0)
    a = LAYERS["stickbreaking"](32, 2, 16, remainder_to_self=True, form="matrix")
    b = LAYERS["stickbreaking"](32, 2, 16, remainder_to_self=True, form="triton")
    b.load_state_dict(a.state_dict())
    x32 = torch.randn(1, 16, 32)
    assert torch.allclose(a(x32), b(x32), rtol=0, atol=1e-4)
    with pytest.raises(TypeError, match="`remainder_to_self`"):
        LAYERS["stickbreaking"](16, 2, remainder_to_self=1)


def test_bad_input():
    layer = _layer("path")
    with pytest.raises(TypeError, match="`x`"):
        layer([[1.0]])
    with pytest.raises(TypeError, match="`x`"):
        layer(torch.zeros(2, 3, D_MODEL, dtype=torch.long))
    with pytest.raises(ValueError, match="`x`"):
        layer(torch.zeros(2, 3, D_MODEL + 1))
    with pytest.raises(ValueError, match="`x`"):
        layer(torch.zeros(3, D_MODEL))
    with pytest.raises(ValueError, match="`x_t`"):
        layer.step(torch.zeros(2, 1, D_MODEL))
    _, cache = layer.step(torch.zeros(2, D_MODEL))
    with pytest.raises(ValueError, match="`cache`"):
        layer.step(torch.zeros(3, D_MODEL), cache)
    with pytest.raises(TypeError, match="`cache`"):
        layer.step(torch.zeros(2, D_MODEL), {})
    with pytest.raises(ValueError, match="`n_heads`"):
        LAYERS["nope"](16, 0)
    with pytest.raises(TypeError, match="`head_dim`"):
        LAYERS["nope"](16, 2, 4.0)
    with pytest.raises(ValueError, match="`d_model`"):
        LAYERS["nope"](15, 2)
    with pytest.raises(ValueError, match="`form`"):
        LAYERS["nope"](16, 2, form="fast")
    with pytest.raises(ValueError, match="`head_dim`"):
        LAYERS["rope"](16, 2, 5)
    with pytest.raises(ValueError, match="`beta_max`"):
        LAYERS["nope"](16, 2, beta_max=1.0)
    with pytest.raises(ValueError, match="`beta_max`"):
        LAYERS["deltanet"](16, 2, beta_max=2.5)
    with pytest.raises(ValueError, match="`w_conv`"):
        LAYERS["rope"](16, 2, w_conv=3)
    with pytest.raises(ValueError, match="`w_rank`"):
        LAYERS["fox"](16, 2, w_rank=4)
    with pytest.raises(ValueError, match="`w_rank`"):
        LAYERS["path"](16, 2, w_rank=0)
    with pytest.raises(ValueError, match="`short_conv`"):
        LAYERS["linear"](16, 2, short_conv=-1)
    with pytest.raises(ValueError, match="`npos_max`"):
        LAYERS["cope"](16, 2, npos_max=0)
