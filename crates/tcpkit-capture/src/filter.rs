//! tcpdump filter expressions compiled to classic BPF by libpcap, for the kernel to run on the
//! capture socket.
//!
//! libpcap is used through a few FFI calls (`pcap_open_dead`, `pcap_compile`, `pcap_freecode`)
//! rather than the `pcap` crate: compiling is all we need from it, and those five functions
//! are a smaller surface than a crate that also wraps live capture, which this crate does
//! itself. libpcap 1.8 and later compile thread-safely; Debian ships 1.10.
//!
//! The compiled program's accepting `ret` returns the snaplen, which is how the kernel learns
//! how much of each packet to copy into the ring: a capture always has a program attached,
//! the empty expression included.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use crate::CaptureError;

/// pcap link type of frames that start with an Ethernet header.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// pcap link type of frames that start with an IPv4 or IPv6 header.
pub const LINKTYPE_RAW: u32 = 101;
/// libpcap's `DLT_RAW` on Linux: what `pcap_open_dead` wants for [`LINKTYPE_RAW`].
const DLT_RAW: c_int = 12;
/// `PCAP_NETMASK_UNKNOWN`: only `ip broadcast` needs the netmask, and it then fails cleanly.
const NETMASK_UNKNOWN: u32 = 0xffff_ffff;

/// `struct bpf_program`; its instructions have the layout of the kernel's `sock_filter`.
#[repr(C)]
struct BpfProgram {
    bf_len: c_uint,
    bf_insns: *mut libc::sock_filter,
}

#[link(name = "pcap")]
extern "C" {
    fn pcap_open_dead(linktype: c_int, snaplen: c_int) -> *mut c_void;
    fn pcap_compile(
        p: *mut c_void,
        fp: *mut BpfProgram,
        s: *const c_char,
        optimize: c_int,
        netmask: u32,
    ) -> c_int;
    fn pcap_geterr(p: *mut c_void) -> *mut c_char;
    fn pcap_freecode(fp: *mut BpfProgram);
    fn pcap_close(p: *mut c_void);
}

/// Closes the dead handle however compilation ends.
struct Dead(*mut c_void);

impl Drop for Dead {
    fn drop(&mut self) {
        // SAFETY: the handle came from pcap_open_dead and is closed once.
        unsafe { pcap_close(self.0) };
    }
}

