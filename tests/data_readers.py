"""Which file of the repository reads which data file of ``pathedu/data``, found by name.

A reader names a data file literally (``"bench_nope_h200.json"``), through a loader that builds the name
(``pathedu.bench.load("nope_h200")`` -> ``bench_nope_h200.json``, ``load(..., backward=True)`` -> ``_fwdbwd``,
``plot_benchmark("cope")``, ``load_checks(...)`` -> ``gpu_checks.json``, ``plots.load("mqrar")`` -> ``exp_mqrar.json``,
chapter 9's ``record("mqrar", "mqrar_fixed")`` -> ``exp_mqrar_fixed.json``), through a package function that reads
a file its caller does not name (``plots.word_problem_grid()``), or by an f-string whose placeholders take the
literals they hold, the package's own names (``pathedu.bench.CHAPTERS`` in ``bench_{chapter}.json``) or the tuple
of a ``for`` written on that line or the three before (``for tag in ("", "_fixed")``); a placeholder left open
matches any name inside a specific stem only (``mqrar_path_N2_{name}``, not ``exp_{name}``).  A quoted string in
a file that loads ``load(name)`` in a loop counts when it is a name the loader builds (chapter 18's file lists).

Readers are the book's pages and slides (``book/*.md``, ``book/slides/*``, ``book/tools.py``), the labs' code cells
(``notebooks/*.ipynb``) and the package (``pathedu/**/*.py``); the check that a file can be removed also looks at
the tests, the CI scripts, the README, CONTRIBUTING and the kernels.  ``python tests/data_readers.py`` prints
every data file with its readers and the files nothing reads; ``--entry NAME.json`` drafts a manifest entry.
"""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "pathedu" / "data"

# Where a product reader lives (the manifest names these), and where the removal check looks besides.
PRODUCT_GLOBS = ("book/*.md", "book/slides/*.md", "book/slides/*.py", "book/tools.py", "notebooks/*.ipynb",
                 "pathedu/**/*.py")
OTHER_GLOBS = ("tests/**/*.py", "tests/**/*.sh", ".ci/*", "conftest.py", "README.md", "CONTRIBUTING.md",
               "kernels/*.py", "kernels/*.md")  # the kernels read no data: their comments may cite a file

_NAME = r"[A-Za-z0-9_.\-]+"
_LITERAL = re.compile(rf"({_NAME}\.json)")
_FSTRING = re.compile(r"""\bf(["'])(.*?)\1""")
_FOR_TUPLE = re.compile(r"for\s+(\w+)\s+in\s+\(([^()]*)\)")
_QUOTED = re.compile(r"""["']([A-Za-z0-9_\-]+)["']""")
# Loader calls whose first argument (a string) is part of a data file's name.
_BENCH_CALL = re.compile(r"""\b(?:load|load_bench|plot_benchmark)\(\s*["']([\w\-]+)["']([^)]*)\)""")
_EXP_DEFAULT = re.compile(r"""\bplots\.load\(\s*["'](\w+)["']\s*\)""")
_RECORD_CALL = re.compile(r"""\brecord\(\s*["']\w+["']\s*,\s*["']([\w\-]+)["']\s*\)""")
_CHECKS_CALL = re.compile(r"\bload_checks\(")


def data_files(data: Path = DATA) -> list[str]:
    """The data files: every ``*.json`` of the folder."""
    return sorted(p.name for p in data.glob("*.json"))


def reader_text(path: Path) -> str:
    """What a reader says: a notebook's code cells, any other file's whole text."""
    text = path.read_text(encoding="utf8")
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return text


