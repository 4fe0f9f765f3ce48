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

The device policy (:mod:`pathedu._device`) runs first: without a CUDA GPU,
Triton's interpreter is switched on before any kernel is defined.
"""
from ._device import configure as _configure

_configure()

from ._device import default_device, triton_mode  # noqa: E402


def _source_checkout_kernels() -> None:
    """Installed, ``kernels/`` is the subpackage ``pathedu.kernels``.  Run from a
    source checkout (``PYTHONPATH=.``, no install), map it by hand the same way."""
    import importlib.util
    import sys
    from pathlib import Path

    if importlib.util.find_spec(__name__ + ".kernels") is not None:
        return
    src = Path(__file__).resolve().parent.parent / "kernels"
    if (src / "__init__.py").is_file():
        spec = importlib.util.spec_from_file_location(
            __name__ + ".kernels", src / "__init__.py", submodule_search_locations=[str(src)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)


_source_checkout_kernels()

__version__ = "0.1.0"

# Every chapter module is an attribute of the package (``pathedu.path.path_matrix``
# works after a plain ``import pathedu``), loaded on first access so that
# ``import pathedu`` itself stays fast (PEP 562).
_LAZY = ("nope", "alibi", "fox", "rope", "path", "pathfox", "cope", "stickbreaking", "checks", "masks", "plotting",
         "constructions", "symbolic", "exercises", "bench", "kernels", "widgets", "course", "tasks", "models", "train",
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


__all__ = ["triton_mode", "default_device", "__version__", *_LAZY]
