#!/usr/bin/env bash
# The whole test suite: formatting and clippy lints, unit tests, the lab's real-network integration tests, the fuzz corpora.
# Needs root (the lab builds network namespaces) and the packages scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root: the tests build network namespaces" >&2; exit 1; }
scripts/setup.sh
# Style and lints first: they fail in seconds where the suite takes minutes.
cargo fmt --all --check || { echo "test.sh: cargo fmt --check: run cargo fmt" >&2; exit 1; }
# Everything in the suite profile (root Cargo.toml: release code without LTO or debuginfo), so
# clippy and the tests share one profile's build scripts (balance's clang-built BPF object).
cargo clippy --workspace --all-targets --profile suite -- -D warnings
# The fuzz crate is a workspace of its own (cargo-fuzz wants that), with the same lints and
# its own copy of the suite profile; stable clippy checks it, no nightly needed. Without its
# default `link` feature, which only fuzzing needs, libFuzzer's C++ is not compiled for it;
# in the workspace's target directory it reuses the dependencies the clippy above checked.
cargo clippy --manifest-path fuzz/Cargo.toml --target-dir "${CARGO_TARGET_DIR:-target}" \
    --all-targets --profile suite --no-default-features -- -D warnings
# Two threads: the lab tests time packets, and more than one per core measures the machine.
cargo test --workspace --profile suite --no-fail-fast -- --test-threads="${TCPKIT_TEST_THREADS:-2}"
