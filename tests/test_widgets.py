"""pathedu.widgets: precomputed explorers (the widgets of the static book).  The browser side is tested on the
built book (tests/test_book.py: moving a slider in headless Chromium changes the figure)."""
from __future__ import annotations

import io
import re

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from pathedu.widgets import MAX_FRAMES, MAX_WIDTH_PX, explore  # noqa: E402


def _draw(a, b=0.0):
    fig, ax = plt.subplots(figsize=(12, 3))  # wider than the column: the explorer must shrink it
    ax.plot([0, 1], [a, b])
    print(f"a={a} b={b}")
    plt.show()


def test_frames_cover_the_grid_in_row_major_order_with_the_printed_text():
    open_before = plt.get_fignums()  # figures another test in this process left open are not the explorer's
    e = explore(_draw, {"a": [1, 2, 3], "b": [0.5, 1.5]})
    assert len(e) == 6
    assert [f[0] for f in e.frames] == [{"a": a, "b": b} for a in (1, 2, 3) for b in (0.5, 1.5)]
    assert [f[2] for f in e.frames] == [f"a={a} b={b}" for a in (1, 2, 3) for b in (0.5, 1.5)]
    widths = {Image.open(io.BytesIO(png)).size[0] for _, png, _ in e.frames}
    assert max(widths) <= MAX_WIDTH_PX
    assert len({png for _, png, _ in e.frames}) == 6, "different values drew different figures"
    assert plt.get_fignums() == open_before, "the explorer closes the figures it drew"


def test_html_starts_at_the_initial_values_and_loads_nothing():
    e = explore(_draw, {"a": [1, 2, 3], "b": [0.5, 1.5]}, initial={"a": 2, "b": 1.5}, caption="cap")
    html = e._repr_html_()
    k0 = 1 * 2 + 1
    assert f'data-frame="{k0}"' in html
    assert html.count('type="range"') == 2 and 'max="2"' in html and 'max="1"' in html
    assert "a=2 b=1.5" in html and "cap" in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "nothing may come from the network"
    assert html == e._repr_html_(), "the same frames write the same HTML (stable ids)"
    assert repr(e) == "<static explorer: 6 frames (a: 3 values, b: 2 values)>"


@pytest.mark.parametrize("controls, initial, error, match", [
    ({}, None, ValueError, "non-empty"),
    ({"a": []}, None, ValueError, r"controls\['a'\] is empty"),
    ({"a": "abc"}, None, TypeError, r"controls\['a'\] must be a sequence"),
    ({"a": range(MAX_FRAMES + 1)}, None, ValueError, "frames"),
    ({"a": [1, 2]}, {"c": 1}, ValueError, "unknown controls"),
    ({"a": [1, 2]}, {"a": 3}, ValueError, r"initial\['a'\] = 3 is not one of its stops"),
])
def test_bad_controls_are_named(controls, initial, error, match):
    with pytest.raises(error, match=match):
        explore(_draw, controls, initial=initial)


def test_a_draw_function_that_draws_nothing_is_an_error():
    with pytest.raises(ValueError, match="opened no matplotlib figure"):
        explore(lambda a: None, {"a": [1]})
    with pytest.raises(TypeError, match="draw must be callable"):
        explore(3, {"a": [1]})
