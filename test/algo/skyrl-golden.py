"""
Regenerates test/algo/skyrl-golden.json: outputs of SkyRL's own ppo_utils.py / off_policy_correction_utils.py
(NovaSky-AI/SkyRL a9564572) on seeded random inputs, for test/algo/skyrlGolden.ts.

    SKYRL=/path/to/SkyRL python3 test/algo/skyrl-golden.py     # needs torch and numpy
    npx biome format --write test/algo/skyrl-golden.json

SkyRL's modules import ray, loguru, jaxtyping and omegaconf only for things these functions do not use, so
minimal stand-ins for those are written to a temporary directory; the two torch helpers the losses use
(masked_mean, safe_exp_delta) are loaded from SkyRL's torch_utils.py by source, without its other imports.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from types import SimpleNamespace as NS

import numpy as np
import torch

SKYRL = os.environ["SKYRL"]
stubs = tempfile.mkdtemp()


def write(path, text):
    os.makedirs(os.path.dirname(os.path.join(stubs, path)), exist_ok=True)
    with open(os.path.join(stubs, path), "w") as f:
        f.write(text)


def skyrl_source(path):
    return subprocess.run(["git", "-C", SKYRL, "show", f"HEAD:{path}"], check=True, capture_output=True, text=True).stdout


write("ray/__init__.py", "def remote(cls):\n    return cls\n\ndef is_initialized():\n    return False\n")
write("jaxtyping/__init__.py", "class _F:\n    def __getitem__(self, k):\n        return object\nFloat = _F()\nInteger = _F()\n")
write("loguru/__init__.py", "import logging\nlogger = logging.getLogger('skyrl')\n")
write("omegaconf/__init__.py", "DictConfig = dict\n")
write("skyrl/train/config/__init__.py", "AlgorithmConfig = object\n")
for pkg in ["skyrl", "skyrl/backends", "skyrl/backends/skyrl_train", "skyrl/train", "skyrl/backends/skyrl_train/utils"]:
    write(f"{pkg}/__init__.py", "")
utils = "skyrl/backends/skyrl_train/utils"
for name in ["ppo_utils.py", "off_policy_correction_utils.py"]:
    write(f"{utils}/{name}", skyrl_source(f"{utils}/{name}"))
torch_utils = skyrl_source(f"{utils}/torch_utils.py")
helpers = [
    m.group(0)
    for m in re.finditer(r"^def (masked_mean|safe_exp_delta)\(.*?(?=^\S|\Z)", torch_utils, re.S | re.M)
]
assert len(helpers) == 2, "masked_mean / safe_exp_delta not found in torch_utils.py"
write(f"{utils}/torch_utils.py", "import torch\n\n" + "\n".join(helpers))
sys.path.insert(0, stubs)

from skyrl.backends.skyrl_train.utils import ppo_utils as p  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skyrl-golden.json")

torch.manual_seed(0)
rng = np.random.default_rng(7)

def camel(k):
    parts = re.split(r"[_/]", k)
    return parts[0] + "".join(w[:1].upper() + w[1:] for w in parts[1:])

def opc(**kw):
    base = dict(tis_ratio_type=None, token_tis_ratio_clip_high=2.0, sequence_tis_ratio_clip_high=5.0,
                sequence_mask_metric=None, geo_mask_high=1.01, geo_mask_low=0.99, product_mask_high=2.0,
                product_mask_low=0.5, outlier_token_is_threshold_low=None, outlier_token_is_threshold_high=None,
                token_mask_is_threshold_low=None, token_mask_is_threshold_high=None)
    base.update(kw)
    return base

OPC = {
    "none": opc(),
    "token": opc(tis_ratio_type="token", token_tis_ratio_clip_high=1.5, outlier_token_is_threshold_low=0.2,
                 outlier_token_is_threshold_high=3.0),
    "sequence": opc(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=2.0, sequence_mask_metric="geometric",
                    geo_mask_low=0.7, geo_mask_high=1.3, token_mask_is_threshold_low=0.5, token_mask_is_threshold_high=1.8),
    "product": opc(sequence_mask_metric="product", product_mask_low=0.3, product_mask_high=3.0),
}
OPC_TS = {
    "none": {},
    "token": dict(tisRatioType="token", tokenTisRatioClipHigh=1.5, outlierTokenIsThresholdLow=0.2, outlierTokenIsThresholdHigh=3.0),
    "sequence": dict(tisRatioType="sequence", sequenceTisRatioClipHigh=2.0, sequenceMaskMetric="geometric",
                     geoMaskLow=0.7, geoMaskHigh=1.3, tokenMaskIsThresholdLow=0.5, tokenMaskIsThresholdHigh=1.8),
    "product": dict(sequenceMaskMetric="product", productMaskLow=0.3, productMaskHigh=3.0),
}

def inputs(B, T):
    old = -rng.uniform(0.2, 3.0, (B, T))
    lp = old + rng.normal(0, 0.5, (B, T))
    lp = np.minimum(lp, -0.05)
    roll = old + rng.normal(0, 0.3, (B, T))
    adv = rng.normal(0, 1.5, (B, T))
    mask = (rng.uniform(size=(B, T)) > 0.25).astype(np.float64)
    mask[:, 0] = 1
    adv = adv * mask
    return dict(logProbs=lp, oldLogProbs=old, rolloutLogProbs=roll, advantages=adv, lossMask=mask)

cases = []
sets = [inputs(3, 5), inputs(4, 6)]
for si, s in enumerate(sets):
    B, T = s["logProbs"].shape
    for name in ["regular", "dual_clip", "gspo", "cispo", "rollout_is", "sapo", "dppo"]:
        for red in ["token_mean", "sequence_mean", "seq_mean_token_sum_norm"]:
            for oname in ["none", "token", "sequence", "product"]:
                for anchor in (["old", "rollout"] if name == "cispo" else ["old"]):
                    if anchor == "rollout" and OPC[oname]["tis_ratio_type"] is not None:
                        continue
                    cfg = NS(eps_clip_low=0.2, eps_clip_high=0.28, clip_ratio_c=3.0, policy_loss_type=name,
                             loss_reduction=red, max_seq_len=T + 2, off_policy_correction=NS(**OPC[oname]),
                             cispo=NS(cispo_eps_clip_low=0.3, cispo_eps_clip_high=0.4, cispo_anchor=anchor),
                             sapo=NS(tau_pos=1.0, tau_neg=1.05),
                             dppo=NS(dppo_type="binary_tv" if red != "sequence_mean" else "binary_kl", delta_low=0.05, delta_high=0.05))
                    f = lambda k: torch.tensor(s[k], dtype=torch.float32)
                    lp = f("logProbs").requires_grad_(True)
                    mask = f("lossMask")
                    adv = p.apply_loss_reduction_to_advantages_minibatch(f("advantages"), mask, red, B, T + 2)
                    loss, metrics = p.PolicyLossRegistry.get(name)(lp, f("oldLogProbs"), adv, cfg, mask, f("rolloutLogProbs"))
                    loss.backward()
                    cases.append(dict(set=si, name=name, config=dict(
                        epsClipLow=0.2, epsClipHigh=0.28, clipRatioC=3.0, lossReduction=red, maxSeqLen=T + 2,
                        cispoEpsClipLow=0.3, cispoEpsClipHigh=0.4, cispoAnchor=anchor, sapoTauPos=1.0, sapoTauNeg=1.05,
                        dppoType=cfg.dppo.dppo_type, dppoDeltaLow=0.05, dppoDeltaHigh=0.05,
                        offPolicyCorrection=OPC_TS[oname]),
                        loss=loss.item(), grad=lp.grad.tolist(),
                        metrics={camel(k): float(v) for k, v in metrics.items()}))

# advantages
adv_cases = []
for trial in range(3):
    B, T = 6, 4
    rewards = np.zeros((B, T))
    lengths = rng.integers(1, T + 1, B)
    mask = np.array([[1.0 if t < l else 0.0 for t in range(T)] for l in lengths])
    for b in range(B):
        rewards[b, lengths[b] - 1] = float(rng.integers(0, 3)) if trial != 2 else rng.normal()
    index = ["a", "a", "b", "b", "b", "c"] if trial != 1 else [0, 0, 0, 1, 1, 1]
    values = rng.normal(0, 1, (B, T))
    f = lambda x: torch.tensor(x, dtype=torch.float64)
    out = {}
    for est in ["grpo", "rloo", "maxrl"]:
        a, r = p.AdvantageEstimatorRegistry.get(est)(token_level_rewards=f(rewards), response_mask=f(mask), index=np.array(index, dtype=object))
        out[est] = dict(advantages=a.tolist(), returns=r.tolist())
    a, r = p.compute_grpo_outcome_advantage(token_level_rewards=f(rewards), response_mask=f(mask), index=np.array(index, dtype=object), grpo_norm_by_std=False)
    out["drgrpo"] = dict(advantages=a.tolist(), returns=r.tolist())
    a, r = p.compute_reinforce_plus_plus_outcome_advantage(token_level_rewards=f(rewards), response_mask=f(mask), gamma=0.9)
    out["reinforce++"] = dict(advantages=a.tolist(), returns=r.tolist())
    a, r = p.compute_gae_advantage_return(token_level_rewards=f(rewards), values=f(values), response_mask=f(mask), gamma=0.95, lambd=0.9)
    out["gae"] = dict(advantages=a.tolist(), returns=r.tolist())
    adv_cases.append(dict(tokenLevelRewards=rewards.tolist(), responseMask=mask.tolist(), index=index, values=values.tolist(), expected=out))

# kl
lpk = rng.normal(-1.5, 0.8, (3, 4)); refk = rng.normal(-1.5, 0.8, (3, 4)); mk = (rng.uniform(size=(3, 4)) > 0.3).astype(np.float64)
lpk[0, 1] = -30.0  # far outside: exercises k3's clamps
kl = {e: p.compute_approx_kl(torch.tensor(lpk, dtype=torch.float32), torch.tensor(refk, dtype=torch.float32), torch.tensor(mk, dtype=torch.float32), e).tolist() for e in ["k1", "k2", "k3", "abs"]}

data = dict(inputs=[{k: v.tolist() for k, v in s.items()} for s in sets], losses=cases, advantages=adv_cases,
            kl=dict(logProbs=lpk.tolist(), refLogProbs=refk.tolist(), mask=mk.tolist(), expected=kl))

# critic loss
critic = []
for clip in [0.2, None]:
    B, T = 3, 4
    v = rng.normal(0, 1, (B, T)); ov = v + rng.normal(0, 0.4, (B, T)); R = rng.normal(0, 1.5, (B, T))
    m = (rng.uniform(size=(B, T)) > 0.3).astype(np.float64); m[:, 0] = 1
    vt = torch.tensor(v, dtype=torch.float32, requires_grad=True)
    loss, cf = p.ppo_critic_loss(vt, torch.tensor(ov, dtype=torch.float32), torch.tensor(R, dtype=torch.float32), NS(value_clip=clip), torch.tensor(m, dtype=torch.float32))
    loss.backward()
    critic.append(dict(values=v.tolist(), oldValues=ov.tolist(), returns=R.tolist(), lossMask=m.tolist(), valueClip=clip, loss=loss.item(), grad=vt.grad.tolist(), clipfrac=cf))
data["critic"] = critic


def rnd(x):
    """7 significant digits: below float32 noise, and a smaller file."""
    if isinstance(x, float):
        return float(f"{x:.7g}")
    if isinstance(x, list):
        return [rnd(v) for v in x]
    if isinstance(x, dict):
        return {k: rnd(v) for k, v in x.items()}
    return x


with open(OUT, "w") as f:
    json.dump(rnd(data), f, separators=(",", ":"))
print(f"{len(cases)} loss cases -> {OUT}; now run: npx biome format --write test/algo/skyrl-golden.json")
