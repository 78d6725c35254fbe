#!/usr/bin/env bash
# The project's test command: set up a fresh Debian 12 machine (idempotent), check formatting
# (rustfmt.toml), lints (clippy, warnings denied) and the API docs (rustdoc, warnings denied: no
# broken intra-doc link), then run every test of the workspace.
# Snapshot tests fail on a stale or missing snapshot (CI=true makes insta refuse to write); bless
# with `cargo insta review` or INSTA_UPDATE=always locally.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CI="${CI:-true}"
# Formatting, lints and docs first: they fail before the long test build.
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
# Every test, each in its own process, the binaries side by side (cargo-nextest, installed by
# setup.sh; .config/nextest.toml), then the doc tests (nextest does not run them).
cargo nextest run --workspace --locked "$@"
cargo test --workspace --locked --doc
# The benches are not run here (timings belong to `cargo bench`), but they must build.
cargo test --workspace --locked --benches --no-run
