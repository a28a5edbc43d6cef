"""Train step of the perf model in PyTorch: forward + backward + Adam on −mean token log-prob, batch 8 × 128 tokens
(the same loss as effect-rl's LogProbs.ofSequences: position 0 counts as log-prob 0). Usage: train_step.py THREADS ITERS.
Prints one JSON line: {"threads", "msPerStep", "tokensPerSec", "matmulGflops", "cpuMsPerStep"}."""
import sys

import torch
import torch.nn.functional as F

from model import CONFIG, Model, emit, matmul_gflops, median_seconds, pick_threads

max_threads, iters = int(sys.argv[1]), int(sys.argv[2])
B, T = 8, 128
torch.manual_seed(0)
model = Model(CONFIG)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
ids = torch.randint(0, CONFIG["vocab"], (B, T))


def step():
    logits, _ = model(ids)
    logp = F.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -logp.sum() / (B * T)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


threads = pick_threads(max_threads, step)
gflops = matmul_gflops(threads)
torch.set_num_threads(threads)
s, cpu = median_seconds(step, iters, cpu=True)
emit(dict(threads=threads, msPerStep=s * 1000, tokensPerSec=B * T / s, matmulGflops=gflops, cpuMsPerStep=cpu * 1000 / 1))
