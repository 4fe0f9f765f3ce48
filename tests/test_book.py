"""The book: it builds strictly, renders maths and widgets offline, and launches the labs on Colab.

The whole book is built once for this module, exactly as ``.ci/book`` builds it
(``python book/tools.py assets``, then ``jupyter-book build <repo> -W -n
--keep-going``), into a temporary folder that also holds the execution cache.
The other tests read the HTML it produced.  The last tests exercise
``book/tools.py`` itself (sync, assets, the Sphinx hooks) without a build.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml

import helpers
import pathedu

# A minute or more of work and the network (npm assets): out of the fast loop `-m "not integration"`.
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf8"))
LAB = "notebooks/01_nope_linear_lab"
CHAPTER = "book/ch01_nope_linear"
CLOSING = "book/ch08_six_dualities"  # the closing chapter of Part I: the six dualities side by side, no lab
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


tools = helpers.load_book_tools()


TOC_FILES = tools.toc_files()


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    """Build the whole book once (about a minute on CI); return its ``_build/html``."""
    out = tmp_path_factory.mktemp("book")
    assets = subprocess.run([sys.executable, str(ROOT / "book" / "tools.py"), "assets"],
                            capture_output=True, text=True, timeout=600)
    assert assets.returncode == 0, assets.stdout + assets.stderr
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    assert jupyter_book.is_file(), f"jupyter-book is not installed next to {sys.executable}"
    build = subprocess.run([str(jupyter_book), "build", str(ROOT), "-W", "-n", "--keep-going",
                            "--path-output", str(out)], capture_output=True, text=True, timeout=1800)
    log = build.stdout + build.stderr
    assert build.returncode == 0, "the book build failed:\n" + log[-8000:]
    assert (out / "_build" / ".jupyter_cache").is_dir(), "the execution cache must live under the build output"
    return out / "_build" / "html"


def _page(html: Path, docname: str) -> str:
    path = html / f"{docname}.html"
    assert path.is_file(), f"{path.relative_to(html)} was not built"
    return path.read_text(encoding="utf8")


def _script_tags(text: str) -> list[str]:
    return re.findall(r"<script\b[^>]*>", text)


def test_every_toc_entry_is_a_page(html):
    assert CHAPTER in TOC_FILES and LAB in TOC_FILES
    for docname in TOC_FILES:
        _page(html, docname)
    assert (html / "index.html").is_file()


def test_no_script_is_loaded_from_the_network(html):
    pages = sorted(html.rglob("*.html"))
    assert len(pages) >= len(TOC_FILES)
    for page in pages:
        for tag in _script_tags(page.read_text(encoding="utf8")):
            src = re.search(r'\bsrc="([^"]*)"', tag)
            if src:
                assert not re.match(r"(https?:)?//", src.group(1)), f"{page.relative_to(html)} loads {tag}"
            # e.g. the MathJax/require.js/embed defaults of Sphinx and myst-nb
            assert not re.search(r"cdn\.jsdelivr|cdnjs|unpkg", tag), f"{page.relative_to(html)}: {tag}"


def test_maths_uses_the_local_mathjax_and_the_book_macros(html):
    mathjax = html / "_static" / "mathjax" / "tex-mml-chtml.js"
    fonts = html / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    assert mathjax.is_file() and any(fonts.glob("*.woff")), "MathJax was not shipped with the build"
    for docname in ("book/intro", "book/notation", CHAPTER):
        text = _page(html, docname)
        assert re.search(r'<script[^>]*src="\.\./_static/mathjax/tex-mml-chtml\.js', text), docname
        config = re.search(r"window\.MathJax = (\{.*?\})</script>", text, re.S)
        assert config, f"{docname}: no MathJax configuration"
        macros = json.loads(config.group(1))["tex"]["macros"]
        assert macros == CONFIG["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]
        assert {"vq", "vk", "vv", "mS", "softmax"} <= set(macros)


def _lab_docnames() -> list[str]:
    """Notebooks in the toc that have a live widget (an ``interact(`` cell)."""
    names = []
    for docname in TOC_FILES:
        path = ROOT / f"{docname}.ipynb"
        if path.is_file():
            nb = nbformat.read(path, as_version=4)
            if any(c.cell_type == "code" and "interact(" in c.source for c in nb.cells):
                names.append(docname)
    return names


def test_widget_pages_show_a_static_explorer_not_an_inert_widget(html):
    """A live widget needs Python: in the static book its output is hidden (tag ``remove-output``) and the
    precomputed explorer under it (``pathedu.widgets.explore``) is what the reader moves."""
    docnames = _lab_docnames()
    assert LAB in docnames and len(docnames) >= 6, docnames
    for docname in docnames:
        text = _page(html, docname)
        assert 'class="pathedu-explorer"' in text, f"{docname}: no precomputed explorer"
        assert not _interact_views(text), f"{docname}: a live widget's view is shown but cannot redraw"


def _interact_views(text: str) -> list[str]:
    """The model ids of the ``interact`` widgets (sliders and their output) whose views a page shows.  Other
    widget views, such as a finished tqdm progress bar, show their final state and stay."""
    shown = set(re.findall(rf'<script type="{re.escape(WIDGET_VIEW)}">\{{"model_id": "(\w+)"', text))
    state = re.search(r'<script type="application/vnd\.jupyter\.widget-state\+json">(.*?)</script>', text, re.S)
    assert state or not shown, "widget views without the widget state"
    models = json.loads(state.group(1))["state"] if state else {}
    return [m for m in shown if "widget-interact" in models.get(m, {}).get("state", {}).get("_dom_classes", [])]


def test_moving_a_slider_changes_the_figure_in_chromium(html):
    """Headless Chromium, no kernel, no network: every explorer's every slider, moved with the keyboard as a
    reader would, shows another frame."""
    with helpers.browser_page() as page:
        for docname in _lab_docnames():
            page.goto((html / f"{docname}.html").as_uri())
            explorers = page.locator(".pathedu-explorer")
            assert explorers.count() >= 1, docname
            for e in range(explorers.count()):
                explorer = explorers.nth(e)
                img = explorer.locator("img")
                sliders = explorer.locator("input[type=range]")
                for s in range(sliders.count()):
                    slider = sliders.nth(s)
                    before = (img.get_attribute("src"), img.get_attribute("data-frame"),
                              slider.locator("xpath=following-sibling::output").inner_text())
                    key = "ArrowLeft" if slider.input_value() == slider.get_attribute("max") else "ArrowRight"
                    slider.focus()
                    page.keyboard.press(key)
                    after = (img.get_attribute("src"), img.get_attribute("data-frame"),
                             slider.locator("xpath=following-sibling::output").inner_text())
                    where = f"{docname}, explorer {e}, slider {s}"
                    assert after[1] != before[1], f"{where}: the frame did not change"
                    assert after[2] != before[2], f"{where}: the value shown did not change"
                    # Two frames may look alike (a slider that only matters elsewhere), never all of them.
                    page.keyboard.press("ArrowLeft" if key == "ArrowRight" else "ArrowRight")
                    assert img.get_attribute("data-frame") == before[1], f"{where}: moving back did not restore"


def test_figures_are_numbered_and_shown_near_their_natural_width(html):
    """At a 1280 px window no figure is shrunk below 0.75 of its natural width (small text stays legible),
    every figure has a numbered caption, and no output box scrolls sideways (long messages wrap)."""
    problems = []
    with helpers.browser_page(1280, 900) as page:
        for docname in TOC_FILES:
            page.goto((html / f"{docname}.html").as_uri())
            page.wait_for_load_state("load")
            sizes = page.evaluate("""() => Array.from(document.querySelectorAll('article img'))
                .filter(i => i.naturalWidth > 0)
                .map(i => [i.clientWidth, i.naturalWidth, (i.getAttribute('src') || '').slice(-24)])""")
            problems += [f"{docname}: {shown}/{natural} px ({src})" for shown, natural, src in sizes
                         if shown < 0.75 * natural]
            bare = page.evaluate("""() => Array.from(document.querySelectorAll('article .cell_output img'))
                .filter(i => !i.closest('.pathedu-explorer'))
                .filter(i => !(i.closest('figure') && i.closest('figure').querySelector('figcaption .caption-number')))
                .map(i => (i.getAttribute('src') || '').slice(-24))""")
            problems += [f"{docname}: a figure without a numbered caption ({src})" for src in bare]
            wide = page.evaluate("""() => Array.from(document.querySelectorAll('article .cell_output pre'))
                .filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.textContent.slice(0, 60))""")
            problems += [f"{docname}: output scrolls sideways: {text!r}" for text in wide]
    assert not problems, "\n".join(problems)


def _typeset(page) -> None:
    """Wait until MathJax (if the page loads it) has typeset the page."""
    if page.evaluate("() => !!window.MathJax"):
        page.wait_for_function("() => MathJax.startup && MathJax.startup.promise", timeout=30000)
        page.evaluate("() => MathJax.startup.promise")


def test_pages_fit_their_column_and_request_no_missing_file(html):
    """A student's view at 1280 px: no table and no display equation is wider than the text column (a scroll bar
    hides its right part), no text output longer than ``MAX_OUTPUT_LINES`` lines sits in the reading flow (fold or
    summarise it), and no page asks for a file the build does not have."""
    problems = []
    with helpers.browser_page(1280, 900) as page:
        failed = []
        page.on("requestfailed", lambda request: failed.append(request.url))
        for docname in TOC_FILES:
            failed.clear()
            page.goto((html / f"{docname}.html").as_uri())
            page.wait_for_load_state("load")
            _typeset(page)
            wide = page.evaluate("""() => {
                const art = document.querySelector('article.bd-article');
                const style = getComputedStyle(art);
                const column = art.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
                const out = [];
                for (const t of art.querySelectorAll('table')) {
                    const w = t.getBoundingClientRect().width;
                    if (w > column + 1) out.push(['a table', w, column, t.textContent]);
                }
                for (const m of art.querySelectorAll('mjx-container[display="true"]')) {
                    const math = m.querySelector('mjx-math');
                    const w = math ? math.getBoundingClientRect().width : m.scrollWidth;
                    if (w > column + 1) out.push(['an equation', w, column, m.textContent]);
                }
                return out;
            }""")
            problems += [f"{docname}: {what} {w:.0f} px wide in a {column:.0f} px column: {text.strip()[:60]!r}"
                         for what, w, column, text in wide]
            long = page.evaluate("""() => Array.from(document.querySelectorAll('article .cell_output pre'))
                .filter(p => p.getClientRects().length > 0 && !p.closest('.pathedu-explorer'))
                .map(p => [p.textContent.replace(/\\n+$/, '').split('\\n').length, p.textContent.slice(0, 60)])""")
            problems += [f"{docname}: an output of {n} lines in the reading flow: {text!r}" for n, text in long
                         if n > tools.MAX_OUTPUT_LINES]
            problems += [f"{docname}: requests a missing file {url}" for url in failed]
    assert not problems, "\n".join(problems)


def test_colab_button_opens_the_lab_notebook(html):
    owner, repo = CONFIG["repository"]["url"].rstrip("/").split("/")[-2:]
    branch = CONFIG["repository"]["branch"]
    want = f"https://colab.research.google.com/github/{owner}/{repo}/blob/{branch}/{LAB}.ipynb"
    links = set(re.findall(r'href="(https://colab\.research\.google\.com/[^"]*)"', _page(html, LAB)))
    assert links == {want}
    # MyST Markdown pages get no Colab button (Colab cannot open a .md file).
    for docname in TOC_FILES:
        if (ROOT / f"{docname}.md").is_file():
            assert "colab.research.google.com" not in _page(html, docname), docname


def test_install_cell_is_not_in_the_book(html):
    for docname in _lab_docnames() + [LAB]:
        text = _page(html, docname)
        assert "%pip install" not in text and tools.INSTALL_MARKER not in text, docname


def test_front_pages(html):
    text = _page(html, "book/how_to_use")
    assert f"Triton mode: {pathedu.triton_mode()}" in text  # the page was executed on this machine
    assert "git clone " + CONFIG["repository"]["url"] in re.sub(r"<[^>]+>", "", text)
    # The landing page links every chapter of the three parts, in the toc's order.
    intro = _page(html, "book/intro")
    chapters = [name for name in TOC_FILES if re.fullmatch(r"book/ch\d\d_\w+", name)]
    assert CHAPTER in chapters and CLOSING in chapters and len(chapters) >= 18
    positions = []
    for name in chapters:
        link = f'href="{name.split("/")[1]}.html"'
        assert link in intro, name
        positions.append(intro.index(link))
    assert positions == sorted(positions), "the landing page lists the chapters in the book's order"


def test_notation_macros_used_are_defined():
    """MathJax shows an undefined macro in red without failing the build: check the book's own ones."""
    macros = set(CONFIG["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"])
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf8") for p in (ROOT / "book").glob("*.md")}
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        texts[path.relative_to(ROOT).as_posix()] = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for name, text in texts.items():
        used = set(re.findall(r"\\(v[a-z]|m[A-Z])(?![A-Za-z])", text))
        assert used <= macros, f"{name} uses undefined macros {sorted(used - macros)}: add them to _config.yml"


