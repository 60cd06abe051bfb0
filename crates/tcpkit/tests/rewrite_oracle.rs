//! `tcpkit replay -t -w` against the oracle, Debian's tcprewrite 4.4.3, through the binary:
//! every rewrite option both tools have, on a capture generated here (correct checksums, so
//! tcprewrite's habit of recomputing them changes nothing) and on
//! testdata/tcpreplay-test.pcap. Packet bytes are compared byte for byte; with `-t` our
//! output keeps the input's timestamps, which is checked too.
//!
//! tcprewrite 4.4.3 bugs we deliberately do not copy (crates/tcpkit-wire/src/rewrite.rs) are
//! masked in [`mask_known_bugs`], each mask limited to the bytes the bug touches and guarded by
//! a check that tcprewrite really produced the buggy bytes and that ours are right; nothing
//! else is skipped.
//!
//! Also: `-w` gives frames of every input link type an Ethernet header (source zero MAC
//! without `--src-mac`, destination broadcast), checked on a DLT_NULL capture and generated
//! raw IPv4 (101, 228) and Linux SLL (113) captures.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{read_frames, stderr, tcpkit, testdata, Frame};

// ---------------------------------------------------------------------------------------------
// Checksums and packet layout, independent of tcpkit-wire (the oracle of the oracle).

fn sum16(mut acc: u32, b: &[u8]) -> u32 {
    for c in b.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Ethertype after any VLAN tags and MPLS labels, and where the L3 header starts, walked as
/// tcprewrite walks them: under the bottom label, IPv4 or IPv6 by the first nibble, or (0) a
/// pseudowire control word and an inner Ethernet frame whose headers are walked in turn.
fn l3_of(f: &[u8]) -> Option<(u16, usize)> {
    let mut off = 12;
    loop {
        let et = u16::from_be_bytes(f.get(off..off + 2)?.try_into().ok()?);
        match et {
            0x8100 | 0x88a8 | 0x9100 => off += 4,
            0x8847 | 0x8848 => {
                let mut p = off + 2;
                while *f.get(p + 2)? & 1 == 0 {
                    p += 4;
                }
                p += 4;
                match *f.get(p)? >> 4 {
                    4 => return Some((0x0800, p)),
                    6 => return Some((0x86dd, p)),
                    0 => off = p + 4 + 12,
                    _ => return None,
                }
            }
            _ => return Some((et, off + 2)),
        }
    }
}

/// Where the inner Ethernet header of an Ethernet-over-MPLS frame starts (after any outer
/// 802.1Q tags, the label stack and the control word).
fn eompls_inner(f: &[u8]) -> Option<usize> {
    let mut p = 12;
    while f.get(p..p + 2)? == [0x81, 0x00] {
        p += 4;
    }
    if f.get(p..p + 2)? != [0x88, 0x47] {
        return None;
    }
    p += 2;
    while *f.get(p + 2)? & 1 == 0 {
        p += 4;
    }
    p += 4;
    (*f.get(p)? >> 4 == 0 && f.len() >= p + 18).then_some(p + 4)
}

/// One checksum field of a frame: where it is and what it should hold.
#[derive(Debug, Clone)]
struct Csum {
    what: &'static str,
    at: usize,
    want: u16,
}

/// Every checksum a full recompute would set in `f`: IPv4 header always; TCP/UDP/ICMP/ICMPv6
/// when the whole datagram is in the frame and it is not a fragment (UDP checksum 0 = none).
fn checksums(f: &[u8]) -> Vec<Csum> {
    let mut out = Vec::new();
    let Some((et, l3)) = l3_of(f) else {
        return out;
    };
    let (proto, l4, l4_len, pseudo) = match et {
        0x0800 if f.len() >= l3 + 20 => {
            let ihl = usize::from(f[l3] & 0x0f) * 4;
            if f.len() < l3 + ihl {
                return out;
            }
            let mut h = f[l3..l3 + ihl].to_vec();
            h[10] = 0;
            h[11] = 0;
            out.push(Csum {
                what: "IPv4 header",
                at: l3 + 10,
                want: fold(sum16(0, &h)),
            });
            let tot = usize::from(be16(f, l3 + 2));
            let frag = be16(f, l3 + 6) & 0x3fff;
            if frag != 0 || tot < ihl || f.len() < l3 + tot {
                return out;
            }
            let proto = f[l3 + 9];
            let l4_len = tot - ihl;
            let pseudo = sum16(sum16(0, &f[l3 + 12..l3 + 20]), &[0, proto]) + l4_len as u32;
            (proto, l3 + ihl, l4_len, if proto == 1 { 0 } else { pseudo })
        }
        0x86dd if f.len() >= l3 + 40 => {
            let plen = usize::from(be16(f, l3 + 4));
            let nh = f[l3 + 6];
            if f.len() < l3 + 40 + plen {
                return out;
            }
            let pseudo = sum16(0, &f[l3 + 8..l3 + 40]) + u32::from(nh) + plen as u32;
            (nh, l3 + 40, plen, pseudo)
        }
        _ => return out,
    };
    let at = match proto {
        6 if l4_len >= 20 => 16,
        17 if l4_len >= 8 => 6,
        1 | 58 if l4_len >= 4 => 2,
        _ => return out,
    };
    if proto == 17 && et == 0x0800 && be16(f, l4 + 6) == 0 {
        return out;
    }
    let mut seg = f[l4..l4 + l4_len].to_vec();
    seg[at] = 0;
    seg[at + 1] = 0;
    let mut want = fold(sum16(pseudo, &seg));
    if proto == 17 && want == 0 {
        want = 0xffff;
    }
    let what = match proto {
        6 => "TCP",
        17 => "UDP",
        1 => "ICMP",
        _ => "ICMPv6",
    };
    out.push(Csum {
        what,
        at: l4 + at,
        want,
    });
    out
}

fn bad_checksums(f: &[u8]) -> Vec<Csum> {
    checksums(f)
        .into_iter()
        .filter(|c| be16(f, c.at) != c.want)
        .collect()
}

fn fix_checksums(f: &mut [u8]) {
    for c in checksums(f) {
        f[c.at..c.at + 2].copy_from_slice(&c.want.to_be_bytes());
    }
}

// ---------------------------------------------------------------------------------------------
// The generated capture.

const MAC_A: [u8; 6] = [0x00, 0x11, 0x22, 0x33, 0x44, 0x55];
const MAC_B: [u8; 6] = [0x00, 0x66, 0x77, 0x88, 0x99, 0xaa];
const A4: [u8; 4] = [10, 1, 2, 3];
const B4: [u8; 4] = [192, 168, 5, 6];
const A6: [u8; 16] = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const B6: [u8; 16] = [0x20, 1, 0xd, 0xb9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34];

fn eth(dst: [u8; 6], src: [u8; 6], vlan_tci: Option<u16>, et: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    if let Some(tci) = vlan_tci {
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&tci.to_be_bytes());
    }
    f.extend_from_slice(&et.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, ttl: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&(20 + l4.len() as u16).to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34]);
    h.extend_from_slice(&frag.to_be_bytes());
    h.extend_from_slice(&[ttl, proto, 0, 0]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h.extend_from_slice(l4);
    h
}

