//! Live captures inside tcpkit-lab namespaces: real AF_PACKET sockets on a veth pair, traffic
//! from real TCP/UDP sockets or from tcpkit-send's AF_PACKET sink on the other end. Every test
//! captures on host B of a `pair` (A 198.18.0.1 <-> B 198.18.0.2); nothing touches the host's
//! own network. These tests need root (the lab says so in one line when it is missing).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tcpkit_capture::{Capture, CaptureError, CaptureOpts, CapturedPacket, Direction, FanoutMode};
use tcpkit_lab::{Host, Lab, Link};
use tcpkit_send::{AfPacketOpts, AfPacketSink, Frame, Sink};
use tcpkit_wire::{flow_key, ConnKey, MacAddr, RewriteConfig, Rewriter, VlanEdit};

const A_IP: &str = "198.18.0.1";
const B_IP: &str = "198.18.0.2";

fn pair(tag: &str) -> (Lab, Host, Host, Link) {
    Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"))
}

/// Options for tests: a small ring and a short block timeout, so packets show up quickly.
fn opts(filter: Option<&str>) -> CaptureOpts {
    CaptureOpts {
        filter: filter.map(str::to_owned),
        block_size: 1 << 16,
        block_count: 64,
        block_timeout_ms: 2,
        ..CaptureOpts::default()
    }
}

fn open_in(host: &Host, ifname: &str, opts: &CaptureOpts) -> Capture {
    host.enter(|| Capture::open(ifname, opts))
        .unwrap_or_else(|e| panic!("open capture on {ifname}: {e}"))
}

/// A captured packet, copied out of the ring.
#[derive(Debug, Clone)]
struct Pkt {
    ts_ns: u64,
    data: Vec<u8>,
    orig_len: u32,
    ifindex: u32,
    direction: Direction,
    vlan_tci: Option<u16>,
    vlan_tpid: Option<u16>,
}

impl Pkt {
    fn from(p: &CapturedPacket<'_>) -> Pkt {
        Pkt {
            ts_ns: p.ts_ns,
            data: p.data.to_vec(),
            orig_len: p.orig_len,
            ifindex: p.ifindex,
            direction: p.direction,
            vlan_tci: p.vlan_tci,
            vlan_tpid: p.vlan_tpid,
        }
    }

    fn seg(&self) -> Option<Tcp> {
        Tcp::parse(&self.data)
    }

    fn payload(&self) -> Vec<u8> {
        self.seg().map(|t| t.payload).unwrap_or_default()
    }
}

/// The TCP facts of an Ethernet frame the tests look at, parsed by etherparse.
#[derive(Debug)]
struct Tcp {
    src: SocketAddr,
    dst: SocketAddr,
    syn: bool,
    ack: bool,
    fin: bool,
    payload: Vec<u8>,
}

impl Tcp {
    fn parse(frame: &[u8]) -> Option<Tcp> {
        let p = SlicedPacket::from_ethernet(frame).ok()?;
        let (src, dst): (IpAddr, IpAddr) = match p.net? {
            NetSlice::Ipv4(ip) => (
                ip.header().source_addr().into(),
                ip.header().destination_addr().into(),
            ),
            NetSlice::Ipv6(ip) => (
                ip.header().source_addr().into(),
                ip.header().destination_addr().into(),
            ),
            NetSlice::Arp(_) => return None,
        };
        let TransportSlice::Tcp(t) = p.transport? else {
            return None;
        };
        Some(Tcp {
            src: SocketAddr::new(src, t.source_port()),
            dst: SocketAddr::new(dst, t.destination_port()),
            syn: t.syn(),
            ack: t.ack(),
            fin: t.fin(),
            payload: t.payload().to_vec(),
        })
    }
}

