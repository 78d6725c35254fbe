#!/usr/bin/env bash
# The project's main job: set up (idempotent); emit, verify and interpret the tiny
# Qwen3-MoE megakernel (prompt + 8 greedy steps, every token one run of the serialized
# Mosaic body in the CPU interpreter, checked against the plain-Rust reference forward
# pass); then emit the Qwen3-30B-A3B megakernel for v7x and print its report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --locked -q
out="${PALLADIUM_OUT:-out}"
mkdir -p "$out"
echo "== tiny Qwen3-MoE, random weights (seed 0): megakernel in interpret mode vs the reference"
./target/release/palladium run fixtures/models/tiny-qwen3-moe.json --random-weights --seed 0 \
    --prompt-ids 1,17,300,42,5 --steps 8 --logits-out "$out/tiny-qwen3-moe.logits.json" --check
echo "== tiny Mixtral, random weights (seed 4)"
./target/release/palladium run fixtures/models/tiny-mixtral.json --random-weights --seed 4 \
    --prompt-ids 1,17,300,42,5 --steps 8 --check
echo "== Qwen3-30B-A3B megakernel for v7x (batch 1, context 4096)"
./target/release/palladium megakernel fixtures/models/qwen3-30b-a3b.json --chip v7x --batch 1 --context 4096 --out "$out/qwen3-30b-a3b-v7x"
