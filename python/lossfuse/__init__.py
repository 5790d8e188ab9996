"""lossfuse: fast, memory-frugal loss functions for PyTorch, forward and backward.

`lossfuse.nn.functional` mirrors `torch.nn.functional`'s losses (same signatures, defaults and results) and
`lossfuse.nn` its loss modules; `lossfuse.patch_torch()` routes torch's functional losses to lossfuse;
`lossfuse.distributed.vocab_parallel_cross_entropy` takes logits split over the vocabulary across ranks. The
kernels are registered as torch custom ops under `torch.ops.lossfuse`. A bad argument raises
`lossfuse.ArgumentError`, both a ValueError and a RuntimeError (torch raises one or the other, depending on the
loss and the argument); a bad class index raises IndexError.
"""

import collections as _collections

import torch as _torch

from . import _library  # noqa: F401  (loads the kernels before anything registers against them)
# the family modules register their ops' fakes and autograd on import
from . import _cross_entropy, _pointwise, _margin, _ctc, _linear_cross_entropy  # noqa: F401
from . import nn
from . import distributed
from ._args import ArgumentError
from ._vmap import register_vmap_rules as _register_vmap_rules
from ._patch import patch_torch, unpatch_torch
from ._cuda import cuda_check, cuda_host_syncs

_register_vmap_rules()  # after every op above is defined

__all__ = [
    "nn", "distributed", "patch_torch", "unpatch_torch", "empty_cache", "ArgumentError", "cache_key_tag", "catalog",
    "CatalogEntry", "cuda_check", "cuda_host_syncs",
]
__version__ = "0.1.0"

# This build's digest, added to torch.compiler.config.cache_key_tag at import (see _library): include it in a tag set
# after importing lossfuse.
cache_key_tag = _library.TAG


def empty_cache():
    """Unmaps the output blocks lossfuse keeps for reuse (the last freed gradients of 1 MiB or more; at most four), as
    torch.cuda.empty_cache() does for torch's CUDA cache. LOSSFUSE_KEEP_BLOCK=0 keeps none."""
    _torch.ops.lossfuse._empty_cache()


CatalogEntry = _collections.namedtuple("CatalogEntry", ["loss", "dtype", "device", "direction"])


def catalog():
    """Every (loss, dtype, device, direction) the kernels implement, as the C++ catalog lists them (`lossfuse catalog`
    prints the same): a list of CatalogEntry, e.g. CatalogEntry('cross_entropy', 'float32', 'cpu', 'forward').
    direction is 'forward', 'backward' or 'forward_backward' (loss and gradient in one pass)."""
    lines = _torch.ops.lossfuse._catalog().splitlines()
    return [CatalogEntry(*line.split(",")) for line in lines[1:]]
