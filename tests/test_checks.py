"""Value checks that need not make the host wait: ``pathedu.checks.value_checks`` chooses between reading each
call's conditions at once (``"raise"``, the default: a ``ValueError`` at the call), deciding them on the device
and reading them later (``"defer"``: :func:`pathedu.checks.check_deferred`), or not computing them (``"off"``).

With checks deferred or off, no function of the package reads a tensor's values on the host during a forward
(``.item()``, ``.tolist()``, ``.cpu()``, ``float(t)``, ``bool(t)``, ...): counted on the CPU by wrapping those
methods and keeping the calls made from the package's own files, so the same code cannot make a GPU wait."""
from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

import pathedu
import pathedu.kernels
from forms import FORMS, call
from pathedu import checks, fox, path

TRITON_FORMS = [f for f in FORMS if f.kind == "triton"]
_OURS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (pathedu, pathedu.kernels))
_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


@pytest.fixture
def host_reads(monkeypatch):
    """The list of host reads of a tensor's values made from the package's own files while the test runs."""
    seen = []
    for name in _READS:
        real = getattr(torch.Tensor, name)

        def spy(self, *args, _real=real, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(_OURS):
                seen.append(f"{_name} at {os.path.basename(caller)}:{sys._getframe(1).f_lineno}")
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return seen


def _inputs(form, T=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, T, 16, generator=g, dtype=torch.float64) for _ in range(3))
    ex = form.extras(q, k, v, seed)
    return (q.float(), k.float(), v.float()), {n: x.float() for n, x in ex.items()}


def _bad_log_f(T=24):
    return torch.full((1, 2, T), -0.1).index_fill_(-1, torch.tensor([5]), 0.5)


def test_the_default_raises_at_the_call_naming_the_argument():
    assert checks.value_check_mode() == "raise"
    q, k, v = (torch.randn(1, 2, 24, 16) for _ in range(3))
    with pytest.raises(ValueError, match=r"`log_f` must be <= 0 .*found 0.5"):
        fox.fox_matrix(q, k, v, _bad_log_f())
    with pytest.raises(ValueError, match=r"`log_f` must be <= 0 .*found 0.5"):
        fox.fox_triton(q, k, v, _bad_log_f())


@pytest.mark.parametrize("fn", [fox.fox_matrix, fox.fox_triton], ids=lambda f: f.__name__)
def test_off_computes_on_the_values_without_a_word(fn):
    q, k, v = (torch.randn(1, 2, 24, 16) for _ in range(3))
    with checks.value_checks(False) as mode:
        assert mode == "off" and checks.value_check_mode() == "off"
        out = fn(q, k, v, _bad_log_f())
        assert checks.range_condition(torch.tensor([3.0]), "x", 0, 1) is None  # no reduction is built
    assert out.shape == (1, 2, 24, 16)
    assert checks.value_check_mode() == "raise"  # the block's end restores the mode


@pytest.mark.parametrize("fn", [fox.fox_matrix, fox.fox_triton], ids=lambda f: f.__name__)
def test_defer_reports_the_same_error_later(fn):
    q, k, v = (torch.randn(1, 2, 24, 16) for _ in range(3))
    good = torch.full((1, 2, 24), -0.1)
    with checks.value_checks("defer"):
        fn(q, k, v, good)
        checks.check_deferred()  # nothing failed
        fn(q, k, v, _bad_log_f())  # no error here
        fn(q, k, v, good)
        with pytest.raises(ValueError, match=r"`log_f` must be <= 0 .*found 0.5"):
            checks.check_deferred()
        checks.check_deferred()  # read once, then forgotten
    with pytest.raises(ValueError, match=r"`log_f` must be <= 0"):
        with checks.value_checks("defer"):
            fn(q, k, v, _bad_log_f())  # the block's end reads what is pending


