#!/usr/bin/env bash
# Runs every fuzz target in turn for SECONDS each (default 600), growing fuzz/corpus/<target>/,
# then minimises each grown corpus (cargo fuzz cmin) so what is committed stays small. The
# grown inputs (named by their hash) are committed beside the hand-written seeds.
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain (`rustup toolchain
# install nightly`). Logs go to target/fuzz-logs/<target>.log; a crash stops the script with
# the reproducer's path (fuzz/artifacts/<target>/).
#
#   scripts/fuzz.sh                 # all targets, 10 minutes each
#   scripts/fuzz.sh 60 dns control  # these targets, 1 minute each
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(pcap_read pcapng rewrite dns http h2 reasm nfqueue netlink merge_report control mpcat_frame mpcat_record fleet_frame)
fi
logs=target/fuzz-logs
mkdir -p "$logs"
cd fuzz
cargo +nightly fuzz build -O
for t in "${targets[@]}"; do
    echo "== $t: ${secs}s"
    # -rss_limit_mb and -timeout turn a leak or a hang into a reported failure, not a stall.
    if ! cargo +nightly fuzz run -O "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 \
        -timeout=10 -print_final_stats=1 >"../$logs/$t.log" 2>&1; then
        echo "fuzz $t failed: see $logs/$t.log and fuzz/artifacts/$t/" >&2
        tail -30 "../$logs/$t.log" >&2
        exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)' \
        "../$logs/$t.log" || true
    cargo +nightly fuzz cmin -O "$t" >"../$logs/$t.cmin.log" 2>&1
    # cmin keeps only inputs that add coverage, so it drops hand-written seeds the grown ones
    # cover; those stay: they are the readable examples the corpus tests name.
    git checkout -- "corpus/$t" 2>/dev/null || true
    echo "$t corpus: $(ls "corpus/$t" | wc -l) files"
done
