"""The PyTorch peer of the effect-rl perf model (src/model/Transformer.ts): a Qwen3-style decoder — RMSNorm pre-norm
blocks, grouped-query attention with RoPE (HF rotate_half) and RMSNorm on q and k over head_dim, SiLU-gated MLP, tied
embeddings, fp32. Written with plain torch ops, as a small PyTorch training loop would be.

Shared by train_step.py and sample.py; also holds the timing helpers, the thread choice (torch's fastest thread
count up to ours, measured on this model) and the optional workload flags (`--config FILE` reads a HF config.json,
e.g. one from scripts/make-checkpoint.ts; `--device cuda` runs on the GPU in fp32 with TF32 off)."""
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

CONFIG = dict(vocab=512, d=256, layers=4, heads=4, kv_heads=4, head_dim=64, mlp=1024, theta=10000.0, eps=1e-6)


def flag(name, default):
    """`--name VALUE` from the command line (after the positional THREADS ITERS), else default."""
    args = sys.argv[3:]
    return args[args.index("--" + name) + 1] if "--" + name in args else default


def config_from_flags():
    """CONFIG, or the Qwen3/Llama-style shape of `--config FILE` (a HF config.json; tied embeddings assumed)."""
    file = flag("config", None)
    if file is None:
        return CONFIG
    with open(file) as f:
        hf = json.load(f)
    heads = hf["num_attention_heads"]
    return dict(vocab=hf["vocab_size"], d=hf["hidden_size"], layers=hf["num_hidden_layers"], heads=heads,
                kv_heads=hf.get("num_key_value_heads", heads), head_dim=hf.get("head_dim", hf["hidden_size"] // heads),
                mlp=hf["intermediate_size"], theta=float(hf.get("rope_theta", 10000.0)), eps=hf.get("rms_norm_eps", 1e-6))


def device_from_flags():
    device = torch.device(flag("device", "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 like effect-rl's tensors
        torch.backends.cudnn.allow_tf32 = False
    return device


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Model(torch.nn.Module):
    def __init__(self, c, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        n = lambda *shape: torch.nn.Parameter(torch.randn(*shape, generator=g) * 0.02)
        ones = lambda k: torch.nn.Parameter(torch.ones(k))
        d, hd, H, Hkv, I = c["d"], c["head_dim"], c["heads"], c["kv_heads"], c["mlp"]
        self.c = c
        self.embed = n(c["vocab"], d)
        self.layers = torch.nn.ModuleList()
        for _ in range(c["layers"]):
            layer = torch.nn.Module()
            layer.ln1, layer.ln2, layer.qn, layer.kn = ones(d), ones(d), ones(hd), ones(hd)
            layer.q, layer.k, layer.v, layer.o = n(H * hd, d), n(Hkv * hd, d), n(Hkv * hd, d), n(d, H * hd)
            layer.gate, layer.up, layer.down = n(I, d), n(I, d), n(d, I)
            self.layers.append(layer)
        self.norm = ones(d)
        inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def rope(self, positions):  # positions [T] -> cos, sin [T, hd]
        ang = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, ids, past=None):
        """ids [B, T]; past: list of (k, v) [B, Hkv, L, hd]. Returns logits [B, T, V] and the new cache."""
        c = self.c
        B, T = ids.shape
        H, Hkv, hd = c["heads"], c["kv_heads"], c["head_dim"]
        P = 0 if past is None else past[0][0].shape[2]
        cos, sin = self.rope(torch.arange(P, P + T, device=ids.device))
        x = F.embedding(ids, self.embed)
        causal = None
        if T > 1:
            causal = torch.full((T, P + T), float("-inf"), device=ids.device).triu(P + 1)
        cache = []
        for i, l in enumerate(self.layers):
            h = rms_norm(x, l.ln1, c["eps"])
            q = rms_norm(F.linear(h, l.q).view(B, T, H, hd), l.qn, c["eps"]).transpose(1, 2)
            k = rms_norm(F.linear(h, l.k).view(B, T, Hkv, hd), l.kn, c["eps"]).transpose(1, 2)
            v = F.linear(h, l.v).view(B, T, Hkv, hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if past is not None:
                k = torch.cat((past[i][0], k), dim=2)
                v = torch.cat((past[i][1], v), dim=2)
            cache.append((k, v))
            if Hkv != H:  # grouped-query attention: each K/V head serves H / Hkv query heads
                k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
            scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
            if causal is not None:
                scores = scores + causal
            a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
            x = x + F.linear(a, l.o)
            h2 = rms_norm(x, l.ln2, c["eps"])
            x = x + F.linear(F.silu(F.linear(h2, l.gate)) * F.linear(h2, l.up), l.down)
        x = rms_norm(x, self.norm, c["eps"])
        return F.linear(x, self.embed), cache


def median_seconds(run, iters, warmup=1, cpu=False):
    """Median wall seconds of `iters` runs (with cpu=True: (wall, CPU seconds of all threads))."""
    for _ in range(warmup):
        run()
    samples, cpus = [], []
    for _ in range(iters):
        start, cpu_start = time.perf_counter(), time.process_time()
        run()
        samples.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu_start)
    return (statistics.median(samples), statistics.median(cpus)) if cpu else statistics.median(samples)


def matmul_gflops(threads, device=torch.device("cpu")):
    torch.set_num_threads(threads)
    n = 1024 if device.type == "cpu" else 8192
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)

    def product():
        a @ b
        sync(device)

    s = median_seconds(product, 10, warmup=3)
    return 2 * n**3 / s / 1e9


def pick_threads(max_threads, trial, device=torch.device("cpu")):
    """torch's faster thread count in 1..max_threads for `trial` (a callable timed once per setting); 1 on a GPU."""
    if device.type != "cpu":
        return 1
    best, best_s = 1, float("inf")
    for t in range(1, max_threads + 1):
        torch.set_num_threads(t)
        s = median_seconds(trial, 3)
        if s < best_s:
            best, best_s = t, s
    torch.set_num_threads(best)
    return best


def emit(result):
    print(json.dumps(result))
    sys.stdout.flush()
