#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine: LLVM/MLIR 22 (for melior), protoc,
# and the TPU oracle's Python venv (jax[tpu]==0.10.2 with libtpu), plus torch and transformers in
# that venv for the model conformance test (model/tests/hf_conformance.rs), and this checkout's
# JAX interop package (python/palladium_jax, by a .pth file). Safe to run again.
set -euo pipefail

LLVM_PACKAGES=(llvm-22-dev libmlir-22-dev mlir-22-tools libclang-22-dev libpolly-22-dev
               libzstd-dev libxml2-dev zlib1g-dev protobuf-compiler)
VENV="${PALLADIUM_TPU_VENV:-$HOME/.cache/palladium/venv-tpu}"
JAX_SPEC="jax[tpu]==0.10.2"
# transformers' Qwen3-MoE needs >= 4.51; 4.57 is the last 4.x (per-expert nn.Linear weights,
# the checkpoint layout). torch from PyPI is the CUDA build (the CPU-only index is not
# reachable): about 3.1 GB of wheels (torch 767 MB + nvidia-* 2.0 GB + triton 253 MB), about
# 5 GB installed, about a minute here. CPU inference works without a GPU.
TORCH_VERSION="2.6.0"
TRANSFORMERS_VERSION="4.57.1"
# XLA's CPU PJRT plugin (pjrt_c_api_cpu_plugin.so, PJRT C API 0.115) for the runtime crate's
# execution tests (runtime/tests/exec.rs). --no-deps: it only pins jax<=0.11.2, which the venv
# already satisfies.
CPU_PLUGIN_SPEC="lammps-jax-pjrt-cpu==0.11.2"

# scripts/test.sh checks formatting and lints: the toolchain's rustfmt and clippy components
# (rustup installs them by default; no other toolchain is fetched here).
for tool in fmt clippy; do
  cargo "$tool" --version >/dev/null 2>&1 || {
    echo "setup: 'cargo $tool' is missing: install it with 'rustup component add ${tool/fmt/rustfmt}'" >&2
    exit 1
  }
done

# scripts/test.sh runs the tests with cargo-nextest (the test binaries side by side); a pinned
# version, built from crates.io once (about 10 CPU-minutes).
NEXTEST_VERSION="0.9.151"
# (Read whole before matching: `grep -q` could close the pipe early, and pipefail would
# then take an installed nextest for a missing one.)
if [[ "$(cargo nextest --version 2>/dev/null || true)" != *"cargo-nextest $NEXTEST_VERSION "* ]]; then
  echo "setup: installing cargo-nextest $NEXTEST_VERSION"
  cargo install --locked --quiet cargo-nextest --version "$NEXTEST_VERSION"
fi

need_apt=()
for p in "${LLVM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if ((${#need_apt[@]})); then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if ! "$VENV/bin/python" -c 'import jax, libtpu; assert jax.__version__ == "0.10.2"' 2>/dev/null; then
  echo "setup: creating the TPU oracle venv at $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "$JAX_SPEC"
fi

if ! "$VENV/bin/python" -c "import torch, transformers
assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__
assert transformers.__version__ == '$TRANSFORMERS_VERSION', transformers.__version__" 2>/dev/null; then
  echo "setup: installing torch==$TORCH_VERSION transformers==$TRANSFORMERS_VERSION into $VENV (~3 GB download)"
  "$VENV/bin/pip" install -q --no-cache-dir "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION"
fi
# The JAX interop package (python/palladium_jax) of this checkout, importable from the venv.
REPO_PYTHON="$(cd "$(dirname "$0")/../python" && pwd)"
SITE_PACKAGES="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
if [ "$(cat "$SITE_PACKAGES/palladium_jax.pth" 2>/dev/null)" != "$REPO_PYTHON" ]; then
  echo "setup: palladium_jax ($REPO_PYTHON) -> $VENV"
  echo "$REPO_PYTHON" > "$SITE_PACKAGES/palladium_jax.pth"
fi
if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('lammps-jax-pjrt-cpu') == '0.11.2'" 2>/dev/null; then
  echo "setup: installing $CPU_PLUGIN_SPEC (XLA's CPU PJRT plugin) into $VENV"
  "$VENV/bin/pip" install -q --no-deps "$CPU_PLUGIN_SPEC"
fi
echo "setup: ok (oracle venv: $VENV)"
