"""Without Triton (macOS, Windows: Triton has wheels for Linux only), ``import pathedu`` and every reference form
work, and every Triton form and kernel entry point raises :class:`pathedu.TritonUnavailable`, which says what to
use instead.  Simulated here in a fresh interpreter where ``import triton`` fails (a finder that refuses it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNEL_MODULES = sorted(p.stem for p in (ROOT / "kernels").glob("*.py") if p.stem != "__init__")

PROBE = r"""
import importlib, importlib.abc, json, sys

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "triton" or fullname.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None

sys.meta_path.insert(0, NoTriton())
import torch
import pathedu

sys.path.insert(0, sys.argv[1])  # tests/, for the registry of forms
from forms import FORMS, call

found = {"mode": pathedu.triton_mode(), "device": str(pathedu.default_device()), "reference": {}, "triton": {},
         "kernels": {}}
for form in FORMS:
    q, k, v = (torch.randn(1, 2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
               for s in range(3))
    ex = form.extras(q, k, v, 0)
    if form.kind == "triton":
        q, k, v, ex = q.float(), k.float(), v.float(), {n: x.float() for n, x in ex.items()}
    try:
        out = call(form, q, k, v, ex)
        ok = tuple(out.shape) == (1, 2, 5, 16) and bool(torch.isfinite(out).all())
        result = "ok" if ok else f"wrong output {tuple(out.shape)}"
    except Exception as exc:
        result = f"{type(exc).__name__}: {exc}"
    found["triton" if form.kind == "triton" else "reference"][form.name] = result
for name in sys.argv[2:]:
    try:
        importlib.import_module("pathedu.kernels." + name)
        found["kernels"][name] = "imported"
    except Exception as exc:
        found["kernels"][name] = f"{type(exc).__name__}: {exc}"
try:
    pathedu.kernels
except Exception as exc:
    found["kernels"]["pathedu.kernels"] = f"{type(exc).__name__}: {exc}"
found["triton_imported"] = "triton" in sys.modules
print(json.dumps(found))
"""

@pytest.fixture(scope="module")
def without_triton(tmp_path_factory) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "tests"), *KERNEL_MODULES],
                          cwd=tmp_path_factory.mktemp("no_triton"), env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_pathedu_works_and_says_there_is_no_triton(without_triton):
    assert without_triton["mode"] == "none"
    assert without_triton["device"] == "cpu"
    assert not without_triton["triton_imported"]


def test_every_reference_form_runs(without_triton):
    broken = {name: why for name, why in without_triton["reference"].items()
              if why != "ok"}
    assert not broken, broken
    assert len(without_triton["reference"]) >= 60


def _says_what_to_use(message: str) -> bool:
    return (message.startswith("TritonUnavailable: ") and "Linux only" in message and "Colab" in message
            and "`path_matrix`" in message and "`*_matrix`" in message)


def test_every_triton_form_says_what_to_use_instead(without_triton):
    forms = without_triton["triton"]
    assert len(forms) >= 17
    unclear = {name: why for name, why in forms.items() if not _says_what_to_use(why)}
    assert not unclear, unclear


def test_every_kernel_entry_point_says_what_to_use_instead(without_triton):
    kernels = without_triton["kernels"]
    assert set(kernels) == set(KERNEL_MODULES) | {"pathedu.kernels"}
    unclear = {name: why for name, why in kernels.items() if not _says_what_to_use(why)}
    assert not unclear, unclear


def test_triton_is_a_linux_only_requirement():
    """pip must not try to install Triton where it has no wheel."""
    for path in (ROOT / "pyproject.toml", ROOT / "requirements.txt"):
        lines = [line for line in path.read_text().splitlines() if line.strip().strip('"').startswith("triton")]
        assert lines and all("sys_platform == " in line and "linux" in line for line in lines), (path.name, lines)
