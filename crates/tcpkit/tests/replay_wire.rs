//! What `tcpkit replay` puts on the wire, checked by a real tcpdump on the receiving host: the
//! frames equal the expected ones byte for byte, in count and order, for pcap and pcapng
//! inputs of every link type we read.

use crate::common;

use common::{testdata, write_pcap, Frame, ReplayLab};
use tcpkit_pcap::{CaptureFile, PcapNgWriter, TsResolution};

const BROADCAST: [u8; 6] = [0xff; 6];

/// Sends `file` at a modest fixed rate (so tcpdump keeps up) and returns what arrived.
fn send(tag: &str, file: &std::path::Path, extra: &[&str]) -> (ReplayLab, Vec<Frame>) {
    let mut lab = ReplayLab::new(tag);
    let path = file.to_str().unwrap().to_string();
    let (out, frames) = lab.capture(|l| {
        let mut args = vec!["--pps", "5000"];
        args.extend_from_slice(extra);
        args.push(&path);
        l.replay(&args)
    });
    assert!(
        out.status.success(),
        "replay failed: {}",
        common::stderr(&out)
    );
    (lab, frames)
}

/// The frames of a capture with link type `dlt`, as the receiver must see them.
fn expected(file: &std::path::Path, src: [u8; 6]) -> Vec<Vec<u8>> {
    let cap = CaptureFile::open(file).unwrap();
    cap.packets()
        .map(|p| {
            let p = p.unwrap();
            let d = p.data;
            let (ethertype, payload): ([u8; 2], &[u8]) = match p.linktype {
                1 => return d.to_vec(),
                0 => {
                    let fam = u32::from_le_bytes(d[0..4].try_into().unwrap());
                    let fam = if fam > 0xffff {
                        u32::from_be_bytes(d[0..4].try_into().unwrap())
                    } else {
                        fam
                    };
                    (if fam == 2 { [0x08, 0x00] } else { [0x86, 0xdd] }, &d[4..])
                }
                101 | 228 | 229 => (
                    if d[0] >> 4 == 4 {
                        [0x08, 0x00]
                    } else {
                        [0x86, 0xdd]
                    },
                    d,
                ),
                113 => ([d[14], d[15]], &d[16..]),
                276 => ([d[0], d[1]], &d[20..]),
                other => panic!("test does not know link type {other}"),
            };
            let mut f = Vec::with_capacity(14 + payload.len());
            f.extend_from_slice(&BROADCAST);
            f.extend_from_slice(&src);
            f.extend_from_slice(&ethertype);
            f.extend_from_slice(payload);
            f
        })
        .collect()
}

fn assert_same(got: &[Frame], want: &[Vec<u8>]) {
    if got.len() != want.len() {
        let first = got.iter().zip(want).position(|(g, w)| g.data != *w);
        panic!(
            "frame count differs: got {}, want {}; first differing frame: {:?}",
            got.len(),
            want.len(),
            first.map(|i| i + 1)
        );
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.linktype, 1);
        assert!(
            g.data == *w,
            "frame {} differs:\n got {:02x?}\nwant {:02x?}",
            i + 1,
            g.data,
            w
        );
    }
}

fn ipv4_packet(n: u8) -> Vec<u8> {
    common::udp_frame(
        u32::from(n),
        60 + usize::from(n),
        [198, 18, 0, 1],
        [198, 18, 0, 2],
    )[14..]
        .to_vec()
}

fn ipv6_packet(n: u8) -> Vec<u8> {
    let payload = 8 + usize::from(n);
    let mut p = vec![0u8; 40 + payload];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&(payload as u16).to_be_bytes());
    p[6] = 17;
    p[7] = 64;
    p[8] = 0xfd;
    p[23] = 1;
    p[24] = 0xfd;
    p[39] = 2;
    p[40..42].copy_from_slice(&5000u16.to_be_bytes());
    p[42..44].copy_from_slice(&5001u16.to_be_bytes());
    p[44..46].copy_from_slice(&(payload as u16).to_be_bytes());
    p[48..].fill(n);
    p
}

#[test]
fn ethernet_pcaps_arrive_byte_identical() {
    for name in [
        "tcpreplay-test.pcap",
        "trex-http_get.pcap",
        "zeek-dns-tcp-keepalive.pcap",
    ] {
        let f = testdata(name);
        let (_lab, got) = send("wireeth", &f, &[]);
        assert_same(&got, &expected(&f, [0; 6]));
    }
}

#[test]
fn ethernet_pcapng_arrives_byte_identical() {
    let f = testdata("zeek-redis-django-cloud.pcapng");
    let (_lab, got) = send("wireng", &f, &["-K"]);
    assert_same(&got, &expected(&f, [0; 6]));
}

