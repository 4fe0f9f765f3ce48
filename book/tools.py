"""Book maintenance, three commands (run from anywhere; paths are the repository's):

``python book/tools.py assets [--force]``
    Fetch the web assets that let the built book render math and widgets with
    no internet access (MathJax 3, RequireJS, the ipywidgets embed script) from
    the npm registry into the git-ignored folder ``book/offline/``.  ``npm pack``
    downloads each package's tarball (no dependencies, no ``node_modules``) into
    a temporary folder; only the files the pages load are copied.  Idempotent: a
    stamp file records what was fetched, and a second run does nothing.
    ``_config.yml`` points Sphinx's ``mathjax_path`` and myst-nb's
    ``nb_ipywidgets_js`` at these files through ``html_static_path``.

``python book/tools.py sync [--check]``
    Rewrite the install cell (the first cell) of every notebook in
    ``notebooks/`` from ``_config.yml``'s ``repository.url`` and
    ``repository.branch``, so that the repository URL lives in one place.
    With ``--check``, change nothing and exit 1 if a notebook is out of date.

``python book/tools.py execute NOTEBOOK.ipynb [...]``
    Execute notebooks in place, for committing them with their outputs (CI
    compares those outputs with nbval).  Always the ``python3`` kernel, the
    notebook's folder as working directory, no GPU (CI has none, so the
    committed outputs must be the CPU ones), ``PYTHONHASHSEED=0``, widget state
    stored, no per-cell timing metadata.  Seeding random generators is the
    notebook's job (its first code cell after the imports).

The module is also a small Sphinx extension (``sphinx.local_extensions`` in
``_config.yml``): it stops the build with the fix when the assets are missing,
keeps the Colab button only on pages made from notebooks (Colab cannot open the
MyST Markdown pages), and lets the widgets typeset their labels with MathJax 3.

Standard library plus nbformat, nbclient and PyYAML only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = ROOT / "book" / "offline"
NOTEBOOKS = ROOT / "notebooks"
STAMP = "assets.json"

# npm package -> [(path inside the package, path under book/offline/)].
# MathJax: the combined TeX+MathML->CHTML component, plus the folders it loads
# from at run time (fonts, TeX extensions such as the macros' dependencies, the
# context menu and the accessibility components it loads by default).
# Widgets: RequireJS and the AMD embed bundle of @jupyter-widgets/html-manager
# 1.x (the line that matches ipywidgets 8), which bundles the standard controls
# (@jupyter-widgets/base, controls, output), so no widget module is fetched
# from a CDN.  The bundled Font Awesome files sit beside the bundle.
ASSETS = {
    "mathjax@3": [
        ("es5/tex-mml-chtml.js", "mathjax/tex-mml-chtml.js"),
        ("es5/output/chtml/fonts/woff-v2", "mathjax/output/chtml/fonts/woff-v2"),
        ("es5/input/tex/extensions", "mathjax/input/tex/extensions"),
        ("es5/ui", "mathjax/ui"),
        ("es5/a11y", "mathjax/a11y"),
        ("LICENSE", "mathjax/LICENSE"),
    ],
    "requirejs@2": [("require.js", "requirejs/require.js")],
    "@jupyter-widgets/html-manager@1": [
        ("dist/embed-amd.js", "jupyter-widgets/embed-amd.js"),
        ("dist/*.woff2", "jupyter-widgets/"),
        ("dist/*.woff", "jupyter-widgets/"),
    ],
}


def die(message: str) -> None:
    sys.exit(f"book/tools.py: {message}")


# ---------------------------------------------------------------------------
# assets
# ---------------------------------------------------------------------------

def _assets_present() -> bool:
    stamp = OFFLINE / STAMP
    if not stamp.is_file():
        return False
    try:
        recorded = json.loads(stamp.read_text())
    except ValueError:
        return False
    if recorded.get("specs") != sorted(ASSETS):
        return False
    return all((OFFLINE / f).is_file() for f in recorded.get("files", []))


def _copy(package: Path, src: str, dest: str, stage: Path) -> list[str]:
    """Copy ``src`` (a file, a folder or a glob) from an unpacked package to ``stage/dest``."""
    matches = sorted(package.glob(src)) if "*" in src else [package / src]
    if not matches or not all(m.exists() for m in matches):
        die(f"`{src}` is missing from the npm package unpacked in {package}: has the package changed layout?")
    copied = []
    for m in matches:
        target = stage / dest / m.name if dest.endswith("/") else stage / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if m.is_dir():
            shutil.copytree(m, target)
        else:
            shutil.copy2(m, target)
        files = [target] if target.is_file() else [p for p in target.rglob("*") if p.is_file()]
        copied += [p.relative_to(stage).as_posix() for p in files]
    return copied


def cmd_assets(args) -> None:
    if not args.force and _assets_present():
        print(f"offline assets already in {OFFLINE.relative_to(ROOT)}/ (use --force to fetch again)")
        return
    npm = shutil.which("npm")
    if npm is None:
        die("`npm` was not found on PATH. The book ships MathJax and the widget scripts with the build, "
            "fetched from the npm registry: install Node.js and npm (Debian: `apt-get install -y npm`) and rerun "
            "`python book/tools.py assets`.")
    OFFLINE.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pathedu-assets-") as tmp:
        tmp = Path(tmp)
        specs = sorted(ASSETS)
        proc = subprocess.run([npm, "pack", "--json", "--pack-destination", str(tmp), *specs], cwd=tmp,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            die(f"`npm pack {' '.join(specs)}` failed:\n{proc.stderr.strip()}")
        packed = json.loads(proc.stdout)  # one entry per spec, in order
        stage = Path(tempfile.mkdtemp(prefix=".offline-", dir=OFFLINE.parent))  # same file system: atomic swap
        try:
            files, versions = [], {}
            for spec, info in zip(specs, packed):
                unpacked = tmp / ("pkg-" + info["filename"])
                with tarfile.open(tmp / info["filename"]) as tar:
                    if hasattr(tarfile, "data_filter"):
                        tar.extractall(unpacked, filter="data")
                    else:  # Python < 3.11.4
                        tar.extractall(unpacked)
                versions[info["name"]] = info["version"]
                for src, dest in ASSETS[spec]:
                    files += _copy(unpacked / "package", src, dest, stage)
            (stage / STAMP).write_text(json.dumps({"specs": specs, "versions": versions, "files": files}, indent=1))
            old = OFFLINE.with_name(stage.name + "-old")
            if OFFLINE.exists():
                OFFLINE.rename(old)
            stage.rename(OFFLINE)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    size = sum((OFFLINE / f).stat().st_size for f in files) / 2**20
    print(f"fetched {', '.join(f'{k}@{v}' for k, v in versions.items())}: "
          f"{len(files)} files, {size:.1f} MiB in {OFFLINE.relative_to(ROOT)}/")


# ---------------------------------------------------------------------------
# sync
# ---------------------------------------------------------------------------

INSTALL_MARKER = "# Install pathedu when it is not importable (as on Colab); hidden in the book."
INSTALL_TAG = "remove-cell"


def read_repository() -> tuple[str, str]:
    """``(url, branch)`` from ``_config.yml``'s ``repository`` section."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf8"))
    repo = config.get("repository") or {}
    url, branch = str(repo.get("url", "")).rstrip("/"), str(repo.get("branch", "main"))
    if not url.startswith("https://"):
        die(f"`repository.url` in _config.yml must be an https URL, got {url!r}")
    return url, branch