# ---------------------------------------------------------------------------
# book/tools.py without a build
# ---------------------------------------------------------------------------

def test_sync_inserts_rewrites_and_is_idempotent():
    url, branch = tools.read_repository()
    assert url == CONFIG["repository"]["url"].rstrip("/")
    source = tools.install_source(url, branch)
    assert f'"pathedu @ git+{url}@{branch}"' in source

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    assert tools.sync_notebook(nb, source)
    assert [c.source for c in nb.cells] == [source, "x = 1"]
    assert nb.cells[0].metadata.tags == ["remove-cell"]
    assert not tools.sync_notebook(nb, source)

    stale = source.replace(url, "https://github.com/someone/else")
    nb.cells[0].source = stale
    cell_id = nb.cells[0].id
    assert tools.sync_notebook(nb, source)
    assert nb.cells[0].source == source and nb.cells[0].id == cell_id and len(nb.cells) == 2
    nbformat.validate(nb)


def test_sync_check_passes_on_the_committed_notebooks():
    proc = subprocess.run([sys.executable, str(ROOT / "book" / "tools.py"), "sync", "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_assets_fail_clearly_without_npm(tmp_path, monkeypatch):
    monkeypatch.setattr(tools, "OFFLINE", tmp_path / "offline")
    monkeypatch.setattr(tools.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="`npm` was not found"):
        tools.cmd_assets(SimpleNamespace(force=False))


def test_build_stops_with_the_fix_when_assets_are_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(tools, "OFFLINE", tmp_path / "offline")
    app = SimpleNamespace(builder=SimpleNamespace(format="html"))
    with pytest.raises(RuntimeError, match=r"python book/tools\.py assets"):
        tools._require_assets(app)


def test_colab_button_is_dropped_from_markdown_pages_only():
    def context():
        colab = {"type": "link", "text": "Colab", "url": "https://colab.research.google.com/x"}
        binder = {"type": "link", "text": "Binder", "url": "https://mybinder.org/x"}
        return {"header_buttons": [{"label": "launch-buttons", "buttons": [colab, binder]}]}

    env = SimpleNamespace(all_docs={"a": 0, "b": 0}, doc2path=lambda name: f"/src/{name}.{'md' if name == 'a' else 'ipynb'}")
    app = SimpleNamespace(env=env)
    md, ipynb = context(), context()
    tools._colab_only_for_notebooks(app, "a", "page.html", md, None)
    tools._colab_only_for_notebooks(app, "b", "page.html", ipynb, None)
    assert [b["text"] for b in md["header_buttons"][0]["buttons"]] == ["Binder"]
    assert [b["text"] for b in ipynb["header_buttons"][0]["buttons"]] == ["Colab", "Binder"]


def test_every_slide_link_resolves_and_every_chapter_links_its_deck(html):
    """The book build writes the decks into ``slides/``; every link to a deck in the built pages reaches a file of
    the build; every chapter page links its own deck (under its title), and the teaching page links every deck and
    the decks' index."""
    assert (html / "slides" / tools.SLIDES_STAMP).is_file(), "the book build did not build the slide decks"
    chapters = tools.toc_chapters()
    assert len(chapters) >= 18
    broken, linked = [], {}
    for page in sorted(html.rglob("*.html")):
        rel = page.relative_to(html)
        if rel.parts[0] in ("slides", "_static", "_sources"):
            continue
        for href in re.findall(r'href="([^"#?]*slides/[^"#?]*)', page.read_text(encoding="utf8")):
            target = (page.parent / href).resolve()
            if not target.is_file():
                broken.append(f"{rel}: {href}")
            linked.setdefault(rel.with_suffix("").as_posix(), set()).add(target)
    assert not broken, "links to files the build does not have:\n" + "\n".join(broken)
    decks = {(html / "slides" / f"ch{nn}.html").resolve() for nn, _ in chapters}
    for nn, doc in chapters:
        own = (html / "slides" / f"ch{nn}.html").resolve()
        assert own in linked.get(doc, set()), f"{doc} does not link its deck slides/ch{nn}.html"
        text = _page(html, doc)
        assert text.count(tools.SLIDES_LINK_CLASS) == 1, f"{doc}: want one 'Slides for this chapter' link"
    teaching = linked.get("book/teaching", set())
    assert decks <= teaching, f"the teaching page misses {sorted(p.name for p in decks - teaching)}"
    assert (html / "slides" / "index.html").resolve() in teaching, "the teaching page does not link the index"


@pytest.mark.integration
def test_the_student_editions_html_holds_no_solution(html, tmp_path_factory):
    """A full build of the student edition (minutes: every page executes), after the book's own build (the ``html``
    fixture: one build at a time): no solution admonition, no cell tagged ``solution``, no solution cell's text; the
    problems and the labs' exercises are there."""
    out = tmp_path_factory.mktemp("student-edition")
    proc = subprocess.run([tools.sys.executable, str(ROOT / "book" / "tools.py"), "assets"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([tools.sys.executable, str(ROOT / "book" / "tools.py"), "edition", "student", "--out",
                           str(out)], capture_output=True, text=True, timeout=3600)
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line or "Error" in line]
    assert proc.returncode == 0, "\n".join(warnings[:40]) + "\n...\n" + (proc.stdout + proc.stderr)[-3000:]
    html = out / "_build" / "html"
    pages = sorted(html.rglob("*.html"))
    assert len(pages) >= len(tools.toc_files())
    for page in pages:
        text = page.read_text(encoding="utf8")
        assert "tag_solution" not in text, page
        assert not re.search(r'class="admonition-title">\s*Solution', text), page
        assert "# Solution." not in text, page
    chapter = (html / "book" / "ch01_nope_linear.html").read_text(encoding="utf8")
    assert "Problem 1.1" in chapter and tools.STUDENT_NOTE in chapter
    lab = (html / "notebooks" / "01_nope_linear_lab.html").read_text(encoding="utf8")
    assert "check_linear_matrix" in lab and "NotImplementedError" in lab
    assert (html / "slides" / "index.html").is_file()
