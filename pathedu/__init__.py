"""pathedu: forget gates and position encodings as one object.

Each mechanism lives in one module holding every form of both sides of the
duality (naive, recurrent, matrix, blockwise/chunked, Triton):

* :mod:`pathedu.nope`   NoPE softmax attention  <->  vanilla linear attention
* :mod:`pathedu.alibi`  ALiBi                   <->  RetNet (constant decay)
* :mod:`pathedu.fox`    Forgetting Transformer  <->  GLA / Mamba2 (data-dependent decay)
* :mod:`pathedu.rope`   RoPE                    <->  complex-valued recurrence
* :mod:`pathedu.path`   PaTH attention          <->  DeltaNet / Householder RNN
* :mod:`pathedu.pathfox` PaTH-FoX               <->  Gated DeltaNet / gated Householder RNN
* :mod:`pathedu.cope`   CoPE (contextual positions: counts of sigmoid gates; no linear dual)
* :mod:`pathedu.stickbreaking` stick-breaking attention (a query-dependent cumulative forget gate; no linear dual)

:mod:`pathedu.layers` wraps each of them in a ``torch.nn.Module`` (``(B, T, d_model) -> (B, T, d_model)``, with
the papers' parametrisation and token-by-token decoding), e.g. ``pathedu.layers.PaTHAttention(d_model, n_heads)``.

Conventions (every form): ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, per-token arguments ``(..., T)``; gates in
log space; 0-based positions, a token's own gate never acting on itself; bad input refused with a
``TypeError``/``ValueError`` naming the argument; non-finite ``q, k, v`` confined to the outputs that depend
on them (a NaN or inf at position t reaches no output before t): :mod:`pathedu.checks` says how, and which
arguments must be finite.

The device policy (:mod:`pathedu._device`) runs first: without a CUDA GPU,
Triton's interpreter is switched on before any kernel is defined; without Triton
(it has wheels for Linux only) every reference form works and the Triton forms
raise :class:`TritonUnavailable`, which says what to use instead.
"""
from ._device import configure as _configure

_configure()

from ._device import TritonUnavailable, default_device, triton_mode  # noqa: E402


def _source_checkout_kernels() -> None:
    """Installed, ``kernels/`` is the subpackage ``pathedu.kernels``.  Run from a source checkout (``PYTHONPATH=.``,
    no install), map it the same way: a finder that loads ``kernels/`` as ``pathedu.kernels`` when it is first
    imported (not before: without Triton, that import raises :class:`TritonUnavailable`, and ``import pathedu``
    must still work)."""
    import importlib.machinery
    import importlib.util
    import sys
    from pathlib import Path

    if importlib.util.find_spec(__name__ + ".kernels") is not None:
        return
    root = Path(__file__).resolve().parent.parent
    if not (root / "kernels" / "__init__.py").is_file():
        return
    name = __name__ + ".kernels"

    class _KernelsFinder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname != name:
                return None
            return importlib.machinery.PathFinder.find_spec(fullname, [str(root)])

    if not any(type(f).__name__ == "_KernelsFinder" for f in sys.meta_path):
        sys.meta_path.append(_KernelsFinder())


_source_checkout_kernels()

__version__ = "0.1.0"

# Every chapter module is an attribute of the package (``pathedu.path.path_matrix``
# works after a plain ``import pathedu``), loaded on first access so that
# ``import pathedu`` itself stays fast (PEP 562).
_LAZY = ("nope", "alibi", "fox", "rope", "path", "pathfox", "cope", "stickbreaking", "checks", "masks", "plotting",
         "constructions", "symbolic", "exercises", "bench", "kernels", "widgets", "course", "tasks", "layers", "models",
         "train",
         "experiments", "distributed")


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["triton_mode", "default_device", "TritonUnavailable", "__version__", *_LAZY]
