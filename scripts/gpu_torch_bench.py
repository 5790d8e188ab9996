"""torch's own cross-entropy on CUDA at the shapes of lossfuse_cuda_bench: eager forward, eager forward+backward and
torch.compile forward+backward (median of timed calls, triton.testing.do_bench); its elementwise losses' eager
forward+backward on the bench's 16M elements (reduction mean, the input's gradient); and its ctc_loss forward+backward at
the bench's CTC shapes, native and cuDNN (whose conditions: float32, blank 0, concatenated int32 targets and int32
lengths on the CPU, every input length T, labels <= 256). Where they import, the same cross-entropy steps through
Liger-Kernel's Triton kernel and through lossfuse's torch package, and the fused linear loss at (8192, 4096, 128256)
bf16 by Liger, lossfuse and torch's unfused linear + cross_entropy. Writes CSV rows in the bench's format
(pct_of_probe left empty) to the path given, and prints them. Run by scripts/gpu_check.sh."""
import csv
import importlib
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

SHAPES = [(32, 32000, torch.float32), (128, 32000, torch.float32), (32, 50257, torch.float32),
          (4096, 32000, torch.float32), (4096, 32000, torch.bfloat16), (8192, 32000, torch.bfloat16),
          (8192, 128256, torch.bfloat16), (16384, 131072, torch.bfloat16), (8192, 128256, torch.float32)]
COMPILED = {(8192, 32000, torch.bfloat16), (8192, 128256, torch.bfloat16), (16384, 131072, torch.bfloat16)}
CTC_SHAPES = [(200, 32, 64, 50), (1000, 64, 5000, 200)]  # (T, N, C, S), as lossfuse_cuda_bench


def ctc_rows():
    rows = []
    for T, N, C, S in CTC_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(1)
        lp = torch.randn(T, N, C, device="cuda", generator=gen).log_softmax(2).requires_grad_(True)
        targets = torch.randint(1, C, (N * S,), dtype=torch.int32, generator=torch.Generator().manual_seed(2))
        il = torch.full((N,), T, dtype=torch.int32)
        tl = torch.full((N,), S, dtype=torch.int32)

        def step(cudnn):
            lp.grad = None
            with torch.backends.cudnn.flags(enabled=cudnn):
                t = targets if cudnn else targets.to("cuda", torch.int64)
                F.ctc_loss(lp, t, il, tl, reduction="sum").backward()

        for mode, cudnn in (("torch_native_forward_backward", False), ("torch_cudnn_forward_backward", True)):
            ms = do_bench(lambda: step(cudnn), warmup=10, rep=200, return_mode="median")
            moved = 2 * lp.numel() * lp.element_size()
            rows.append(["ctc", N, C, "f32", f"{mode}_T{T}_S{S}", f"{ms * 1e3:.1f}", moved, f"{moved / ms / 1e6:.1f}",
                         ""])
            print(",".join(map(str, rows[-1])), flush=True)
    return rows


PW_ELEMENTS = 1 << 24


def pointwise_rows():
    """Each elementwise loss of lossfuse_cuda_bench (bench/pointwise_rows.hpp: N(0, 1) operands mapped into the loss's
    domain, reduction mean, default options), torch eager, float32 and bfloat16: forward+backward for the input's
    gradient, bytes as the bench's (k operands read, the gradient written)."""
    sig = torch.sigmoid
    losses = [  # name, operands from three N(0, 1) tensors (x, y, z), torch's call
        ("mse", lambda x, y, z: (x, y), F.mse_loss), ("l1", lambda x, y, z: (x, y), F.l1_loss),
        ("smooth_l1", lambda x, y, z: (x, y), F.smooth_l1_loss), ("huber", lambda x, y, z: (x, y), F.huber_loss),
        ("bce", lambda x, y, z: (sig(x), sig(y)), F.binary_cross_entropy),
        ("bce_with_logits", lambda x, y, z: (x, sig(y)), F.binary_cross_entropy_with_logits),
        ("kl_div", lambda x, y, z: (-x.abs() - 0.1, sig(y)), F.kl_div),
        ("poisson_nll", lambda x, y, z: (x, (2 * y.abs()).floor()), F.poisson_nll_loss),
        ("gaussian_nll", lambda x, y, z: (x, y, 0.5 + z.abs()), F.gaussian_nll_loss),
        ("hinge_embedding", lambda x, y, z: (x, torch.where(y >= 0, 1.0, -1.0)), F.hinge_embedding_loss),
        ("margin_ranking", lambda x, y, z: (x, y, torch.where(z >= 0, 1.0, -1.0)), F.margin_ranking_loss),
    ]
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(29)
    base = [torch.randn(PW_ELEMENTS, device="cuda", generator=gen) for _ in range(3)]
    for dt in (torch.float32, torch.bfloat16):
        name = "f32" if dt == torch.float32 else "bf16"
        for loss, make, fn in losses:
            ops = [o.to(dt) for o in make(*base)]
            x = ops[0].clone().requires_grad_(True)

            def step():
                x.grad = None
                fn(x, *ops[1:]).backward()

            try:
                ms = do_bench(step, warmup=20, rep=200, return_mode="median")
            except RuntimeError as e:  # a dtype torch's kernel lacks: noted, the others still run
                print(f"{loss},{name}: {e}", flush=True)
                continue
            moved = (len(ops) + 1) * x.numel() * x.element_size()
            rows.append([loss, 1, PW_ELEMENTS, name, "torch_eager_forward_backward", f"{ms * 1e3:.1f}", moved,
                         f"{moved / ms / 1e6:.1f}", ""])
            print(",".join(map(str, rows[-1])), flush=True)
    return rows


