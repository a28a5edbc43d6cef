"""The PyTorch peer of effect-rl's transformer (src/model/Decoder.ts): the Qwen3 / Qwen2 / Llama decoder —
RMSNorm pre-norm blocks, grouped-query attention with RoPE (HF rotate_half; llama3 frequency scaling when the config
has it), RMSNorm on q and k over head_dim (Qwen3), q/k/v biases (Qwen2, or `attention_bias`), SiLU-gated MLP, tied or
separate LM head, fp32. Written with plain torch ops, as a small PyTorch training loop would be.

Shared by train_step.py and sample.py; also holds the timing helpers, the thread choice (torch's fastest thread
count up to ours, measured on the workload itself) and the workload flags:
  --model DIR              a HF checkpoint directory (config.json + model.safetensors or shards with
                           model.safetensors.index.json, e.g. from scripts/make-checkpoint.ts), weights read as
                           effect-rl reads them: BF16 / F16 / F32 on disk → float32; without it, the perf model
                           (CONFIG), random-init
  --device cpu|cuda        cuda: on the GPU in fp32 with TF32 off
  --lora-rank R            LoRA rank R on q,k,v,o,gate,up,down (α = 2R, no dropout, PEFT's init), base frozen
  --gradient-checkpointing torch.utils.checkpoint around each decoder layer (non-reentrant)
Every script's JSON line carries `peakRssMb` (ru_maxrss of this process)."""
import json
import math
import os
import resource
import statistics
import struct
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

# the perf model of bench/harness.ts (Qwen3-style: q/k norm, tied embeddings)
CONFIG = dict(vocab=512, d=256, layers=4, heads=4, kv_heads=4, head_dim=64, mlp=1024, theta=10000.0, eps=1e-6,
              qk_norm=True, bias=False, tied=True, rope_scaling=None)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def flag(name, default):
    """`--name VALUE` from the command line (after the positional THREADS ITERS), else default."""
    args = sys.argv[3:]
    return args[args.index("--" + name) + 1] if "--" + name in args else default


def switch(name):
    return "--" + name in sys.argv[3:]


def config_of(hf):
    """Our shape dict from a HF config.json (the same switches as src/model/ModelConfig.ts)."""
    model_type = hf.get("model_type", "")
    heads = hf["num_attention_heads"]
    scaling = hf.get("rope_scaling") or None
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise SystemExit(f"model.py: rope scaling {scaling} is not supported (default or llama3)")
    return dict(vocab=hf["vocab_size"], d=hf["hidden_size"], layers=hf["num_hidden_layers"], heads=heads,
                kv_heads=hf.get("num_key_value_heads", heads),
                head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, mlp=hf["intermediate_size"],
                theta=float(hf.get("rope_theta", 10000.0)), eps=hf.get("rms_norm_eps", 1e-6),
                qk_norm=model_type == "qwen3", bias=model_type == "qwen2" or hf.get("attention_bias") is True,
                tied=hf.get("tie_word_embeddings") is True, rope_scaling=scaling)