def install_source(url: str, branch: str) -> str:
    """The source of the install cell that every notebook starts with."""
    return "\n".join([
        INSTALL_MARKER,
        "try:",
        "    import pathedu",
        "except ImportError:",
        f'    %pip install -q "pathedu @ git+{url}@{branch}"',
        "    import pathedu",
    ])


def sync_notebook(nb, source: str) -> bool:
    """Make ``nb``'s first cell the install cell; return whether anything changed.

    A first cell that starts with the install marker is rewritten in place
    (keeping its id and execution count); otherwise a new install cell is
    inserted before it.
    """
    import nbformat

    cells = nb.cells
    if cells and cells[0].cell_type == "code" and cells[0].source.startswith(INSTALL_MARKER):
        cell, changed = cells[0], False
    else:
        cell = nbformat.v4.new_code_cell(source)
        cells.insert(0, cell)
        changed = True
    tags = cell.metadata.setdefault("tags", [])
    if INSTALL_TAG not in tags:
        tags.append(INSTALL_TAG)
        changed = True
    if cell.source != source:
        cell.source, changed = source, True
    if cell.get("outputs"):  # pathedu is importable where notebooks are executed: no output
        cell.outputs, changed = [], True
    return changed


def cmd_sync(args) -> None:
    import nbformat

    source = install_source(*read_repository())
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    stale = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if sync_notebook(nb, source):
            stale.append(path)
            if not args.check:
                nbformat.write(nb, path)
    rel = [p.relative_to(ROOT).as_posix() for p in stale]
    if args.check:
        if stale:
            die("install cell out of date (run `python book/tools.py sync`): " + ", ".join(rel))
        print(f"{len(paths)} notebooks: install cells up to date")
    else:
        print(f"{len(paths)} notebooks, rewrote {len(stale)}" + (": " + ", ".join(rel) if rel else ""))


