//! Compiles bpf/*.bpf.c with clang for the BPF target into OUT_DIR; the loader embeds the
//! object. Needs clang and libbpf's headers (libbpf-dev: bpf_helpers.h), installed by
//! scripts/setup.sh.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let src = "bpf/balance.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed=bpf/balance.h");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // <asm/types.h> lives under the multiarch include directory on Debian.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = match arch.as_str() {
        "x86_64" => "/usr/include/x86_64-linux-gnu",
        "aarch64" => "/usr/include/aarch64-linux-gnu",
        _ => "/usr/include",
    };
    let obj = out.join("balance.bpf.o");
    let status = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror",
        ])
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| {
            panic!("running {clang} to build {src}: {e} (scripts/setup.sh installs clang)")
        });
    assert!(
        status.success(),
        "{clang} failed on {src} (scripts/setup.sh installs clang and libbpf-dev)"
    );
}
