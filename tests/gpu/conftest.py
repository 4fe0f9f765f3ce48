"""GPU-only tests: run on the device machine with `python -m pytest tests/gpu -o addopts=""`.

They are not collected by the default test command (testpaths excludes this
folder), so CI on a CPU machine neither runs nor skips them.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/helpers.py

if not torch.cuda.is_available():
    raise pytest.UsageError("tests/gpu needs a CUDA GPU (run it on the device machine)")
