#!/usr/bin/env bash
# The webgpu checks on a GPU machine, from the repository root, after build-kit.sh: the adapter and Vulkan driver,
# parity with the cpu backend, a tiny GRPO run, and train-step / sample on the Qwen3-0.6B shape beside PyTorch CUDA
# (and the cpu backend, unless SKIP_CPU=1). Every stage writes under $OUT; a deadline (BUDGET seconds) skips late ones.
set -u
: "${OUT:?set OUT to a directory}"
kit=bench/.work/webgpu-kit
START=$(date +%s); BUDGET=${BUDGET:-420}
left() { echo $((BUDGET - ($(date +%s) - START))); }
stage() { # stage NAME TIMEOUT CMD...
  local name=$1 t=$2 l; shift 2; l=$(left)
  if [ "$l" -lt 20 ]; then echo "== $name: skipped (${l}s left)" | tee -a "$OUT/stages.txt"; return; fi
  [ "$t" -gt "$l" ] && t=$l
  local s; s=$(date +%s)
  timeout -k 5 "$t" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name rc=$? in $(($(date +%s) - s))s" | tee -a "$OUT/stages.txt"
  grep -v '^Warning: maxDynamic' "$OUT/$name.log" | tail -3 | cut -c1-600
}
# the loader and glvnd go to / (as the device notes advise); vulkaninfo and the X libraries stay apart
for p in libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2; do dpkg -x "$kit"/debs/"${p}"_*.deb /; done
ldconfig
mkdir -p /tmp/vt && for f in "$kit"/debs/*.deb; do dpkg -x "$f" /tmp/vt; done
mkdir -p /tmp/kit-node && xz -dc "$kit/node.xz" >/tmp/kit-node/node && chmod +x /tmp/kit-node/node
export PATH=/tmp/kit-node:$PATH
tar -xJf "$kit/tree.tar.xz" -C .
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! ls /usr/share/vulkan/icd.d/*nvidia* /etc/vulkan/icd.d/*nvidia* >/dev/null 2>&1 && [ -f $icd ]; then
  export VK_DRIVER_FILES=$icd
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; node --version; grep PRETTY /etc/os-release
  ls -la /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d; echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"
} >"$OUT/machine.txt" 2>&1
LD_LIBRARY_PATH=/tmp/vt/usr/lib/x86_64-linux-gnu timeout 30 /tmp/vt/usr/bin/vulkaninfo --summary >"$OUT/vulkaninfo.txt" 2>&1
grep -E "deviceName|driverName|driverInfo|apiVersion|Found no|ERROR" "$OUT/vulkaninfo.txt" | head -6
export BENCH_PYTHON=${BENCH_PYTHON:-$(command -v python3)}
model=/tmp/qwen3-0.6b-random
stage parity 120 node bench/webgpu-parity.mjs --steps 100
stage grpo 150 node dist/main.mjs train --config tiny-gpu.yaml --run-dir /tmp/grpo backend.name=webgpu
stage checkpoint 120 node scripts/make-checkpoint.mjs --preset qwen3-0.6b --out $model
stage train-webgpu 210 node bench/train-step.mjs --backend webgpu --model $model --batch 4 --tokens 256 --iters 5 \
  --torch-device cuda --out "$OUT/train-step-webgpu-qwen3-0.6b.json"
stage sample-webgpu 180 node bench/sample.mjs --backend webgpu --model $model --batch 8 --prompt 32 --new 64 --iters 3 \
  --min-iters 3 --torch-device cuda --out "$OUT/sample-webgpu-qwen3-0.6b.json"
[ "${SKIP_CPU:-0}" = 1 ] || stage sample-cpu 150 node bench/sample.mjs --backend cpu --model $model --batch 1 --prompt 8 \
  --new 2 --iters 1 --min-iters 1 --warmup 0 --no-torch
cat "$OUT/stages.txt"
