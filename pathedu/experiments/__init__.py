r"""The PaTH paper's synthetic experiments, reproduced at small scale with the book's mechanisms.

``python -m pathedu.experiments NAME [--mixers ...] [--steps N] [--seeds ...] [--device DEV] [--out FILE] [--tiny]``
runs experiment ``NAME`` (:data:`EXPERIMENTS`: ``flipflop``, ``word_problem``, ``mqrar``) and writes its record to
a new file in the current folder, ``exp_NAME.json`` (``exp_NAME-2.json``, ``-3``, ... when that exists: a run never
replaces a file it was not told to), and prints where.  ``--out FILE`` writes ``FILE`` instead; an existing
``FILE`` is replaced only with ``--overwrite``.  The records the book reads are the package's
``pathedu/data/exp_NAME.json`` (:func:`default_out`); refreshing one is
``--out pathedu/data/exp_NAME.json --overwrite`` from a clone.  The record::

    {"experiment", "command", "commit", "dirty", "device", "versions": {python, torch, triton, pathedu},
     "config": {...every setting...}, "wall_time_s",
     "runs": [{"seed", "mixer", ...setting..., "n_params", "final": {...}, "history": {...}}, ...],
     "summary": {...}}

``runs`` holds every run, in the order they ran: nothing is filtered or picked.  ``--tiny``
shrinks every size so that the experiment runs on a CPU in seconds (for tests and the lab);
its numbers mean nothing.

Each experiment module has ``DEFAULTS`` (the paper's setting, sized to about 15 minutes on one
H100), ``TINY`` (overrides for ``--tiny``), ``run(config, *, device, progress) -> (runs, summary)`` and
``summarize(runs, config)``.

A series too long for one sitting (the GPU machine takes commands of at most 10 minutes) is run in parts, a
few seeds or mixers each, and merged: ``python -m pathedu.experiments.merge OUT PART.json ...``
(:func:`merge_records`) keeps every run of every part and each part's command, commit and device.
``--jobs K`` trains the runs in ``K`` processes at once on one device (:mod:`pathedu.experiments.parallel`).
"""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import torch

from .._provenance import git_commit

__all__ = ["EXPERIMENTS", "get_module", "make_config", "run_experiment", "merge_records", "metadata", "git_commit",
           "default_out", "new_out", "write_record"]

EXPERIMENTS = ("flipflop", "word_problem", "mqrar")
_ROOT = Path(__file__).resolve().parent.parent  # the pathedu package


