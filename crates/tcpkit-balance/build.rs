//! Compiles bpf/*.bpf.c with clang for the BPF target into OUT_DIR (the loader embeds the
//! object), and generates the Rust side of bpf/balance.h (its structs and constants) into
//! OUT_DIR/balance.rs with bindgen, so the header stays the one definition of what user space
//! and the programs share. Needs clang, libclang and libbpf's headers (libbpf-dev:
//! bpf_helpers.h), installed by scripts/setup.sh.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The structs of bpf/balance.h, by their C names, and the Rust names they get.
const STRUCTS: [(&str, &str); 9] = [
    ("svc_key", "SvcKey"),
    ("svc", "Svc"),
    ("backend", "Backend"),
    ("revnat", "Revnat"),
    ("trace_event", "TraceEvent"),
    ("active", "Active"),
    ("persist_key", "PersistKey"),
    ("persist_val", "PersistVal"),
    ("sock_tag", "SockTag"),
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let src = "bpf/balance.bpf.c";
    let header = "bpf/balance.h";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed={header}");
    // <asm/types.h> lives under the multiarch include directory on Debian.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = match arch.as_str() {
        "x86_64" => "/usr/include/x86_64-linux-gnu",
        "aarch64" => "/usr/include/aarch64-linux-gnu",
        _ => "/usr/include",
    };
    compile_bpf(src, multiarch, &out.join("balance.bpf.o"));
    generate(header, multiarch, &out.join("balance.rs"));
}

/// -Wpadded (an error here) keeps padding out of the shared structs: aya copies a map key or
/// value's every byte to the kernel, so the `Pod` impls in src/bpf.rs need structs with no
/// padding bytes. It is given here, not to bindgen: libclang parsing the header alone does not
/// lay the structs out, so it never says -Wpadded's errors (a header with a hole went through
/// bindgen without one); compiling the programs does.
fn compile_bpf(src: &str, multiarch: &str, obj: &Path) {
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let status = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Wpadded", "-Werror",
        ])
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
/// see: bindgen asserts every struct's size, alignment and field offsets at compile time, so a
/// host whose repr(C) layout differed from the programs' would not build.
fn generate(header: &str, multiarch: &str, rs: &Path) {
    let mut b = bindgen::Builder::default()
        .header(header)
        .clang_arg("--target=bpf")
        .clang_arg(format!("-I{multiarch}"))
        .derive_default(true)
        .derive_eq(true)
        .use_core()
        .parse_callbacks(Box::new(Names))
        // The defines (MAX_SERVICES, ALGO_*, COUNTER_*, ...) as u32 constants.
        .allowlist_var("[A-Z][A-Z0-9_]*");
    for (c, _) in STRUCTS {
        b = b.allowlist_type(c);
    }
    b.generate()
        .unwrap_or_else(|e| {
            panic!("bindgen over {header}: {e} (scripts/setup.sh installs libclang-dev)")
        })
        .write_to_file(rs)
        .unwrap_or_else(|e| panic!("writing {}: {e}", rs.display()));
}

/// Gives the structs Rust names; the fields keep the header's.
#[derive(Debug)]
struct Names;

impl bindgen::callbacks::ParseCallbacks for Names {
    fn item_name(&self, item: bindgen::callbacks::ItemInfo<'_>) -> Option<String> {
        STRUCTS
            .iter()
            .find(|(c, _)| *c == item.name)
            .map(|(_, r)| (*r).to_string())
    }
}
