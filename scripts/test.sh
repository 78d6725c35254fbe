#!/usr/bin/env bash
# The project's test command: set up a fresh Debian 12 machine (idempotent), then run every
# test of the workspace. Snapshot tests fail on a stale or missing snapshot (CI=true makes
# insta refuse to write); bless with `cargo insta review` or INSTA_UPDATE=always locally.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CI="${CI:-true}"
cargo test --workspace --locked "$@"
# The benches are not run here (timings belong to `cargo bench`), but they must build.
cargo test --workspace --locked --benches --no-run
