"""Where ``python -m pathedu.experiments NAME`` writes: without ``--out``, a new file in the current folder, never
the package's (the book's) ``pathedu/data/exp_NAME.json``; an existing ``--out`` file only with ``--overwrite``.
(tests/test_install.py runs it from an installed copy too.)"""
from __future__ import annotations

import hashlib
import json

import pytest

from pathedu.experiments import default_out, new_out, run_experiment, make_config
from pathedu.experiments.__main__ import main as experiments_main

ARGS = ["flipflop", "--tiny", "--no-progress", "--mixers", "rope", "--steps", "2"]


def _digests():
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in default_out("flipflop").parent.glob("exp_*.json")}


def test_a_run_without_out_writes_a_new_file_here_and_leaves_the_book_data_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = _digests()
    assert default_out("flipflop").name in before  # the book's record is there to be protected
    assert experiments_main(ARGS) == 0
    first = tmp_path / "exp_flipflop.json"
    assert json.loads(first.read_text())["experiment"] == "flipflop"
    assert f"written to {first}" in capsys.readouterr().out
    assert experiments_main(ARGS) == 0  # a second run keeps the first one's file
    second = tmp_path / "exp_flipflop-2.json"
    assert second.is_file() and f"written to {second}" in capsys.readouterr().out
    assert _digests() == before


def test_out_replaces_an_existing_file_only_with_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "mine.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        experiments_main(ARGS + ["--out", str(out)])
    assert exit_.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert out.read_text() == "{}"
    with pytest.raises(SystemExit):
        experiments_main(ARGS + ["--overwrite"])  # --overwrite names no file: refused
    assert experiments_main(ARGS + ["--out", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text())["experiment"] == "flipflop"
    assert list(tmp_path.iterdir()) == [out]


def test_the_python_api_writes_a_new_file_here_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp_flipflop.json").write_text("{}")
    assert new_out("flipflop") == tmp_path / "exp_flipflop-2.json"
    before = _digests()
    config = make_config("flipflop", tiny=True, mixers=["rope"], steps=2)
    record = run_experiment("flipflop", config=config, device="cpu", progress=False)
    assert record["written_to"] == str(tmp_path / "exp_flipflop-2.json")
    assert (tmp_path / "exp_flipflop.json").read_text() == "{}" and _digests() == before
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_experiment("flipflop", config=config, device="cpu", progress=False, out=tmp_path / "exp_flipflop.json",
                       overwrite=False)


def test_timing_writes_one_row_per_shape_and_form_and_never_over_a_file(tmp_path):
    """``python -m pathedu.experiments.timing NAME --forms A B --out FILE``: each shape timed in each form asked, the
    form it ran in recorded beside the one asked, the command in the meta; a second run to the same file refuses."""
    from pathedu.experiments.timing import main as timing_main

    out = tmp_path / "timing.json"
    args = ["mqrar", "--tiny", "--mixers", "linear", "--forms", "chunked", "matrix", "--steps", "1", "--warmup", "0",
            "--device", "cpu", "--out", str(out)]
    timing_main(args)
    data = json.loads(out.read_text())
    assert [(r["mixer"], r["asked"], r["form"]) for r in data["rows"]] == [("linear", "chunked", "chunked"),
                                                                          ("linear", "matrix", "matrix")]
    assert data["meta"]["command"].endswith(" ".join(args)) and data["meta"]["experiment"] == "mqrar"
    assert all(r["step_s"] > 0 for r in data["rows"])
    with pytest.raises(SystemExit):
        timing_main(args)