fn ipv6(src: [u8; 16], dst: [u8; 16], nh: u8, hlim: u8, l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    h.extend_from_slice(&[nh, hlim]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h.extend_from_slice(l4);
    h
}

fn tcp(sp: u16, dp: u16, data: &[u8]) -> Vec<u8> {
    let mut s = sp.to_be_bytes().to_vec();
    s.extend_from_slice(&dp.to_be_bytes());
    s.extend_from_slice(&[
        0, 0, 0x12, 0x34, 0, 0, 0x56, 0x78, 0x50, 0x18, 0x20, 0, 0, 0, 0, 0,
    ]);
    s.extend_from_slice(data);
    s
}

fn udp(sp: u16, dp: u16, data: &[u8]) -> Vec<u8> {
    let mut s = sp.to_be_bytes().to_vec();
    s.extend_from_slice(&dp.to_be_bytes());
    s.extend_from_slice(&(8 + data.len() as u16).to_be_bytes());
    s.extend_from_slice(&[0, 0]);
    s.extend_from_slice(data);
    s
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add(i as u8)).collect()
}

/// Ethernet frames: TCP and UDP over IPv4 and IPv6, ICMP, ICMPv6, ARP, a VLAN-tagged frame,
/// two frames longer than 600 bytes of L3, a UDP datagram in two fragments, TTLs near both
/// ends. Every checksum is right.
fn generated_frames() -> Vec<Vec<u8>> {
    let v4 = |s, d, proto, ttl, l4: Vec<u8>| {
        eth(
            MAC_B,
            MAC_A,
            None,
            0x0800,
            &ipv4(s, d, proto, ttl, 0x4000, &l4),
        )
    };
    let v6 = |s, d, nh, hl, l4: Vec<u8>| eth(MAC_B, MAC_A, None, 0x86dd, &ipv6(s, d, nh, hl, &l4));
    let mut frames = vec![
        v4(A4, B4, 6, 64, tcp(1234, 80, b"GET / HTTP/1.0\r\n\r\n")),
        eth(
            MAC_A,
            MAC_B,
            None,
            0x0800,
            &ipv4(
                B4,
                A4,
                6,
                254,
                0x4000,
                &tcp(80, 1234, b"HTTP/1.0 200 OK\r\n"),
            ),
        ),
        v4(
            A4,
            B4,
            17,
            2,
            udp(40000, 53, b"\x12\x34\x01\x00\x00\x01query"),
        ),
        v6(A6, B6, 6, 64, tcp(1234, 80, b"v6 over tcp")),
        v6(B6, A6, 17, 255, udp(53, 5000, b"v6 answer")),
        v4(
            A4,
            B4,
            1,
            64,
            vec![8, 0, 0, 0, 0x00, 0x07, 0x00, 0x01, b'p', b'i', b'n', b'g'],
        ),
        v6(
            A6,
            B6,
            58,
            1,
            vec![128, 0, 0, 0, 0x00, 0x07, 0x00, 0x01, 1, 2, 3, 4],
        ),
        {
            let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
            arp.extend_from_slice(&MAC_A);
            arp.extend_from_slice(&A4);
            arp.extend_from_slice(&[0; 6]);
            arp.extend_from_slice(&B4);
            eth([0xff; 6], MAC_A, None, 0x0806, &arp)
        },
        // VLAN 100, priority 3.
        eth(
            MAC_B,
            MAC_A,
            Some(0x6064),
            0x0800,
            &ipv4(A4, B4, 6, 64, 0x4000, &tcp(1234, 80, b"tagged")),
        ),
        v4(A4, B4, 6, 64, tcp(1234, 80, &pattern(1000, 7))),
        v6(A6, B6, 17, 64, udp(5000, 53, &pattern(800, 9))),
    ];
    // A UDP datagram in two fragments: the first carries the header and the checksum of the
    // whole datagram, the second only payload.
    let mut whole = v4(A4, B4, 17, 64, udp(53, 40001, &pattern(64, 3)));
    fix_checksums(&mut whole);
    let dgram = &whole[34..];
    frames.push(eth(
        MAC_B,
        MAC_A,
        None,
        0x0800,
        &ipv4(A4, B4, 17, 64, 0x2000, &dgram[..40]),
    ));
    frames.push(eth(
        MAC_B,
        MAC_A,
        None,
        0x0800,
        &ipv4(A4, B4, 17, 64, 40 / 8, &dgram[40..]),
    ));
    for f in &mut frames {
        fix_checksums(f);
        assert!(bad_checksums(f).is_empty());
    }
    frames
}