def get_module(name: str):
    """The module of experiment ``name``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"`name` must be one of {', '.join(EXPERIMENTS)}; got {name!r}")
    import importlib

    return importlib.import_module(f"{__name__}.{name}")


def default_out(name: str) -> Path:
    """``pathedu/data/exp_NAME.json``: the package's record of experiment ``name``, the one the book reads.  Runs
    write there only when told to (:func:`write_record`)."""
    return _ROOT / "data" / f"exp_{name}.json"


def new_out(name: str, folder=None) -> Path:
    """Where a run writes when not told where: ``exp_NAME.json`` in ``folder`` (default: the current folder), or
    ``exp_NAME-2.json``, ``exp_NAME-3.json``, ... the first that does not exist."""
    folder = Path.cwd() if folder is None else Path(folder)
    path, n = folder / f"exp_{name}.json", 1
    while path.exists():
        n += 1
        path = folder / f"exp_{name}-{n}.json"
    return path


def metadata(device: torch.device) -> dict:
    """Command, commit, device name and versions."""
    import pathedu

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = None
    commit, dirty = git_commit()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {
        "command": " ".join(sys.argv),
        "commit": commit, "dirty": dirty, "device": name, "device_type": device.type,
        "triton_mode": pathedu.triton_mode(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": triton_version,
                     "pathedu": pathedu.__version__},
    }


def make_config(name: str, *, tiny: bool = False, **overrides) -> dict:
    """The experiment's defaults, then its ``TINY`` overrides (``tiny=True``), then ``overrides``
    (keys must exist in the defaults; ``None`` values are ignored)."""
    mod = get_module(name)
    config = json.loads(json.dumps(mod.DEFAULTS))  # a deep copy, JSON-clean
    if tiny:
        config.update(json.loads(json.dumps(mod.TINY)))
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in config:
            raise ValueError(f"unknown setting {key!r} for experiment {name!r}; known: {', '.join(config)}")
        config[key] = value
    config["tiny"] = tiny
    return config


def run_experiment(name: str, *, config: dict | None = None, device=None, out=None, progress: bool = True,
                   command: str | None = None, overwrite: bool = True) -> dict:
    """Run experiment ``name`` with ``config`` (default :func:`make_config` ``(name)``) on ``device``
    (default: CUDA when available, else CPU); write the JSON as :func:`write_record` does (``out=None``: a new
    file in the current folder; ``out=False``: write nothing) and return the record."""
    mod = get_module(name)
    config = make_config(name) if config is None else config
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    record = {"experiment": name, **metadata(device)}
    if command is not None:
        record["command"] = command
    record["config"] = config
    start = time.perf_counter()
    runs, summary = mod.run(config, device=device, progress=progress)
    record["wall_time_s"] = time.perf_counter() - start
    record["runs"] = runs
    record["summary"] = summary
    return write_record(record, out, overwrite=overwrite)


def check_out(out, overwrite: bool) -> None:
    """Refuse ``out`` (a path, or None / False: nothing to check) when it exists and ``overwrite`` is false, before
    any training: ``FileExistsError`` naming ``--overwrite``."""
    if out not in (None, False) and Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass --overwrite (overwrite=True) to replace it, or another --out "
                              "(without --out a run writes a new file in the current folder)")


def write_record(record: dict, out=None, *, overwrite: bool = True) -> dict:
    """Write ``record`` as JSON and return it, with ``"written_to"`` set (the absolute path) when written.

    ``out=None``: a new file in the current folder (:func:`new_out`), never an existing one; ``out=False``:
    nothing; a path: that file, which may already exist only with ``overwrite`` (the default here, since the
    caller named it; the command line's ``--out`` passes ``overwrite=False`` unless given ``--overwrite``)."""
    if out is not False:
        check_out(out, overwrite)
        path = Path(out) if out is not None else new_out(record["experiment"])
        path = path.resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n")
        record["written_to"] = str(path)
    return record


# Settings that map a mixer to a value (e.g. {"deltanet": 2.0}): two parts agree on one if they agree for the
# mixers they both ran; a mixer that a part did not run is not compared.
PER_MIXER = ("beta_max", "short_conv")

# Constraints on how long a run may train: parts may differ in one where it stopped none of their runs early
# (every run did all its steps), since then it changed no result; the merged record keeps the largest value.
RUN_LIMITS = ("time_limit_s",)


def _all_finished(record: dict) -> bool:
    return all(r.get("history", {}).get("stopped_at") == r.get("history", {}).get("steps") for r in record["runs"])


def merge_records(records: list[dict]) -> dict:
    """One record from the parts of a series: the same experiment and settings, run for different values of
    the settings that enumerate its runs (the module's ``GRID``: seeds, mixers, and e.g. the word problems'
    lengths and depths); per-mixer settings (:data:`PER_MIXER`) must agree for the mixers the parts ran, and
    the merged record's cover them all.  A run limit (:data:`RUN_LIMITS`, e.g. ``time_limit_s``) may differ
    between parts whose runs all did every step.  Every run of every part is kept in order; ``parts`` keeps each
    part's command, commit, device, versions and wall time; the summary is recomputed over all runs."""
    if not records:
        raise ValueError("`records` is empty: nothing to merge")
    name = records[0]["experiment"]
    mod = get_module(name)
    varying = tuple(mod.GRID)

    def split(record):  # (settings that must be equal, per-mixer settings restricted to the mixers it ran)
        ran = set(record["config"].get("mixers", ()))
        rest = {k: v for k, v in record["config"].items() if k not in varying}
        per = {k: {m: x for m, x in rest.pop(k).items() if m in ran}
               for k in PER_MIXER if isinstance(rest.get(k), dict)}
        return rest, per, ran

    base, per_mixer, ran_so_far = split(records[0])
    finished = all(_all_finished(r) for r in records)
    for r in records[1:]:
        if r["experiment"] != name:
            raise ValueError(f"cannot merge experiment {r['experiment']!r} into {name!r}")
        other, per, ran = split(r)
        diff = {k for k in set(base) | set(other) if base.get(k) != other.get(k)}
        if finished:  # a limit that stopped no run changed no result
            diff -= set(RUN_LIMITS)
        diff |= {k for k in set(per_mixer) | set(per)  # a mixer both ran must have the same value (absent: default)
                 for m in ran & ran_so_far if per_mixer.get(k, {}).get(m) != per.get(k, {}).get(m)}
        if diff:
            raise ValueError(f"the parts differ in settings other than {', '.join(varying)}: {sorted(diff)}")
        for k, v in per.items():
            per_mixer[k] = {**per_mixer.get(k, {}), **v}
        ran_so_far |= ran
    config = dict(records[0]["config"], **per_mixer)
    for key in RUN_LIMITS:
        values = {r["config"].get(key) for r in records}
        if len(values) > 1:  # only when no run was stopped (above): the largest limit, None meaning none
            config[key] = None if None in values else max(values)
    for key in varying:
        config[key] = list(dict.fromkeys(x for r in records for x in r["config"][key]))
    runs = [run for r in records for run in r["runs"]]
    keep = ("command", "commit", "dirty", "device", "device_type", "triton_mode", "versions", "wall_time_s",
            "parallel")
    parts = [{k: r.get(k) for k in keep} for r in records]
    commits = sorted({p["commit"] for p in parts})
    devices = sorted({p["device"] for p in parts})
    return {"experiment": name,
            "command": " && ".join(p["command"] for p in parts),
            "commit": commits[0] if len(commits) == 1 else commits,
            "dirty": any(p["dirty"] for p in parts) if all(p["dirty"] is not None for p in parts) else None,
            "device": devices[0] if len(devices) == 1 else devices,
            "device_type": records[0].get("device_type"), "triton_mode": records[0].get("triton_mode"),
            "versions": records[0].get("versions"), "config": config,
            "wall_time_s": sum(p["wall_time_s"] for p in parts), "parts": parts,
            "runs": runs, "summary": mod.summarize(runs, config)}