def test_defer_keeps_the_first_failure_in_call_order_and_folds_old_flags(monkeypatch):
    x = torch.tensor([0.5, 1.5])
    with checks.value_checks("defer"):
        checks.require(checks.range_condition(x, "a", 0.0, 2.0), checks.range_condition(x, "b", 0.0, 1.0))
        checks.require(checks.finite_condition(torch.tensor([float("nan")]), "c"))
        with pytest.raises(ValueError, match=r"`b` must lie in \[0, 1\]; found 1.5"):
            checks.check_deferred()
        monkeypatch.setattr(checks, "MAX_PENDING", 4)
        checks.require(checks.range_condition(x, "d", 0.0, 1.0))  # the oldest: folded, message dropped
        for _ in range(6):
            checks.require(checks.range_condition(x, "e", 0.0, 2.0))
        assert len(checks._pending) <= 5
        with pytest.raises(ValueError, match="message was dropped"):
            checks.check_deferred()
        for _ in range(6):
            checks.require(checks.range_condition(x, "e", 0.0, 2.0))
        checks.check_deferred()


@pytest.mark.parametrize("values", [[0.0, 0.5, 2.0], [0.0, 2.0001], [-1e-9, 1.0], [1.0, float("nan")],
                                    [float("inf")], [float("-inf"), 1.0]])
def test_the_device_verdict_is_the_host_verdict(values):
    x = torch.tensor(values)
    for c in (checks.range_condition(x, "x", 0.0, 2.0), checks.finite_condition(x, "x"),
              checks.range_condition(x, "x", 0.0, float("inf"), finite=True),
              checks.range_condition(x, "x", 0.0, 1.0, lo_open=True), checks.log_gate_condition(-x, "x"),
              checks.transition_condition(x[None], torch.ones(1))):
        lo, hi = c.stats.tolist()
        assert bool(c.holds_on_device(c.stats)) == c.holds(lo, hi)


def test_modes_are_named_and_per_thread():
    with pytest.raises(ValueError, match="`mode` must be True, False or one of"):
        with checks.value_checks("sometimes"):
            pass
    with pytest.raises(ValueError, match="`mode`"):
        checks.set_value_checks(1)
    previous = checks.set_value_checks("off")
    try:
        assert previous == "raise" and checks.value_check_mode() == "off"
        with checks.value_checks(True):
            assert checks.value_check_mode() == "raise"
            seen = []
            worker = threading.Thread(target=lambda: seen.append(checks.value_check_mode()))
            worker.start()
            worker.join()
            assert seen == ["off"]  # another thread sees the process's mode, not this block's
    finally:
        checks.set_value_checks(previous)
    assert checks.value_check_mode() == "raise"


def test_the_spy_sees_the_reads_of_the_default(host_reads):
    """The counting below can fail: the default mode reads the conditions on the host."""
    form = next(f for f in TRITON_FORMS if f.name == "path_triton")
    (q, k, v), ex = _inputs(form)
    call(form, q, k, v, ex)
    assert any(r.startswith("tolist at checks.py") for r in host_reads), host_reads


@pytest.mark.parametrize("mode", ["off", "defer"])
@pytest.mark.parametrize("form", TRITON_FORMS, ids=lambda f: f.name)
def test_triton_forwards_read_nothing_on_the_host_with_checks_deferred_or_off(form, mode, host_reads):
    (q, k, v), ex = _inputs(form)
    with checks.value_checks(mode):
        out = call(form, q, k, v, ex)
        assert not host_reads, host_reads
        del host_reads[:]
        if mode == "defer":  # every form with a per-token or per-head value argument kept its flags
            assert bool(checks._pending) == bool(ex), (form.name, list(ex))
    assert torch.isfinite(out if isinstance(out, torch.Tensor) else out[0]).all()


@pytest.mark.parametrize("mode", ["off", "defer"])
@pytest.mark.parametrize("name", ["alibi_triton", "fox_triton", "rope_triton", "path_triton", "pathfox_triton",
                                  "householder_triton", "deltanet_triton", "gated_householder_triton",
                                  "gated_deltanet_triton"])
def test_a_training_step_reads_nothing_on_the_host(name, mode, host_reads):
    """Forward and backward of the softmax side's Triton forms and of the delta-rule family's, with every value
    argument requiring grad."""
    form = next(f for f in TRITON_FORMS if f.name == name)
    (q, k, v), ex = _inputs(form)
    leaves = [q, k, v, *ex.values()]
    for x in leaves:
        x.requires_grad_()
    with checks.value_checks(mode):
        out = call(form, q, k, v, ex)
        out.square().sum().backward()
        assert not host_reads, host_reads
        del host_reads[:]
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves)
