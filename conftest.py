"""Repository-wide pytest hooks, loaded for every test path (``notebooks/`` included).

The nbval items (one per notebook cell) are collected from ``notebooks/``, outside
``tests/``, so the hook that marks them lives here rather than in ``tests/conftest.py``.
"""
import pytest


def pytest_collection_modifyitems(config, items):
    """Every notebook cell (an nbval item) is an ``integration`` test: out of the fast loop
    ``python -m pytest -m "not integration"``, still run by CI (``.ci/run`` runs everything)."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.integration)
