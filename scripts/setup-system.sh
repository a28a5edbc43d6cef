#!/usr/bin/env bash
# Debian packages effect-rl's tests and benchmarks use. None is needed to run effect-rl itself:
#   libopenblas-dev      BLAS for the native tfjs kernels (built by `npm ci`; without it a portable SGEMM is used)
#   python3-torch, libopenblas0-pthread, python3-numpy
#                        the independent float64 PyTorch reference the model tests compare against, and the
#                        benchmarks' peer (without OpenBLAS, Debian's torch uses the reference BLAS, ~50x slower)
#   chromium             the headless browser the report test renders report.html in (driven by playwright-core)
#   postgresql           the server binaries scripts/local-postgres.sh runs (initdb + pg_ctl in a temp dir, no service):
#                        the cluster's storage in the end-to-end test and the cluster bench
#   prometheus           the Prometheus server the tracking test scrapes a training run's /metrics endpoint with
#   mesa-vulkan-drivers  (>= 25, from bookworm-backports on Debian 12) lavapipe, a Vulkan driver on the CPU: the
#                        webgpu backend's tests run on it (Dawn needs a newer Mesa than bookworm's 22.3)
# Idempotent: installs only what is missing. Skips quietly without root or apt.
set -euo pipefail
packages=(libopenblas-dev python3-torch python3-numpy libopenblas0-pthread chromium prometheus postgresql)
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

# The URI of the Debian archive this machine's apt sources use for the bookworm suite: a one-line `deb URI bookworm
# …` entry, or a deb822 stanza (/etc/apt/sources.list.d/*.sources) whose Suites include bookworm. Empty when none does.
debian_mirror() {
  local uri
  uri=$(grep -hsE '^\s*deb\s+(\[[^]]*\]\s+)?[a-z+]+://\S+\s+bookworm(\s|$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
    sed -E 's/^\s*deb\s+(\[[^]]*\]\s+)?//' | awk '{print $1; exit}')
  if [ -z "$uri" ]; then
    uri=$(awk '
      /^[[:space:]]*$/ { if (suite && uris != "") { print uris; exit } suite = 0; uris = ""; next }
      tolower($1) == "uris:" { uris = $2 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite = 1 }
      END { if (suite && uris != "") print uris }
    ' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
  fi
  echo "$uri"
}

# lavapipe for the webgpu tests. Dawn (the `webgpu` npm package) needs Mesa >= 25; Debian 12 ships 22.3, so take it
# from bookworm-backports there. Elsewhere (a newer Debian or Ubuntu) the distribution's own package is new enough.
mesa_version=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
mesa_major=${mesa_version%%.*}
if [ -z "$mesa_version" ] || [ "${mesa_major:-0}" -lt 25 ] 2>/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  if [ "$codename" = bookworm ]; then
    list=/etc/apt/sources.list.d/bookworm-backports.list
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
      # backports from the mirror this machine already uses for bookworm (its own sources), never a fixed host
      mirror=$(debian_mirror)
      if [ -n "$mirror" ]; then
        echo "deb $mirror bookworm-backports main" >"$list"
      else
        echo "setup-system: no Debian mirror for bookworm in /etc/apt/sources.list{,.d}; add bookworm-backports yourself"
      fi
    fi
    echo "setup-system: installing mesa-vulkan-drivers from bookworm-backports (lavapipe for the webgpu tests)"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends -t bookworm-backports mesa-vulkan-drivers >/dev/null ||
      echo "setup-system: could not install mesa-vulkan-drivers; the webgpu tests will skip"
  else
    echo "setup-system: installing mesa-vulkan-drivers (lavapipe for the webgpu tests)"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers >/dev/null ||
      echo "setup-system: could not install mesa-vulkan-drivers; the webgpu tests will skip"
  fi
fi
echo "setup-system: ok"