/// Reads blocks until `done` says so or `max` has passed; returns what was captured.
fn drain(cap: &mut Capture, max: Duration, done: impl Fn(&[Pkt]) -> bool) -> Vec<Pkt> {
    let end = Instant::now() + max;
    let mut got = Vec::new();
    while Instant::now() < end && !done(&got) {
        cap.next_block(Duration::from_millis(20), |p| got.push(Pkt::from(p)))
            .unwrap_or_else(|e| panic!("next_block: {e}"));
    }
    got
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// An Ethernet + IPv4 + TCP frame from `src` to `dst` carrying `payload`, to `dst_mac` (or
/// to a MAC nobody has, so the receiving stack ignores it), optionally VLAN-tagged.
fn tcp_frame(
    src: SocketAddr,
    dst: SocketAddr,
    dst_mac: Option<[u8; 6]>,
    vlan: Option<VlanEdit>,
    payload: &[u8],
) -> Vec<u8> {
    let ip = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(_) => panic!("test frames are IPv4"),
    };
    // Source MAC: locally administered, nobody's.
    let mut out = Vec::new();
    PacketBuilder::ethernet2([0x02, 0, 0, 0, 0, 1], [0x02, 0, 0, 0, 0, 2])
        .ipv4(ip(src), ip(dst), 64)
        .tcp(src.port(), dst.port(), 1000, 512)
        .ack(0)
        .psh()
        .write_to_vec(&mut out, payload)
        .expect("build test frame");
    let cfg = RewriteConfig {
        dst_mac: dst_mac.map(MacAddr),
        vlan,
        ..RewriteConfig::default()
    };
    Rewriter::new(cfg)
        .apply(&mut out)
        .expect("rewrite test frame");
    out
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().expect("test address")
}

/// Sends `frames` on `ifname` from inside `host`; returns how many the sink sent.
fn send_frames(host: &Host, ifname: &str, frames: &[Vec<u8>]) -> u64 {
    host.enter(|| {
        let mut sink = AfPacketSink::open(ifname, AfPacketOpts::default())
            .unwrap_or_else(|e| panic!("sink on {ifname}: {e}"));
        let batch: Vec<Frame<'_>> = frames.iter().map(|d| Frame { data: d, ts_ns: 0 }).collect();
        for chunk in batch.chunks(32) {
            sink.send_batch(chunk).expect("send_batch");
        }
        sink.flush().expect("flush");
        sink.counters().successful
    })
}

const REQUEST: &[u8] = b"GET /capture HTTP/1.1\r\nHost: b\r\n\r\n";
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";

