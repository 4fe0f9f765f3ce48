"""The slide decks: one per chapter, built by ``python book/tools.py slides``, projecting with no network.

The decks are built once for this module into a temporary folder, exactly as the
command line builds them (the book's ``.ci/book`` runs the same command into
``_build/html/slides``).  They need the offline assets that ``python book/tools.py
assets`` fetches from npm (reveal.js and MathJax, in ``book/offline/``): without
them the fixture fetches them first, as the book's tests do, so the tests that build
decks are ``integration`` (network on a fresh clone).  The last test opens a deck in headless Chromium (``integration``).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import helpers
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf8"))
REMOTE = re.compile(r"^(https?:)?//", re.I)
FORM = re.compile(r"`(\w+_(?:naive|recurrent|matrix|blockwise|chunked|triton))`")


tools = helpers.load_book_tools()
CHAPTERS = tools.toc_chapters()  # [(NN, docname)] in _toc.yml's order


class _Tags(HTMLParser):
    """Every start tag as ``(tag, attrs)``, plus the text of inline scripts."""

    def __init__(self):
        super().__init__()
        self.tags, self.scripts, self._in_script = [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.scripts.append(data)


def _parse(path: Path) -> _Tags:
    parser = _Tags()
    parser.feed(path.read_text(encoding="utf8"))
    return parser


def _loaded(parser: _Tags) -> list[str]:
    """What the page loads: ``<script src>``, ``<link href>``, ``<img src>``."""
    refs = []
    for tag, attrs in parser.tags:
        key = {"script": "src", "link": "href", "img": "src"}.get(tag)
        if key and attrs.get(key):
            refs.append(attrs[key])
    return refs


def _css_refs(css: Path) -> list[str]:
    text = css.read_text(encoding="utf8", errors="replace")
    refs = re.findall(r"url\(\s*['\"]?([^'\")]+)['\"]?\s*\)", text)
    refs += re.findall(r"@import\s+['\"]([^'\"]+)['\"]", text)
    return [r for r in refs if not r.startswith("data:")]


@pytest.fixture(scope="module")
def slides(tmp_path_factory) -> Path:
    """Build the decks once (seconds: figures are drawn with pathedu); return the output folder."""
    if not tools._assets_present():  # a fresh clone: fetch them as the book's build does (npm, network)
        assets = subprocess.run([sys.executable, str(ROOT / "book" / "tools.py"), "assets"],
                                capture_output=True, text=True, timeout=600)
        assert assets.returncode == 0, assets.stdout + assets.stderr
    out = tmp_path_factory.mktemp("slides") / "slides"
    proc = subprocess.run([sys.executable, str(ROOT / "book" / "tools.py"), "slides", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _decks(slides: Path) -> list[Path]:
    return [slides / f"ch{nn}.html" for nn, _ in CHAPTERS]


@pytest.mark.integration  # needs the npm assets (network on a fresh clone)
def test_one_deck_per_chapter_in_toc_order(slides):
    assert [nn for nn, _ in CHAPTERS] == [f"{n:02d}" for n in range(1, len(CHAPTERS) + 1)]
    assert len(CHAPTERS) >= 7, "chapters 1 to 8 are in _toc.yml"
    sources = sorted(p.stem for p in (ROOT / "book" / "slides").glob("ch*.md"))
    assert sources == [f"ch{nn}" for nn, _ in CHAPTERS], "book/slides/chNN.md: one per chapter, no other"
    for deck in _decks(slides):
        assert deck.is_file(), f"{deck.name} was not built"
    index = (slides / "index.html").read_text(encoding="utf8")
    links = re.findall(r'href="(ch\d\d\.html)"', index)
    assert links == [f"ch{nn}.html" for nn, _ in CHAPTERS], "index.html lists the decks in the book's order"
    for _, doc in CHAPTERS:  # and links each chapter's page of the built book
        assert f'href="../{doc}.html"' in index


@pytest.mark.integration  # needs the npm assets (network on a fresh clone)
def test_every_deck_has_slides_maths_and_notes(slides):
    for deck in _decks(slides):
        text = deck.read_text(encoding="utf8")
        sections = text.count("<section>")
        assert sections >= 8, f"{deck.name}: {sections} slides, want at least 8"
        assert text.count('<aside class="notes">') >= 1, f"{deck.name}: no speaker notes"
        assert text.count("\\[") >= 3, f"{deck.name}: fewer than 3 displayed equations"
        assert "$" not in re.sub(r"<script.*?</script>", "", text, flags=re.S), \
            f"{deck.name}: a `$` was left unconverted (MathJax reads only \\( \\) and \\[ \\])"


@pytest.mark.integration  # needs the npm assets (network on a fresh clone)
def test_nothing_is_loaded_from_the_network(slides):
    pages = sorted(slides.glob("*.html"))
    assert len(pages) == len(CHAPTERS) + 1
    for page in pages:
        parser = _parse(page)
        for ref in _loaded(parser):
            assert not REMOTE.match(ref), f"{page.name} loads {ref}"
        for script in parser.scripts:
            assert not re.search(r"https?://|cdn\.jsdelivr|cdnjs|unpkg", script), f"{page.name}: {script[:200]}"
    for css in slides.rglob("*.css"):
        for ref in _css_refs(css):
            assert not REMOTE.match(ref), f"{css.relative_to(slides)} loads {ref}"


@pytest.mark.integration  # needs the npm assets (network on a fresh clone)
def test_every_referenced_local_file_exists(slides):
    seen_css = set()
    for page in sorted(slides.glob("ch*.html")):
        refs = _loaded(_parse(page))
        assert any(r.endswith("reveal.js/reveal.js") for r in refs), page.name
        for ref in refs:
            target = (page.parent / ref.split("#")[0].split("?")[0]).resolve()
            assert target.is_file(), f"{page.name} references {ref}, which is not in the build"
            assert target.is_relative_to(slides.resolve()), f"{page.name}: {ref} lies outside the slides folder"
            if target.suffix == ".css":
                seen_css.add(target)
    stack = list(seen_css)
    while stack:  # the theme imports its fonts' stylesheet, which loads the font files
        css = stack.pop()
        for ref in _css_refs(css):
            target = (css.parent / ref.split("#")[0].split("?")[0]).resolve()
            assert target.is_file(), f"{css.relative_to(slides)} references {ref}, which is not in the build"
            if target.suffix == ".css" and target not in seen_css:
                seen_css.add(target)
                stack.append(target)


def _reveal_config(page: Path) -> str:
    text = page.read_text(encoding="utf8")
    match = re.search(r"Reveal\.initialize\((\{.*?\})\);", text, re.S)
    assert match, f"{page.name}: no Reveal.initialize"
    return match.group(1)


@pytest.mark.integration  # needs the npm assets (network on a fresh clone)
def test_math_plugin_points_at_the_local_mathjax_with_the_book_macros(slides):
    for page in _decks(slides):
        config = _reveal_config(page)
        assert re.search(r'"plugins":\s*\[RevealMath\.MathJax3, RevealNotes\]', config), page.name
        data = json.loads(re.sub(r',\s*"plugins":\s*\[[^\]]*\]', "", config))
        url = data["mathjax3"]["mathjax"]
        assert not REMOTE.match(url) and (page.parent / url).is_file(), f"{page.name}: MathJax at {url}"
        assert url.endswith("mathjax/tex-mml-chtml.js")
        fonts = (page.parent / url).parent / "output" / "chtml" / "fonts" / "woff-v2"
        assert any(fonts.glob("*.woff")), "MathJax's fonts were not shipped with the decks"
        assert data["mathjax3"]["tex"]["macros"] == CONFIG["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]
        assert data["mathjax3"]["tex"]["inlineMath"] == [["\\(", "\\)"]]


@pytest.mark.integration  # needs the npm assets (network on a fresh clone)
def test_figures_are_drawn_at_build_time_not_committed(slides):
    figures = sorted(p.name for p in (slides / "fig").glob("*.png"))
    assert figures, "no figure was drawn"
    for deck in _decks(slides):
        for ref in re.findall(r'<img[^>]*src="([^"]+)"', deck.read_text(encoding="utf8")):
            assert ref.startswith("fig/") and ref.endswith(".png"), f"{deck.name}: {ref}"
    tracked = subprocess.run(["git", "ls-files", "book/slides"], cwd=ROOT, capture_output=True, text=True).stdout
    assert not re.search(r"\.(png|jpe?g|svg|gif)$", tracked, re.M), "book/slides/ must not commit images"


def test_maths_survives_markdown():
    """``_`` and ``*`` inside formulas are not emphasis; ``$`` becomes MathJax's delimiters."""
    figures = set()
    md = tools._markdown(figures)
    html = tools.render_slide(md, "## T\n\nsum $\\sum_{s=j+1}^{i} a_s * b_s$ and `x_naive`\n\n$$\nA_{ij} < B_{ij}\n$$\n\n"
                              "![alt](fig:ch01_decay)", "say $x$")
    assert "\\(\\sum_{s=j+1}^{i} a_s * b_s\\)" in html
    assert "\\[\nA_{ij} &lt; B_{ij}\n\\]" in html
    assert '<img class="fig" src="fig/ch01_decay.png" alt="alt">' in html and figures == {"ch01_decay"}
    assert '<aside class="notes">' in html and "<em>" not in html
    with pytest.raises(ValueError, match="fig:NAME"):
        tools.render_slide(md, "![x](https://example.org/x.png)", "")
    meta, slides = tools.split_deck("---\ntitle: T\n---\n\n# A\n\nNote:\nn\n\n---\n\n## B\n")
    assert meta == {"title": "T"} and slides == [("# A", "n"), ("## B", "")]


