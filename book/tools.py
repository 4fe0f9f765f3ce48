"""Book maintenance, six commands (run from anywhere; paths are the repository's):

``python book/tools.py assets [--force]``
    Fetch the web assets that let the built book render math and widgets with
    no internet access (MathJax 3, RequireJS, the ipywidgets embed script, and
    reveal.js for the slide decks) from
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

``python book/tools.py page PAGE.md [...] [--no-run]``
    Read a chapter page as its reader meets it: execute its cells (as the
    book build does, in ``book/``), then report the failing cell if any, the
    words of prose (``book/style.py`` says what counts), every sentence that
    speaks of how the project was made, the schematics, and cell outputs
    longer than the reading flow allows.  Exit 1 when something is wrong.

``python book/tools.py slides [--out DIR]``
    Build one reveal.js slide deck per chapter of ``_toc.yml`` from
    ``book/slides/chNN.md`` into ``_build/html/slides/chNN.html``, with an
    ``index.html`` listing them (every HTML build of the book runs it last).
    The Markdown is converted here (markdown-it, as MyST uses; ``$``/``$$``
    maths is handed to MathJax untouched), figures named ``fig:NAME`` are drawn
    from ``pathedu`` by ``book/slides/figures.py`` into ``fig/``, and reveal.js
    and MathJax are copied from ``book/offline/`` into ``lib/``: the folder is
    self-contained and projects from disk with no network.  Needs the assets.

``python book/tools.py edition student|instructor --out DIR``
    Build one edition of the book into ``DIR/_build/html`` (slides in its
    ``slides/``).  The instructor edition is the normal build of the
    repository.  The student edition is built from a copy of the sources in
    ``DIR/source`` without any solution: every chapter's problem solutions
    (the ``{admonition} Solution`` blocks and the code cell that checks each),
    and the labs as ``python -m pathedu.course student`` copies them (no
    solution cell, no output from the first exercise on).  Needs the assets.

The module is also a small Sphinx extension (``sphinx.local_extensions`` in
``_config.yml``): it stops the build with the fix when the assets are missing,
keeps the Colab button only on pages made from notebooks (Colab cannot open the
MyST Markdown pages), puts a link to its slide deck under every chapter's title
and builds the decks into the HTML folder's ``slides/`` when the build succeeds,
and lets the widgets typeset their labels with MathJax 3.

Standard library plus nbformat, nbclient and PyYAML; ``slides`` also uses
markdown-it-py and mdit-py-plugins (installed with jupyter-book) and, for its
figures, pathedu and matplotlib.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
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
    # The slide decks (``python book/tools.py slides``): reveal.js's script and
    # style, the "white" theme with the Source Sans Pro files it imports (the
    # themes that import Google Fonts are not used), the math plugin (pointed at
    # the MathJax above, never its CDN default) and the speaker-notes plugin.
    "reveal.js@5": [
        ("dist/reveal.js", "reveal.js/reveal.js"),
        ("dist/reveal.css", "reveal.js/reveal.css"),
        ("dist/theme/white.css", "reveal.js/theme/white.css"),
        ("dist/theme/fonts/source-sans-pro", "reveal.js/theme/fonts/source-sans-pro"),
        ("plugin/math/math.js", "reveal.js/plugin/math/math.js"),
        ("plugin/notes/notes.js", "reveal.js/plugin/notes/notes.js"),
        ("LICENSE", "reveal.js/LICENSE"),
    ],
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


def read_yaml(name: str):
    """A YAML file of the repository root (``_config.yml``, ``_toc.yml``), parsed."""
    import yaml

    return yaml.safe_load((ROOT / name).read_text(encoding="utf8"))


def read_repository() -> tuple[str, str]:
    """``(url, branch)`` from ``_config.yml``'s ``repository`` section."""
    config = read_yaml("_config.yml")
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
# page: one chapter as its reader meets it
# ---------------------------------------------------------------------------

MAX_OUTPUT_LINES = 15   # a cell's text output in the reading flow, beyond which it must be folded or summarised
PART_ONE_WORDS = 5000   # the prose of a chapter of Part I, at most


