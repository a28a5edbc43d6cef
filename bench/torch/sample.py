"""KV-cache sampling with the perf model in PyTorch: batch 8, prompt 32, 96 new tokens, temperature 1 (softmax +
multinomial per step), under no_grad. Usage: sample.py THREADS ITERS [--config FILE] [--batch B] [--tokens PROMPT]
[--new N] [--device cpu|cuda]. Prints one JSON line:
{"threads", "msPerStep", "tokensPerSec", "matmulGflops", "cpuMsPerStep"} (msPerStep: one decode step, i.e. one token for each row)."""
import sys

import torch

from model import Model, config_from_flags, device_from_flags, emit, flag, matmul_gflops, median_seconds, pick_threads, sync

max_threads, iters = int(sys.argv[1]), int(sys.argv[2])
B, PROMPT, NEW = int(flag("batch", 8)), int(flag("tokens", 32)), int(flag("new", 96))
config, device = config_from_flags(), device_from_flags()
torch.manual_seed(0)
model = Model(config).to(device).eval()
prompts = torch.randint(0, config["vocab"], (B, PROMPT), device=device)


@torch.no_grad()
def generate():
    logits, cache = model(prompts)
    out = []
    for _ in range(NEW):
        probs = torch.softmax(logits[:, -1], dim=-1)
        nxt = torch.multinomial(probs, 1)  # [B, 1]
        out.append(nxt)
        logits, cache = model(nxt, cache)
    out = torch.cat(out, 1)
    sync(device)
    return out


threads = pick_threads(max_threads, generate, device)
gflops = matmul_gflops(threads, device)
torch.set_num_threads(threads)
s, cpu = median_seconds(generate, iters, cpu=True)
emit(dict(threads=threads, msPerStep=s * 1000 / NEW, tokensPerSec=B * NEW / s, matmulGflops=gflops, cpuMsPerStep=cpu * 1000 / NEW))