def _fstring_names(context: str, body: str, names: list[str], known: dict) -> set[str]:
    """The data names an f-string body (``bench_{chapter}_fwdbwd_{mode}.json``) can build.  A placeholder takes
    the string literals it holds (``{'_fwdbwd' if backward else ''}``), the values ``known`` gives its name, or the
    tuple of a ``for`` over it in ``context``."""
    loops = {var: _literals(items) for var, items in _FOR_TUPLE.findall(context)}
    parts = re.split(r"\{([^{}]*)\}", body)
    literal, fields = parts[0::2], parts[1::2]
    choices = [_literals(f) if re.search(r"""["']""", f) else known.get(f.strip(), loops.get(f.strip()))
               for f in fields]
    if all(c is not None for c in choices):
        built = set()
        for combo in itertools.product(*choices):
            built.add("".join(itertools.chain.from_iterable(itertools.zip_longest(literal, combo, fillvalue=""))))
        return {n for n in names for b in built if n == b or n == f"exp_{b}.json" or n == f"{b}.json"}
    # An unresolved placeholder matches any name, but only inside a specific stem: a generic builder
    # (``exp_{name}.json``, ``{stem}.json``, ``part{i}.json``) reads whatever its caller names.
    specific = re.sub(r"^(exp_|bench_)|\.json$", "", "".join(literal))
    if len(specific) < 8:
        return set()
    pattern = "".join(re.escape(lit) + ("" if i >= len(fields) else r"[\w\-]*" if choices[i] is None
                                        else "(?:" + "|".join(map(re.escape, choices[i])) + ")")
                      for i, lit in enumerate(literal))
    return {n for n in names if re.fullmatch(rf"(exp_)?{pattern}(\.json)?", n)}


def _literals(source: str) -> list[str]:
    """The string literals written in ``source``, the empty one included."""
    return [m.group(2) for m in re.finditer(r"""(["'])([A-Za-z0-9_\-]*)\1""", source)]


def package_calls() -> dict:
    """Package functions that read data files their callers do not name: function name -> files."""
    from pathedu.experiments import plots

    return {"word_problem_grid": [plots.GRID_FILE]}


def package_names() -> dict:
    """The values of the package's own name builders: ``chapter`` (``pathedu.bench.CHAPTERS``) in
    ``bench_{chapter}.json``, ``name`` (``pathedu.experiments.EXPERIMENTS``) in ``exp_{name}.json``."""
    from pathedu.bench import CHAPTERS
    from pathedu.experiments import EXPERIMENTS

    return {"pathedu/bench/__init__.py": {"chapter": list(CHAPTERS)},
            "pathedu/bench/__main__.py": {"a.chapter": list(CHAPTERS)},
            "pathedu/experiments/__init__.py": {"name": list(EXPERIMENTS)}}


def references(text: str, names: list[str], known: dict | None = None) -> set[str]:
    """The data files among ``names`` that ``text`` reads or names; ``known``: values of placeholders by name."""
    found = {n for n in _LITERAL.findall(text) if n in names}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        for _, body in _FSTRING.findall(line):
            if "{" in body and (".json" in body or "exp_" in body or "bench_" in body or "record(" in line):
                found |= _fstring_names("\n".join(lines[max(0, i - 3):i + 1]), body, names, known or {})
    for m in _BENCH_CALL.finditer(text):
        suffix = "_fwdbwd" if re.search(r"backward\s*=\s*True", m.group(2)) else ""
        found.add(f"bench_{m.group(1)}{suffix}.json")
    found |= {f"exp_{s}.json" for s in _EXP_DEFAULT.findall(text)}
    found |= {f"exp_{s}.json" for s in _RECORD_CALL.findall(text)}
    if re.search(r"""\brecord\(\s*["']\w+["']\s*,\s*\w""", text):  # record(experiment, n) for n in (...)
        found |= {f"exp_{s}.json" for s in _QUOTED.findall(text)}
    for call, files in package_calls().items():  # a package function that reads files the caller never names
        if re.search(rf"\b{call}\(", text):
            found |= set(files)
    if _CHECKS_CALL.search(text):
        found.add("gpu_checks.json")
    if re.search(r"(?<!def )\bload\(\s*name\b", text):  # a loop over quoted stems (chapter 18's file lists)
        backward = re.search(r"\bload\(\s*name\s*,\s*backward\s*=\s*True", text)
        for stem in _QUOTED.findall(text):
            found.add(f"bench_{stem}.json")
            if backward:
                found.add(f"bench_{stem}_fwdbwd.json")
    return found & set(names)