def device_from_flags():
    device = torch.device(flag("device", "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 like effect-rl's tensors
        torch.backends.cudnn.allow_tf32 = False
    return device


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def read_safetensors(directory):
    """name → float32 tensor for every tensor of a checkpoint directory, single file or sharded. One tensor's bytes
    are in memory at a time besides the float32 results (what effect-rl holds after loading, too)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(os.path.join(directory, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for file in files:
        with open(os.path.join(directory, file), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                f.seek(8 + n + start)
                raw = bytearray(f.read(end - start))
                tensors[name] = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]).reshape(info["shape"]).float()
    return tensors


def load_from_flags():
    """(config, weights): `--model DIR`'s config and tensors, or the perf model's CONFIG and None (random init)."""
    directory = flag("model", None)
    if directory is None:
        return CONFIG, None
    with open(os.path.join(directory, "config.json")) as f:
        config = config_of(json.load(f))
    return config, read_safetensors(directory)


# ---------------------------------------------------------------------------------------------------------------
# Model


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama3_inv_freq(inv, s):
    """HF's `_compute_llama3_parameters`: long wavelengths slowed by `factor`, short kept, a smooth blend between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, blended, scaled)


class Linear(torch.nn.Module):
    """y = x Wᵀ (+ b), W [out, in] as HF stores it; with LoRA also + (x Aᵀ) Bᵀ · α/r, A [r, in], B [out, r]."""

    def __init__(self, weight, bias=None):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.bias = None if bias is None else torch.nn.Parameter(bias)
        self.lora_A = self.lora_B = None
        self.scale = 0.0

    def add_lora(self, r, alpha, generator):
        out_dim, in_dim = self.weight.shape
        bound = 1 / math.sqrt(in_dim)  # PEFT: Kaiming-uniform with a = √5 on A, zeros on B (as src/model/Lora.ts)
        self.lora_A = torch.nn.Parameter((torch.rand(r, in_dim, generator=generator) * 2 - 1) * bound)
        self.lora_B = torch.nn.Parameter(torch.zeros(out_dim, r))
        self.scale = alpha / r

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        if self.lora_A is not None:
            y = y + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale
        return y


class Layer(torch.nn.Module):
    def __init__(self, c, get, p):
        super().__init__()
        d, hd, H, Hkv, I = c["d"], c["head_dim"], c["heads"], c["kv_heads"], c["mlp"]
        self.c = c
        self.ln1 = torch.nn.Parameter(get(f"{p}.input_layernorm.weight", [d], "ones"))
        self.ln2 = torch.nn.Parameter(get(f"{p}.post_attention_layernorm.weight", [d], "ones"))
        if c["qk_norm"]:
            self.qn = torch.nn.Parameter(get(f"{p}.self_attn.q_norm.weight", [hd], "ones"))
            self.kn = torch.nn.Parameter(get(f"{p}.self_attn.k_norm.weight", [hd], "ones"))

        def linear(name, out_dim, in_dim, bias=False):
            w = get(f"{p}.{name}.weight", [out_dim, in_dim], "normal")
            return Linear(w, get(f"{p}.{name}.bias", [out_dim], "zeros") if bias else None)

        self.q_proj = linear("self_attn.q_proj", H * hd, d, c["bias"])
        self.k_proj = linear("self_attn.k_proj", Hkv * hd, d, c["bias"])
        self.v_proj = linear("self_attn.v_proj", Hkv * hd, d, c["bias"])
        self.o_proj = linear("self_attn.o_proj", d, H * hd)
        self.gate_proj = linear("mlp.gate_proj", I, d)
        self.up_proj = linear("mlp.up_proj", I, d)
        self.down_proj = linear("mlp.down_proj", d, I)

    def forward(self, x, cos, sin, causal, past=None):
        """x [B, T, d]; past (k, v) [B, Hkv, L, hd] or None. Returns x and this layer's (k, v) with the new T."""
        c = self.c
        B, T, _ = x.shape
        H, Hkv, hd = c["heads"], c["kv_heads"], c["head_dim"]
        h = rms_norm(x, self.ln1, c["eps"])
        q = self.q_proj(h).view(B, T, H, hd)
        k = self.k_proj(h).view(B, T, Hkv, hd)
        v = self.v_proj(h).view(B, T, Hkv, hd).transpose(1, 2)
        if c["qk_norm"]:
            q, k = rms_norm(q, self.qn, c["eps"]), rms_norm(k, self.kn, c["eps"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        kv = (k, v)
        if Hkv != H:  # grouped-query attention: each K/V head serves H / Hkv query heads
            k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        if causal is not None:
            scores = scores + causal
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + self.o_proj(a)
        h2 = rms_norm(x, self.ln2, c["eps"])
        return x + self.down_proj(F.silu(self.gate_proj(h2)) * self.up_proj(h2)), kv


class Model(torch.nn.Module):
    def __init__(self, c, weights=None, seed=0):
        """weights: HF name → float32 tensor (consumed), or None for a random init N(0, 0.02²), ones, zeros."""
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def get(name, shape, init):
            if weights is not None:
                t = weights.pop(name)
                assert list(t.shape) == list(shape), f"{name}: {list(t.shape)} in the checkpoint, {shape} expected"
                return t
            if init == "normal":
                return torch.randn(*shape, generator=g) * 0.02
            return torch.ones(*shape) if init == "ones" else torch.zeros(*shape)

        d, hd = c["d"], c["head_dim"]
        self.c = c
        self.embed = torch.nn.Parameter(get("model.embed_tokens.weight", [c["vocab"], d], "normal"))
        self.layers = torch.nn.ModuleList(Layer(c, get, f"model.layers.{i}") for i in range(c["layers"]))
        self.norm = torch.nn.Parameter(get("model.norm.weight", [d], "ones"))
        self.head = None if c["tied"] else torch.nn.Parameter(get("lm_head.weight", [c["vocab"], d], "normal"))
        inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        if c["rope_scaling"] is not None:
            inv = llama3_inv_freq(inv, c["rope_scaling"])
        self.register_buffer("inv_freq", inv, persistent=False)
        self.checkpointing = False

    def add_lora(self, r, seed=0):
        """Freeze every weight and attach LoRA rank r (α = 2r) on q,k,v,o,gate,up,down of every layer."""
        g = torch.Generator().manual_seed(seed)
        for p in self.parameters():
            p.requires_grad_(False)
        for layer in self.layers:
            for name in LORA_TARGETS:
                getattr(layer, name).add_lora(r, 2 * r, g)

    def rope(self, positions):  # positions [T] -> cos, sin [T, hd]
        ang = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        return emb.cos(), emb.sin()

    def hidden(self, ids, past=None):
        """ids [B, T]; past: list of (k, v) [B, Hkv, L, hd]. Returns final-norm hidden states [B, T, d], new cache."""
        T = ids.shape[1]
        P = 0 if past is None else past[0][0].shape[2]
        cos, sin = self.rope(torch.arange(P, P + T, device=ids.device))
        x = F.embedding(ids, self.embed)
        causal = None
        if T > 1:
            causal = torch.full((T, P + T), float("-inf"), device=ids.device).triu(P + 1)
        cache = []
        for i, layer in enumerate(self.layers):
            if self.checkpointing and torch.is_grad_enabled():
                # recomputed in backward; the cache is not needed when training
                x = torch.utils.checkpoint.checkpoint(
                    lambda x, layer=layer: layer(x, cos, sin, causal)[0], x, use_reentrant=False)
            else:
                x, kv = layer(x, cos, sin, causal, None if past is None else past[i])
                cache.append(kv)
        return rms_norm(x, self.norm, self.c["eps"]), cache

    def logits(self, h):
        return F.linear(h, self.embed if self.head is None else self.head)

    def forward(self, ids, past=None):
        h, cache = self.hidden(ids, past)
        return self.logits(h), cache


def model_from_flags(device):
    """The model of `--model DIR` (or the perf model), with `--lora-rank` and `--gradient-checkpointing` applied."""
    config, weights = load_from_flags()
    model = Model(config, weights)
    rank = int(flag("lora-rank", 0))
    if rank > 0:
        model.add_lora(rank)
    model.checkpointing = switch("gradient-checkpointing")
    return config, model.to(device)


# ---------------------------------------------------------------------------------------------------------------
# Timing


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
    """torch's faster thread count for `trial` (a callable, timed 3 times per setting after one warm-up, once with
    `--model`, whose steps are long) among 1, 2, 4, … and max_threads; 1 on a GPU."""
    if device.type != "cpu":
        return 1
    candidates = sorted({t for t in (2**i for i in range(16)) if t < max_threads} | {max_threads})
    best, best_s = 1, float("inf")
    for t in candidates:
        torch.set_num_threads(t)
        s = median_seconds(trial, 1 if flag("model", None) is not None else 3)
        if s < best_s:
            best, best_s = t, s
    torch.set_num_threads(best)
    return best


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def emit(result):
    print(json.dumps({**result, "peakRssMb": peak_rss_mb()}))
    sys.stdout.flush()
