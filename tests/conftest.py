import os
import sys

# Make tests/helpers.py importable as `helpers` from every test module.
sys.path.insert(0, os.path.dirname(__file__))

import pathedu  # noqa: E402,F401  (applies the device policy before any kernel is defined)
