"""Train step of the perf model in PyTorch: forward + backward + Adam on −mean token log-prob, batch 8 × 128 tokens
(the same loss as effect-rl's LogProbs.ofSequences: position 0 counts as log-prob 0). Usage: train_step.py THREADS ITERS
[--config FILE] [--batch B] [--tokens T] [--device cpu|cuda].
Prints one JSON line: {"threads", "msPerStep", "tokensPerSec", "matmulGflops", "cpuMsPerStep"}."""
import sys

import torch
import torch.nn.functional as F

from model import Model, config_from_flags, device_from_flags, emit, flag, matmul_gflops, median_seconds, pick_threads, sync

max_threads, iters = int(sys.argv[1]), int(sys.argv[2])
B, T = int(flag("batch", 8)), int(flag("tokens", 128))
config, device = config_from_flags(), device_from_flags()
torch.manual_seed(0)
model = Model(config).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
ids = torch.randint(0, config["vocab"], (B, T), device=device)


def step():
    logits, _ = model(ids)
    logp = F.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -logp.sum() / (B * T)
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
emit(dict(threads=threads, msPerStep=s * 1000, tokensPerSec=B * T / s, matmulGflops=gflops, cpuMsPerStep=cpu * 1000 / 1))