#[test]
fn tcp_conversation_is_captured_in_both_directions() {
    let (_lab, a, b, link) = pair("capconv");
    let listener = b
        .enter(|| TcpListener::bind(addr(B_IP, 0)))
        .expect("listen in B");
    let port = listener.local_addr().expect("local addr").port();
    let mut cap = open_in(&b, &link.b.name, &opts(Some(&format!("tcp port {port}"))));
    let before = now_ns();

    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut req = vec![0u8; REQUEST.len()];
        s.read_exact(&mut req).expect("read request");
        assert_eq!(req, REQUEST);
        s.write_all(RESPONSE).expect("write response");
        // Close first, so both FINs are on the wire once the client closes too.
    });
    let answer = a.enter(|| {
        let mut c = TcpStream::connect(addr(B_IP, port)).expect("connect from A");
        c.write_all(REQUEST).expect("write request");
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).expect("read response");
        answer
    });
    server.join().expect("server thread");
    assert_eq!(answer, RESPONSE);

    let fin_from = |pkts: &[Pkt], d: Direction| {
        pkts.iter()
            .any(|p| p.direction == d && p.seg().is_some_and(|s| s.fin))
    };
    let pkts = drain(&mut cap, Duration::from_secs(5), |p| {
        fin_from(p, Direction::Incoming) && fin_from(p, Direction::Outgoing)
    });
    // The last ACK follows the second FIN.
    let mut pkts = pkts;
    pkts.extend(drain(&mut cap, Duration::from_millis(100), |_| false));
    let after = now_ns();

    assert!(
        fin_from(&pkts, Direction::Incoming) && fin_from(&pkts, Direction::Outgoing),
        "both FINs captured: {pkts:#?}"
    );
    let server_addr = addr(B_IP, port);
    let mut last_ts = before;
    for p in &pkts {
        let seg = p.seg().unwrap_or_else(|| panic!("not TCP: {p:?}"));
        // Incoming means client -> server, outgoing server -> client.
        match p.direction {
            Direction::Incoming => {
                assert_eq!(seg.dst, server_addr, "{p:?}");
                assert!(p.data.starts_with(&link.b.mac), "to B's MAC: {p:?}");
            }
            Direction::Outgoing => {
                assert_eq!(seg.src, server_addr, "{p:?}");
                assert!(p.data.starts_with(&link.a.mac), "to A's MAC: {p:?}");
            }
            Direction::Other => panic!("neither direction: {p:?}"),
        }
        assert_eq!(p.ifindex, link.b.ifindex);
        assert_eq!(p.orig_len as usize, p.data.len(), "whole packet: {p:?}");
        assert_eq!(p.vlan_tci, None);
        assert!(p.ts_ns >= last_ts, "timestamps go forward: {pkts:#?}");
        last_ts = p.ts_ns;
    }
    assert!(last_ts <= after);

    let first = pkts.first().and_then(Pkt::seg).expect("first packet");
    assert!(first.syn && !first.ack, "the SYN comes first: {first:?}");
    assert_eq!(pkts[0].direction, Direction::Incoming);
    let second = pkts[1].seg().expect("second packet");
    assert!(second.syn && second.ack, "then the SYN-ACK: {second:?}");
    assert_eq!(pkts[1].direction, Direction::Outgoing);

    // The bytes of each direction, exactly, in one packet each.
    let req: Vec<&Pkt> = pkts.iter().filter(|p| !p.payload().is_empty()).collect();
    assert_eq!(req.len(), 2, "one data packet each way: {pkts:#?}");
    assert_eq!(req[0].direction, Direction::Incoming);
    assert_eq!(req[0].payload(), REQUEST);
    assert_eq!(req[1].direction, Direction::Outgoing);
    assert_eq!(req[1].payload(), RESPONSE);

    let st = cap.stats().expect("stats");
    assert_eq!(st.drops, 0);
    assert_eq!(
        st.packets,
        pkts.len() as u64,
        "every accepted packet was delivered"
    );
}

#[test]
fn filter_passes_only_matching_packets() {
    let (_lab, a, b, link) = pair("capfilt");
    let (tcp80, tcp_other, udp80, udp_other) = b.enter(|| {
        (
            TcpListener::bind(addr(B_IP, 80)).expect("tcp 80"),
            TcpListener::bind(addr(B_IP, 0)).expect("tcp other"),
            UdpSocket::bind(addr(B_IP, 80)).expect("udp 80"),
            UdpSocket::bind(addr(B_IP, 0)).expect("udp other"),
        )
    });
    let other_tcp = tcp_other.local_addr().expect("addr").port();
    let other_udp = udp_other.local_addr().expect("addr").port();
    let mut filtered = open_in(&b, &link.b.name, &opts(Some("tcp port 80")));
    // The same traffic without a filter, to show the other packets did cross the link.
    let mut all = open_in(&b, &link.b.name, &opts(None));

    a.enter(|| {
        let u = UdpSocket::bind(addr(A_IP, 0)).expect("udp in A");
        u.send_to(b"udp to 80", addr(B_IP, 80)).expect("udp 80");
        u.send_to(b"udp elsewhere", addr(B_IP, other_udp))
            .expect("udp other");
        for port in [80, other_tcp] {
            let mut c = TcpStream::connect(addr(B_IP, port)).expect("connect");
            c.write_all(format!("to {port}").as_bytes()).expect("write");
        }
    });
    let mut buf = [0u8; 64];
    assert_eq!(udp80.recv(&mut buf).expect("udp 80 recv"), 9);
    assert_eq!(udp_other.recv(&mut buf).expect("udp other recv"), 13);
    drop((tcp80.accept(), tcp_other.accept()));

    let has_payload = |pkts: &[Pkt], want: &[u8]| {
        pkts.iter()
            .any(|p| p.data.windows(want.len()).any(|w| w == want))
    };
    let to_other = format!("to {other_tcp}");
    let seen = drain(&mut all, Duration::from_secs(5), |p| {
        has_payload(p, b"udp to 80")
            && has_payload(p, b"udp elsewhere")
            && has_payload(p, b"to 80")
            && has_payload(p, to_other.as_bytes())
    });
    assert!(has_payload(&seen, b"udp elsewhere") && has_payload(&seen, b"udp to 80"));
    assert!(
        has_payload(&seen, to_other.as_bytes()),
        "unfiltered saw all"
    );

    let kept = drain(&mut filtered, Duration::from_millis(300), |_| false);
    assert!(has_payload(&kept, b"to 80"), "port 80 data kept: {kept:#?}");
    assert!(kept.iter().any(|p| p.direction == Direction::Outgoing));
    for p in &kept {
        let seg = p.seg().unwrap_or_else(|| panic!("only TCP passes: {p:?}"));
        assert!(seg.src.port() == 80 || seg.dst.port() == 80, "{seg:?}");
    }
    assert!(!has_payload(&kept, b"udp to 80"));
    assert!(!has_payload(&kept, to_other.as_bytes()));
    assert!(kept.len() < seen.len());
}