def test_macros_used_in_the_decks_are_defined():
    macros = set(CONFIG["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"])
    for path in sorted((ROOT / "book" / "slides").glob("ch*.md")):
        used = set(re.findall(r"\\(v[a-z]|m[A-Z])(?![A-Za-z])", path.read_text(encoding="utf8")))
        assert used <= macros, f"{path.name} uses undefined macros {sorted(used - macros)}"


def test_functions_named_on_slides_exist():
    """Every form a slide names (``x_naive`` ... ``x_triton``) is a public function of pathedu."""
    import pathedu  # noqa: F401
    from pathedu import alibi, cope, fox, nope, path, pathfox, rope, stickbreaking

    modules = (nope, alibi, fox, rope, path, pathfox, stickbreaking, cope)
    for src in sorted((ROOT / "book" / "slides").glob("ch*.md")):
        for name in set(FORM.findall(src.read_text(encoding="utf8"))):
            assert any(callable(getattr(m, name, None)) for m in modules), f"{src.name} names `{name}`"


def test_slides_stop_with_the_fix_when_assets_are_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(tools, "OFFLINE", tmp_path / "offline")
    with pytest.raises(SystemExit, match=r"python book/tools\.py assets"):
        tools.build_slides(tmp_path / "slides")
    assert not (tmp_path / "slides").exists()


