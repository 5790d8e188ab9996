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
    """A digest of one build of lossfuse: the contents of the Python sources under package_dir and of the kernels'
    file (about 8 ms for the latter), the same for every install of one build. Hidden files and folders (an editor's
    lock files) and files that cannot be read are left out: the digest never fails."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(f for f in files if f.endswith(".py") and not f.startswith(".")):
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as f:
                    content = f.read()
            except OSError:
                continue
            digest.update(os.path.relpath(path, package_dir).encode() + b"\0" + content)
    digest.update(b"\0kernels\0")
    try:
        with open(library, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        pass
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
# caches of its own. It is set once, here: a caller who sets cache_key_tag after importing lossfuse replaces it, and
# should include lossfuse.cache_key_tag in the new value.
TAG = build_tag(_HERE, PATH)
torch.compiler.config.cache_key_tag = joined_tag(torch.compiler.config.cache_key_tag, TAG)
