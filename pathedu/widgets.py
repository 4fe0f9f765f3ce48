"""Widgets that work without a kernel: precomputed frames driven by a few lines of JavaScript.

The labs' live widgets (``ipywidgets.interact``) redraw a figure with Python every time a slider moves, so
in the static HTML book, where no Python runs, they would look alive and do nothing.  :func:`explore` calls
the same drawing function once for every combination of a few chosen slider values, keeps each figure as a
PNG, and returns an object that displays as HTML: one range input per control and an image that the inputs
switch between.  It needs nothing but the browser (no CDN, no kernel, no widget manager), so it works in the
built book, in Jupyter, in Colab and in a downloaded ``.html`` alike.

    explore(show, {"t": range(12)})                        # one slider, 12 frames
    explore(show, {"slope": [0.06, 0.25, 1], "content": [0, 1, 2]}, initial={"slope": 0.25})

``draw(**values)`` must draw with matplotlib (it may call ``plt.show()``, which is silenced while frames
are rendered) and may print: the text goes under the image.  The last figure it opens is kept.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import io
import itertools
import json
from collections.abc import Callable, Mapping, Sequence

__all__ = ["Explorer", "explore", "MAX_FRAMES"]

MAX_FRAMES = 64          # every frame is stored in the page: keep the grid small
MAX_WIDTH_PX = 680       # the book's content column is 688 px wide at a 1280 px window


class Explorer:
    """A grid of precomputed frames.  ``frames[k] = (values, png_bytes, text)``, ``k`` running over the
    grid in row-major order of ``controls`` (the last control varies fastest)."""

    def __init__(self, controls: dict, frames: list, initial: dict, caption: str | None):
        self.controls, self.frames, self.initial, self.caption = controls, frames, initial, caption

    def __len__(self) -> int:
        return len(self.frames)

    def __repr__(self) -> str:
        spans = ", ".join(f"{name}: {len(vals)} values" for name, vals in self.controls.items())
        return f"<static explorer: {len(self.frames)} frames ({spans})>"

    def _repr_html_(self) -> str:
        names = list(self.controls)
        labels = [[_label(v) for v in self.controls[n]] for n in names]
        start = [list(self.controls[n]).index(self.initial[n]) for n in names]
        pngs = [base64.b64encode(png).decode("ascii") for _, png, _ in self.frames]
        texts = [text for _, _, text in self.frames]
        # A stable id (a hash of the content) so that re-running a cell writes the same HTML.
        uid = "pe-" + hashlib.sha1("".join(pngs[:1] + texts + names).encode()).hexdigest()[:12]
        k0 = _flat(start, [len(lab) for lab in labels])
        rows = []
        for i, (name, labs) in enumerate(zip(names, labels)):
            rows.append(
                f'<label style="display:flex;align-items:center;gap:0.6em;margin:0.15em 0">'
                f'<span style="min-width:7em">{html.escape(name)}</span>'
                f'<input type="range" min="0" max="{len(labs) - 1}" step="1" value="{start[i]}" data-axis="{i}" '
                f'aria-label="{html.escape(name)}" style="flex:1;max-width:22em">'
                f'<output style="min-width:5em;font-family:monospace">{html.escape(labs[start[i]])}</output></label>')
        caption = (f'<div style="font-size:90%;color:#555">{html.escape(self.caption)}</div>'
                   if self.caption else "")
        first_text = html.escape(texts[k0])
        script = (
            "(function(){"
            f"var root=document.getElementById({json.dumps(uid)});"
            f"var frames={json.dumps(pngs)};var texts={json.dumps(texts)};var labels={json.dumps(labels)};"
            "var inputs=root.querySelectorAll('input[type=range]');"
            "var img=root.querySelector('img');var pre=root.querySelector('pre');"
            "function update(){var k=0;for(var a=0;a<inputs.length;a++){"
            "var v=parseInt(inputs[a].value,10);k=k*labels[a].length+v;"
            "inputs[a].nextElementSibling.textContent=labels[a][v];}"
            "img.src='data:image/png;base64,'+frames[k];img.setAttribute('data-frame',k);"
            "pre.textContent=texts[k];pre.style.display=texts[k]?'':'none';}"
            "for(var a=0;a<inputs.length;a++){inputs[a].addEventListener('input',update);}"
            "})();")
        return (f'<div class="pathedu-explorer" id="{uid}" style="max-width:100%">'
                f'{caption}{"".join(rows)}'
                f'<img src="data:image/png;base64,{pngs[k0]}" data-frame="{k0}" alt="precomputed figure" '
                f'style="max-width:100%;height:auto;display:block">'
                f'<pre style="white-space:pre-wrap;margin:0.3em 0;{"" if texts[k0] else "display:none"}">'
                f'{first_text}</pre><script>{script}</script></div>')


def _label(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _flat(index: Sequence[int], sizes: Sequence[int]) -> int:
    k = 0
    for i, n in zip(index, sizes):
        k = k * n + i
    return k


def _render(draw: Callable, values: dict, dpi_cap: float) -> tuple[bytes, str]:
    """Call ``draw(**values)`` with ``plt.show`` silenced; return its last figure as PNG, and what it printed."""
    import matplotlib.pyplot as plt

    before = set(plt.get_fignums())
    out = io.StringIO()
    show = plt.show
    plt.show = lambda *a, **k: None
    try:
        with contextlib.redirect_stdout(out):
            draw(**values)
    finally:
        plt.show = show
    new = [n for n in plt.get_fignums() if n not in before]
    if not new:
        raise ValueError(f"draw({values}) opened no matplotlib figure: the explorer has nothing to show")
    fig = plt.figure(new[-1])
    dpi = min(dpi_cap, MAX_WIDTH_PX / fig.get_figwidth())
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    for n in new:
        plt.close(n)
    return _shrink_png(buf.getvalue()), out.getvalue().rstrip("\n")


def _shrink_png(png: bytes) -> bytes:
    """Quantise to a 256-colour palette: the frames are stored in the page, and this makes them ~3x smaller."""
    try:
        from PIL import Image
    except ImportError:  # pillow comes with matplotlib; without it the PNG is kept as it is
        return png
    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def explore(draw: Callable, controls: Mapping[str, Sequence], *, initial: Mapping | None = None,
            caption: str | None = None, dpi: float = 100.0, progress: bool = False) -> Explorer:
    """Precompute ``draw(**values)`` on the grid ``controls`` and return an :class:`Explorer`.

    ``controls``: an ordered mapping ``name -> values`` (the keyword arguments of ``draw`` and the stops of
    each slider; at most :data:`MAX_FRAMES` combinations).  ``initial``: the values shown first (default:
    each control's first value; each must be one of the stops).  ``dpi``: the rendering resolution, lowered
    when needed so that no frame is wider than the book's column.
    """
    if not callable(draw):
        raise TypeError(f"draw must be callable, got {type(draw).__name__}")
    if not isinstance(controls, Mapping) or not controls:
        raise ValueError("controls must be a non-empty mapping name -> sequence of values")
    grid = {}
    for name, values in controls.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, range)):
            raise TypeError(f"controls[{name!r}] must be a sequence of values, got {type(values).__name__}")
        if len(values) == 0:
            raise ValueError(f"controls[{name!r}] is empty")
        grid[name] = list(values)
    total = 1
    for values in grid.values():
        total *= len(values)
    if total > MAX_FRAMES:
        raise ValueError(f"controls span {total} frames; at most {MAX_FRAMES} fit in a page: use fewer stops")
    initial = dict(initial or {})
    unknown = set(initial) - set(grid)
    if unknown:
        raise ValueError(f"initial names unknown controls {sorted(unknown)}; controls are {list(grid)}")
    for name, values in grid.items():
        initial.setdefault(name, values[0])
        if initial[name] not in values:
            raise ValueError(f"initial[{name!r}] = {initial[name]!r} is not one of its stops {values}")
    combos = list(itertools.product(*grid.values()))
    if progress:
        from tqdm.auto import tqdm
        combos = tqdm(combos, desc="precomputing frames")
    frames = []
    for combo in combos:
        values = dict(zip(grid, combo))
        png, text = _render(draw, values, dpi)
        frames.append((values, png, text))
    return Explorer(grid, frames, initial, caption)