def optional(module):
    """The module, or None (printed) where it does not import: the GPU hosts may lack Liger or lossfuse's build."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        print(f"{module}: not timed ({type(e).__name__}: {e})", flush=True)
        return None


LIGER = optional("liger_kernel.ops")
LF = optional("lossfuse.nn.functional")
LINEAR = (8192, 4096, 128256)  # (N, H, V) bf16, as lossfuse_cuda_bench's fused linear loss


def fwd_bwd(x, t, loss=F.cross_entropy):
    x.grad = None
    loss(x, t).backward()


def liger_ce(x, t):  # its forward writes the gradient into x: timed last at each shape
    return LIGER.LigerCrossEntropyFunction.apply(x, t, None)[0]


def linear_rows():
    n, h, v = LINEAR
    gen = torch.Generator(device="cuda").manual_seed(41)
    x = (torch.randn(n, h, device="cuda", generator=gen) * 0.5).bfloat16().requires_grad_(True)
    w = (torch.randn(v, h, device="cuda", generator=gen) * 0.02).bfloat16().requires_grad_(True)
    t = torch.randint(0, v, (n,), device="cuda", generator=gen)
    cases = [("torch_unfused_forward_backward", lambda: F.cross_entropy((x @ w.t()).float(), t))]
    if LF is not None:
        cases.append(("lossfuse_forward_backward", lambda: LF.linear_cross_entropy(x, w, t)))
    if LIGER is not None:
        cases.append(("liger_forward_backward", lambda: LIGER.LigerFusedLinearCrossEntropyFunction.apply(x, w, t)[0]))
    rows = []
    for mode, loss in cases:
        def step():
            x.grad = w.grad = None
            loss().backward()

        torch.cuda.reset_peak_memory_stats()
        ms = do_bench(step, warmup=5, rep=100, return_mode="median")
        peak = torch.cuda.max_memory_allocated()
        rows.append(["linear_cross_entropy", n, v, "bf16", f"{mode}_H{h}_peak{peak >> 20}MiB", f"{ms * 1e3:.1f}",
                     "", "", ""])
        print(",".join(map(str, rows[-1])), flush=True)
    return rows


def main(path):
    rows = []
    compiled_loss = torch.compile(lambda x, t: F.cross_entropy(x, t), fullgraph=True)

    def compiled_step(x, t):
        x.grad = None
        compiled_loss(x, t).backward()

    for n, c, dt in SHAPES:
        x = (torch.rand(n, c, device="cuda", dtype=torch.float32) * 4 - 2).to(dt).requires_grad_(True)
        t = torch.randint(0, c, (n,), device="cuda")
        nbytes = x.numel() * x.element_size()
        name = str(dt).removeprefix("torch.").replace("float32", "f32").replace("bfloat16", "bf16")
        cases = [("torch_eager_forward", lambda: F.cross_entropy(x.detach(), t), nbytes),
                 ("torch_eager_forward_backward", lambda: fwd_bwd(x, t), 2 * nbytes)]
        if (n, c, dt) in COMPILED:
            cases.append(("torch_compile_forward_backward", lambda: compiled_step(x, t), 2 * nbytes))
            if LF is not None:
                cases.append(("lossfuse_torch_forward_backward", lambda: fwd_bwd(x, t, LF.cross_entropy), 2 * nbytes))
            if LIGER is not None:
                cases.append(("liger_forward_backward", lambda: fwd_bwd(x, t, liger_ce), 2 * nbytes))
        for mode, fn, moved in cases:
            ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
            rows.append(["cross_entropy", n, c, name, mode, f"{ms * 1e3:.1f}", moved, f"{moved / ms / 1e6:.1f}", ""])
            print(",".join(map(str, rows[-1])), flush=True)
        del x, t
        torch.cuda.empty_cache()
    rows += linear_rows()
    rows += pointwise_rows()
    rows += ctc_rows()
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
