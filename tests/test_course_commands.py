"""The course commands as a new user meets them: after ``pip install .`` the labs are not in the package, so
``python -m pathedu.course student`` says where they are and takes ``--labs DIR``; ``grade`` without its
dependencies names the extra that installs them (``pip install "pathedu[course]"``), never a traceback.
(tests/test_install.py runs the same commands from an installed copy.)"""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pathedu import course

ROOT = Path(__file__).resolve().parent.parent


def test_student_without_labs_says_where_they_are(tmp_path, monkeypatch, capsys):
    """As installed: the folder next to the package holds no labs."""
    monkeypatch.setattr(course, "LABS_DIR", tmp_path / "site-packages" / "notebooks")
    with pytest.raises(SystemExit) as exit_:
        course.main(["student", str(tmp_path / "copies")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no lab notebooks" in err and "--labs" in err and "notebooks/ folder of pathedu's repository" in err
    assert not (tmp_path / "copies").exists()
    with pytest.raises(course.LabsNotFound, match="--labs"):
        course.student(tmp_path / "copies")


def test_student_with_labs_dir_copies_every_lab(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(course, "LABS_DIR", tmp_path / "site-packages" / "notebooks")
    assert course.main(["student", str(tmp_path / "copies"), "--labs", str(ROOT / "notebooks")]) == 0
    written = sorted(p.name for p in (tmp_path / "copies").iterdir())
    assert written == [p.name for p in course.labs(ROOT / "notebooks")] and len(written) >= 6
    assert capsys.readouterr().out.count("wrote ") == len(written)
    with pytest.raises(SystemExit):  # the labs' own folder is refused, wherever it is
        course.main(["student", str(ROOT / "notebooks"), "--labs", str(ROOT / "notebooks")])


BLOCK = r"""
import importlib.abc, runpy, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in ("nbclient", "nbformat"):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None

sys.meta_path.insert(0, Block())
sys.argv = ["python -m pathedu.course", *sys.argv[1:]]
runpy.run_module("pathedu.course", run_name="__main__")
"""


def test_grade_without_its_dependencies_names_the_extra(tmp_path):
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", BLOCK, "grade", str(tmp_path / "subs"), "--out",
                           str(tmp_path / "grades.csv")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert 'pip install "pathedu[course]"' in proc.stderr and "nbclient, nbformat" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "grades.csv").exists()


def test_the_course_extra_holds_what_the_commands_import():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {req.split(">")[0].split("=")[0].split("<")[0].strip() for req in extras["course"]}
    assert names == set(course.COURSE_DEPENDENCIES)
