#!/usr/bin/env bash
# Debian packages effect-rl's tests and benchmarks use. None is needed to run effect-rl itself:
#   libopenblas-dev      BLAS for the native tfjs kernels (built by `npm ci`; without it a portable SGEMM is used)
#   python3-torch, libopenblas0-pthread, python3-numpy
#                        the independent float64 PyTorch reference the model tests compare against, and the
#                        benchmarks' peer (without OpenBLAS, Debian's torch uses the reference BLAS, ~50x slower)
#   chromium             the headless browser the report test renders report.html in (driven by playwright-core)
# Idempotent: installs only what is missing. Skips quietly without root or apt.
set -euo pipefail
packages=(libopenblas-dev python3-torch python3-numpy libopenblas0-pthread chromium)
command -v apt-get >/dev/null 2>&1 || { echo "setup-system: no apt-get, skipping (${packages[*]})"; exit 0; }
[ "$(id -u)" = 0 ] || { echo "setup-system: not root, skipping (${packages[*]})"; exit 0; }
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-system: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup-system: ok"
