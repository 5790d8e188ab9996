"""Trains a small Llama-style causal LM (about 50M parameters, vocabulary 128256, built from its config: no download)
on synthetic text twice from the same start, once with transformers' own loss and once with
lossfuse.integrations.transformers, each in its own process, and reports per-step time, the step's peak memory and
both loss curves.

    .venv/bin/python examples/python/finetune_llama.py --steps 200 --out docs/examples/finetune  # + .csv, .md, .png

The text: a fixed random Markov chain over 2048 token ids spread over the vocabulary (each has 8 likely successors), so
the loss falls from ln(128256) through ln(2048) towards the chain's entropy (about 1.5). Step peak memory: the
process's resident size, sampled every millisecond during each step, above its size before the step (the parameters,
their gradients, the optimizer's state and the batch are resident already); the largest over the timed steps. Time:
the median of the timed steps (the first steps warm up and are not timed).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=3, help="steps not timed")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--hidden", type=int, default=320)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", help="write OUT.csv (per step), OUT.md (summary); OUT.png with matplotlib")
    p.add_argument("--variant", choices=["transformers", "lossfuse"], help=argparse.SUPPRESS)
    return p.parse_args()


class RssPeak:
    """The largest resident set size seen by a thread sampling /proc/self/statm every millisecond while active."""

    def __init__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak, self.running = 0, True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def rss(self):
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self):
        while self.running:
            self.peak = max(self.peak, self.rss())
            time.sleep(0.001)

    def reset(self):
        self.peak = self.rss()
        return self.peak


def markov_batches(args, torch):
    """Token batches from a fixed Markov chain on 2048 ids: token i is followed by one of succ[i] (8 ids)."""
    g = torch.Generator().manual_seed(1234)
    active = torch.randperm(args.vocab, generator=g)[:2048]
    succ = active[torch.randint(0, len(active), (args.vocab, 8), generator=g)]
    probs = torch.tensor([0.5, 0.2, 0.1, 0.08, 0.05, 0.04, 0.02, 0.01])
    for _ in range(args.steps):
        ids = torch.empty(args.batch, args.seq, dtype=torch.long)
        ids[:, 0] = active[torch.randint(0, len(active), (args.batch,), generator=g)]
        choice = torch.multinomial(probs, args.batch * args.seq, replacement=True, generator=g).view(args.batch, -1)
        for t in range(1, args.seq):
            ids[:, t] = succ[ids[:, t - 1], choice[:, t]]
        yield ids


def train(args):
    import torch
    import transformers
    if args.threads:
        torch.set_num_threads(args.threads)
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                      intermediate_size=args.hidden * 27 // 10, num_hidden_layers=args.layers,
                                      num_attention_heads=args.hidden // 64 or 1,
                                      num_key_value_heads=args.hidden // 64 or 1, max_position_embeddings=args.seq,
                                      tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    if args.variant == "lossfuse":
        import lossfuse.integrations.transformers as lft
        lft.apply(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = RssPeak()
    rows = []
    for step, ids in enumerate(markov_batches(args, torch)):
        before = sampler.reset()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # gradients stay resident: the step peak is what the step adds
        seconds = time.perf_counter() - start
        rows.append(dict(step=step, loss=loss.item(), seconds=seconds, peak_bytes=sampler.peak - before))
        if step % 10 == 9 or step + 1 == args.steps:
            print(f"{args.variant}: step {step + 1}/{args.steps}, loss {rows[-1]['loss']:.4f}, {seconds:.2f} s",
                  file=sys.stderr, flush=True)
    sampler.running = False
    params = sum(p.numel() for p in model.parameters())
    return dict(variant=args.variant, params=params, threads=torch.get_num_threads(), torch=torch.__version__,
                transformers=transformers.__version__, rows=rows)


def run_variant(args, variant):
    cmd = [sys.executable, __file__, "--variant", variant] + [
        f"--{k}={v}" for k, v in vars(args).items() if k not in ("variant", "out") and v is not None]
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)  # progress: stderr, passed through
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(args, results):
    timed = {r["variant"]: r["rows"][args.warmup:] or r["rows"] for r in results}
    med = {v: statistics.median(x["seconds"] for x in rows) for v, rows in timed.items()}
    peak = {v: max(x["peak_bytes"] for x in rows) for v, rows in timed.items()}
    a, b = (r["rows"] for r in results)
    diff = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
    lines = [f"{results[0]['params'] / 1e6:.1f}M parameters, vocabulary {args.vocab}, batch {args.batch} x {args.seq} "
             f"tokens, {args.steps} steps, AdamW, float32, {results[0]['threads']} threads; torch "
             f"{results[0]['torch']}, transformers {results[0]['transformers']}", "",
             "| loss computed by | median step (s) | step peak memory (MiB) | first loss | last loss |",
             "|---|---|---|---|---|"]
    for r in results:
        v, rows = r["variant"], r["rows"]
        lines.append(f"| {v} | {med[v]:.3f} | {peak[v] / 2**20:.0f} | {rows[0]['loss']:.4f} | {rows[-1]['loss']:.4f} |")
    lines += ["", f"lossfuse / transformers: step time {med['lossfuse'] / med['transformers']:.2f}x, step peak memory "
              f"{peak['lossfuse'] / peak['transformers']:.2f}x; largest relative loss difference over the run "
              f"{diff:.1e} (ln({args.vocab}) = {math.log(args.vocab):.2f})"]
    return "\n".join(lines)


def write(args, results, summary):
    with open(args.out + ".csv", "w") as f:
        f.write("variant,step,loss,seconds,peak_bytes\n")
        for r in results:
            for x in r["rows"]:
                f.write(f"{r['variant']},{x['step']},{x['loss']:.7g},{x['seconds']:.5f},{x['peak_bytes']}\n")
    with open(args.out + ".md", "w") as f:
        f.write(summary + "\n")
    try:
        import matplotlib
    except ImportError:
        print("finetune_llama: no matplotlib (pip install matplotlib): no plot", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.8))
    for r, style in zip(results, ("-", "--")):
        steps = [x["step"] for x in r["rows"]]
        ax1.plot(steps, [x["loss"] for x in r["rows"]], style, label=r["variant"])
        ax2.plot(steps, [x["seconds"] for x in r["rows"]], style, label=r["variant"])
        ax3.plot(steps, [x["peak_bytes"] / 2**20 for x in r["rows"]], style, label=r["variant"])
    for ax, title in ((ax1, "loss"), (ax2, "step time (s)"), (ax3, "step peak memory (MiB)")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)


def main():
    args = parse()
    if args.variant:
        print(json.dumps(train(args)))
        return
    results = [run_variant(args, v) for v in ("transformers", "lossfuse")]
    summary = summarize(args, results)
    print(summary)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        write(args, results, summary)


if __name__ == "__main__":
    main()
