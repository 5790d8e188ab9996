"""The CUDA calls' check policy and their host-sync count (lossfuse::CudaCheck, lossfuse::cuda_host_syncs)."""

import contextlib

import torch

from ._args import ArgumentError


_CUDA_CHECKS = {"report": 0, "nan": 1}


@contextlib.contextmanager
def cuda_check(mode):
    """How lossfuse's CUDA calls made by this thread in the block treat a bad value the CPU would name in an error (a
    class target out of range, a CTC length or label, a probability outside [0, 1], a negative variance):
    'report' (the default) reads back one 8-byte check record per call (one synchronisation) and raises the CPU's
    error, having written nothing; 'nan' reads no check record back, and the bad value's row (CTC: sample;
    elementwise: every output) is NaN, as under CUDA-graph capture (CTC's concatenated targets still bring their
    lengths to the host). For a training step that must not synchronise on inputs known good.
    The backward passes always run as 'nan': their forward checked the inputs. CPU calls always raise (their check
    costs no synchronisation). Set it outside a torch.compile'd function (the ops read it when they run). A forward
    run inside a backward on autograd's thread (a checkpoint's recomputation) has that thread's own setting."""
    if mode not in _CUDA_CHECKS:
        raise ArgumentError(f"lossfuse: cuda_check: mode: expected 'report' or 'nan', got {mode!r}")
    prev = torch.ops.lossfuse._cuda_check(_CUDA_CHECKS[mode])
    try:
        yield
    finally:
        torch.ops.lossfuse._cuda_check(prev)


def cuda_host_syncs():
    """The synchronising copies lossfuse's CUDA calls have made in this process (check records and bad values read
    back, host copies of device values): a diagnostic, such as for a training step meant to read nothing back."""
    return torch.ops.lossfuse._cuda_host_syncs()
