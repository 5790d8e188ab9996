"""Loads liblossfuse_torch.so, which registers the torch.ops.lossfuse kernels.

Looked up in $LOSSFUSE_LIBRARY, then next to this file (an installed package), then in the source tree's
build/python (a developer running from python/ with PYTHONPATH).
"""

import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_NAME = "liblossfuse_torch.so"
_CANDIDATES = [
    os.environ.get("LOSSFUSE_LIBRARY", ""),
    os.path.join(_HERE, _NAME),
    os.path.join(_HERE, "..", "..", "build", "python", "python", _NAME),
]
for _path in _CANDIDATES:
    if _path and os.path.exists(_path):
        break
else:
    raise ImportError(
        f"lossfuse: the compiled kernels ({_NAME}) were not found in {[p for p in _CANDIDATES if p]}; install the "
        "package with 'pip install --no-build-isolation .' from the project root"
    )
PATH = os.path.abspath(_path)
torch.ops.load_library(PATH)
