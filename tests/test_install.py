"""pathedu installs as a normal (non-editable) package and its kernels work from the installed copy.

The top-level folder ``kernels/`` of the repository must be installed as the
subpackage ``pathedu.kernels`` and never as a top-level ``kernels`` package
(another project's name on PyPI).  The test installs the repository with pip
into a temporary folder, then imports and runs a kernel from there in a fresh
interpreter whose working directory is elsewhere, so that neither the checkout
nor the editable install of the development environment can be picked up.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Tens of seconds of work: out of the fast loop `-m "not integration"`.
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent

# What pip needs to build the package; build outputs and environments are left out,
# so that the build does not write into the checkout and cannot reuse stale files.
_IGNORE = shutil.ignore_patterns(".git", ".venv", "_build", "build", "dist", "*.egg-info", "__pycache__",
                                 ".pytest_cache", ".jupyter_cache", ".ipynb_checkpoints", "offline", ".whl")

PROBE = r"""
import importlib.util, json, sys
import torch
import pathedu
from pathedu import nope
from pathedu.kernels import flash_attention

torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
out = flash_attention.attention(q, k, v)
ref = nope.nope_matrix(q.double(), k.double(), v.double())
err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
print(json.dumps({
    "pathedu": pathedu.__file__,
    "kernel": flash_attention.__file__,
    "mode": pathedu.triton_mode(),
    "top_level_kernels": importlib.util.find_spec("kernels") is not None,
    "err": err,
    "shape": list(out.shape),
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("install")
    src, target = base / "src", base / "site"
    shutil.copytree(ROOT, src, ignore=_IGNORE)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                           "--no-index", "--quiet", "--target", str(target), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def test_installed_files(installed):
    assert (installed / "pathedu" / "__init__.py").is_file()
    assert (installed / "pathedu" / "kernels" / "flash_attention.py").is_file()
    assert (installed / "pathedu" / "kernels" / "_launch.py").is_file()
    # No top-level package or module named `kernels` (nor anything else but pathedu).
    assert not (installed / "kernels").exists() and not (installed / "kernels.py").exists()
    top = {p.name for p in installed.iterdir() if not p.name.endswith((".dist-info", ".egg-info"))}
    assert top == {"pathedu"}, top
    records = [p for p in installed.glob("pathedu-*.dist-info/RECORD")]
    assert len(records) == 1
    paths = [line.split(",")[0] for line in records[0].read_text().splitlines()]
    assert not any(p.startswith("kernels/") for p in paths)


def test_kernel_runs_from_the_installed_copy(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(installed)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("pathedu", "kernel"):
        path = Path(found[key]).resolve()
        assert path.is_relative_to(installed.resolve()), f"{key} came from {path}"
        assert not path.is_relative_to(ROOT), f"{key} came from the checkout: {path}"
    assert not found["top_level_kernels"], "a top-level `kernels` package is importable"
    assert found["shape"] == [1, 2, 40, 16]
    assert found["err"] <= 2e-3  # the fp32 tolerance of the Triton forms
    import torch

    assert found["mode"] == ("gpu" if torch.cuda.is_available() else "interpreter")


def _installed_env(installed) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(installed)
    return env


def test_course_student_from_the_installed_copy(installed, tmp_path):
    """The labs are not in the package: the command says where they are instead of a traceback, and takes them
    from a clone with --labs."""
    env = _installed_env(installed)
    proc = subprocess.run([sys.executable, "-m", "pathedu.course", "student", "copies"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--labs" in proc.stderr and "notebooks/ folder of pathedu's repository" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "pathedu.course", "student", "copies", "--labs",
                           str(ROOT / "notebooks")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in (tmp_path / "copies").iterdir()) == \
        sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*_lab.ipynb"))


def test_experiment_from_the_installed_copy_leaves_the_package_data_alone(installed, tmp_path):
    """Without --out a run writes a new file in the current folder, never the package's exp_NAME.json."""
    data = installed / "pathedu" / "data" / "exp_flipflop.json"
    before = data.read_bytes()
    (tmp_path / "exp_flipflop.json").write_text("{}")  # an earlier run's file: kept too
    proc = subprocess.run([sys.executable, "-m", "pathedu.experiments", "flipflop", "--tiny", "--no-progress",
                           "--mixers", "rope", "--set", "steps=2"], cwd=tmp_path, env=_installed_env(installed),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert data.read_bytes() == before
    assert (tmp_path / "exp_flipflop.json").read_text() == "{}"
    new = tmp_path / "exp_flipflop-2.json"
    assert new.is_file() and f"written to {new.name}" in proc.stdout.replace(str(tmp_path) + os.sep, "")


def test_the_build_prints_no_deprecation_warning(tmp_path):
    """pyproject.toml as setuptools wants it: the license as an SPDX string, pathedu.data declared with its files."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_IGNORE)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-v", "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    for noise in ("is deprecated", "DeprecationWarning", "absent from the `packages` configuration", "project.license"):
        assert noise not in out, [line for line in out.splitlines() if noise in line][:5]