#[test]
fn vlan_tag_stripped_by_the_kernel_is_reported() {
    let (_lab, a, b, link) = pair("capvlan");
    // Not B's answers (RSTs from port 80): they are outgoing and untagged.
    let mut cap = open_in(&b, &link.b.name, &opts(Some("tcp dst port 80")));
    let tagged = tcp_frame(
        addr(A_IP, 40000),
        addr(B_IP, 80),
        Some(link.b.mac),
        Some(VlanEdit::Add {
            vid: 100,
            pcp: 5,
            cfi: false,
        }),
        b"tagged",
    );
    let plain = tcp_frame(
        addr(A_IP, 40001),
        addr(B_IP, 80),
        Some(link.b.mac),
        None,
        b"plain",
    );
    assert_eq!(
        send_frames(&a, &link.a.name, &[tagged.clone(), plain.clone()]),
        2
    );

    let pkts = drain(&mut cap, Duration::from_secs(3), |p| p.len() >= 2);
    assert_eq!(pkts.len(), 2, "{pkts:#?}");
    let t = &pkts[0];
    assert_eq!(t.vlan_tci, Some((5 << 13) | 100));
    assert_eq!(t.vlan_tpid.unwrap_or(0x8100), 0x8100);
    assert_eq!(t.direction, Direction::Incoming);
    assert_eq!(t.payload(), b"tagged");
    // Without the tag the frame is the untagged one, byte for byte (same addresses, other port).
    assert_eq!(t.data.len(), tagged.len() - 4);
    assert_eq!(t.orig_len as usize, t.data.len());
    let p = &pkts[1];
    assert_eq!(p.vlan_tci, None);
    assert_eq!(p.vlan_tpid, None);
    assert_eq!(p.data, plain);
}

#[test]
fn bad_filter_and_missing_interface_are_one_line_errors() {
    let (_lab, _a, b, link) = pair("caperr");
    let e = b
        .enter(|| Capture::open(&link.b.name, &opts(Some("tcp port"))))
        .expect_err("bad filter");
    assert_eq!(e.to_string(), "filter \"tcp port\": syntax error");
    let e = b
        .enter(|| Capture::open("eth9", &opts(None)))
        .expect_err("no eth9 in the namespace");
    assert!(matches!(e, CaptureError::NoSuchInterface { .. }));
    assert_eq!(e.to_string(), "eth9: no such network interface");
}

