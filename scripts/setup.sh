#!/usr/bin/env bash
# Installs what tcpkit's build, tests, demo and benchmarks need on a fresh Debian machine, and
# nothing more. Idempotent: a second run installs nothing.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "setup.sh: run as root (it installs Debian packages)" >&2; exit 1; }

pkgs=(
  iproute2 iputils-ping ethtool procps psmisc   # the lab: namespaces, veth, tc, ping, process tools
  tcpdump tshark                                # what went on the wire
  nftables iptables                             # lab rules (dropped SYNs); intercept --on-target's queue rule (iptables where nft has no queue)
  tcpreplay                                     # tcpreplay/tcprewrite: peer and oracle
  libpcap-dev clang pkg-config                  # filter compilation, BPF programs
  libbpf-dev linux-libc-dev bpftool             # balance: bpf_helpers.h and linux/bpf.h for its BPF C; bpftool for the tests' kernel-side checks
  libclang-dev                                  # balance's build: bindgen reads bpf/balance.h through libclang (the Rust side of its map structs)
  time util-linux                               # /usr/bin/time for peak memory; prlimit
  man-db                                        # man: the tests read tcpkit man's pages as a user would (man -w, rendering)
  dpkg-dev binutils systemd                     # scripts/package.sh: dpkg-shlibdeps (Depends), strip; systemd-analyze verify on the units
  redis-server nginx unbound dnsperf wrk        # real servers and load peers for tests and benchmarks
  nghttp2-client openssl curl                   # TLS and HTTP/2 peers: h2load (HTTP/2 load), openssl (the lab's test CA, s_client, s_time), curl (HTTPS/h2 requests, SSLKEYLOGFILE)
  iperf3 socat mptcpize                         # bench mpcat: its peers (one stream, iperf3 -P 4, MPTCP through mptcpize)
  libxdp-dev libcap-dev                         # bench replay: xdpsock, its AF_XDP reference sender, is built against them (below)
  openssh-server openssh-client python3-venv    # the fleet lab: sshd in each host, ansible-playbook over ssh (venv below)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; the answer does not matter for root.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get update -qq
  # Servers are started by the tests inside their own namespaces, never as host services:
  # keep their packages from starting daemons in the root namespace while installing.
  policy=/usr/sbin/policy-rc.d
  had_policy=0; [ -e "$policy" ] && had_policy=1
  [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; }
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ "$had_policy" = 1 ] || rm -f "$policy"
fi
# ansible-core for deploy/ansible and its lab test, from PyPI into a venv of its own (Debian 12's
# pip refuses to install into the system's Python). Pinned: the newest release that runs on
# Debian 12's Python 3.11 (2.20 needs 3.12).
ANSIBLE_VENV=/opt/tcpkit-ansible
ANSIBLE_CORE=2.19.14
if [ "$("$ANSIBLE_VENV/bin/ansible-playbook" --version 2>/dev/null | sed -n 's/.*\[core \(.*\)\]/\1/p')" != "$ANSIBLE_CORE" ]; then
  echo "setup.sh: installing ansible-core $ANSIBLE_CORE into $ANSIBLE_VENV"
  [ -x "$ANSIBLE_VENV/bin/pip" ] || /usr/bin/python3 -m venv "$ANSIBLE_VENV"
  "$ANSIBLE_VENV/bin/pip" install -q "ansible-core==$ANSIBLE_CORE"
fi
# kubernetes-validate for deploy/kubernetes's test: the manifests are validated offline against
# the Kubernetes OpenAPI schemas this PyPI package bundles (its version fixes the newest schema
# version, 1.37); the test reads the manifests with the PyYAML it brings. A venv of its own, as
# ansible's, pinned.
KUBEVAL_VENV=/opt/tcpkit-kubernetes-validate
KUBEVAL=1.37.0
if [ "$("$KUBEVAL_VENV/bin/kubernetes-validate" --version 2>/dev/null)" != "$KUBEVAL" ]; then
  echo "setup.sh: installing kubernetes-validate $KUBEVAL into $KUBEVAL_VENV"
  [ -x "$KUBEVAL_VENV/bin/pip" ] || /usr/bin/python3 -m venv "$KUBEVAL_VENV"
  "$KUBEVAL_VENV/bin/pip" install -q "kubernetes-validate==$KUBEVAL"
fi
# bench replay's AF_XDP reference sender: xdpsock of xdp-project/bpf-examples, kept in
# bench/xdpsock (its README says which commit and what changed), built with clang against
# Debian's libxdp and libbpf. Only the benchmark runs it: a build that fails is said and the
# suite goes on (the bench's reference row then says xdpsock is missing).
XDPSOCK_DIR=/opt/tcpkit-xdpsock
XDPSOCK_SRC="$(cd "$(dirname "$0")/.." && pwd)/bench/xdpsock"
XDPSOCK_SUM=$(sha256sum "$XDPSOCK_SRC/xdpsock.c" | cut -d' ' -f1)
if [ "$(cat "$XDPSOCK_DIR/SOURCE" 2>/dev/null)" != "$XDPSOCK_SUM" ]; then
  echo "setup.sh: building xdpsock (bench/xdpsock) into $XDPSOCK_DIR"
  mkdir -p "$XDPSOCK_DIR"
  if clang -O2 -I"$XDPSOCK_SRC" -o "$XDPSOCK_DIR/xdpsock" "$XDPSOCK_SRC/xdpsock.c" \
      -lxdp -lbpf -lpthread -lcap; then
    echo "$XDPSOCK_SUM" > "$XDPSOCK_DIR/SOURCE"
  else
    echo "setup.sh: xdpsock did not build: bench replay will run without its AF_XDP reference row" >&2
  fi
fi
command -v cargo >/dev/null || { echo "setup.sh: cargo not found (install Rust with rustup)" >&2; exit 1; }
# scripts/package.sh builds the Debian package with cargo-deb (kornelski's, the usual builder of
# .debs from Cargo projects), pinned so a package is made the same way on every machine.
cargo_deb=3.8.0
if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $cargo_deb" ]; then
  echo "setup.sh: installing cargo-deb $cargo_deb"
  cargo install --locked --quiet cargo-deb --version "$cargo_deb"
fi
