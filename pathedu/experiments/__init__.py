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

``--preset NAME`` starts from named settings of the experiment (each module's ``PRESETS``; ``paper``: the PaTH
paper's comparison with every seed).  The record is rewritten after every finished run, so a series stopped
part-way keeps its finished runs; ``--skip-done RECORD ...`` trains only the runs that those records (same
settings) do not hold.  A series too long for one sitting (the GPU machine takes commands of at most 10 minutes)
is run in parts, a few seeds or mixers each, and merged: ``python -m pathedu.experiments.merge OUT PART.json ...``
(:func:`merge_records`) keeps every run of every part and each part's command, commit and device.
``--jobs K`` trains the runs in ``K`` processes at once on one device (:mod:`pathedu.experiments.parallel`).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from .._provenance import git_commit

__all__ = ["EXPERIMENTS", "get_module", "make_config", "presets", "run_experiment", "merge_records", "metadata",
           "git_commit", "default_out", "new_out", "write_record", "record_writer", "done_points", "point_key"]

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


def presets(name: str) -> dict:
    """The named settings of experiment ``name`` (its module's ``PRESETS``: ``{preset: {setting: value}}``)."""
    return getattr(get_module(name), "PRESETS", {})


def make_config(name: str, *, tiny: bool = False, preset: str | None = None, **overrides) -> dict:
    """The experiment's defaults, then the settings of ``preset`` (a name in :func:`presets`), then its ``TINY``
    overrides (``tiny=True``; a preset keeps its runs, the settings of the module's ``GRID``, at tiny sizes), then
    ``overrides`` (keys must exist in the defaults; ``None`` values are ignored)."""
    mod = get_module(name)
    config = json.loads(json.dumps(mod.DEFAULTS))  # a deep copy, JSON-clean
    chosen = {}
    if preset is not None:
        if preset not in presets(name):
            known = ", ".join(presets(name)) or "none"
            raise ValueError(f"`preset` must be one of the presets of {name!r} ({known}), got {preset!r}")
        chosen = json.loads(json.dumps(presets(name)[preset]))
        config.update(chosen)
    if tiny:
        config.update(json.loads(json.dumps(mod.TINY)))
        config.update({k: v for k, v in chosen.items() if k in mod.GRID})
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in config:
            raise ValueError(f"unknown setting {key!r} for experiment {name!r}; known: {', '.join(config)}")
        config[key] = value
    config["tiny"] = tiny
    return config


def run_experiment(name: str, *, config: dict | None = None, device=None, out=None, progress: bool = True,
                   command: str | None = None, overwrite: bool = True, skip=()) -> dict:
    """Run experiment ``name`` with ``config`` (default :func:`make_config` ``(name)``) on ``device``
    (default: CUDA when available, else CPU); write the JSON as :func:`write_record` does (``out=None``: a new
    file in the current folder; ``out=False``: write nothing) and return the record.

    The runs (the points of the module's ``GRID``) train one after the other, and the record is rewritten after
    each, holding the runs finished so far with ``config``'s grid settings narrowed to them, so that a series cut
    short leaves a record of its finished runs (:func:`merge_records` takes it as a part).  ``skip``: records
    (dicts) of the same experiment and settings whose runs are not trained again (:func:`done_points`); the
    record then holds the new runs only, a part to merge with those."""
    from .parallel import grid_points, narrowed

    mod = get_module(name)
    config = make_config(name) if config is None else config
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    done = done_points(name, config, skip)
    points = [p for p in grid_points(name, config) if point_key(name, p) not in done]
    record = {"experiment": name, **metadata(device)}
    if command is not None:
        record["command"] = command
    write = record_writer(out, name, overwrite=overwrite)
    start = time.perf_counter()
    runs, finished = [], []
    for point in points:
        runs.extend(mod.run({**config, **{k: [v] for k, v in point.items()}}, device=device, progress=progress)[0])
        finished.append(point)
        part = narrowed(config, finished, mod.GRID)
        record.update(config=part, wall_time_s=time.perf_counter() - start, runs=runs,
                      summary=mod.summarize(runs, part))
        record = write(record)
    if not points:
        record.update(config=narrowed(config, [], mod.GRID), wall_time_s=0.0, runs=[], summary=None)
    return record


def point_key(name: str, point: dict) -> tuple:
    """A run's place in experiment ``name``'s grid: the values of the module's ``GRID`` settings, in its order,
    from a grid point (``{"seeds": 0, ...}``) or from a run of a record (``{"seed": 0, ...}``)."""
    grid = get_module(name).GRID
    if all(k in point for k in grid):
        return tuple(point[k] for k in grid)
    return tuple(point[field] for field in grid.values())


def done_points(name: str, config: dict, records) -> set:
    """The grid places (:func:`point_key`) of the runs in ``records`` (dicts, e.g. a record cut short), after
    checking that each was made with ``config``'s settings: ``ValueError`` naming the settings that differ
    (per-mixer settings compared for the mixers both ran; a run limit only where it stopped a run)."""
    mod = get_module(name)
    varying = tuple(mod.GRID)
    done = set()
    for record in records:
        if record.get("experiment") != name:
            raise ValueError(f"cannot skip the runs of experiment {record.get('experiment')!r} in {name!r}")
        base, per, ran = _settings(config, varying)
        other, per_other, ran_other = _settings(record["config"], varying)
        diff = {k for k in set(base) | set(other) if base.get(k) != other.get(k)}
        if _all_finished(record):
            diff -= set(RUN_LIMITS)
        diff |= {k for k in set(per) | set(per_other) for m in ran & ran_other
                 if per.get(k, {}).get(m) != per_other.get(k, {}).get(m)}
        if diff:
            raise ValueError(f"the record to skip differs in settings other than {', '.join(varying)}: "
                             f"{sorted(diff)}")
        done |= {point_key(name, r) for r in record["runs"]}
    return done


def record_writer(out, name: str, *, overwrite: bool):
    """``write(record) -> record``: :func:`write_record` to one file, again and again (a record rewritten as runs
    finish).  ``out``: as for :func:`write_record` (None: a new file in the current folder, chosen at the first
    write; False: nothing); only the first write checks ``overwrite``; each write replaces the file at once (a
    reader never sees half of it)."""
    state = {"path": None}

    def write(record: dict) -> dict:
        if out is False:
            return record
        if state["path"] is None:
            check_out(out, overwrite)
            state["path"] = (Path(out) if out is not None else new_out(name)).resolve()
        return write_record(record, state["path"], overwrite=True)
    return write


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
        record.pop("written_to", None)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n")
        os.replace(tmp, path)  # whole or not at all: a command cut while writing leaves the previous record
        record["written_to"] = str(path)
    return record


# Settings that map a mixer to a value (e.g. {"deltanet": 2.0}): two parts agree on one if they agree for the
# mixers they both ran; a mixer that a part did not run is not compared.
PER_MIXER = ("beta_max", "short_conv")

# Constraints on how long a run may train: parts may differ in one where it stopped none of their runs early
# (every run did all its steps), since then it changed no result; the merged record keeps the largest value.
RUN_LIMITS = ("time_limit_s",)


def _settings(config: dict, varying) -> tuple:
    """``(settings that parts must share, per-mixer settings restricted to the mixers run, those mixers)`` of a
    record's ``config``; ``varying``: the settings that enumerate the runs (left out)."""
    ran = set(config.get("mixers", ()))
    rest = {k: v for k, v in config.items() if k not in varying}
    per = {k: {m: x for m, x in rest.pop(k).items() if m in ran}
           for k in PER_MIXER if isinstance(rest.get(k), dict)}
    return rest, per, ran


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

    def split(record):
        return _settings(record["config"], varying)

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