/// Immediate mode hands each packet over as it lands: the same datagrams, beside a V3 ring
/// whose blocks retire only after 10 s, are read at once, whole, with their direction and
/// time; the V3 ring has handed over nothing yet. (Intercept reads the target's answers this
/// way: a copy waits on each one.)
#[test]
fn immediate_mode_hands_over_each_packet_before_a_block_would_retire() {
    let (_lab, a, b, link) = pair("capimm");
    let slow = CaptureOpts {
        filter: Some("udp dst port 9".into()),
        block_timeout_ms: 10_000,
        ..CaptureOpts::default()
    };
    let mut blocks = open_in(&b, &link.b.name, &slow);
    let mut frames = open_in(
        &b,
        &link.b.name,
        &CaptureOpts {
            immediate: true,
            ..slow.clone()
        },
    );
    let big = vec![0x5a; 1400];
    let sent_at = now_ns();
    a.enter(|| {
        let u = UdpSocket::bind(addr(A_IP, 0)).expect("udp in A");
        for d in [&b"first"[..], &big, b"third"] {
            u.send_to(d, addr(B_IP, 9)).expect("send");
        }
    });
    let got = drain(&mut frames, Duration::from_millis(500), |p| p.len() >= 3);
    let payloads: Vec<&[u8]> = got.iter().map(|p| &p.data[42..]).collect();
    assert_eq!(payloads, [&b"first"[..], &big, b"third"], "{got:#?}");
    for p in &got {
        assert_eq!(p.direction, Direction::Incoming);
        assert_eq!(p.orig_len as usize, p.data.len());
        assert!(
            p.ts_ns >= sent_at && p.ts_ns < sent_at + 5_000_000_000,
            "{p:?}"
        );
    }
    assert_eq!(
        blocks
            .next_block(Duration::ZERO, |_| {})
            .expect("next_block"),
        0,
        "the V3 block has not retired"
    );
    assert_eq!(frames.stats().expect("stats").packets, 3);
}

#[test]
fn a_full_ring_drops_are_counted_never_silent() {
    let (_lab, a, b, link) = pair("capdrop");
    // One 4 KiB block holds a few dozen small frames; the rest must be dropped and counted.
    let tiny = CaptureOpts {
        filter: Some("tcp dst port 9".into()),
        block_size: 4096,
        block_count: 1,
        block_timeout_ms: 1,
        ..CaptureOpts::default()
    };
    let mut cap = open_in(&b, &link.b.name, &tiny);
    let frames: Vec<Vec<u8>> = (0..5000u16)
        .map(|i| {
            tcp_frame(
                addr(A_IP, 1024 + i),
                addr(B_IP, 9),
                None,
                None,
                b"0123456789",
            )
        })
        .collect();
    let sent = send_frames(&a, &link.a.name, &frames);
    assert_eq!(sent, 5000);
    // Let the receive path settle before reading: nothing has been read so far.
    std::thread::sleep(Duration::from_millis(200));

    let mut captured = 0u64;
    while cap
        .next_block(Duration::from_millis(50), |_| captured += 1)
        .expect("next_block")
        > 0
    {}
    let st = cap.stats().expect("stats");
    assert!(captured > 0, "the one block was filled");
    assert!(
        st.drops > 0,
        "a flooded one-block ring reports drops: {st:?}"
    );
    assert!(st.freeze_count > 0, "{st:?}");
    assert_eq!(
        st.packets,
        captured + st.drops,
        "every accepted packet accounted"
    );
    assert!(st.packets <= sent, "{st:?}");
    // Most of the flood reached the socket (the veth backlog may drop a few).
    assert!(st.packets * 10 >= sent * 9, "{st:?} of {sent}");

    // The kernel resets its counters on each read; ours keep the sum.
    let again = cap.stats().expect("stats again");
    assert_eq!(again, st);
    // And the ring works again once the block is back.
    let one = tcp_frame(addr(A_IP, 7), addr(B_IP, 9), None, None, b"after");
    assert_eq!(send_frames(&a, &link.a.name, &[one]), 1);
    let pkts = drain(&mut cap, Duration::from_secs(3), |p| !p.is_empty());
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].payload(), b"after");
    let last = cap.stats().expect("stats");
    assert_eq!((last.packets, last.drops), (st.packets + 1, st.drops));
    // A one-block ring freezes whenever its block is out, packet or not: this only grows.
    assert!(last.freeze_count >= st.freeze_count);
}

