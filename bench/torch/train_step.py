"""Train step in PyTorch: forward + backward + Adam on −mean token log-prob (the same loss as effect-rl's
LogProbs.ofSequences: position 0 counts as log-prob 0, the head runs on positions 0 … T−2). Batch 8 × 128 tokens of
the perf model, or `--model DIR` (see model.py) with the batch and length the bench passes.
Usage: train_step.py THREADS ITERS [--model DIR] [--batch B] [--tokens T] [--device cpu|cuda] [--lora-rank R]
[--gradient-checkpointing]. With --lora-rank only the adapters train (Adam over them alone).
Prints one JSON line: {"threads", "msPerStep", "tokensPerSec", "matmulGflops", "cpuMsPerStep", "trainable",
"peakRssMb"}."""
import sys

import torch
import torch.nn.functional as F

from model import device_from_flags, emit, flag, matmul_gflops, median_seconds, model_from_flags, pick_threads, sync

max_threads, iters = int(sys.argv[1]), int(sys.argv[2])
B, T = int(flag("batch", 8)), int(flag("tokens", 128))
device = device_from_flags()
torch.manual_seed(0)
config, model = model_from_flags(device)
trainable = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.Adam(trainable, lr=1e-4)
ids = torch.randint(0, config["vocab"], (B, T), device=device)


def step():
    h, _ = model.hidden(ids)
    logits = model.logits(h[:, :-1])  # [B, T−1, V]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum") / (B * T)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    value = loss.item()
    sync(device)
    return value


threads = pick_threads(max_threads, step, device)
gflops = matmul_gflops(threads, device)
torch.set_num_threads(threads)
s, cpu = median_seconds(step, iters, cpu=True)
emit(dict(threads=threads, msPerStep=s * 1000, tokensPerSec=B * T / s, matmulGflops=gflops, cpuMsPerStep=cpu * 1000,
          trainable=sum(p.numel() for p in trainable)))
