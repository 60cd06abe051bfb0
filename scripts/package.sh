#!/usr/bin/env bash
# Builds the Debian package: target/debian/tcpkit_<version>_<arch>.deb (cargo-deb, installed by
# scripts/setup.sh). It holds /usr/bin/tcpkit, the man pages and shell completions generated
# from that binary, the systemd units of deploy/systemd/ and their /etc/tcpkit/*.conf.
#
#   scripts/package.sh                  # release build (as shipped), then the package
#   scripts/package.sh --profile suite --no-build --fast --output DIR
#                                       # package a binary already built (the tests' own)
#
# --profile NAME  the Cargo profile whose binary is packaged (default release)
# --no-build      package the binary already in the profile's directory; fail if there is none
# --output DIR    write the .deb into DIR instead of target/debian/
# --fast          lighter compression (a bigger .deb, made sooner)
set -euo pipefail

usage() { echo "package.sh: $1 (usage: scripts/package.sh [--profile NAME] [--no-build] [--output DIR] [--fast])" >&2; exit 2; }

profile=release
build=1
deb_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) [ $# -ge 2 ] || usage "--profile needs a name"; profile=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --output) [ $# -ge 2 ] || usage "--output needs a directory"; mkdir -p "$2"; deb_args+=(--output "$2"); shift 2 ;;
    --fast) deb_args+=(--fast); shift ;;
    *) usage "unknown argument $1" ;;
  esac
done
# cargo's dev profile builds into target/debug, and cargo-deb refuses it: a package is optimised.
[ "$profile" != dev ] || usage "--profile dev: package an optimised build (release, suite)"

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v cargo-deb >/dev/null || { echo "package.sh: cargo-deb not found (run scripts/setup.sh)" >&2; exit 1; }

# Where cargo puts the profile's binary, whatever CARGO_TARGET_DIR or a config says.
target=$(cargo metadata --no-deps --format-version 1 --locked | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target" ] || { echo "package.sh: cargo metadata named no target directory" >&2; exit 1; }
out="$target/$profile"

if [ "$build" = 1 ]; then
  cargo build --locked -p tcpkit --bin tcpkit --profile "$profile"
fi
bin="$out/tcpkit"
[ -x "$bin" ] || { echo "package.sh: $bin: no binary (build it, or leave out --no-build)" >&2; exit 1; }

# Generated from the binary being packaged, so they say what its --help says; made afresh each
# time (a page of a subcommand that is gone must not linger in the package).
gen="$out/package"
rm -rf "$gen"
"$bin" man "$gen/man1"
# Compressed as Debian policy asks (cargo-deb compresses only pages it did not find under target/).
gzip -9n "$gen"/man1/*.1
mkdir -p "$gen/completions"
"$bin" completions bash > "$gen/completions/tcpkit.bash"
"$bin" completions zsh > "$gen/completions/_tcpkit"
"$bin" completions fish > "$gen/completions/tcpkit.fish"

cargo deb -p tcpkit --no-build --profile "$profile" --locked "${deb_args[@]}"