@pytest.mark.integration  # needs the npm assets (network on a fresh clone)
def test_slides_refuse_to_replace_a_foreign_folder(tmp_path, slides):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    with pytest.raises(SystemExit, match="not replacing"):
        tools.build_slides(foreign)
    assert (foreign / "keep.txt").is_file()


@pytest.mark.integration
def test_a_deck_renders_offline_in_chromium(slides):
    """Headless Chromium opens chapter 1's deck from disk, with background networking off: reveal.js
    starts (it records ``Reveal.getTotalSlides()`` on its ``ready`` event) and MathJax typesets."""
    deck = _decks(slides)[0]
    proc = subprocess.run([helpers.chromium_path(), *helpers.CHROMIUM_FLAGS, "--window-size=1280,720",
                           "--virtual-time-budget=15000", "--dump-dom", deck.as_uri()],
                          capture_output=True, text=True, timeout=180)
    dom = proc.stdout
    assert proc.returncode == 0 and "<html" in dom, proc.stderr[-2000:]
    total = re.search(r'data-total-slides="(\d+)"', dom)
    assert total and int(total.group(1)) >= 8, "reveal.js did not start"
    assert int(total.group(1)) == deck.read_text(encoding="utf8").count("<section>")
    assert "<mjx-container" in dom, "MathJax did not typeset the deck"
    assert "<mjx-merror" not in dom, "MathJax reported a TeX error"


