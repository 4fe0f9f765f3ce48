"""The package's front door: every chapter module is an attribute of ``pathedu``, loaded lazily."""
import subprocess
import sys

import pytest

import pathedu

CHAPTERS = ["nope", "alibi", "fox", "rope", "path", "pathfox"]


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_modules_are_attributes(name):
    """What readers type: ``import pathedu; pathedu.path.path_matrix``."""
    module = getattr(pathedu, name)
    assert module.__name__ == f"pathedu.{name}"
    assert name in dir(pathedu)
    for form in module.__all__:
        assert callable(getattr(module, form)) or not form.islower()


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'not_a_chapter'"):
        pathedu.not_a_chapter  # noqa: B018


def test_import_pathedu_loads_no_chapter_module():
    """``import pathedu`` stays cheap: chapter modules (and matplotlib, sympy) load on first use."""
    code = ("import sys, pathedu; "
            "print(sorted(m for m in sys.modules if m.startswith('pathedu.') or m in ('matplotlib', 'sympy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['pathedu._device']", out
    code = "import pathedu; pathedu.path.path_matrix; import sys; print('pathedu.path' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "True"
