"""Loads liblossfuse_torch.so, which registers the torch.ops.lossfuse kernels, and gives torch.compile's caches a tag
of this build.

Looked up in $LOSSFUSE_LIBRARY, then next to this file (an installed package), then in the source tree's
build/python (a developer running from python/ with PYTHONPATH).
"""

import hashlib
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


def build_tag(package_dir, library):
    """A digest of one build of lossfuse: the Python sources under package_dir and the kernels' file (its size and
    modification time)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, package_dir).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    st = os.stat(library)
    digest.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return "lossfuse-" + digest.hexdigest()[:16]


def joined_tag(existing, tag):
    """torch.compiler.config.cache_key_tag with this build's tag added (a tag of another lossfuse build replaced; the
    caller's own tag kept)."""
    parts = [p for p in existing.split("+") if p and not p.startswith("lossfuse-")]
    return "+".join(parts + [tag])


# torch.compile's on-disk caches (Inductor's FX graph cache and the AOTAutograd cache, shared by later processes) key
# a graph by its ops, not by the Python that gives a custom op its fake outputs and its autograd formula. After
# lossfuse changes, a graph compiled against the previous build would be reused: outputs of the old dtypes (a runtime
# error), or the old backward formula (silently). The tag, part of every such cache key, gives each build of lossfuse
# caches of its own.
TAG = build_tag(_HERE, PATH)
torch.compiler.config.cache_key_tag = joined_tag(torch.compiler.config.cache_key_tag, TAG)