# ---------------------------------------------------------------------------
# execute
# ---------------------------------------------------------------------------

KERNEL = "python3"


def cmd_execute(args) -> None:
    import nbformat
    from nbclient import NotebookClient

    # The kernel inherits this environment: no GPU (committed outputs are CI's
    # CPU outputs, with Triton in its interpreter), fixed string hashing.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["PYTHONHASHSEED"] = "0"
    os.environ.pop("TRITON_INTERPRET", None)  # pathedu's device policy decides
    for name in args.notebooks:
        path = Path(name).resolve()
        if path.suffix != ".ipynb" or not path.is_file():
            die(f"`{name}` is not a notebook file")
        nb = nbformat.read(path, as_version=4)
        nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": KERNEL}
        client = NotebookClient(nb, kernel_name=KERNEL, timeout=args.timeout, allow_errors=False,
                                record_timing=False, store_widget_state=True,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
        nbformat.write(nb, path)
        print(f"executed {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


# ---------------------------------------------------------------------------
# Sphinx extension (``sphinx.local_extensions`` in _config.yml)
# ---------------------------------------------------------------------------

def _require_assets(app) -> None:
    """Stop a build early, with the fix, when the offline assets are missing."""
    if app.builder.format == "html" and not _assets_present():
        raise RuntimeError(f"the offline web assets are missing from {OFFLINE}: "
                           "run `python book/tools.py assets` (or `bash .ci/book`) first")


def _colab_only_for_notebooks(app, pagename, templatename, context, doctree) -> None:
    """Keep the Colab launch button only on pages made from an ``.ipynb``.

    The theme also offers it on MyST Markdown pages, where it would send Colab
    a ``.md`` file that Colab cannot open; those pages keep their download
    button (the executed page as ``.ipynb``).
    """
    if pagename not in app.env.all_docs or Path(app.env.doc2path(pagename)).suffix == ".ipynb":
        return
    buttons = context.get("header_buttons") or []
    for group in list(buttons):
        if group.get("label") == "launch-buttons":
            group["buttons"] = [b for b in group.get("buttons", []) if b.get("text") != "Colab"]
            if not group["buttons"]:
                buttons.remove(group)


# ipywidgets 8 typesets widget labels through MathJax 2's API (``MathJax.Hub.Queue``);
# the book loads MathJax 3, which has no ``Hub``.  Deferred scripts (MathJax) have
# run by DOMContentLoaded; the widgets render later, on "load".
MATHJAX2_SHIM = """document.addEventListener("DOMContentLoaded", function () {
  var mj = window.MathJax;
  if (mj && mj.startup && !mj.Hub) {
    mj.Hub = {Queue: function (job) {
      var el = job && job[2];
      mj.startup.promise.then(function () { return mj.typesetPromise(el ? [el] : undefined); });
    }};
  }
});"""


def setup(app):
    app.add_js_file(None, body=MATHJAX2_SHIM)
    app.connect("builder-inited", _require_assets)
    app.connect("html-page-context", _colab_only_for_notebooks, priority=900)  # after the theme's (501)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python book/tools.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("assets", help="fetch MathJax and the widget scripts from npm into book/offline/")
    p.add_argument("--force", action="store_true", help="fetch again even if present")
    p.set_defaults(func=cmd_assets)
    p = sub.add_parser("sync", help="rewrite every notebook's install cell from _config.yml")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook is out of date")
    p.set_defaults(func=cmd_sync)
    p = sub.add_parser("execute", help="execute notebooks in place (outputs to commit)")
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK")
    p.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds (default 600)")
    p.set_defaults(func=cmd_execute)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
