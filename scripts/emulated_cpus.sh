#!/usr/bin/env bash
# The Rust tests on CPUs other than this one, under QEMU's user-mode emulators: x86-64 without
# AVX-512 (`-cpu max`: AVX2, FMA, F16C) and without AVX (`-cpu Nehalem`), where an instruction
# the CPU lacks is SIGILL as on real hardware; and aarch64, every crate but the Python binding.
# tests/test_emulated_cpus.py runs a generation on the same two x86-64 CPUs. scripts/test.sh
# calls this; it installs what is missing (Debian packages, the rustup target).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != x86_64 ]; then
    echo "emulated CPUs: skipped, this script emulates from an x86-64 machine"
    exit 0
fi

missing=()
need() { [ -e "$1" ] || missing+=("$2"); }
need /usr/bin/qemu-x86_64 qemu-user
need /usr/bin/qemu-aarch64 qemu-user
need /usr/bin/aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
need /usr/aarch64-linux-gnu/lib/crt1.o libc6-dev-arm64-cross
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu ||
    rustup target add aarch64-unknown-linux-gnu

# srt's crates optimized, their dependencies as `cargo test` built them. Emulated, the tests
# took 5.7 min on `-cpu max`, 3.1 on Nehalem and 2.5 on aarch64 unoptimized, and 2.8, 0.6 and
# 0.3 optimized (2 busy cores), for about 50 s of compiling per target.
args=(--locked --tests --config 'profile.dev.package.srt-kernels.opt-level=3'
    --config 'profile.dev.package.srt-runtime.opt-level=3')
for cpu in max Nehalem; do
    echo "the Rust tests on qemu-x86_64 -cpu $cpu"
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="qemu-x86_64 -cpu $cpu" \
        cargo test --workspace "${args[@]}"
done
echo "the Rust tests on aarch64, every crate but the Python binding, under qemu-aarch64"
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
    cargo test --workspace --exclude srt-python --target aarch64-unknown-linux-gnu "${args[@]}"