@pytest.mark.integration
def test_no_slide_is_taller_than_the_slide(slides):
    """Every slide of every deck fits reveal.js's slide (its configured height) once MathJax has typeset it:
    nothing is cut at the bottom, as a projector would cut it."""
    too_tall = []
    with helpers.browser_page(1280, 720) as page:
        for deck in _decks(slides):
            page.goto(deck.as_uri())
            page.wait_for_function("() => window.Reveal && Reveal.isReady()", timeout=30000)
            page.wait_for_function("() => !window.MathJax || (MathJax.startup && MathJax.startup.promise)",
                                   timeout=30000)
            page.evaluate("() => MathJax.startup.promise")
            heights = page.evaluate("""() => {
                const limit = Reveal.getConfig().height;
                return Reveal.getSlides().map((s, n) => {
                    Reveal.slide(...Object.values(Reveal.getIndices(s)));
                    return [n + 1, s.scrollHeight, limit, (s.querySelector('h1,h2,h3') || {}).textContent || ''];
                });
            }""")
            too_tall += [f"{deck.name} slide {n} ({title.strip()[:40]!r}): {h} px > {limit}"
                         for n, h, limit, title in heights if h > limit + 1]
    assert not too_tall, "\n".join(too_tall)


def test_every_chapter_page_gets_a_link_to_its_deck():
    """The book's Sphinx hook puts one link under each chapter's title, to ``slides/chNN.html`` beside the pages'
    folder (where ``.ci/book`` and the editions build the decks); other pages get none."""
    import posixpath

    assert CHAPTERS, "_toc.yml lists no chapter"
    for nn, doc in CHAPTERS:
        context = {"body": f'<section id="x">\n<h1>Title {nn}<a class="headerlink" href="#x">#</a></h1>\n<p>text</p>'}
        tools._link_chapter_slides(None, doc, "page.html", context, None)
        body = context["body"]
        links = re.findall(r'<p class="' + tools.SLIDES_LINK_CLASS + r'"><a [^>]*href="([^"]+)"', body)
        assert len(links) == 1, f"{doc}: {len(links)} slide links"
        target = posixpath.normpath(posixpath.join(posixpath.dirname(doc), links[0]))
        assert target == f"slides/ch{nn}.html", f"{doc} links {links[0]}, which is {target}"
        assert body.index("</h1>") < body.index(tools.SLIDES_LINK_CLASS) < body.index("<p>text"), "under the title"
    for page in ("book/teaching", "book/intro", "notebooks/01_nope_linear_lab"):
        context = {"body": "<h1>T</h1>"}
        tools._link_chapter_slides(None, page, "page.html", context, None)
        assert context["body"] == "<h1>T</h1>", page


def test_the_book_build_builds_the_decks_only_after_a_good_html_build(monkeypatch, tmp_path):
    """The Sphinx hook builds the decks into ``<outdir>/slides`` when an HTML build succeeds, and not otherwise."""
    built = []
    monkeypatch.setattr(tools, "build_slides", lambda out: built.append(out) or [out / "ch01.html"])
    html = SimpleNamespace(builder=SimpleNamespace(format="html"), outdir=str(tmp_path))
    tools._build_slides_with_the_book(html, RuntimeError("the build failed"))
    tools._build_slides_with_the_book(SimpleNamespace(builder=SimpleNamespace(format="latex"), outdir="x"), None)
    assert built == []
    tools._build_slides_with_the_book(html, None)
    assert built == [tmp_path / "slides"]
    monkeypatch.setattr(tools, "build_slides", lambda out: tools.die("book/slides/ch99.md has no slides"))
    with pytest.raises(RuntimeError, match="ch99"):
        tools._build_slides_with_the_book(html, None)


def test_every_lab_is_named_on_its_chapters_deck():
    """A chapter with a lab in _toc.yml names the lab's notebook on its deck, and every notebook a deck names exists."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf8"))
    labs_of = {}
    for part in toc["parts"]:
        for entry in part["chapters"]:
            labs_of[entry["file"]] = [s["file"] for s in entry.get("sections", []) if s["file"].startswith("notebooks/")]
    for nn, doc in CHAPTERS:
        deck = (ROOT / "book" / "slides" / f"ch{nn}.md").read_text(encoding="utf8")
        for lab in labs_of.get(doc, []):
            assert f"`{lab}.ipynb`" in deck, f"book/slides/ch{nn}.md does not name its lab {lab}.ipynb"
        for named in re.findall(r"`(notebooks/[\w.]+\.ipynb)`", deck):
            assert (ROOT / named).is_file(), f"book/slides/ch{nn}.md names {named}, which does not exist"
