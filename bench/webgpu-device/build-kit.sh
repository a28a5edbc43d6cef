#!/usr/bin/env bash
# Packs what the webgpu device checks need into bench/.work/webgpu-kit/ (ignored by git), for a GPU machine that has
# no Node and no node_modules (and no network): esbuild bundles of the benches, the CLI and the toolbox MCP server,
# Dawn's prebuilt binding, uplot (the report), Node itself, and the Vulkan loader + glvnd from Debian (amd64).
# Then, on the GPU machine, from the repository root: OUT=<dir> bash bench/webgpu-device/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=bench/.work/webgpu-kit
stage=$kit/tree
rm -rf "$kit"; mkdir -p "$stage/bench" "$stage/scripts" "$stage/dist" "$kit/debs"
esbuild=(npx --yes esbuild@0.25.12)
common=(--bundle --platform=node --format=esm --target=node24 --external:webgpu --log-level=warning
  "--banner:js=import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);")
for e in train-step sample webgpu-parity; do "${esbuild[@]}" "bench/$e.ts" "${common[@]}" "--outfile=$stage/bench/$e.mjs"; done
"${esbuild[@]}" scripts/make-checkpoint.ts "${common[@]}" "--outfile=$stage/scripts/make-checkpoint.mjs"
"${esbuild[@]}" src/main.ts "${common[@]}" "--outfile=$stage/dist/main.mjs"
"${esbuild[@]}" src/toolbox/server.ts "${common[@]}" "--outfile=$stage/dist/toolbox.mjs"
mkdir -p "$stage/node_modules/webgpu/dist/linux-x64" "$stage/node_modules/uplot/dist"
# tfjs-core's gradients and chained ops, bundled by `npm ci` (src/tensor/Tf.ts finds them beside tfjs-core's package.json)
mkdir -p "$stage/node_modules/@tensorflow/tfjs-core" "$stage/node_modules/.cache/effect-rl"
cp node_modules/@tensorflow/tfjs-core/package.json "$stage/node_modules/@tensorflow/tfjs-core/"
cp node_modules/.cache/effect-rl/tfjs-core-*-registrations.cjs "$stage/node_modules/.cache/effect-rl/"
# Dawn: where `npm run setup:webgpu` installs it (or a node_modules copy); the kit's node_modules is where the bundles
# resolve it from
dawn=node_modules/webgpu
[ -d "$dawn" ] || dawn=.webgpu/node_modules/webgpu
[ -f "$dawn/dist/linux-x64/dawn.node" ] || { echo "build-kit: no Dawn for linux-x64: run npm run setup:webgpu" >&2; exit 1; }
cp "$dawn/index.js" "$dawn/package.json" "$stage/node_modules/webgpu/"
cp "$dawn/dist/linux-x64/dawn.node" "$stage/node_modules/webgpu/dist/linux-x64/"
cp node_modules/uplot/package.json node_modules/uplot/LICENSE "$stage/node_modules/uplot/"
cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css "$stage/node_modules/uplot/dist/"
sed 's#args: \[src/toolbox/server.ts\]#args: [dist/toolbox.mjs]#' configs/tiny.yaml >"$stage/tiny-gpu.yaml"
tar -C "$stage" -cf - . | xz -T0 -3 >"$kit/tree.tar.xz"
rm -rf "$stage"
xz -T0 -6 -c node_modules/node/bin/node >"$kit/node.xz"
# the loader and glvnd (the NVIDIA ICD lives in libGLX_nvidia, which needs glvnd); vulkaninfo and its X libraries
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/webgpu-kit-apt)
mkdir -p /tmp/webgpu-kit-apt/partial
apt-get "${o[@]}" update >/dev/null
(cd "$kit/debs" && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 \
  vulkan-tools libx11-6 libxcb1 libxau6 libxdmcp6 libwayland-client0 libbsd0 libmd0 >/dev/null)
du -sh "$kit"
