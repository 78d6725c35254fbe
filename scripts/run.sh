#!/usr/bin/env bash
# The project's main job on its bundled default: set up (idempotent), list the kernel
# library, print the verified IR of the bundled tiled matmul, lower it to Mosaic MLIR, and
# have libtpu (through the TPU oracle, deviceless) compile the serialized body we emitted.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked -q
venv="${PALLADIUM_TPU_VENV:-$HOME/.cache/palladium/venv-tpu}"
oracle="$(pwd)/../shared/tpu-oracle/oracle.py"
out="${PALLADIUM_OUT:-out}"
./target/release/palladium kernels
./target/release/palladium ir matmul --chip v6e
./target/release/palladium emit matmul --chip v6e --out "$out"
echo "libtpu (v6e) on $out/matmul.body.mlir:"
ALLOW_MULTIPLE_LIBTPU_LOAD=1 "$venv/bin/python" "$oracle" compile-body "$out/matmul.body.mlir" --chip v6e --spec "$out/matmul.call.json" 2>/dev/null