#[test]
fn fanout_hash_splits_flows_and_keeps_each_flow_together() {
    let (_lab, a, b, link) = pair("capfan");
    let fan = CaptureOpts {
        fanout: Some((7, FanoutMode::Hash)),
        ..opts(Some("tcp port 80"))
    };
    let mut caps = [
        open_in(&b, &link.b.name, &fan),
        open_in(&b, &link.b.name, &fan),
    ];
    const FLOWS: u16 = 32;
    const PER_FLOW: usize = 3;
    let client = |i: u16| addr(A_IP, 20000 + i);
    let server = addr(B_IP, 80);
    let mut to_b = Vec::new();
    let mut from_b = Vec::new();
    for _ in 0..PER_FLOW {
        for i in 0..FLOWS {
            to_b.push(tcp_frame(client(i), server, None, None, b"request"));
            from_b.push(tcp_frame(server, client(i), None, None, b"response"));
        }
    }
    let expected = 2 * usize::from(FLOWS) * PER_FLOW;
    // A's frames arrive at B (incoming); B's own leave it (outgoing): both directions.
    assert_eq!(send_frames(&a, &link.a.name, &to_b), to_b.len() as u64);
    assert_eq!(send_frames(&b, &link.b.name, &from_b), from_b.len() as u64);

    let mut got: [Vec<Pkt>; 2] = [Vec::new(), Vec::new()];
    let end = Instant::now() + Duration::from_secs(5);
    while got[0].len() + got[1].len() < expected && Instant::now() < end {
        for (cap, g) in caps.iter_mut().zip(got.iter_mut()) {
            cap.next_block(Duration::from_millis(10), |p| g.push(Pkt::from(p)))
                .expect("next_block");
        }
    }
    assert_eq!(got[0].len() + got[1].len(), expected);
    let conns = |pkts: &[Pkt]| -> std::collections::BTreeSet<ConnKey> {
        pkts.iter()
            .map(|p| flow_key(&p.data).expect("IP frame").connection())
            .collect()
    };
    let (c0, c1) = (conns(&got[0]), conns(&got[1]));
    assert!(!c0.is_empty() && !c1.is_empty(), "both sockets got flows");
    assert!(c0.is_disjoint(&c1), "a flow went to both sockets");
    assert_eq!(c0.len() + c1.len(), usize::from(FLOWS));
    for g in &got {
        for dir in [Direction::Incoming, Direction::Outgoing] {
            assert_eq!(
                conns(g),
                conns(
                    &g.iter()
                        .filter(|p| p.direction == dir)
                        .cloned()
                        .collect::<Vec<_>>()
                ),
                "each socket has both directions of its flows"
            );
        }
    }
}

#[test]
fn any_captures_every_ethernet_interface() {
    let (_lab, a, b, link) = pair("capany");
    let mut cap = open_in(&b, "any", &opts(Some("udp port 5555")));
    let u = b
        .enter(|| UdpSocket::bind(addr(B_IP, 5555)))
        .expect("udp in B");
    a.enter(|| {
        let s = UdpSocket::bind(addr(A_IP, 0)).expect("udp in A");
        s.send_to(b"via veth", addr(B_IP, 5555)).expect("send");
    });
    b.enter(|| {
        let s = UdpSocket::bind(addr("127.0.0.1", 0)).expect("udp on lo");
        s.send_to(b"via lo", addr("127.0.0.1", 5555)).expect("send");
    });
    let mut buf = [0u8; 16];
    assert_eq!(u.recv(&mut buf).expect("recv"), 8);
    let lo = b.enter(|| tcpkit_send::if_info("lo")).expect("lo").ifindex;
    let has = |pkts: &[Pkt], want: &[u8], ifindex: u32| {
        pkts.iter()
            .any(|p| p.ifindex == ifindex && p.data.windows(want.len()).any(|w| w == want))
    };
    let pkts = drain(&mut cap, Duration::from_secs(3), |p| {
        has(p, b"via veth", link.b.ifindex) && has(p, b"via lo", lo)
    });
    assert!(has(&pkts, b"via veth", link.b.ifindex), "{pkts:#?}");
    assert!(has(&pkts, b"via lo", lo), "{pkts:#?}");
    assert_eq!(cap.linktype(), tcpkit_capture::LINKTYPE_ETHERNET);
}