def reader_paths(globs=PRODUCT_GLOBS) -> list[Path]:
    paths = {p for g in globs for p in ROOT.glob(g) if p.is_file() and DATA not in p.parents
             and not any(part in (".venv", "_build", "build", "offline") for part in p.relative_to(ROOT).parts)}
    return sorted(paths)


def readers_by_file(names=None, globs=PRODUCT_GLOBS) -> dict[str, list[str]]:
    """Every data file -> the repository paths (relative, POSIX) that read or name it."""
    names = data_files() if names is None else list(names)
    out = {n: [] for n in names}
    known = package_names()
    for path in reader_paths(globs):
        rel = path.relative_to(ROOT).as_posix()
        for name in references(reader_text(path), names, known.get(rel)):
            out[name].append(rel)
    return out


# What a manifest entry says about where a file came from, read from the file's own header: ``meta`` (benchmarks,
# launches, parts, checks, comparison runs) or the record's top level (experiments, probes); a file that keeps
# several runs gives their commands and the span of their dates.
NOT_RECORDED = "not recorded"
_LONG = 300  # a longer command is cut at its first " && " and says how many follow


def _walk(obj, key):
    """Every value stored under ``key`` anywhere in ``obj`` (rows and records skipped), in order."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key and isinstance(v, str):
                yield v
            elif k not in ("rows", "records", "history") and isinstance(v, (dict, list)):
                yield from _walk(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v, key)


def provenance(record: dict) -> dict:
    """``{"command", "device", "date"}`` of a data file, from its header; :data:`NOT_RECORDED` where it has none."""
    head = record["meta"] if isinstance(record.get("meta"), dict) else record
    out = {}
    for field in ("command", "device", "date"):
        own = head.get(field) if isinstance(head.get(field), str) else None
        found = [own] if own else list(dict.fromkeys(
            v for k in (field, f"probe_{field}", f"ab_{field}") for v in _walk(record, k)))
        if field == "date":
            days = sorted({v[:10] for v in found})
            out[field] = (days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}") if days else NOT_RECORDED
        elif field == "command":
            cut = []
            for cmd in found:
                pieces = cmd.split(" && ")
                if len(cmd) > _LONG and len(pieces) > 1:
                    cmd = f"{pieces[0]} (then {len(pieces) - 1} more, in the file's command)"
                cut.append(cmd)
            script = [k for k in head if k.endswith("script")] if not cut else []
            out[field] = (cut[0] if len(cut) == 1 else cut if cut else
                          f"{NOT_RECORDED} (the script that made it is kept in the file: meta.{script[0]})" if script
                          else NOT_RECORDED)
        else:
            out[field] = found[0] if len(set(found)) == 1 else sorted(set(found)) if found else NOT_RECORDED
    return out


def toml_entry(name: str, readers: list[str], wheel: bool, shows: str = "") -> str:
    """A manifest entry for data file ``name`` (TOML), its provenance read from the file."""
    prov = provenance(json.loads((DATA / name).read_text()))
    lines = [f'["{name}"]']
    if shows:
        lines.append(f"shows = {json.dumps(shows)}")
    for field in ("command", "device", "date"):
        value = prov[field]
        if isinstance(value, list):
            lines.append(f"{field} = [\n" + "".join(f"    {json.dumps(v)},\n" for v in value) + "]")
        else:
            lines.append(f"{field} = {json.dumps(value)}")
    lines.append("readers = [" + ", ".join(json.dumps(r) for r in readers) + "]")
    lines.append(f"wheel = {'true' if wheel else 'false'}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--entry"]:  # python tests/data_readers.py --entry NAME.json: a draft manifest entry
        for name in sys.argv[2:]:
            print(toml_entry(name, readers_by_file([name])[name], wheel=False))
        raise SystemExit(0)
    product = readers_by_file()
    other = readers_by_file(globs=OTHER_GLOBS)
    for name in data_files():
        print(f"{name}: {', '.join(product[name]) or '-'}" + (f"  [also: {', '.join(other[name])}]" if other[name] else ""))
    unread = [n for n in data_files() if not product[n]]
    print(f"\n{len(unread)} files read by nothing in the book, the labs or the package:")
    print("\n".join(f"  {n}" + (f"  (named in {', '.join(other[n])})" if other[n] else "") for n in unread))
