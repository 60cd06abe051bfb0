#!/usr/bin/env bash
# Sets everything up and runs the demo: a two-host lab in network namespaces where
# `tcpkit replay` sends a bundled capture to a host that records it with tcpdump; both sides'
# counts are printed. Extra arguments go to `tcpkit replay` (e.g. --pps 200, --loop 3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet -p tcpkit -p tcpkit-lab --bins --examples
# Man pages and bash completion, as the peers (tcpreplay, tcpdump, iperf3, dnsperf) ship theirs.
target/release/tcpkit man /usr/local/share/man/man1
mkdir -p /usr/share/bash-completion/completions
target/release/tcpkit completions bash > /usr/share/bash-completion/completions/tcpkit
exec target/release/examples/demo "$@"