/// Microsecond timestamps (tcprewrite writes µs) with uneven gaps.
fn timestamps(n: usize) -> Vec<u64> {
    let mut t = 1_600_000_000_123_456_000u64;
    (0..n)
        .map(|i| {
            t += 1_000 * (17 + (i as u64 * 7919) % 250_000);
            t
        })
        .collect()
}

fn write_generated(path: &Path) -> Vec<Frame> {
    let frames = generated_frames();
    let ts = timestamps(frames.len());
    let mut w = tcpkit_pcap::PcapWriter::create(path, 1, 65535, false).expect("create pcap");
    for (f, t) in frames.iter().zip(&ts) {
        w.write_packet(*t, f, f.len() as u32).expect("write");
    }
    w.finish().expect("finish");
    read_frames(path)
}

// ---------------------------------------------------------------------------------------------
// Running both tools.

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tcpkit-rewrite-oracle-")
        .tempdir()
        .expect("tempdir")
}

fn tcprewrite(input: &Path, out: &Path, args: &[&str]) -> Vec<Frame> {
    let o = Command::new("tcprewrite")
        .arg("-i")
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("tcprewrite is the oracle of this test and cannot run: {e}"));
    assert!(
        o.status.success(),
        "tcprewrite {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    read_frames(out)
}

fn tcpkit_w(input: &Path, out: &Path, args: &[&str]) -> Vec<Frame> {
    let o = Command::new(tcpkit())
        .args(["replay", "-t", "-w"])
        .arg(out)
        .args(args)
        .arg(input)
        .output()
        .expect("run tcpkit");
    assert!(
        o.status.success(),
        "tcpkit replay -t -w {args:?} {}: {}",
        input.display(),
        stderr(&o)
    );
    read_frames(out)
}

