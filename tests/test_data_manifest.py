"""pathedu/data holds what the book, the labs and the package read, each file described in MANIFEST.toml, and the
installed package ships only what its functions and the labs read.

The manifest's entries: ``command``, ``device``, ``date`` (read from the file's own header, so a mistyped or
invented one fails here), ``readers`` (repository paths; a package module may carry its function in brackets) and
``wheel``.  How a reader names a file (literally, through a loader, an f-string) is found by tests/data_readers.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data_readers as dr  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

MANIFEST = dr.DATA / "MANIFEST.toml"
WHEEL_LIMIT = 2 * 1024 * 1024  # bytes


@pytest.fixture(scope="module")
def manifest() -> dict:
    return tomllib.loads(MANIFEST.read_text(encoding="utf8"))


def reader_path(reader: str) -> str:
    """``"pathedu/bench/__init__.py (pathedu.bench.load)"`` -> ``"pathedu/bench/__init__.py"``."""
    return reader.split(" (")[0]


def shipped(entry: dict) -> bool:
    """What the wheel must ship: a file a lab reads, or a package function outside a clone."""
    return any(r.startswith("notebooks/") or (r.startswith("pathedu/") and "in a clone" not in r)
               for r in entry["readers"])


def test_every_data_file_has_an_entry_and_every_entry_a_file(manifest):
    files = set(dr.data_files())
    assert sorted(files - set(manifest)) == [], "data files missing from MANIFEST.toml (README.md: how to add one)"
    assert sorted(set(manifest) - files) == [], "MANIFEST.toml entries whose file is not in pathedu/data"
    others = {p.name for p in dr.DATA.iterdir()} - files - {"MANIFEST.toml", "README.md"}
    assert not others, f"pathedu/data holds only JSON data, the manifest and the README: {sorted(others)}"


def test_every_entry_says_where_its_file_came_from(manifest):
    """Command, device and date are the file's own (``provenance`` reads its header); a file derived from others
    by a package function names them, and they are in the folder."""
    for name, entry in manifest.items():
        assert {"command", "device", "date", "readers", "wheel"} <= set(entry), name
        assert isinstance(entry["wheel"], bool) and entry["readers"], name
        if "derived_from" in entry:
            assert set(entry["derived_from"]) <= set(manifest), name
            continue
        recorded = dr.provenance(json.loads((dr.DATA / name).read_text()))
        assert {k: entry[k] for k in recorded} == recorded, f"{name}: not what its header records"


def test_every_reader_names_its_file(manifest):
    """Each reader in the manifest reads the file: by name, through a loader or an f-string (tests/data_readers.py)."""
    known = dr.package_names()
    wrong = []
    for name, entry in manifest.items():
        for reader in entry["readers"]:
            path = dr.ROOT / reader_path(reader)
            if not path.is_file() or name not in dr.references(dr.reader_text(path), [name],
                                                               known.get(reader_path(reader))):
                wrong.append((name, reader))
    assert wrong == [], "manifest readers that do not read the file"


def test_every_file_is_read_by_the_product(manifest):
    """Nothing in the folder is read only by tests or notes: every file has a reader among the book's pages and
    slides, the labs and the package (found by name, independently of the manifest)."""
    found = dr.readers_by_file(list(manifest))
    assert [n for n, readers in found.items() if not readers] == []


def test_the_wheel_flag_follows_the_readers(manifest):
    """``wheel = true`` exactly for the files a lab or a package function reads; pyproject.toml lists them."""
    wrong = [n for n, e in manifest.items() if e["wheel"] != shipped(e)]
    assert wrong == [], "wheel flags that disagree with the readers (a lab or a package function: true)"
    pyproject = tomllib.loads((dr.ROOT / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["package-data"]["pathedu.data"])
    assert listed == {n for n, e in manifest.items() if e["wheel"]}
    # Otherwise a clone's pathedu.egg-info/SOURCES.txt (an editable install's) adds every file of the folder.
    assert pyproject["tool"]["setuptools"]["include-package-data"] is False


def test_the_grid_the_lab_reads_is_made_from_the_committed_records():
    """exp_word_problem_grid.json (in the wheel) is what make_word_problem_grid computes from the full records."""
    from pathedu.experiments import plots

    assert plots.word_problem_grid() == json.loads(json.dumps(plots.make_word_problem_grid()))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a clean copy of what it is made of (a stale build/ folder would add files)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for part in ("pyproject.toml", "README.md", "pathedu", "kernels"):
        if (dr.ROOT / part).is_dir():
            shutil.copytree(dr.ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(dr.ROOT / part, src / part)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-w", str(base / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = (base / "dist").glob("pathedu-*.whl")
    return built


def test_the_wheel_ships_the_package_data_and_nothing_else(manifest, wheel):
    """At most 2 MB (a few seconds to build), its data exactly the wheel = true files."""
    assert wheel.stat().st_size <= WHEEL_LIMIT, f"{wheel.stat().st_size / 2**20:.2f} MB"
    with zipfile.ZipFile(wheel) as z:
        data = {Path(n).name for n in z.namelist() if n.startswith("pathedu/data/")}
    assert data == {n for n, e in manifest.items() if e["wheel"]}


PROBE = r"""
import json
from pathedu import bench
from pathedu.experiments import EXPERIMENTS, plots
found = {}
for chapter in bench.CHAPTERS:
    for backward in (False, True):
        try:
            found[f"bench_{chapter}{'_fwdbwd' if backward else ''}.json"] = bool(bench.load(chapter, backward=backward)["rows"])
        except FileNotFoundError:
            pass
    try:
        found["gpu_checks.json"] = bool(bench.load_checks(chapter)["records"])
    except FileNotFoundError:
        pass
for name in EXPERIMENTS:
    if plots.load(name) is not None:
        found[f"exp_{name}.json"] = True
grid = plots.word_problem_grid()
found[plots.GRID_FILE] = bool(plots.min_layers(grid))
print(json.dumps({"found": found, "file": bench.__file__}))
"""


def test_the_installed_package_reads_what_it_ships(manifest, wheel, tmp_path):
    """Unpacked as pip installs it, the package's loaders (pathedu.bench.load for every chapter, with and without
    the backward pass; load_checks; plots.load for every experiment; lab 9's plots.word_problem_grid) find every
    shipped file, and nothing else of the folder."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(site))
    assert all(out["found"].values())
    assert set(out["found"]) == {n for n, e in manifest.items() if e["wheel"]}