/// Compiles the tcpdump expression `expr` for frames of pcap link type `linktype`
/// ([`LINKTYPE_ETHERNET`], [`LINKTYPE_RAW`], or another `LINKTYPE_*` that libpcap knows),
/// accepting packets with their first `snaplen` bytes. The empty expression accepts all.
///
/// The program is for a live Linux socket: `inbound`/`outbound` become loads of the kernel's
/// packet type. The `vlan` keyword, however, tests for a tag inside the frame, and the kernel
/// strips the tag of received frames before the filter runs (it is reported in
/// [`CapturedPacket::vlan_tci`](crate::CapturedPacket::vlan_tci)); for the same reason a
/// filter without `vlan` matches received tagged traffic as if untagged, as tcpdump does.
pub fn compile_filter(
    expr: &str,
    linktype: u32,
    snaplen: u32,
) -> Result<Vec<libc::sock_filter>, CaptureError> {
    let fail = |reason: String| CaptureError::Filter {
        expr: expr.to_owned(),
        reason,
    };
    if snaplen == 0 {
        return Err(fail("snaplen 0 would capture nothing".into()));
    }
    let cexpr = CString::new(expr).map_err(|_| fail("contains a NUL byte".into()))?;
    let dlt = match linktype {
        LINKTYPE_RAW => DLT_RAW,
        other => c_int::try_from(other).map_err(|_| fail(format!("link type {other}")))?,
    };
    let snap = c_int::try_from(snaplen).unwrap_or(c_int::MAX);
    // SAFETY: plain constructor; null on failure.
    let p = unsafe { pcap_open_dead(dlt, snap) };
    if p.is_null() {
        return Err(fail(format!(
            "libpcap cannot open a handle for link type {linktype}"
        )));
    }
    let dead = Dead(p);
    let mut prog = BpfProgram {
        bf_len: 0,
        bf_insns: std::ptr::null_mut(),
    };
    // SAFETY: the handle is open, `prog` and the C string outlive the call.
    let rc = unsafe { pcap_compile(dead.0, &mut prog, cexpr.as_ptr(), 1, NETMASK_UNKNOWN) };
    if rc != 0 {
        // SAFETY: pcap_geterr returns the handle's NUL-terminated message buffer.
        let msg = unsafe { CStr::from_ptr(pcap_geterr(dead.0)) }.to_string_lossy();
        // libpcap 1.10 prefixes parser errors with this; our message already says "filter".
        let reason = msg.trim();
        let reason = reason
            .strip_prefix("can't parse filter expression: ")
            .unwrap_or(reason);
        return Err(fail(reason.to_owned()));
    }
    let insns = if prog.bf_insns.is_null() {
        Vec::new()
    } else {
        // SAFETY: on success libpcap allocated bf_len instructions at bf_insns.
        unsafe { std::slice::from_raw_parts(prog.bf_insns, prog.bf_len as usize) }.to_vec()
    };
    // SAFETY: frees what pcap_compile allocated, once.
    unsafe { pcap_freecode(&mut prog) };
    if insns.is_empty() {
        return Err(fail("libpcap returned an empty program".into()));
    }
    Ok(insns)
}

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Prepends to `prog` (compiled for Ethernet) a test that drops frames from interfaces that
/// are neither Ethernet nor loopback. A socket bound to all interfaces sees every link type,
/// and the program's fixed offsets would read an IP header (tun, WireGuard) as if it started
/// with an Ethernet header; such frames are kept out instead of being misfiltered and then
/// misparsed. Classic BPF jumps are relative, so `prog` itself is unchanged.
pub(crate) fn ethernet_only(prog: &[libc::sock_filter]) -> Vec<libc::sock_filter> {
    let hatype = (libc::SKF_AD_OFF + libc::SKF_AD_HATYPE) as u32;
    let mut out = Vec::with_capacity(prog.len() + 4);
    out.push(stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, hatype));
    // Ethernet: on to the program (skip the next two).
    out.push(jump(
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        u32::from(libc::ARPHRD_ETHER),
        2,
        0,
    ));
    // Loopback: on to the program (skip the next one); anything else: drop.
    out.push(jump(
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        u32::from(libc::ARPHRD_LOOPBACK),
        1,
        0,
    ));
    out.push(stmt(libc::BPF_RET | libc::BPF_K, 0));
    out.extend_from_slice(prog);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_ret_k(i: &libc::sock_filter, k: u32) -> bool {
        u32::from(i.code) == libc::BPF_RET | libc::BPF_K && i.k == k
    }

    #[test]
    fn empty_expression_accepts_snaplen_bytes() {
        let p = compile_filter("", LINKTYPE_ETHERNET, 1234).expect("compile");
        assert_eq!(p.len(), 1);
        assert!(is_ret_k(&p[0], 1234));
    }

    #[test]
    fn port_filter_accepts_with_snaplen_and_rejects_with_zero() {
        let p = compile_filter("tcp port 80", LINKTYPE_ETHERNET, 96).expect("compile");
        assert!(p.len() > 5);
        assert!(p.iter().any(|i| is_ret_k(i, 96)));
        assert!(p.iter().any(|i| is_ret_k(i, 0)));
        // Port 80 appears as a constant compared against.
        assert!(p.iter().any(|i| i.k == 80));
    }

    #[test]
    fn raw_ip_link_type_compiles_differently_from_ethernet() {
        let eth = compile_filter("ip", LINKTYPE_ETHERNET, 100).expect("ethernet");
        let raw = compile_filter("ip", LINKTYPE_RAW, 100).expect("raw");
        // On Ethernet `ip` loads the ethertype at offset 12; raw IP looks at the version nibble.
        assert!(eth.iter().any(|i| i.k == 12));
        assert!(!raw.iter().any(|i| i.k == 12));
    }

    #[test]
    fn bad_expressions_name_the_expression_and_libpcap_reason() {
        let e = compile_filter("tcp port", LINKTYPE_ETHERNET, 65535).unwrap_err();
        assert_eq!(e.to_string(), "filter \"tcp port\": syntax error");
        let e = compile_filter("tcp port 99999", LINKTYPE_ETHERNET, 65535)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("filter \"tcp port 99999\": "), "{e}");
        assert!(e.contains("99999"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = compile_filter("tcp\0", LINKTYPE_ETHERNET, 65535).unwrap_err();
        assert_eq!(e.to_string(), "filter \"tcp\\0\": contains a NUL byte");
        let e = compile_filter("tcp", LINKTYPE_ETHERNET, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "filter \"tcp\": snaplen 0 would capture nothing"
        );
    }

    #[test]
    fn ethernet_only_guard_keeps_the_program_after_it() {
        let p = compile_filter("udp", LINKTYPE_ETHERNET, 500).expect("compile");
        let g = ethernet_only(&p);
        assert_eq!(g.len(), p.len() + 4);
        let key = |i: &libc::sock_filter| (i.code, i.jt, i.jf, i.k);
        assert!(g[4..].iter().map(key).eq(p.iter().map(key)));
        // Both accepting jumps land on the program's first instruction (index 4).
        assert_eq!(1 + 1 + usize::from(g[1].jt), 4);
        assert_eq!(2 + 1 + usize::from(g[2].jt), 4);
        assert!(is_ret_k(&g[3], 0));
    }
}
