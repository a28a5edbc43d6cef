"""KV-cache sampling in PyTorch: prefill the prompts, then one token per row per step (softmax + multinomial,
temperature 1), under no_grad. Batch 8, prompt 32, 96 new tokens on the perf model, or `--model DIR` (see model.py)
with the sizes the bench passes.
Usage: sample.py THREADS ITERS [--model DIR] [--batch B] [--tokens PROMPT] [--new N] [--device cpu|cuda].
Prints one JSON line: {"threads", "msPerStep", "tokensPerSec", "matmulGflops", "cpuMsPerStep", "peakRssMb"}
(msPerStep: one decode step, i.e. one token for each row)."""
import sys

import torch

from model import device_from_flags, emit, flag, matmul_gflops, median_seconds, model_from_flags, pick_threads, sync

max_threads, iters = int(sys.argv[1]), int(sys.argv[2])
B, PROMPT, NEW = int(flag("batch", 8)), int(flag("tokens", 32)), int(flag("new", 96))
device = device_from_flags()
torch.manual_seed(0)
config, model = model_from_flags(device)
model.eval()
prompts = torch.randint(0, config["vocab"], (B, PROMPT), device=device)


@torch.no_grad()
def generate():
    h, cache = model.hidden(prompts)  # the head on the last position only, as effect-rl's sampler
    out = []
    for i in range(NEW):
        probs = torch.softmax(model.logits(h[:, -1]), dim=-1)  # [B, V]
        nxt = torch.multinomial(probs, 1)  # [B, 1]
        out.append(nxt)
        if i + 1 < NEW:
            h, cache = model.hidden(nxt, cache)
    out = torch.cat(out, 1)
    sync(device)
    return out


threads = pick_threads(max_threads, generate, device)
gflops = matmul_gflops(threads, device)
torch.set_num_threads(threads)
s, cpu = median_seconds(generate, iters, cpu=True)
emit(dict(threads=threads, msPerStep=s * 1000 / NEW, tokensPerSec=B * NEW / s, matmulGflops=gflops,
          cpuMsPerStep=cpu * 1000 / NEW))