/// Byte ranges where two frames differ (and a length difference).
fn differing(a: &[u8], b: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for i in 0..a.len().max(b.len()) {
        if a.get(i) != b.get(i) {
            match out.last_mut() {
                Some(r) if r.end == i => r.end = i + 1,
                _ => out.push(i..i + 1),
            }
        }
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What the options should do, as far as the masks need to know.
#[derive(Default, Clone, Copy)]
struct Opts {
    src_mac: Option<[u8; 6]>,
    dst_mac: Option<[u8; 6]>,
    /// `Some(tci)`: --enet-vlan add; `None` inside `Some`: del.
    vlan: Option<Option<u16>>,
    /// --fixcsum or --mtu-trunc: we recompute checksums too.
    full_csum: bool,
    maps_ip: bool,
}

/// What the options do to the Ethernet header alone (MACs of Ethernet II frames, the outer VLAN
/// tag), the rest of the frame as in the input: what a frame whose payload no option touches
/// (MPLS) must come out as.
fn l2_model(opts: Opts, input: &[u8]) -> Vec<u8> {
    let mut f = input.to_vec();
    if be16(&f, 12) < 0x600 {
        return f;
    }
    if let Some(m) = opts.dst_mac {
        f[0..6].copy_from_slice(&m);
    }
    if let Some(m) = opts.src_mac {
        f[6..12].copy_from_slice(&m);
    }
    match opts.vlan {
        Some(Some(tci)) => {
            f.splice(12..12, [0x81, 0x00, (tci >> 8) as u8, tci as u8]);
        }
        Some(None) if be16(&f, 12) == 0x8100 => {
            f.drain(12..16);
        }
        _ => {}
    }
    f
}

/// One's-complement difference between a checksum field and its right value: how wrong it is.
fn csum_error(field: u16, want: u16) -> u16 {
    let d = fold(u32::from(!field) + u32::from(want));
    if d == 0xffff {
        0
    } else {
        d
    }
}

/// Our checksum `what` must be right when we recomputed (`full`) or the input's was right;
/// otherwise it must be exactly as wrong as the input's (incremental updates keep the error).
fn assert_our_checksum(what: &str, opts: Opts, input: &[u8], ours: &[u8]) {
    let find = |f: &[u8]| checksums(f).into_iter().find(|c| c.what == what);
    let (Some(i), Some(o)) = (find(input), find(ours)) else {
        panic!(
            "{what} checksum missing\n in   {}\n ours {}",
            hex(input),
            hex(ours)
        );
    };
    let in_err = csum_error(be16(input, i.at), i.want);
    let our_err = csum_error(be16(ours, o.at), o.want);
    if opts.full_csum || in_err == 0 {
        assert_eq!(our_err, 0, "our {what} checksum is wrong: {}", hex(ours));
    } else {
        assert_eq!(
            our_err,
            in_err,
            "our {what} checksum lost the input's error: {}",
            hex(ours)
        );
    }
}

fn is_ipv4_multicast(f: &[u8]) -> bool {
    matches!(l3_of(f), Some((0x0800, l3)) if f.len() >= l3 + 20 && f[l3 + 16] & 0xf0 == 0xe0)
}

/// Known tcprewrite 4.4.3 bugs: where tcprewrite's frame differs from a correct rewrite only
/// because of one of them, set exactly the bytes the bug touched in `theirs` to ours, after
/// checking that tcprewrite's bytes are the bug's and ours are right. Returns the names of
/// the bugs masked.
fn mask_known_bugs(
    opts: Opts,
    input: &[u8],
    ours: &[u8],
    theirs: &mut Vec<u8>,
) -> Vec<&'static str> {
    let mut bugs = Vec::new();
    let Some((et, l3)) = l3_of(ours) else {
        return bugs;
    };
    if let (Some(ours_in), Some(input_in)) = (eompls_inner(ours), eompls_inner(input)) {
        // tcprewrite 4.4.3 bug: on Ethernet over MPLS (label stack, control word, Ethernet
        // frame) it takes the *inner* Ethernet header for the frame's own: MACs are set and
        // VLAN tags pushed or popped in the inner frame, while the outer header stays as
        // captured. Ours edits the outer header; the inner IP header is edited by both. So
        // tcprewrite's frame must be: the input's outer headers, then our inner frame with
        // the L2 edits applied to it. Then, and only then, it is this bug.
        if *theirs != ours {
            let mut model = input[..input_in].to_vec();
            model.extend_from_slice(&l2_model(opts, &ours[ours_in..]));
            assert_eq!(
                hex(theirs),
                hex(&model),
                "EoMPLS: tcprewrite's frame is not the input's outer header over our inner frame with the L2 edits"
            );
            *theirs = ours.to_vec();
            bugs.push("tcprewrite edits the inner frame of Ethernet over MPLS");
        }
        return bugs;
    }
    let want_macs = &l2_model(opts, input)[0..12];
    if et == 0x86dd && theirs.len() >= l3 + 40 && l3_of(theirs) == Some((et, l3)) {
        // tcprewrite 4.4.3 replaces the MACs of every IPv6 frame it edits with multicast MACs
        // 33:33:<last 4 bytes of the destination / source address>, unicast or not, and
        // even over --enet-smac/--enet-dmac. Ours: the input's MACs or the ones asked for.
        let mcast = |addr: usize| [&[0x33, 0x33][..], &theirs[addr + 12..addr + 16]].concat();
        let (dst, src) = (mcast(l3 + 24), mcast(l3 + 8));
        if theirs[0..6] == dst[..] && theirs[6..12] == src[..] {
            assert_eq!(ours[0..12], *want_macs, "IPv6 frame MACs");
            theirs[0..12].copy_from_slice(&ours[0..12]);
            bugs.push("IPv6 33:33 MACs");
        }
    }
    if is_ipv4_multicast(ours) {
        // tcprewrite 4.4.3 writes the IPv4 multicast MAC prefix 01:00:5e over the first three
        // bytes of the source MAC of frames to 224.0.0.0/4 (and over the destination's when
        // --enet-dmac is given).
        for at in [0, 6] {
            if theirs[at..at + 3] == [1, 0, 0x5e] && ours[at..at + 3] != [1, 0, 0x5e] {
                assert_eq!(
                    ours[at..at + 6],
                    want_macs[at..at + 6],
                    "multicast frame MACs"
                );
                theirs[at..at + 3].copy_from_slice(&ours[at..at + 3]);
                bugs.push("01:00:5e over a MAC of IPv4 multicast");
            }
        }
    }
    if et == 0x0800
        && l3_of(theirs) == Some((et, l3))
        && theirs.len() == ours.len()
        && ours.len() >= l3 + 20
    {
        let frame_len = (ours.len() - l3) as u16;
        if be16(ours, l3 + 2) != frame_len && be16(theirs, l3 + 2) == frame_len {
            // tcprewrite 4.4.3 sets an IPv4 total length that differs from the frame (Ethernet
            // padding, trailing bytes, a datagram cut by the snaplen) to the frame's length;
            // the header checksum matches it when an option recomputes it, else it is left as
            // it was for the old length (stale). Ours keeps the header as captured.
            let ip_want = |f: &[u8]| {
                checksums(f)
                    .into_iter()
                    .find(|c| c.what == "IPv4 header")
                    .unwrap()
                    .want
            };
            let mut old_len = theirs.clone();
            old_len[l3 + 2..l3 + 4].copy_from_slice(&ours[l3 + 2..l3 + 4]);
            let field = be16(theirs, l3 + 10);
            assert!(
                field == ip_want(theirs) || field == ip_want(&old_len),
                "tcprewrite's IPv4 header checksum is neither right nor stale: {}",
                hex(theirs)
            );
            assert_eq!(
                be16(ours, l3 + 2),
                be16(&input[input.len() - ours.len() + l3..], 2),
                "our IPv4 total length changed"
            );
            assert_our_checksum("IPv4 header", opts, input, ours);
            // With the longer length, the trailing bytes (an Ethernet FCS the capture kept,
            // padding) become TCP/UDP payload, and tcprewrite's L4 checksum is recomputed over
            // them: right for its datagram, not for the real one.
            for c in checksums(theirs) {
                if matches!(c.what, "TCP" | "UDP")
                    && be16(theirs, c.at) == c.want
                    && theirs[c.at..c.at + 2] != ours[c.at..c.at + 2]
                {
                    assert_our_checksum(c.what, opts, input, ours);
                    theirs[c.at..c.at + 2].copy_from_slice(&ours[c.at..c.at + 2]);
                }
            }
            theirs[l3 + 2..l3 + 4].copy_from_slice(&ours[l3 + 2..l3 + 4]);
            theirs[l3 + 10..l3 + 12].copy_from_slice(&ours[l3 + 10..l3 + 12]);
            bugs.push("IPv4 total length set from the frame");
        }
    }
    if !opts.full_csum && theirs.len() == ours.len() && l3_of(theirs) == Some((et, l3)) {
        for c in checksums(ours) {
            let t = checksums(theirs)
                .into_iter()
                .find(|t| t.what == c.what && t.at == c.at);
            let Some(t) = t else { continue };
            if be16(ours, c.at) != c.want && be16(theirs, t.at) == t.want {
                // tcprewrite 4.4.3 recomputes the IPv4, TCP and UDP checksums of every packet
                // it writes, so a capture's wrong checksums come out right; we leave them as
                // captured unless asked (--fixcsum), updating them incrementally.
                assert_our_checksum(c.what, opts, input, ours);
                theirs[c.at..c.at + 2].copy_from_slice(&ours[c.at..c.at + 2]);
                bugs.push("wrong input checksum fixed by tcprewrite");
            }
        }
    }
    if opts.maps_ip
        && et == 0x86dd
        && ours.len() >= l3 + 44
        && ours[l3 + 6] == 58
        && theirs.len() == ours.len()
    {
        // tcprewrite 4.4.3 does not update the ICMPv6 checksum after an IPv6 address map.
        let at = l3 + 42;
        if theirs[at..at + 2] != ours[at..at + 2]
            && theirs[l3 + 8..l3 + 40] != input[input.len() - ours.len() + l3 + 8..][..32]
        {
            assert_eq!(
                theirs[at..at + 2],
                input[input.len() - ours.len() + at..][..2],
                "tcprewrite's ICMPv6 checksum is not the input's"
            );
            assert_our_checksum(
                "ICMPv6",
                Opts {
                    full_csum: true,
                    ..opts
                },
                input,
                ours,
            );
            theirs[at..at + 2].copy_from_slice(&ours[at..at + 2]);
            bugs.push("stale ICMPv6 checksum after an address map");
        }
    }
    bugs
}

struct Compared {
    equal: usize,
    /// Frames the option changed, equal to tcprewrite's without any mask.
    changed_equal: usize,
    masked: Vec<(usize, Vec<&'static str>)>,
}

fn compare(input: &Path, ours_args: &[&str], theirs_args: &[&str], opts: Opts) -> Compared {
    let dir = tempdir();
    let src = read_frames(input);
    let theirs = tcprewrite(input, &dir.path().join("theirs.pcap"), theirs_args);
    let ours = tcpkit_w(input, &dir.path().join("ours.pcap"), ours_args);
    let name = format!("{} {ours_args:?}", input.display());
    assert_eq!(ours.len(), src.len(), "{name}: packet count");
    assert_eq!(theirs.len(), src.len(), "{name}: tcprewrite's packet count");
    let mut res = Compared {
        equal: 0,
        changed_equal: 0,
        masked: Vec::new(),
    };
    let mut diffs = Vec::new();
    for (n, ((i, o), t)) in src.iter().zip(&ours).zip(&theirs).enumerate() {
        assert_eq!(o.linktype, 1, "{name}: packet {} link type", n + 1);
        // -t keeps the capture's timestamps.
        assert_eq!(o.ts_ns, i.ts_ns, "{name}: packet {} timestamp", n + 1);
        let mut t = t.data.clone();
        let masked = mask_known_bugs(opts, &i.data, &o.data, &mut t);
        if o.data != t {
            diffs.push(format!(
                "packet {}: l3 {:?}, lens in {} ours {} them {}, differing bytes {:?}\n  in   {}\n  ours {}\n  them {}",
                n + 1,
                l3_of(&o.data),
                i.data.len(),
                o.data.len(),
                t.len(),
                differing(&o.data, &t),
                hex(&i.data),
                hex(&o.data),
                hex(&t)
            ));
        } else if masked.is_empty() {
            res.equal += 1;
            if o.data != i.data {
                res.changed_equal += 1;
            }
        } else {
            res.masked.push((n + 1, masked));
        }
    }
    assert!(
        diffs.is_empty(),
        "{name}: {} packets differ from tcprewrite:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    res
}

fn gen_input() -> (tempfile::TempDir, PathBuf) {
    let dir = tempdir();
    let p = dir.path().join("generated.pcap");
    write_generated(&p);
    (dir, p)
}

/// Every capture in testdata/, as Ethernet: a DLT_NULL capture first goes through `tcpkit
/// replay -w` alone, which gives each frame an Ethernet header and nothing else
/// (`dlt_null_gets_ethernet_header` checks that byte for byte), because tcprewrite 4.4.3
/// cannot be the oracle there: its `--dlt=enet` writes DLT_NULL frames as 802.3 frames of
/// length 0 with the address family and part of the IP header lost.
fn bundled_captures(dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(testdata(""))
        .expect("testdata/")
        .map(|e| e.expect("testdata/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap" || e == "pcapng"))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "testdata/ holds {names:?}");
    names
        .into_iter()
        .map(|p| {
            if read_frames(&p).iter().all(|f| f.linktype == 1) {
                return p;
            }
            let eth = dir.join(format!(
                "{}.ethernet.pcap",
                p.file_stem().unwrap().to_string_lossy()
            ));
            tcpkit_w(&p, &eth, &[]);
            eth
        })
        .collect()
}

/// One option pair on the generated capture and on every frame of every bundled capture. The
/// option must have changed some frames, and some of those must equal tcprewrite's without any
/// mask: an option we ignored cannot pass. Masks are for odd frames, not a way around the
/// comparison: at least two thirds of all frames equal tcprewrite's unmasked.
fn check_option(ours: &[&str], theirs: &[&str], opts: Opts) {
    let (d, g) = gen_input();
    let mut inputs = vec![g];
    inputs.extend(bundled_captures(d.path()));
    let (mut changed_equal, mut equal, mut all) = (0, 0, 0);
    for input in &inputs {
        let frames = read_frames(input).len();
        let r = compare(input, ours, theirs, opts);
        eprintln!(
            "{} {ours:?}: {} of {frames} equal ({} changed), masked {:?}",
            input.display(),
            r.equal,
            r.changed_equal,
            r.masked
        );
        changed_equal += r.changed_equal;
        equal += r.equal;
        all += frames;
    }
    // trex-http_get.pcap keeps each frame's 4-byte FCS, so every one of its frames meets the
    // total-length bug: the share is over all captures together.
    assert!(
        equal * 3 >= all * 2,
        "{ours:?}: only {equal} of {all} frames equal without a mask"
    );
    assert!(
        changed_equal > 0,
        "{ours:?} changed no frame, or none equal to tcprewrite's"
    );
}

#[test]
fn src_mac() {
    check_option(
        &["--src-mac", "aa:bb:cc:dd:ee:ff"],
        &["--enet-smac=aa:bb:cc:dd:ee:ff"],
        Opts {
            src_mac: Some(mac("aa:bb:cc:dd:ee:ff")),
            ..Opts::default()
        },
    );
}

fn mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

#[test]
fn dst_mac() {
    let m = "01:02:03:04:05:06";
    check_option(
        &["--dst-mac", m],
        &[&format!("--enet-dmac={m}")],
        Opts {
            dst_mac: Some(mac(m)),
            ..Opts::default()
        },
    );
}

#[test]
fn srcipmap() {
    let m = "10.0.0.0/8:172.16.0.0/12,172.16.0.0/12:10.0.0.0/8,[2001:db8::/32]:[2001:db7::/32]";
    check_option(
        &["--srcipmap", m],
        &[&format!("--srcipmap={m}")],
        Opts {
            maps_ip: true,
            ..Opts::default()
        },
    );
}

#[test]
fn dstipmap() {
    let m = "192.168.0.0/16:10.9.0.0/16,216.34.181.45/32:198.18.0.1/32,[2001:db9::/32]:[fd00::/8]";
    check_option(
        &["--dstipmap", m],
        &[&format!("--dstipmap={m}")],
        Opts {
            maps_ip: true,
            ..Opts::default()
        },
    );
}

#[test]
fn portmap() {
    let m = "80:8080,53:5353";
    check_option(
        &["--portmap", m],
        &[&format!("--portmap={m}")],
        Opts::default(),
    );
}

#[test]
fn mtu_trunc() {
    check_option(
        &["--mtu-trunc", "--mtu", "600"],
        &["--mtu-trunc", "--mtu=600"],
        Opts {
            full_csum: true,
            ..Opts::default()
        },
    );
}

#[test]
fn fixcsum() {
    check_option(
        &["--fixcsum"],
        &["--fixcsum"],
        Opts {
            full_csum: true,
            ..Opts::default()
        },
    );
}

#[test]
fn vlan_add() {
    check_option(
        &[
            "--enet-vlan",
            "add",
            "--enet-vlan-tag",
            "7",
            "--enet-vlan-pri",
            "3",
            "--enet-vlan-cfi",
            "0",
        ],
        &[
            "--enet-vlan=add",
            "--enet-vlan-tag=7",
            "--enet-vlan-pri=3",
            "--enet-vlan-cfi=0",
        ],
        Opts {
            vlan: Some(Some(0x6007)),
            ..Opts::default()
        },
    );
}

#[test]
fn vlan_del() {
    check_option(
        &["--enet-vlan", "del"],
        &["--enet-vlan=del"],
        Opts {
            vlan: Some(None),
            ..Opts::default()
        },
    );
}

#[test]
fn ttl_set() {
    check_option(&["--ttl", "33"], &["--ttl=33"], Opts::default());
}

#[test]
fn ttl_up() {
    check_option(&["--ttl", "+3"], &["--ttl=+3"], Opts::default());
}

#[test]
fn ttl_down() {
    check_option(&["--ttl", "-3"], &["--ttl=-3"], Opts::default());
}

#[test]
fn combination() {
    let (s, d) = ("02:00:00:00:00:01", "02:00:00:00:00:02");
    check_option(
        &[
            "--src-mac",
            s,
            "--dst-mac",
            d,
            "--srcipmap",
            "10.0.0.0/8:198.18.0.0/15",
            "--portmap",
            "80:8080,53:5353",
            "--ttl",
            "-3",
            "--enet-vlan",
            "add",
            "--enet-vlan-tag",
            "42",
            "--enet-vlan-pri",
            "5",
            "--enet-vlan-cfi",
            "1",
            "--fixcsum",
        ],
        &[
            &format!("--enet-smac={s}"),
            &format!("--enet-dmac={d}"),
            "--srcipmap=10.0.0.0/8:198.18.0.0/15",
            "--portmap=80:8080,53:5353",
            "--ttl=-3",
            "--enet-vlan=add",
            "--enet-vlan-tag=42",
            "--enet-vlan-pri=5",
            "--enet-vlan-cfi=1",
            "--fixcsum",
        ],
        Opts {
            src_mac: Some(mac(s)),
            dst_mac: Some(mac(d)),
            vlan: Some(Some(0xb02a)),
            full_csum: true,
            maps_ip: true,
        },
    );
}

/// The generated capture's checksums are right by Wireshark's count too, so tcprewrite's
/// recomputing them changes nothing and every comparison above is about the option.
#[test]
fn generated_capture_has_right_checksums() {
    let (_d, g) = gen_input();
    let o = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&g)
        .args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "tcp.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
        ])
        .args([
            "-T",
            "fields",
            "-e",
            "ip.checksum.status",
            "-e",
            "tcp.checksum.status",
            "-e",
            "udp.checksum.status",
            "-e",
            "icmp.checksum.status",
            "-e",
            "icmpv6.checksum.status",
        ])
        .output()
        .expect("tshark is needed to check the generated capture");
    assert!(o.status.success(), "tshark: {}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), generated_frames().len());
    // Status 1 = good, 0 = bad, 2 = not checked (fragments); every frame but ARP has one.
    let good = lines
        .iter()
        .filter(|l| l.split(['\t', ',']).any(|s| s == "1"))
        .count();
    assert!(
        lines
            .iter()
            .all(|l| !l.split(['\t', ',']).any(|s| s == "0")),
        "bad checksum in:\n{text}"
    );
    assert_eq!(good, lines.len() - 1, "{text}");
}

