#!/usr/bin/env bash
# The whole test suite: unit tests, the lab's real-network integration tests, the fuzz corpora.
# Needs root (the lab builds network namespaces) and the packages scripts/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test.sh: run as root: the tests build network namespaces" >&2; exit 1; }
scripts/setup.sh
cargo test --workspace --release --no-fail-fast -- --test-threads="${TCPKIT_TEST_THREADS:-2}"
