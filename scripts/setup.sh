#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine: LLVM/MLIR 22 (for melior), protoc,
# and the TPU oracle's Python venv (jax[tpu]==0.10.2 with libtpu). Safe to run again.
set -euo pipefail

LLVM_PACKAGES=(llvm-22-dev libmlir-22-dev mlir-22-tools libclang-22-dev libpolly-22-dev
               libzstd-dev libxml2-dev zlib1g-dev protobuf-compiler)
VENV="${PALLADIUM_TPU_VENV:-$HOME/.cache/palladium/venv-tpu}"
JAX_SPEC="jax[tpu]==0.10.2"

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
echo "setup: ok (oracle venv: $VENV)"