def load_style():
    """``book/style.py`` as a module (the book's folder is not a package)."""
    spec = importlib.util.spec_from_file_location("pathedu_book_style", ROOT / "book" / "style.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_page(path: Path):
    """A MyST Markdown page as an nbformat notebook (myst-nb's reader, as the build uses)."""
    from myst_nb.core.read import read_myst_markdown_notebook

    return read_myst_markdown_notebook(path.read_text(encoding="utf8"), path=path)


def output_lines(cell) -> int:
    """Lines of text a code cell shows in the page: streams and plain-text results (figures count 0).
    Cells tagged ``hide-output``/``remove-output`` (folded or hidden) show none in the reading flow."""
    tags = set(cell.get("metadata", {}).get("tags", []) or [])
    if tags & {"hide-output", "remove-output", "remove-cell", "hide-cell"}:
        return 0
    lines = 0
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            lines += "".join(out.get("text", "")).rstrip("\n").count("\n") + 1
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "text/plain" in data and not ({"image/png", "text/html"} & set(data)):
                lines += "".join(data["text/plain"]).rstrip("\n").count("\n") + 1
    return lines


def cmd_page(args) -> None:
    from nbclient import NotebookClient

    style = load_style()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    bad = False
    for name in args.pages:
        path = Path(name).resolve()
        if path.suffix != ".md" or not path.is_file():
            die(f"`{name}` is not a MyST Markdown page")
        text = path.read_text(encoding="utf8")
        nb = read_page(path)
        print(f"{path.relative_to(ROOT)}: {style.prose_words(text)} words of prose, "
              f"{sum(style.is_schematic(c) for c in nb.cells)} schematic(s)")
        for line, found, why in style.register_violations(text):
            bad = True
            print(f"  line {line}: {found!r} ({why})")
        if args.no_run:
            continue
        client = NotebookClient(nb, kernel_name=KERNEL, timeout=args.timeout, allow_errors=True,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
        for n, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            first = cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""
            if errors:
                bad = True
                print(f"  cell {n} failed ({first!r}): {errors[0]['ename']}: {errors[0]['evalue'][:300]}")
            if (lines := output_lines(cell)) > MAX_OUTPUT_LINES:
                bad = True
                print(f"  cell {n} shows {lines} lines of output ({first!r}): fold or summarise it")
    sys.exit(1 if bad else 0)


# ---------------------------------------------------------------------------
# slides
# ---------------------------------------------------------------------------

SLIDES_SRC = ROOT / "book" / "slides"
SLIDES_OUT = ROOT / "_build" / "html" / "slides"
SLIDES_STAMP = ".pathedu-slides"  # marks a folder this command wrote (and may therefore replace)
CHAPTER_RE = re.compile(r"book/ch(\d\d)_\w+")
# What the decks load, under book/offline/ (copied to <out>/lib/ with the same relative paths).
REVEAL_FILES = ["reveal.js/reveal.js", "reveal.js/reveal.css", "reveal.js/theme/white.css",
                "reveal.js/plugin/math/math.js", "reveal.js/plugin/notes/notes.js"]
SLIDE_LIB = ["reveal.js", "mathjax"]  # folders of book/offline/ that the decks need at run time
MATHJAX_URL = "lib/mathjax/tex-mml-chtml.js"
FIGURE_SCHEME = "fig:"  # ![alt](fig:NAME): a PNG drawn at build time by book/slides/figures.py


def _require_slide_assets() -> None:
    if not _assets_present() or not all((OFFLINE / f).is_file() for f in REVEAL_FILES + ["mathjax/tex-mml-chtml.js"]):
        die(f"the offline web assets (reveal.js, MathJax) are missing from {OFFLINE}: "
            "run `python book/tools.py assets` (or `bash .ci/book`) first")


def toc_files() -> list[str]:
    """Every ``file:`` (and the ``root``) of the jb-book ``_toc.yml``, in the book's order."""
    def walk(node):
        if isinstance(node, dict):
            for key in ("root", "file"):
                if key in node:
                    yield str(node[key])
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    return list(walk(read_yaml("_toc.yml")))


def toc_parts() -> dict[str, list[str]]:
    """``{caption: [docname, ...]}`` for every part of ``_toc.yml``, its chapters and their sections in order."""
    return {part["caption"]: [name for chapter in part["chapters"] for name in _walk_files(chapter)]
            for part in read_yaml("_toc.yml")["parts"]}


def _walk_files(node) -> list[str]:
    files = [str(node["file"])] if "file" in node else []
    for child in node.get("sections", []):
        files += _walk_files(child)
    return files


def part_one() -> list[str]:
    """The chapter pages of Part I (the dualities), in order: the part whose caption starts "Part I:"."""
    (caption,) = [c for c in toc_parts() if c.startswith("Part I:")]
    return [name for name in toc_parts()[caption] if CHAPTER_RE.fullmatch(name)]


def toc_chapters() -> list[tuple[str, str]]:
    """``[(NN, docname)]`` for every ``book/chNN_*`` file of ``_toc.yml``, in the book's order."""
    return [(m.group(1), name) for name in toc_files() if (m := CHAPTER_RE.fullmatch(name))]


def book_macros() -> dict:
    """The TeX macros of the book (``_config.yml``), so that slides and pages typeset alike."""
    return dict(read_yaml("_config.yml")["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"])


def split_deck(text: str) -> tuple[dict, list[tuple[str, str]]]:
    """A deck source -> ``(front matter, [(slide markdown, notes markdown)])``.

    Format: optional YAML front matter between ``---`` lines (``title``), then
    slides separated by lines that are exactly ``---``; in a slide, a line
    starting ``Note:`` begins the speaker notes (the rest of the slide).
    """
    import yaml

    meta = {}
    text = text.replace("\r\n", "\n")
    if text.startswith("---\n"):
        head, sep, text = text[4:].partition("\n---\n")
        if not sep:
            raise ValueError("front matter opened with `---` is never closed")
        meta = yaml.safe_load(head) or {}
    slides = []
    for chunk in re.split(r"^---[ \t]*$", text, flags=re.M):
        if not chunk.strip():
            continue
        body, *notes = re.split(r"^Note:[ \t]*", chunk, maxsplit=1, flags=re.M)
        slides.append((body.strip("\n"), notes[0].strip() if notes else ""))
    return meta, slides


def _markdown(figures: set):
    """markdown-it (CommonMark + tables + ``$``/``$$`` maths) that leaves TeX untouched for MathJax.

    Maths is emitted as ``\\( .. \\)`` / ``\\[ .. \\]`` with only ``& < >`` escaped, so
    no ``_`` or ``*`` inside a formula is ever read as emphasis.  Images must be
    ``fig:NAME`` (a figure drawn at build time, collected into ``figures``):
    a deck loads nothing else.
    """
    from markdown_it import MarkdownIt
    from markdown_it.common.utils import escapeHtml
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    md = MarkdownIt("commonmark", {"html": False, "typographer": False}).enable("table")
    md.use(dollarmath_plugin, double_inline=True)

    def inline(self, tokens, idx, options, env):
        return "\\(" + escapeHtml(tokens[idx].content) + "\\)"

    def block(self, tokens, idx, options, env):
        return '<div class="math">\\[' + escapeHtml(tokens[idx].content) + "\\]</div>\n"

    def image(self, tokens, idx, options, env):
        token = tokens[idx]
        src = token.attrGet("src") or ""
        if not src.startswith(FIGURE_SCHEME):
            raise ValueError(f"image `{src}`: a slide may only show a build-time figure `{FIGURE_SCHEME}NAME`")
        name = src[len(FIGURE_SCHEME):]
        figures.add(name)
        alt = escapeHtml(self.renderInlineAsText(token.children or [], options, env))
        return f'<img class="fig" src="fig/{escapeHtml(name)}.png" alt="{alt}">'

    for name in ("math_inline", "math_inline_double"):
        md.add_render_rule(name, inline)
    for name in ("math_block", "math_block_label"):
        md.add_render_rule(name, block)
    md.add_render_rule("image", image)
    return md


def render_slide(md, body: str, notes: str) -> str:
    """One ``<section>``.  A line ``||`` splits the slide into columns (a heading on the
    slide's first line stays above them); notes become ``<aside class="notes">``."""
    parts = re.split(r"^\|\|[ \t]*$", body, flags=re.M)
    head = ""
    if len(parts) > 1 and parts[0].lstrip().startswith("#"):
        head, _, parts[0] = parts[0].lstrip().partition("\n")
    if len(parts) > 1:
        inner = md.render(head) + '<div class="cols">' + "".join(
            f'<div class="col">\n{md.render(p)}</div>' for p in parts) + "</div>\n"
    else:
        inner = md.render(body)
    if notes:
        inner += f'<aside class="notes">\n{md.render(notes)}</aside>\n'
    return f"<section>\n{inner}</section>\n"


SLIDE_CSS = """:root { --r-main-font-size: 30px; --r-heading1-size: 1.9em; --r-heading2-size: 1.35em;
  --r-heading-text-transform: none; --r-heading-color: #1d3557; --r-link-color: #2a6f97; }
.reveal .slides section { text-align: left; }
.reveal .slides section:first-child, .reveal .slides section.title { text-align: center; }
.reveal h1, .reveal h2 { margin-bottom: 0.5em; }
.reveal ul, .reveal ol { display: block; margin-left: 1.1em; }
.reveal li { margin: 0.18em 0; }
.reveal p { margin: 0.45em 0; }
.reveal code { font-size: 0.85em; color: #6a3d9a; }
.reveal table { font-size: 0.8em; margin: 0.4em 0; }
.reveal table th, .reveal table td { padding: 0.2em 0.5em; }
.reveal .math { margin: 0.4em 0; }
.reveal mjx-container[display="true"] { margin: 0.3em 0 !important; }
.reveal .cols { display: flex; gap: 1.4em; align-items: flex-start; }
.reveal .cols > .col { flex: 1; min-width: 0; }
.reveal img.fig { display: block; margin: 0.2em auto; max-width: 100%; max-height: 440px; }
.reveal .small { font-size: 0.7em; color: #555; }
"""

DECK_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
<link rel="stylesheet" href="lib/reveal.js/reveal.css">
<link rel="stylesheet" href="lib/reveal.js/theme/white.css">
<style>
{css}</style>
</head>
<body>
<div class="reveal"><div class="slides">
{sections}</div></div>
<script src="lib/reveal.js/reveal.js"></script>
<script src="lib/reveal.js/plugin/math/math.js"></script>
<script src="lib/reveal.js/plugin/notes/notes.js"></script>
<script>
// Everything is local: MathJax is the copy under lib/ (the math plugin's default is a CDN).
Reveal.initialize({config});
Reveal.on("ready", function () {{ document.documentElement.dataset.totalSlides = Reveal.getTotalSlides(); }});
</script>
</body>
</html>
"""

INDEX_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>Slides: {book}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 46em; margin: 3em auto; padding: 0 1em; color: #222; }}
h1 {{ color: #1d3557; }} li {{ margin: 0.6em 0; }} .meta {{ color: #666; font-size: 0.9em; }}
</style>
</head>
<body>
<h1>Slides: {book}</h1>
<p>One reveal.js deck per chapter; everything they load sits in this folder, so they project with no network.
Keys: arrows to move, <kbd>S</kbd> for the speaker notes, <kbd>F</kbd> for full screen, <kbd>Esc</kbd> for an overview.</p>
<ol>
{items}</ol>
</body>
</html>
"""


def _deck_config(macros: dict) -> str:
    config = {
        "hash": True, "width": 1280, "height": 720, "margin": 0.04, "slideNumber": "c/t",
        "transition": "none", "center": False,
        "mathjax3": {
            "mathjax": MATHJAX_URL,
            "tex": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]], "macros": macros},
            # the notes stay plain text in the speaker view
            "options": {"ignoreHtmlClass": "notes"},
        },
    }
    text = json.dumps(config, indent=1)
    return text[:-1].rstrip() + ',\n "plugins": [RevealMath.MathJax3, RevealNotes]\n}'