#[test]
fn quiet_interface_times_out_down_waits_deleted_errors() {
    let (_lab, a, b, link) = pair("capdown");
    let mut cap = open_in(&b, &link.b.name, &opts(Some("udp port 6000")));
    let t = Instant::now();
    assert_eq!(
        cap.next_block(Duration::from_millis(100), |_| ())
            .expect("quiet"),
        0
    );
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_secs(2),
        "{waited:?}"
    );

    let ns = b.netns().to_owned();
    let ip = |args: &[&str]| {
        let st = std::process::Command::new("ip")
            .args(["-n", &ns])
            .args(args)
            .status()
            .expect("ip");
        assert!(st.success(), "ip {args:?}");
    };
    ip(&["link", "set", &link.b.name, "down"]);
    assert_eq!(
        cap.next_block(Duration::from_millis(100), |_| ())
            .expect("down"),
        0
    );
    ip(&["link", "set", &link.b.name, "up"]);
    // Back up: the kernel re-attached the socket. Wait for the link to carry traffic again.
    let u = b
        .enter(|| UdpSocket::bind(addr(B_IP, 6000)))
        .expect("udp in B");
    u.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut buf = [0u8; 8];
    let s = a
        .enter(|| UdpSocket::bind(addr(A_IP, 0)))
        .expect("udp in A");
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        s.send_to(b"again", addr(B_IP, 6000)).expect("send");
        if u.recv(&mut buf).is_ok() || Instant::now() > end {
            break;
        }
    }
    let pkts = drain(&mut cap, Duration::from_secs(3), |p| !p.is_empty());
    assert!(!pkts.is_empty(), "captured after the link came back");

    ip(&["link", "del", &link.b.name]);
    let e = cap
        .next_block(Duration::from_secs(2), |_| ())
        .expect_err("interface deleted");
    assert_eq!(
        e.to_string(),
        format!("{}: no such network interface", link.b.name)
    );
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec that we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Reads until a block wait times out; returns (packets, bytes).
fn drain_count(cap: &mut Capture, wait: Duration) -> (u64, u64) {
    let (mut n, mut bytes) = (0u64, 0u64);
    while cap
        .next_block(wait, |p| {
            n += 1;
            bytes += p.data.len() as u64;
        })
        .expect("next_block")
        > 0
    {}
    (n, bytes)
}