// ---------------------------------------------------------------------------------------------
// Link types without Ethernet: -w gives every frame an Ethernet header.

/// Runs `tcpkit replay -t -w` on `input` and checks every output frame is
/// `dst | src | ethertype | payload` of its input frame, with the input's timestamp.
fn check_ethernet_added(
    input: &Path,
    extra: &[&str],
    src: [u8; 6],
    dst: [u8; 6],
    payload: impl Fn(&[u8]) -> (u16, Vec<u8>),
) {
    let dir = tempdir();
    let out = dir.path().join("out.pcap");
    let src_frames = read_frames(input);
    assert!(!src_frames.is_empty());
    let ours = tcpkit_w(input, &out, extra);
    assert_eq!(ours.len(), src_frames.len(), "{}", input.display());
    for (n, (i, o)) in src_frames.iter().zip(&ours).enumerate() {
        let (et, body) = payload(&i.data);
        let mut want = dst.to_vec();
        want.extend_from_slice(&src);
        want.extend_from_slice(&et.to_be_bytes());
        want.extend_from_slice(&body);
        assert_eq!(
            o.linktype,
            1,
            "{} packet {}: link type",
            input.display(),
            n + 1
        );
        assert_eq!(
            hex(&o.data),
            hex(&want),
            "{} packet {}",
            input.display(),
            n + 1
        );
        assert_eq!(
            o.ts_ns,
            i.ts_ns,
            "{} packet {}: timestamp",
            input.display(),
            n + 1
        );
    }
    // The same, as tcpdump reads it: Ethernet, source zero / destination broadcast by default.
    let t = Command::new("tcpdump")
        .args(["-nn", "-e", "-r"])
        .arg(&out)
        .output()
        .expect("tcpdump");
    assert!(t.status.success(), "tcpdump -r: {}", stderr(&t));
    assert!(
        String::from_utf8_lossy(&t.stderr).contains("link-type EN10MB"),
        "{}",
        stderr(&t)
    );
    let text = String::from_utf8_lossy(&t.stdout);
    let macs = format!("{} > {}", macstr(&src), macstr(&dst));
    assert_eq!(
        text.lines().filter(|l| l.contains(&macs)).count(),
        ours.len(),
        "tcpdump -e:\n{text}"
    );
}