#[test]
fn dlt_null_gets_an_ethernet_header_from_the_interface() {
    let f = testdata("zeek-redis-pipelining-dlt-null.pcap");
    let (lab, got) = send("wirenull", &f, &[]);
    assert_same(&got, &expected(&f, lab.link.a.mac));
}

#[test]
fn raw_sll_and_sll2_captures_get_ethernet_headers() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases = Vec::new();
    // Raw IP (101), IPv4 (228), IPv6 (229).
    for (dlt, v6) in [(101u32, false), (101, true), (228, false), (229, true)] {
        let p = dir.path().join(format!("raw{dlt}{v6}.pcap"));
        let pkts: Vec<(u64, Vec<u8>)> = (0..20u8)
            .map(|n| {
                (
                    u64::from(n) * 1_000_000,
                    if v6 { ipv6_packet(n) } else { ipv4_packet(n) },
                )
            })
            .collect();
        write_pcap(&p, dlt, &pkts);
        cases.push(p);
    }
    // Linux cooked v1 (113): 16-byte header, protocol last.
    let p = dir.path().join("sll.pcap");
    let pkts: Vec<(u64, Vec<u8>)> = (0..20u8)
        .map(|n| {
            let (proto, ip) = if n % 2 == 0 {
                ([0x08, 0x00], ipv4_packet(n))
            } else {
                ([0x86, 0xdd], ipv6_packet(n))
            };
            let mut h = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, proto[0], proto[1]];
            h.extend_from_slice(&ip);
            (u64::from(n) * 1_000_000, h)
        })
        .collect();
    write_pcap(&p, 113, &pkts);
    cases.push(p);
    // Linux cooked v2 (276): 20-byte header, protocol first.
    let p = dir.path().join("sll2.pcap");
    let pkts: Vec<(u64, Vec<u8>)> = (0..20u8)
        .map(|n| {
            let (proto, ip) = if n % 2 == 0 {
                ([0x08, 0x00], ipv4_packet(n))
            } else {
                ([0x86, 0xdd], ipv6_packet(n))
            };
            let mut h = vec![
                proto[0], proto[1], 0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0,
            ];
            h.extend_from_slice(&ip);
            (u64::from(n) * 1_000_000, h)
        })
        .collect();
    write_pcap(&p, 276, &pkts);
    cases.push(p);
    for f in cases {
        let (lab, got) = send("wireraw", &f, &[]);
        assert_same(&got, &expected(&f, lab.link.a.mac));
    }
}

#[test]
fn pcapng_with_two_interfaces_of_different_link_types() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("two.pcapng");
    let mut w = PcapNgWriter::new(
        std::io::BufWriter::new(std::fs::File::create(&p).unwrap()),
        false,
    )
    .unwrap();
    let eth = w
        .add_interface(1, 65535, TsResolution::Pow10(6), 0)
        .unwrap();
    let raw = w
        .add_interface(228, 65535, TsResolution::Pow10(9), 0)
        .unwrap();
    let mut want = Vec::new();
    for n in 0..30u8 {
        if n % 3 == 0 {
            let ip = ipv4_packet(n);
            w.write_epb(raw, u64::from(n) * 1_000_000, &ip, ip.len() as u32)
                .unwrap();
            want.push(ip);
        } else {
            let f = common::udp_frame(u32::from(n), 80, [198, 18, 0, 1], [198, 18, 0, 2]);
            w.write_epb(eth, u64::from(n) * 1_000_000, &f, f.len() as u32)
                .unwrap();
            want.push(f);
        }
    }
    w.finish().unwrap();
    let (lab, got) = send("wiretwo", &p, &[]);
    let want: Vec<Vec<u8>> = want
        .into_iter()
        .map(|d| {
            if d[0] == 0x45 {
                let mut f = BROADCAST.to_vec();
                f.extend_from_slice(&lab.link.a.mac);
                f.extend_from_slice(&[0x08, 0x00]);
                f.extend_from_slice(&d);
                f
            } else {
                d
            }
        })
        .collect();
    assert_same(&got, &want);
}

#[test]
fn several_files_are_sent_in_order_and_loops_repeat_them() {
    let a = testdata("zeek-dns-tcp-keepalive.pcap");
    let b = testdata("trex-http_get.pcap");
    let mut lab = ReplayLab::new("wirefiles");
    let (out, got) = lab.capture(|l| {
        l.replay(&[
            "--pps",
            "5000",
            "--loop",
            "2",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ])
    });
    assert!(out.status.success(), "{}", common::stderr(&out));
    let mut want = expected(&a, [0; 6]);
    want.extend(expected(&b, [0; 6]));
    let once = want.clone();
    want.extend(once);
    assert_same(&got, &want);
}
