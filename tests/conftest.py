import os
import sys

# Make tests/helpers.py importable as `helpers` from every test module.
sys.path.insert(0, os.path.dirname(__file__))

import pathedu  # noqa: E402,F401  (applies the device policy before any kernel is defined)
import torch  # noqa: E402

# xdist already runs one worker per core; a second torch thread per worker only
# contends (small loop-heavy reference forms ran ~20x slower with it).
torch.set_num_threads(1)