/// Top-speed measurement, in two parts, with 64-byte frames and the default ring plus a filter
/// (as copy would have one: its cost is part of the figures):
/// 1. A's AF_PACKET TX ring sends at full speed for 5 s while B's capture loop reads: the rate
///    sustained, the drops, and the reader's CPU time (its headroom).
/// 2. 300k frames are sent without reading, then the ring is read as fast as the loop can:
///    the loop's own ceiling, independent of the sender, and how much an unread ring holds.
///
/// `cargo test --release -p tcpkit-capture --test live -- --ignored --nocapture`
#[test]
#[ignore = "measurement: run alone with --ignored --nocapture"]
fn measure_capture_rate_64_byte_frames() {
    let (_lab, a, b, link) = pair("caprate");
    let with_filter = CaptureOpts {
        filter: Some("tcp dst port 9".into()),
        ..CaptureOpts::default()
    };
    let mut cap = open_in(&b, &link.b.name, &with_filter);
    let frame = tcp_frame(addr(A_IP, 1), addr(B_IP, 9), None, None, b"0123456789");
    assert_eq!(frame.len(), 64);
    let batch = vec![
        Frame {
            data: &frame,
            ts_ns: 0
        };
        64
    ];
    let stop = AtomicBool::new(false);
    let run = Duration::from_secs(5);
    let (sent, captured, elapsed, cpu) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            a.enter(|| {
                let mut sink =
                    AfPacketSink::open(&link.a.name, AfPacketOpts::default()).expect("sink");
                while !stop.load(Ordering::Relaxed) {
                    sink.send_batch(&batch).expect("send");
                }
                sink.flush().expect("flush");
                sink.counters().successful
            })
        });
        let (t0, cpu0) = (Instant::now(), thread_cpu());
        let (mut n, mut bytes) = (0u64, 0u64);
        while t0.elapsed() < run {
            cap.next_block(Duration::from_millis(50), |p| {
                n += 1;
                bytes += p.data.len() as u64;
            })
            .expect("next_block");
        }
        stop.store(true, Ordering::Relaxed);
        let sent = sender.join().expect("sender");
        // What is still in the ring after the sender stopped.
        let (n2, bytes2) = drain_count(&mut cap, Duration::from_millis(100));
        assert_eq!(
            bytes + bytes2,
            64 * (n + n2),
            "only the flood passes the filter"
        );
        (
            sent,
            n + n2,
            t0.elapsed(),
            thread_cpu().saturating_sub(cpu0),
        )
    });
    let st = cap.stats().expect("stats");
    let secs = elapsed.as_secs_f64();
    println!(
        "capture at top speed: {captured} frames in {secs:.2} s = {:.0} pps; kernel drops {} \
         ({:.2} %); accepted {}; freezes {}; sender {sent} frames = {:.0} pps; reader CPU \
         {:.2} s ({:.0} ns/frame)",
        captured as f64 / secs,
        st.drops,
        100.0 * st.drops as f64 / st.packets.max(1) as f64,
        st.packets,
        st.freeze_count,
        sent as f64 / secs,
        cpu.as_secs_f64(),
        cpu.as_nanos() as f64 / captured.max(1) as f64,
    );
    assert!(captured > 0);
    assert_eq!(st.packets, captured + st.drops);

    // Part 2: about 150 bytes of ring per frame, so 300k would fit in 64 MiB if the blocks were
    // full; blocks retired by their timeout are not (see CaptureOpts::block_count).
    const FILL: u64 = 300_000;
    let filled = a.enter(|| {
        let mut sink = AfPacketSink::open(&link.a.name, AfPacketOpts::default()).expect("sink");
        for _ in 0..FILL / 64 {
            sink.send_batch(&batch).expect("send");
        }
        sink.flush().expect("flush");
        sink.counters().successful
    });
    // Let the last block retire (block timeout 10 ms).
    std::thread::sleep(Duration::from_millis(100));
    let (t0, cpu0) = (Instant::now(), thread_cpu());
    let (n, bytes) = drain_count(&mut cap, Duration::ZERO);
    let (wall, cpu) = (t0.elapsed(), thread_cpu().saturating_sub(cpu0));
    let st2 = cap.stats().expect("stats");
    println!(
        "capture loop ceiling: {n} frames from a full ring in {:.1} ms = {:.0} pps \
         ({:.1} ns/frame CPU); unread ring held {n} of {filled} sent, dropped {}",
        wall.as_secs_f64() * 1e3,
        n as f64 / wall.as_secs_f64(),
        cpu.as_nanos() as f64 / n.max(1) as f64,
        st2.drops - st.drops,
    );
    assert_eq!(bytes, 64 * n);
    assert_eq!(st2.packets - st.packets, n + (st2.drops - st.drops));
}