fn macstr(m: &[u8]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

const ZERO: [u8; 6] = [0; 6];
const BCAST: [u8; 6] = [0xff; 6];

/// The IP packets of the generated capture (no ARP, no VLAN) with their ethertypes.
fn ip_packets() -> Vec<(u16, Vec<u8>)> {
    generated_frames()
        .into_iter()
        .filter_map(|f| match be16(&f, 12) {
            et @ (0x0800 | 0x86dd) => Some((et, f[14..].to_vec())),
            _ => None,
        })
        .collect()
}

fn write_link(path: &Path, dlt: u32, frames: &[Vec<u8>]) {
    let ts = timestamps(frames.len());
    let f: Vec<(u64, Vec<u8>)> = ts.into_iter().zip(frames.iter().cloned()).collect();
    common::write_pcap(path, dlt, &f);
}

fn ip_ethertype(p: &[u8]) -> u16 {
    match p[0] >> 4 {
        4 => 0x0800,
        6 => 0x86dd,
        v => panic!("IP version {v}"),
    }
}

#[test]
fn dlt_null_gets_ethernet_header() {
    let input = testdata("zeek-redis-pipelining-dlt-null.pcap");
    assert_eq!(
        read_frames(&input)[0].linktype,
        0,
        "the test capture is DLT_NULL"
    );
    // DLT_NULL: a 4-byte address family in the writer's byte order; 2 = IPv4.
    let payload = |d: &[u8]| {
        let fam = u32::from_le_bytes(d[0..4].try_into().unwrap());
        let fam = if fam > 0xffff {
            u32::from_be_bytes(d[0..4].try_into().unwrap())
        } else {
            fam
        };
        let et = match fam {
            2 => 0x0800,
            10 | 24 | 28 | 30 => 0x86dd,
            f => panic!("family {f}"),
        };
        (et, d[4..].to_vec())
    };
    check_ethernet_added(&input, &[], ZERO, BCAST, payload);
    let (s, d) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
    check_ethernet_added(
        &input,
        &["--src-mac", &macstr(&s), "--dst-mac", &macstr(&d)],
        s,
        d,
        payload,
    );
}

#[test]
fn raw_ip_gets_ethernet_header() {
    let pkts = ip_packets();
    assert!(pkts.iter().any(|p| p.0 == 0x86dd) && pkts.iter().any(|p| p.0 == 0x0800));
    let dir = tempdir();
    // DLT 101 (LINKTYPE_RAW): IPv4 and IPv6, told apart by the version nibble.
    let raw = dir.path().join("raw101.pcap");
    write_link(
        &raw,
        101,
        &pkts.iter().map(|p| p.1.clone()).collect::<Vec<_>>(),
    );
    check_ethernet_added(&raw, &[], ZERO, BCAST, |d| (ip_ethertype(d), d.to_vec()));
    // DLT 228 (LINKTYPE_IPV4): IPv4 only.
    let v4 = dir.path().join("ipv4-228.pcap");
    write_link(
        &v4,
        228,
        &pkts
            .iter()
            .filter(|p| p.0 == 0x0800)
            .map(|p| p.1.clone())
            .collect::<Vec<_>>(),
    );
    check_ethernet_added(&v4, &[], ZERO, BCAST, |d| (0x0800, d.to_vec()));
    let s = [2, 0, 0, 0, 0, 0x11];
    check_ethernet_added(&v4, &["--src-mac", &macstr(&s)], s, BCAST, |d| {
        (0x0800, d.to_vec())
    });
}

#[test]
fn linux_sll_gets_ethernet_header() {
    // Linux cooked v1: packet type, ARPHRD, address length, 8 address bytes, protocol.
    let frames: Vec<Vec<u8>> = ip_packets()
        .into_iter()
        .enumerate()
        .map(|(n, (et, ip))| {
            let mut f = vec![0, if n % 2 == 0 { 0 } else { 4 }, 0, 1, 0, 6];
            f.extend_from_slice(&[0x02, 0x42, 0xac, 0x11, 0, n as u8, 0, 0]);
            f.extend_from_slice(&et.to_be_bytes());
            f.extend_from_slice(&ip);
            f
        })
        .collect();
    let dir = tempdir();
    let sll = dir.path().join("sll.pcap");
    write_link(&sll, 113, &frames);
    check_ethernet_added(&sll, &[], ZERO, BCAST, |d| (be16(d, 14), d[16..].to_vec()));
    // Rewriting applies to the frame with its new header: the destination asked for.
    let d = [2, 0, 0, 0, 0, 0x22];
    check_ethernet_added(&sll, &["--dst-mac", &macstr(&d)], ZERO, d, |x| {
        (be16(x, 14), x[16..].to_vec())
    });
}
