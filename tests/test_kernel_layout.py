"""What keeps the kernel modules navigable, read from their source: PaTH's kernels all named in one docstring, no
private name imported from another module, and every launch with keyword arguments."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pathedu.kernels

KERNELS = Path(pathedu.kernels.__file__).parent
# Every kernel module: each is held to the same layout.
HELD = tuple(sorted(p.stem for p in KERNELS.glob("*.py") if p.stem != "__init__"))


def _tree(name: str) -> ast.Module:
    return ast.parse((KERNELS / f"{name}.py").read_text())


@pytest.mark.parametrize("name", HELD)
def test_no_private_name_is_imported_from_another_module(name):
    private = [(node.module, a.name) for node in ast.walk(_tree(name))
               if isinstance(node, ast.ImportFrom) and node.level >= 1
               for a in node.names if a.name.startswith("_")]
    assert not private, f"{name} imports private names {private}: make them public where they are defined"


@pytest.mark.parametrize("name", HELD)
def test_every_launch_passes_keyword_arguments(name):
    """A launch is ``kernel[grid](...)``: its arguments are named (``**args`` of a dict of names counts)."""
    positional = [node.lineno for node in ast.walk(_tree(name))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and node.args]
    assert not positional, f"{name}: launches with positional arguments at lines {positional}"


def test_every_kernel_of_path_is_named_in_the_map():
    """path_attention's docstring lists every kernel PaTH launches, forward and backward, with its launcher."""
    from pathedu.kernels import flash_attention, gates, path_attention, path_carry, ut_prepare

    doc = path_attention.__doc__
    kernels = ["_path_fwd", "_path_dyadic_fwd", "_path_bwd", "_carry_fwd", "_carry_bwd", "_ut_diag_inverse",
               "_ut_prepare", "_bwd_delta", "_gate_prefix", *(k.fn.__name__ for k in ut_prepare._UT_BWD_KERNELS)]
    for module, name in [(path_attention, "_path_fwd"), (path_carry, "_carry_bwd"), (flash_attention, "_bwd_delta"),
                         (gates, "_gate_prefix"), (ut_prepare, "_ut_prepare")]:
        assert hasattr(module, name)
    missing = [k for k in kernels if f"``{k}``" not in doc and f":func:`{k}`" not in doc]
    assert not missing, missing
    for launcher in ["_path_launch", "_path_train_forward", "_path_bwd_launch", "carry_forward", "carry_backward",
                     "ut_prepare_backward", "invert_diagonal_blocks", "bwd_delta", "cumulative_log_gates"]:
        assert launcher in doc, launcher
