#!/usr/bin/env bash
# The project's main job on its bundled default: set up (idempotent), list the kernel
# library, and trace, verify and print the IR of the bundled tiled matmul.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked -q
./target/release/palladium kernels
./target/release/palladium ir matmul --chip v6e
