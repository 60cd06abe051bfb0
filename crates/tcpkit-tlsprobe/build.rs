//! Compiles bpf/tlsprobe.bpf.c with clang for the BPF target into OUT_DIR (the loader embeds
//! the object), and generates the Rust side of bpf/tlsprobe.h (the ring-buffer record, the
//! counters' indices, the bounds) into OUT_DIR/tlsprobe.rs with bindgen, so the header stays
//! the one definition of what user space and the programs share. Needs clang, libclang and
//! libbpf's headers (libbpf-dev), installed by scripts/setup.sh, as tcpkit-balance does.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let src = "bpf/tlsprobe.bpf.c";
    let header = "bpf/tlsprobe.h";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed={header}");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    // <asm/types.h> under the multiarch directory on Debian; bpf_tracing.h's PT_REGS_* need
    // the target architecture to read a probe's arguments from struct pt_regs.
    let (multiarch, target_arch) = match arch.as_str() {
        "x86_64" => ("/usr/include/x86_64-linux-gnu", "x86"),
        "aarch64" => ("/usr/include/aarch64-linux-gnu", "arm64"),
        other => panic!("tcpkit-tlsprobe: no uprobe argument registers known for {other}"),
    };
    compile_bpf(src, multiarch, target_arch, &out.join("tlsprobe.bpf.o"));
    generate(header, multiarch, &out.join("tlsprobe.rs"));
}

/// -Wpadded as an error keeps padding out of the shared structs (the record is read from the
/// ring as bytes, each field at the offset bindgen asserts).
fn compile_bpf(src: &str, multiarch: &str, target_arch: &str, obj: &Path) {
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let status = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Wpadded", "-Werror",
        ])
        .arg(format!("-D__TARGET_ARCH_{target_arch}"))
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(obj)
        .status()
        .unwrap_or_else(|e| {
            panic!("running {clang} to build {src}: {e} (scripts/setup.sh installs clang)")
        });
    assert!(
        status.success(),
        "{clang} failed on {src} (scripts/setup.sh installs clang and libbpf-dev)"
    );
}

/// bindgen over the header as clang lays it out for the BPF target, the layout the programs
/// write: bindgen asserts every struct's size and field offsets at compile time.
fn generate(header: &str, multiarch: &str, rs: &Path) {
    bindgen::Builder::default()
        .header(header)
        .clang_arg("--target=bpf")
        .clang_arg(format!("-I{multiarch}"))
        .derive_default(true)
        .use_core()
        .allowlist_type("record")
        .allowlist_type("secret_record")
        .allowlist_type("layout")
        .allowlist_var("[A-Z][A-Z0-9_]*")
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen over {header}: {e} (scripts/setup.sh installs libclang-dev)")
        })
        .write_to_file(rs)
        .unwrap_or_else(|e| panic!("writing {}: {e}", rs.display()));
}
