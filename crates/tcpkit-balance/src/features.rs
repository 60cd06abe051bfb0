//! What this kernel offers balance, probed for real (never guessed from the version): each
//! socket-address hook by loading a two-instruction program of that attach type, helpers by
//! aya's probe (a program calling the helper, judged by the verifier's answer), the ring
//! buffer by creating one, and bpf_sock_destroy (a kfunc, so it has no helper number) by
//! its name in the kernel's own BTF. Each comes with what is lost without it.

use serde::{Deserialize, Serialize};

/// One feature and whether the kernel has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Feature {
    pub name: String,
    /// `hook`, `helper`, `kfunc` or `map`.
    pub kind: String,
    pub present: bool,
    /// What does not work without it.
    pub without: String,
}

// enum bpf_attach_type (include/uapi/linux/bpf.h): the socket-address hooks.
const HOOKS: [(&str, u32, &str); 8] = [
    (
        "connect4",
        10,
        "IPv4 connects to a VIP are not balanced (balance cannot load)",
    ),
    (
        "connect6",
        11,
        "IPv6 and v4-mapped connects are not balanced (balance cannot load)",
    ),
    (
        "getpeername4",
        29,
        "getpeername() shows the backend, not the VIP (balance cannot load)",
    ),
    (
        "getpeername6",
        30,
        "getpeername() on IPv6 sockets shows the backend (balance cannot load)",
    ),
    (
        "sendmsg4",
        14,
        "unconnected UDP to an IPv4 VIP is not balanced (balance cannot load)",
    ),
    (
        "sendmsg6",
        15,
        "unconnected UDP to an IPv6 VIP is not balanced (balance cannot load)",
    ),
    (
        "recvmsg4",
        19,
        "UDP replies show the backend's address, not the VIP (balance cannot load)",
    ),
    (
        "recvmsg6",
        20,
        "UDP replies on IPv6 sockets show the backend (balance cannot load)",
    ),
];

const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
const BPF_PROG_LOAD: libc::c_long = 5;

/// The start of `union bpf_attr` for BPF_PROG_LOAD, up to expected_attach_type (the kernel
/// takes a shorter attr than it knows, zero-filling the rest).
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// Whether a cgroup/sock_addr program of `attach_type` loads: `r0 = 1; exit`.
fn hook_loads(attach_type: u32) -> bool {
    // struct bpf_insn: code, dst/src registers, offset, immediate.
    let insns: [u64; 2] = [
        u64::from_le_bytes([0xb7, 0, 0, 0, 1, 0, 0, 0]), // BPF_ALU64 | BPF_MOV | BPF_K: r0 = 1
        u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]), // BPF_JMP | BPF_EXIT
    ];
    let license = c"GPL";
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: [0; 16],
        prog_ifindex: 0,
        expected_attach_type: attach_type,
    };
    // SAFETY: bpf(2) reads `attr` (size given) and the instructions and license it points
    // to, all alive for the call; it returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &attr as *const ProgLoadAttr,
            std::mem::size_of::<ProgLoadAttr>() as u32,
        )
    };
    if fd >= 0 {
        // SAFETY: the descriptor bpf(2) just returned, ours alone.
        unsafe { libc::close(fd as i32) };
        true
    } else {
        false
    }
}

fn helper(name: &str, id: aya::sys::BpfHelper, without: &str) -> Feature {
    let present = aya::sys::is_helper_supported(aya::programs::ProgramType::CgroupSockAddr, id)
        .unwrap_or(false);
    Feature {
        name: name.into(),
        kind: "helper".into(),
        present,
        without: without.into(),
    }
}

/// Whether `name` is a function in the kernel's BTF (/sys/kernel/btf/vmlinux's string
/// section holds every type and function name, NUL-separated).
fn in_kernel_btf(name: &str) -> bool {
    let Ok(btf) = std::fs::read("/sys/kernel/btf/vmlinux") else {
        return false;
    };
    let mut want = Vec::with_capacity(name.len() + 2);
    want.push(0);
    want.extend_from_slice(name.as_bytes());
    want.push(0);
    btf.windows(want.len()).any(|w| w == want.as_slice())
}

/// Probes everything (a few milliseconds: ten tiny program loads, one map).
pub fn probe() -> Vec<Feature> {
    let mut out: Vec<Feature> = HOOKS
        .iter()
        .map(|(name, at, without)| Feature {
            name: (*name).into(),
            kind: "hook".into(),
            present: hook_loads(*at),
            without: (*without).into(),
        })
        .collect();
    use aya::sys::BpfHelper as H;
    out.push(helper(
        "bpf_set_retval",
        H::BPF_FUNC_set_retval,
        "a VIP with no backend cannot be refused with ECONNREFUSED (kernel >= 5.18; balance cannot load)",
    ));
    out.push(helper(
        "bpf_get_netns_cookie",
        H::BPF_FUNC_get_netns_cookie,
        "maglev by client cannot tell network namespaces apart (balance cannot load)",
    ));
    out.push(Feature {
        name: "bpf_sock_destroy".into(),
        kind: "kfunc".into(),
        present: in_kernel_btf("bpf_sock_destroy"),
        without: "sockets still on a dead backend cannot be ended from BPF (kernel >= 6.5; sock_diag destroy is the fallback)".into(),
    });
    out.push(Feature {
        name: "ringbuf".into(),
        kind: "map".into(),
        present: aya::sys::is_map_supported(aya::maps::MapType::RingBuf).unwrap_or(false),
        without: "--trace has nothing to read (kernel >= 5.8; balance cannot load)".into(),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attr_is_the_kernels_prefix() {
        // union bpf_attr's BPF_PROG_LOAD fields up to expected_attach_type end at byte 72.
        assert_eq!(std::mem::size_of::<ProgLoadAttr>(), 72);
    }

    #[test]
    fn a_missing_function_is_not_found_in_btf() {
        assert!(!in_kernel_btf("tcpkit_no_such_function_anywhere"));
    }
}