def _load_figures():
    spec = importlib.util.spec_from_file_location("pathedu_slide_figures", SLIDES_SRC / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_slides(out: Path = SLIDES_OUT) -> list[Path]:
    """Write one deck per chapter of ``_toc.yml`` (``chNN.html``), ``index.html``, the
    figures (``fig/``) and the assets (``lib/``) into ``out``; return the decks' paths."""
    import html as html_lib

    _require_slide_assets()
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()) and not (out / SLIDES_STAMP).is_file():
        die(f"{out} exists and was not written by `python book/tools.py slides`: not replacing it")
    chapters = toc_chapters()
    if not chapters:
        die("_toc.yml lists no chapter `book/chNN_*`")
    sources = {p.stem: p for p in SLIDES_SRC.glob("ch[0-9][0-9].md")}
    missing = [f"book/slides/ch{nn}.md (for {doc})" for nn, doc in chapters if f"ch{nn}" not in sources]
    extra = sorted(set(sources) - {f"ch{nn}" for nn, _ in chapters})
    if missing or extra:
        die("every chapter of _toc.yml needs a deck and every deck a chapter: "
            + "; ".join([*(f"missing {m}" for m in missing), *(f"no chapter for book/slides/{e}.md" for e in extra)]))
    macros = book_macros()
    config = _deck_config(macros)
    stage = Path(tempfile.mkdtemp(prefix="pathedu-slides-"))  # nothing half-written ever sits in `out`
    stage.chmod(0o755)  # mkdtemp makes it private; a web server must read it
    try:
        for folder in SLIDE_LIB:
            shutil.copytree(OFFLINE / folder, stage / "lib" / folder)
        figures: dict[str, set] = {}
        decks, items = [], []
        for nn, doc in chapters:
            meta, slides = split_deck(sources[f"ch{nn}"].read_text(encoding="utf8"))
            if not slides:
                die(f"book/slides/ch{nn}.md has no slides")
            used: set = set()
            md = _markdown(used)
            try:
                sections = "".join(render_slide(md, body, notes) for body, notes in slides)
            except ValueError as err:
                die(f"book/slides/ch{nn}.md: {err}")
            for name in used:
                figures.setdefault(name, set()).add(f"ch{nn}")
            title = str(meta.get("title") or f"Chapter {int(nn)}")
            deck = stage / f"ch{nn}.html"
            deck.write_text(DECK_TEMPLATE.format(title=html_lib.escape(title), css=SLIDE_CSS, sections=sections,
                                                 config=config), encoding="utf8")
            decks.append(out / deck.name)
            items.append(f'<li><a href="ch{nn}.html">Chapter {int(nn)}: {html_lib.escape(title)}</a> '
                         f'<span class="meta">({len(slides)} slides; '
                         f'<a href="../{doc}.html">the chapter</a>)</span></li>\n')
        if figures:
            module = _load_figures()
            (stage / "fig").mkdir()
            for name in sorted(figures):
                draw = module.FIGURES.get(name)
                if draw is None:
                    die(f"figure `{name}` (used by {', '.join(sorted(figures[name]))}) is not in "
                        "book/slides/figures.py's FIGURES")
                draw(stage / "fig" / f"{name}.png")
        (stage / "index.html").write_text(INDEX_TEMPLATE.format(book=html_lib.escape(_book_title()),
                                                                items="".join(items)), encoding="utf8")
        (stage / SLIDES_STAMP).write_text("written by python book/tools.py slides\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(stage), str(out))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return decks


def _book_title() -> str:
    return str(read_yaml("_config.yml").get("title", "pathedu"))


def cmd_slides(args) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    decks = build_slides(Path(args.out))
    shown = decks[0].parent
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
    print(f"{len(decks)} slide decks in {shown}/: open {shown}/index.html")


# ---------------------------------------------------------------------------
# edition: the student edition (no solutions) and the instructor edition
# ---------------------------------------------------------------------------

EDITIONS = ("student", "instructor")
# What the book build reads from the repository: the configuration, the pages, the labs, the kernels that pages
# include with literalinclude.  book/offline (the assets) is linked, not copied.
EDITION_SOURCES = ("_config.yml", "_toc.yml", "book", "notebooks", "kernels")
SOLUTION_INFO = re.compile(r"\{(admonition|dropdown)\}\s*Solution\b")
SOLUTIONS_FOLDED = re.compile(r"Each\s+solution\s+is\s+folded\s+away.*?\.(?=\s|$)", re.S)
STUDENT_NOTE = "The solutions are in the instructor edition of this book."


def _page_blocks(text: str):
    """The top-level blocks of a MyST page as markdown-it tokens with line maps (front matter, colon fences)."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.colon_fence import colon_fence_plugin
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from mdit_py_plugins.front_matter import front_matter_plugin

    md = MarkdownIt("commonmark").use(front_matter_plugin).use(colon_fence_plugin).use(dollarmath_plugin)
    return [t for t in md.parse(text) if t.level == 0 and t.map is not None and t.nesting in (0, 1)]


def strip_solutions(text: str) -> tuple[str, int, int]:
    """A page without its problems' solutions: ``(text, solutions removed, check cells removed)``.

    Removed: every ``{admonition} Solution`` (or ``{dropdown} Solution``) block, the code cell right after it
    (the hidden cell that checks the solution), and the Problems introduction's sentence that says the solutions
    are folded away, which becomes :data:`STUDENT_NOTE`."""
    lines = text.splitlines(keepends=True)
    blocks = _page_blocks(text)
    drop, solutions, checks = set(), 0, 0
    for i, token in enumerate(blocks):
        if token.type in ("fence", "colon_fence") and SOLUTION_INFO.match(token.info.strip()):
            drop.update(range(*token.map))
            solutions += 1
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            if after is not None and after.type == "fence" and after.info.strip().startswith("{code-cell}"):
                drop.update(range(*after.map))
                checks += 1
    kept = "".join(line for n, line in enumerate(lines) if n not in drop)
    if solutions:
        kept = SOLUTIONS_FOLDED.sub(STUDENT_NOTE, kept)
    return re.sub(r"\n{3,}", "\n\n", kept), solutions, checks


def student_sources(dest: Path) -> dict:
    """Write the student edition's sources into ``dest`` (a copy of :data:`EDITION_SOURCES`, ``book/offline``
    linked): every page of ``book/`` through :func:`strip_solutions`, every notebook of ``notebooks/`` through
    :func:`pathedu.course.student_copy` (lesson outputs kept).  Returns ``{path: (solutions, checks)}`` for the
    pages and ``{path: solution cells}`` for the notebooks, relative to ``dest``."""
    from pathedu.course import is_solution, student_copy

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in EDITION_SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns(
                "offline", "__pycache__", ".ipynb_checkpoints", "_build"))
        else:
            shutil.copy2(src, dest / name)
    if OFFLINE.is_dir():
        (dest / "book" / "offline").symlink_to(OFFLINE, target_is_directory=True)
    removed = {}
    for page in sorted((dest / "book").glob("*.md")):
        text, solutions, checks = strip_solutions(page.read_text(encoding="utf8"))
        page.write_text(text, encoding="utf8")
        removed[page.relative_to(dest).as_posix()] = (solutions, checks)
    for path in sorted((dest / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf8"))
        path.write_text(json.dumps(student_copy(nb, keep_lesson_outputs=True), indent=1, ensure_ascii=False) + "\n",
                        encoding="utf8")
        removed[path.relative_to(dest).as_posix()] = sum(is_solution(c) for c in nb["cells"])
    return removed


def build_edition(edition: str, out: Path) -> Path:
    """Build ``edition`` (see the module docstring) into ``out``; returns the HTML folder."""
    if edition not in EDITIONS:
        raise ValueError(f"`edition` must be one of {', '.join(EDITIONS)}, got {edition!r}")
    _require_slide_assets()
    out = out.resolve()
    source = ROOT
    if edition == "student":
        source = out / "source"
        removed = student_sources(source)
        pages = sum(1 for v in removed.values() if isinstance(v, tuple) and v[0])
        print(f"student sources in {source}: the solutions of {pages} pages' problems and "
              f"{sum(v for v in removed.values() if isinstance(v, int))} lab solution cells removed")
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    command = [str(jupyter_book) if jupyter_book.is_file() else "jupyter-book", "build", str(source), "-W", "-n",
               "--keep-going", "--path-output", str(out)]
    if subprocess.run(command).returncode != 0:
        die(f"the {edition} edition's build failed (the log is above)")
    html = out / "_build" / "html"
    os.environ.setdefault("MPLBACKEND", "Agg")  # the slides' figures (not before: the pages show theirs inline)
    build_slides(html / "slides")
    return html


def cmd_edition(args) -> None:
    html = build_edition(args.edition, Path(args.out))
    print(f"{args.edition} edition in {html}: open {html / 'index.html'}")


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


SLIDES_LINK_CLASS = "pathedu-slides-link"


def chapter_slides_href(pagename: str) -> str | None:
    """The link from a chapter's built page to its deck, ``slides/chNN.html`` at the root of the HTML folder (where
    ``.ci/book`` and the editions build the decks), relative to the page; ``None`` for a page that is no chapter."""
    match = CHAPTER_RE.fullmatch(pagename)
    if match is None:
        return None
    return "../" * pagename.count("/") + f"slides/ch{match.group(1)}.html"


def _link_chapter_slides(app, pagename, templatename, context, doctree) -> None:
    """Put a "Slides for this chapter" link under the title of every chapter page (``book/chNN_*``)."""
    href = chapter_slides_href(pagename)
    body = context.get("body")
    if href is None or not body:
        return
    link = (f'<p class="{SLIDES_LINK_CLASS}"><a class="reference external" href="{href}">'
            "Slides for this chapter</a> (reveal.js; <kbd>S</kbd> opens the speaker notes)</p>\n")
    title = body.find("</h1>")
    at = title + len("</h1>") if title >= 0 else 0
    context["body"] = body[:at] + "\n" + link + body[at:]


def _build_slides_with_the_book(app, exception) -> None:
    """Build the decks into the HTML folder's ``slides/`` at the end of a successful HTML build, so that every
    build of the book (``jupyter-book build`` as well as ``.ci/book`` and the editions) carries the decks that its
    chapter pages link."""
    if exception is not None or app.builder.format != "html":
        return
    os.environ.setdefault("MPLBACKEND", "Agg")  # the decks' figures; the pages' own ran in their kernels
    try:
        decks = build_slides(Path(app.outdir) / "slides")
    except SystemExit as stop:  # build_slides reports a broken deck with die()
        raise RuntimeError(f"the slide decks could not be built: {stop}") from None
    print(f"{len(decks)} slide decks in {Path(app.outdir) / 'slides'}")


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


# The widget bundle (``embed-amd.js``) finds its icon fonts beside the URL that RequireJS gives its module id,
# ``@jupyter-widgets/html-manager/dist/...``, resolved against the page: a folder that does not exist.  A RequireJS
# configuration made before require.js loads (the global ``require`` object) maps that id to the folder where
# ``assets`` put the bundle and its fonts.  Pages with widgets are the labs, one folder below the book's root.
REQUIRE_PATHS = """var require = {paths: {"@jupyter-widgets/html-manager/dist": "../_static/jupyter-widgets"}};"""


def setup(app):
    app.add_js_file(None, body=REQUIRE_PATHS, priority=100)  # before require.js (priority 500)
    app.add_js_file(None, body=MATHJAX2_SHIM)
    app.connect("builder-inited", _require_assets)
    app.connect("html-page-context", _colab_only_for_notebooks, priority=900)  # after the theme's (501)
    app.connect("html-page-context", _link_chapter_slides)
    app.connect("build-finished", _build_slides_with_the_book)
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
    p = sub.add_parser("page", help="execute chapter pages and report what their readers would trip over")
    p.add_argument("pages", nargs="+", metavar="PAGE")
    p.add_argument("--no-run", action="store_true", help="read only: words, register, schematics")
    p.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds (default 600)")
    p.set_defaults(func=cmd_page)
    p = sub.add_parser("slides", help="build the chapters' reveal.js slide decks (needs the assets)")
    p.add_argument("--out", default=str(SLIDES_OUT), help="output folder (default _build/html/slides)")
    p.set_defaults(func=cmd_slides)
    p = sub.add_parser("edition", help="build the student edition (no solutions) or the instructor edition")
    p.add_argument("edition", choices=EDITIONS)
    p.add_argument("--out", required=True, help="output folder (the HTML goes to OUT/_build/html)")
    p.set_defaults(func=cmd_edition)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
