"""Past 2^31 elements through the PyTorch binding: cross-entropy forward+backward in bfloat16 on (16400, 131072)
logits (2^31 + 2^21 elements; 8.6 GB with the gradient): the summed loss against float64, and the gradient of the
first rows and of the rows past element 2^31 against float64 torch. Row r is the base row rolled by 13 r, so every
row has one log-sum-exp and a wrapped offset shows as another row's values (tests/large/ holds the C++ side and the
mutation that fails it)."""

import os

import pytest
import torch
import torch.nn.functional as F

import lossfuse.nn.functional as LF

ROWS, CLASSES, SHIFT = 16400, 131072, 13


def float64_grad(logits, target, rows):
    ref = logits.detach()[rows].double().requires_grad_()
    (grad,) = torch.autograd.grad(F.cross_entropy(ref, target[rows], reduction="sum"), ref)
    return grad


def available_gib():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/meminfo") or available_gib() < 12,
                    reason="needs 12 GiB of free memory (the logits and their gradient: 8.6 GB)")
def test_cross_entropy_past_2_to_31_elements():
    assert ROWS * CLASSES > 2**31
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(CLASSES, generator=g, dtype=torch.float64) * 3).to(torch.bfloat16)
    logits = torch.empty(ROWS, CLASSES, dtype=torch.bfloat16)
    for r in range(ROWS):
        logits[r] = torch.roll(base, -((SHIFT * r) % CLASSES))
    target = (torch.arange(ROWS, dtype=torch.int64) * 7919) % CLASSES
    logits.requires_grad_()
    loss = LF.cross_entropy(logits, target, reduction="sum")
    (grad,) = torch.autograd.grad(loss, logits)
    want = (torch.logsumexp(base.double(), 0) - logits.detach().gather(1, target[:, None]).double()).sum()
    assert abs(loss.double().item() - want.item()) <= 2**-8 * want.item()  # the bf16 loss's rounding
    for rows in (slice(0, 2), slice(16380, ROWS)):  # 16384 x 131072 = 2^31
        torch.testing.assert_close(grad[rows].double(), float64_grad(logits, target, rows), rtol=2**-8, atol=1e-9)
