#!/bin/bash
# What one SSL_do_handshake probe costs, by part (issue 27's secrets mode), in-process and
# without a lab: hsbench calls SSL_do_handshake on an object with no handshake function (-1 at
# once) or runs whole in-memory TLS 1.3 handshakes (client and server in one thread, the server
# calling it twice per handshake as nginx does), pinned to CPU 1, CPU from getrusage. Parts:
#   entry / return: perf's uprobe / uretprobe events (counting only): the traps alone;
#   copy:           `tcpkit copy -i lo --tls-uprobe LIBSSL` (no traffic on its port): the
#                   probes with their BPF programs; the programs' own run time per call from
#                   kernel.bpf_stats_enabled (turned off again); IRQ work interrupts (the ring's
#                   wakeups) from /proc/interrupts.
# Run as root from anywhere: bench/uprobe-cost/run.sh [TCPKIT] [ROUNDS] (default: the suite
# build, 3 rounds). Needs gcc, libssl-dev, perf, bpftool, openssl.
set -eu
TCPKIT=${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/suite/tcpkit}
ROUNDS=${2:-3}
L=/usr/lib/x86_64-linux-gnu/libssl.so.3
D=$(mktemp -d)
trap 'perf probe -q -d "probe_libssl:*" 2>/dev/null || true; sysctl -q kernel.bpf_stats_enabled=0; rm -rf "$D"' EXIT
gcc -O2 -o "$D/hsbench" "$(dirname "$0")/hsbench.c" -lssl -lcrypto
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$D/k.pem" \
	-out "$D/c.pem" -subj /CN=bench -days 1 2>/dev/null
perf probe -q -x $L --add SSL_do_handshake
perf probe -q -x $L --add 'SSL_do_handshake%return'
B="taskset -c 1 $D/hsbench"
iwi() { awk '/IWI/{print $2+$3}' /proc/interrupts; }
copy() {
	"$TCPKIT" copy -x 9-127.0.0.1:9 -i lo --tls-uprobe $L --json -q >"$D/copy.json" 2>&1 &
	CP=$!
	sleep 1.5
}
stopc() { kill -INT $CP; wait $CP || true; }
for r in $(seq "$ROUNDS"); do
	echo "round $r, load $(cut -d' ' -f1 /proc/loadavg)"
	echo "calls none    $($B calls 300000)"
	echo "calls entry   $(perf stat -x, -e probe_libssl:SSL_do_handshake -o /dev/null -- $B calls 300000)"
	echo "calls return  $(perf stat -x, -e probe_libssl:SSL_do_handshake__return -o /dev/null -- $B calls 300000)"
	copy
	echo "calls copy    $($B calls 300000)"
	stopc
	echo "hs13 none     $($B hs13 1000 "$D/c.pem" "$D/k.pem")"
	sysctl -q kernel.bpf_stats_enabled=1
	copy
	a=$(iwi)
	echo "hs13 copy     $($B hs13 1000 "$D/c.pem" "$D/k.pem")"
	echo "  irq work interrupts: $(($(iwi) - a)) per 1000 handshakes"
	bpftool prog show | awk '/tk_hs_(enter|leave)/ {printf "  %s: %.0f ns/run over %d runs\n", $4, $9 / $11, $11}'
	stopc
	sysctl -q kernel.bpf_stats_enabled=0
done
