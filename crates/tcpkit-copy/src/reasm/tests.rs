//! Unit tests of the tracker: one per capture situation, with frames built by
//! `tcpkit_wire::tcp::Segment::emit` and payloads of marker bytes.

use std::net::SocketAddr;

use tcpkit_wire::tcp::{Flags, Options, Segment};

use super::*;

pub(crate) const SYN: Flags = Flags::SYN;
pub(crate) const ACK: Flags = Flags::ACK;
pub(crate) const FIN_ACK: Flags = Flags(Flags::FIN.0 | Flags::ACK.0);
pub(crate) const SYN_ACK: Flags = Flags(Flags::SYN.0 | Flags::ACK.0);
pub(crate) const RST: Flags = Flags::RST;

pub(crate) fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

pub(crate) fn frame(
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    ack: u32,
    flags: Flags,
    payload: &[u8],
) -> Vec<u8> {
    let s = Segment {
        src,
        dst,
        seq,
        ack,
        flags,
        window: 1024,
        options: Options::default(),
        payload: 0..0,
        payload_len: 0,
    };
    let mut f = Vec::new();
    s.emit(payload, &mut f).unwrap();
    f
}

/// A client and a server with their initial sequence numbers, building frames of one
/// connection at stream offsets (offset 0 = first byte after the SYN).
pub(crate) struct Conn {
    pub c: SocketAddr,
    pub s: SocketAddr,
    pub c_isn: u32,
    pub s_isn: u32,
}

impl Conn {
    pub fn new(c_isn: u32, s_isn: u32) -> Conn {
        Conn {
            c: addr("10.1.0.1:43210"),
            s: addr("10.1.0.2:80"),
            c_isn,
            s_isn,
        }
    }
    pub fn syn(&self) -> Vec<u8> {
        frame(self.c, self.s, self.c_isn, 0, SYN, b"")
    }
    pub fn syn_ack(&self) -> Vec<u8> {
        frame(
            self.s,
            self.c,
            self.s_isn,
            self.c_isn.wrapping_add(1),
            SYN_ACK,
            b"",
        )
    }
    fn cseq(&self, off: u64) -> u32 {
        self.c_isn.wrapping_add(1).wrapping_add(off as u32)
    }
    fn sseq(&self, off: u64) -> u32 {
        self.s_isn.wrapping_add(1).wrapping_add(off as u32)
    }
    /// Client data at offset `off`, acknowledging server offset `ack`.
    pub fn c(&self, off: u64, ack: u64, flags: Flags, p: &[u8]) -> Vec<u8> {
        frame(self.c, self.s, self.cseq(off), self.sseq(ack), flags, p)
    }
    pub fn s(&self, off: u64, ack: u64, flags: Flags, p: &[u8]) -> Vec<u8> {
        frame(self.s, self.c, self.sseq(off), self.cseq(ack), flags, p)
    }
}

pub(crate) fn run(t: &mut Tracker, frames: &[Vec<u8>]) -> Vec<Event> {
    let mut out = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        t.push(1_000 * (i as u64 + 1), f, &mut out);
    }
    out
}

/// The bytes of `dir` in `events`, checking they are contiguous.
pub(crate) fn stream(events: &[Event], want: Dir) -> Vec<u8> {
    let mut v = Vec::new();
    for e in events {
        if let Event::Data {
            dir, offset, bytes, ..
        } = e
        {
            if *dir == want {
                assert_eq!(*offset, v.len() as u64, "{want:?} not contiguous");
                v.extend_from_slice(bytes);
            }
        }
    }
    v
}

pub(crate) fn closes(events: &[Event]) -> Vec<CloseKind> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Close { how, .. } => Some(*how),
            _ => None,
        })
        .collect()
}

fn marker(n: usize, m: u8) -> Vec<u8> {
    (0..n).map(|i| m ^ (i as u8)).collect()
}

fn tracker() -> Tracker {
    Tracker::new(TrackerConfig::default())
}

#[test]
fn handshake_request_response_and_fin() {
    let k = Conn::new(1000, 5000);
    let mut t = tracker();
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.syn_ack(),
            k.c(0, 0, ACK, b""),
            k.c(0, 0, ACK, b"GET / HTTP/1.1\r\n\r\n"),
            k.s(0, 18, ACK, b"HTTP/1.1 200 OK\r\n\r\n"),
            k.c(18, 19, FIN_ACK, b""),
            k.s(19, 19, FIN_ACK, b""),
            k.c(19, 20, ACK, b""),
        ],
    );
    assert!(matches!(
        ev[0],
        Event::Open { client, server, syn_seen: true, ts_ns: 1000, .. } if client == k.c && server == k.s
    ));
    assert_eq!(stream(&ev, Dir::ClientToServer), b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(stream(&ev, Dir::ServerToClient), b"HTTP/1.1 200 OK\r\n\r\n");
    // Turns show in capture order: request, response, close.
    let kinds: Vec<_> = ev
        .iter()
        .map(|e| match e {
            Event::Open { .. } => "open",
            Event::Data {
                dir: Dir::ClientToServer,
                ..
            } => "req",
            Event::Data { .. } => "resp",
            Event::Gap { .. } => "gap",
            Event::Close { .. } => "close",
        })
        .collect();
    assert_eq!(kinds, ["open", "req", "resp", "close"]);
    assert_eq!(closes(&ev), [CloseKind::Fin]);
    if let Event::Data { seq, ts_ns, .. } = &ev[1] {
        assert_eq!((*seq, *ts_ns), (1001, 4000));
    }
    let st = t.stats();
    assert_eq!(
        (st.sessions_seen, st.sessions_open, st.closed_fin),
        (1, 0, 1)
    );
    assert_eq!(
        (st.bytes_client_to_server, st.bytes_server_to_client),
        (18, 19)
    );
    assert_eq!(
        st.after_close_frames, 1,
        "the last ACK comes after the close"
    );
}

#[test]
fn retransmissions_and_duplicates_are_delivered_once() {
    let k = Conn::new(7, 9);
    let mut t = tracker();
    let a = marker(100, 0x10);
    let b = marker(50, 0x20);
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.c(0, 0, ACK, &a),
            k.c(0, 0, ACK, &a),
            k.c(100, 0, ACK, &b),
            k.c(100, 0, ACK, &b),
            k.c(50, 0, ACK, &[&a[50..], &b[..]].concat()),
        ],
    );
    assert_eq!(stream(&ev, Dir::ClientToServer), [&a[..], &b[..]].concat());
    assert_eq!(t.stats().retransmitted_bytes, 100 + 50 + 100);
    assert_eq!(t.stats().conflicting_bytes, 0);
}

#[test]
fn out_of_order_segments_wait_for_the_hole() {
    let k = Conn::new(u32::MAX - 5, 0);
    let mut t = tracker();
    let (a, b, c) = (marker(10, 1), marker(20, 2), marker(30, 3));
    let ev = run(&mut t, &[k.syn(), k.c(30, 0, ACK, &c), k.c(10, 0, ACK, &b)]);
    assert!(stream(&ev, Dir::ClientToServer).is_empty());
    assert!(t.stats().buffered_bytes >= 50);
    let ev = run(&mut t, &[k.c(0, 0, ACK, &a)]);
    assert_eq!(stream(&ev, Dir::ClientToServer), [a, b, c].concat());
    assert_eq!(ev.len(), 3, "the filled hole, then the two buffered pieces");
    assert_eq!(t.stats().out_of_order_segments, 2);
    assert_eq!(t.stats().buffered_bytes, 0);
}

#[test]
fn conflicting_overlaps_keep_the_first_bytes() {
    let k = Conn::new(100, 0);
    let mut t = tracker();
    let a = marker(40, 0x30);
    let mut other = marker(40, 0x77);
    other[..10].copy_from_slice(&a[..10]);
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.c(20, 0, ACK, &a[20..]),       // buffered
            k.c(10, 0, ACK, &other[10..30]), // 10 new bytes, 10 overlapping the buffer
            k.c(0, 0, ACK, &a[..20]),        // fills; 10 overlap what the last one buffered
        ],
    );
    let want = [&a[..10], &other[10..20], &a[20..]].concat();
    assert_eq!(stream(&ev, Dir::ClientToServer), want);
    let st = t.stats();
    assert_eq!(st.overlapping_bytes, 20);
    let differ = |x: &[u8], y: &[u8]| x.iter().zip(y).filter(|(p, q)| p != q).count() as u64;
    assert_eq!(
        st.conflicting_bytes,
        differ(&other[20..30], &a[20..30]) + differ(&a[10..20], &other[10..20])
    );
    // After delivery: compared against the recheck ring.
    let before = t.stats().conflicting_bytes;
    let ev = run(&mut t, &[k.c(0, 0, ACK, &marker(40, 0x55))]);
    assert!(stream(&ev, Dir::ClientToServer).is_empty());
    assert_eq!(
        t.stats().conflicting_bytes - before,
        differ(&marker(40, 0x55), &want)
    );
    assert_eq!(t.stats().retransmitted_bytes, 40);
}

#[test]
fn gro_super_frames_larger_than_the_mss() {
    let k = Conn::new(0, 0);
    let mut t = tracker();
    let big = marker(60_000, 0x42);
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.c(0, 0, ACK, &big),
            k.c(1460, 0, ACK, &big[1460..2920]),
        ],
    );
    assert_eq!(stream(&ev, Dir::ClientToServer), big);
    assert_eq!(t.stats().retransmitted_bytes, 1460);
}

#[test]
fn sequence_numbers_wrap_at_2_32() {
    for isn in [u32::MAX, u32::MAX - 1, u32::MAX - 99, 0x7fff_ffff] {
        let k = Conn::new(isn, isn.wrapping_add(12345));
        let mut t = tracker();
        let d = marker(300, 9);
        let ev = run(
            &mut t,
            &[
                k.syn(),
                k.syn_ack(),
                k.c(100, 0, ACK, &d[100..]),
                k.c(0, 0, ACK, &d[..150]),
                k.s(0, 300, ACK, &d),
            ],
        );
        assert_eq!(stream(&ev, Dir::ClientToServer), d, "isn {isn:#x}");
        assert_eq!(stream(&ev, Dir::ServerToClient), d);
    }
}

#[test]
fn mid_stream_join_starts_at_the_first_segment_of_each_direction() {
    let k = Conn::new(5_000_000, 9_000_000);
    let mut t = Tracker::new(TrackerConfig {
        server_ports: vec![80],
        ..Default::default()
    });
    // The server speaks first here: roles still come from the port.
    let ev = run(
        &mut t,
        &[
            k.s(500, 200, ACK, b"response tail"),
            k.c(200, 513, ACK, b"next request"),
            k.c(100, 513, ACK, b"old"),
        ],
    );
    assert!(matches!(ev[0], Event::Open { client, syn_seen: false, .. } if client == k.c));
    assert_eq!(stream(&ev, Dir::ServerToClient), b"response tail");
    assert_eq!(stream(&ev, Dir::ClientToServer), b"next request");
    assert_eq!(t.stats().sessions_joined_mid_stream, 1);
    assert_eq!(
        t.stats().retransmitted_bytes,
        0,
        "bytes before the join are not the stream"
    );

    // Without server ports the lower port is the server's.
    let mut t = tracker();
    let ev = run(&mut t, &[k.s(0, 0, ACK, b"x")]);
    assert!(matches!(ev[0], Event::Open { client, server, .. } if client == k.c && server == k.s));
}

#[test]
fn only_full_and_server_ports_decide_what_is_tracked() {
    let k = Conn::new(1, 2);
    let mut t = Tracker::new(TrackerConfig {
        only_full: true,
        ..Default::default()
    });
    let ev = run(&mut t, &[k.c(0, 0, ACK, b"abc"), k.s(0, 3, ACK, b"def")]);
    assert!(ev.is_empty());
    assert_eq!(t.stats().untracked_frames, 2);
    let ev = run(&mut t, &[k.syn(), k.c(0, 0, ACK, b"abc")]);
    assert_eq!(stream(&ev, Dir::ClientToServer), b"abc");

    let mut t = Tracker::new(TrackerConfig {
        server_ports: vec![8080],
        ..Default::default()
    });
    assert!(run(&mut t, &[k.syn(), k.c(0, 0, ACK, b"abc")]).is_empty());
    assert_eq!(t.stats().untracked_frames, 2);
    // Frames that are not TCP are counted, not tracked.
    let mut out = Vec::new();
    t.push(1, &[0u8; 10], &mut out);
    let mut frag = k.syn();
    frag[20] = 0x20;
    t.push(1, &frag, &mut out);
    assert!(out.is_empty());
    assert_eq!(
        (t.stats().not_tcp_frames, t.stats().fragment_frames),
        (1, 1)
    );
}

#[test]
fn reset_closes_and_a_hole_behind_it_is_lost_data() {
    let k = Conn::new(10, 20);
    let mut t = tracker();
    let ev = run(
        &mut t,
        &[k.syn(), k.c(0, 0, ACK, b"abc"), k.s(0, 3, RST, b"")],
    );
    assert_eq!(closes(&ev), [CloseKind::Rst]);
    assert_eq!(t.stats().closed_rst, 1);

    let mut t = tracker();
    let ev = run(
        &mut t,
        &[k.syn(), k.c(5, 0, ACK, b"late"), k.c(9, 0, RST, b"")],
    );
    assert_eq!(
        closes(&ev),
        [CloseKind::LostData {
            dir: Dir::ClientToServer,
            at_seq: 11
        }]
    );
    assert_eq!(t.stats().undelivered_bytes, 4);
}

#[test]
fn capture_loss_ends_the_session_after_the_hole_timeout() {
    let k = Conn::new(1 << 31, 3);
    let cfg = TrackerConfig::default();
    let hole = cfg.hole_timeout_ns;
    let mut t = Tracker::new(cfg);
    let (a, b) = (marker(100, 1), marker(100, 2));
    // Segment 100..200 never captured.
    let mut ev = run(&mut t, &[k.syn(), k.c(0, 0, ACK, &a), k.c(200, 0, ACK, &b)]);
    t.tick(3_000 + hole / 2, &mut ev);
    assert!(closes(&ev).is_empty(), "still within the timeout");
    t.tick(3_000 + hole + hole / 8, &mut ev);
    assert_eq!(
        stream(&ev, Dir::ClientToServer),
        a,
        "nothing after the hole"
    );
    assert_eq!(
        closes(&ev),
        [CloseKind::LostData {
            dir: Dir::ClientToServer,
            at_seq: (1u32 << 31) + 101
        }]
    );
    assert_eq!(t.stats().closed_lost_data, 1);
    assert_eq!(t.stats().buffered_bytes, 0);
}

/// The requests a lost segment cut off are counted at the close: those the capture saw past
/// the hole (each client turn after a server turn, resends not counted again), beside those
/// delivered; the lost request itself was never seen and is not.
#[test]
fn requests_seen_past_a_hole_are_counted_at_its_close() {
    let k = Conn::new(1000, 5000);
    let mut t = tracker();
    let (req, ans) = (b"GET /x HTTP/1.1\r\n\r\n", b"HTTP/1.1 204 No\r\n\r\n");
    let (r, a) = (req.len() as u64, ans.len() as u64);
    let mut ev = run(
        &mut t,
        &[
            k.syn(),
            k.syn_ack(),
            k.c(0, 0, ACK, req),
            k.s(0, r, ACK, ans),
            // The second request was never captured; its answer was.
            k.s(a, 2 * r, ACK, ans),
            k.c(2 * r, 2 * a, ACK, req),
            k.s(2 * a, 3 * r, ACK, ans),
            // A resend of the third request, then the fourth.
            k.c(2 * r, 3 * a, ACK, req),
            k.c(3 * r, 3 * a, ACK, req),
        ],
    );
    assert_eq!(
        stream(&ev, Dir::ClientToServer),
        req,
        "one request delivered"
    );
    t.tick(10_000_000_000, &mut ev);
    let seen: Vec<(CloseKind, u64)> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Close {
                how, requests_seen, ..
            } => Some((*how, *requests_seen)),
            _ => None,
        })
        .collect();
    assert_eq!(
        seen,
        [(
            CloseKind::LostData {
                dir: Dir::ClientToServer,
                at_seq: 1001 + r as u32
            },
            3
        )]
    );
    // Without a hole every request seen is delivered: the counts agree.
    let mut t = tracker();
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.c(0, 0, ACK, req),
            k.s(0, r, ACK, ans),
            k.c(r, a, ACK, req),
            k.c(r, a, ACK, req),
            k.c(2 * r, 2 * a, RST, b""),
        ],
    );
    assert!(
        matches!(
            ev.last(),
            Some(Event::Close {
                how: CloseKind::Rst,
                requests_seen: 2,
                ..
            })
        ),
        "{ev:?}"
    );
}

#[test]
fn an_ack_beyond_the_data_seen_is_a_hole() {
    // The last segment was lost: only the server's ACK tells.
    let k = Conn::new(0, 0);
    let mut t = tracker();
    let mut ev = run(
        &mut t,
        &[
            k.syn(),
            k.syn_ack(),
            k.c(0, 0, ACK, b"abc"),
            k.s(0, 6, ACK, b""),
        ],
    );
    t.tick(10_000_000_000, &mut ev);
    assert_eq!(
        closes(&ev),
        [CloseKind::LostData {
            dir: Dir::ClientToServer,
            at_seq: 4
        }]
    );
    // An ACK of the FIN is no hole.
    let mut t = tracker();
    let mut ev = run(
        &mut t,
        &[
            k.syn(),
            k.syn_ack(),
            k.c(0, 0, FIN_ACK, b"abc"),
            k.s(0, 4, ACK, b""),
        ],
    );
    t.tick(10_000_000_000, &mut ev);
    t.tick(400_000_000_000, &mut ev);
    assert_eq!(closes(&ev), [CloseKind::Idle]);
}

#[test]
fn a_hole_filled_in_time_is_no_loss() {
    let k = Conn::new(0, 0);
    let cfg = TrackerConfig::default();
    let hole = cfg.hole_timeout_ns;
    let mut t = Tracker::new(cfg);
    let mut out = Vec::new();
    t.push(1, &k.syn(), &mut out);
    t.push(2, &k.c(10, 0, ACK, &marker(10, 2)), &mut out);
    t.push(hole - 1, &k.c(0, 0, ACK, &marker(10, 1)), &mut out);
    t.tick(hole * 3, &mut out);
    assert_eq!(
        stream(&out, Dir::ClientToServer),
        [marker(10, 1), marker(10, 2)].concat()
    );
    assert!(closes(&out).is_empty());
}

#[test]
fn a_snaplen_cut_frame_leaves_a_hole() {
    let k = Conn::new(0, 0);
    let mut t = tracker();
    let full = k.c(0, 0, ACK, &marker(100, 1));
    let cut = full[..full.len() - 40].to_vec();
    let mut ev = run(&mut t, &[k.syn(), cut]);
    assert_eq!(stream(&ev, Dir::ClientToServer), marker(60, 1));
    assert_eq!(t.stats().truncated_segments, 1);
    // A retransmission of the whole segment fills it.
    ev.extend(run(&mut t, &[full]));
    assert_eq!(stream(&ev, Dir::ClientToServer), marker(100, 1));
    t.tick(10_000_000_000, &mut ev);
    assert!(closes(&ev).is_empty());
    let mut t = tracker();
    // 26 of 100 payload bytes captured: the hole starts at 1 + 26.
    let mut ev = run(
        &mut t,
        &[k.syn(), k.c(0, 0, ACK, &marker(100, 1))[..80].to_vec()],
    );
    t.tick(10_000_000_000, &mut ev);
    assert!(matches!(
        closes(&ev)[..],
        [CloseKind::LostData { at_seq: 27, .. }]
    ));
}

#[test]
fn buffering_limits_shed_the_session() {
    let k = Conn::new(0, 0);
    let mut t = Tracker::new(TrackerConfig {
        max_buffered_per_dir: 1000,
        ..Default::default()
    });
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.c(10, 0, ACK, &[1; 500]),
            k.c(600, 0, ACK, &[1; 500]),
        ],
    );
    assert_eq!(closes(&ev), [CloseKind::Shed]);
    assert_eq!((t.stats().closed_shed, t.stats().buffered_bytes), (1, 0));

    let mut t = Tracker::new(TrackerConfig {
        max_buffered_total: 1000,
        ..Default::default()
    });
    let k2 = Conn {
        c: addr("10.1.0.3:5555"),
        ..Conn::new(0, 0)
    };
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k2.syn(),
            k.c(10, 0, ACK, &[1; 600]),
            k2.c(10, 0, ACK, &[1; 600]),
        ],
    );
    assert_eq!(closes(&ev), [CloseKind::Shed]);
    assert_eq!(t.stats().sessions_open, 1);
}

/// A connection that lost capture data goes on: its new bytes after the LostData close
/// start a session again at once, joined mid-stream, where the closed entry used to swallow
/// them for the whole linger (the soak's keep-alive copies: every request of a connection
/// for 10 s after one kernel drop, neither copied nor counted at the source). Retransmissions
/// of what was seen before the close still linger.
#[test]
fn a_connection_that_lost_data_is_joined_again_on_its_next_new_bytes() {
    let k = Conn::new(1000, 5000);
    let cfg = TrackerConfig::default();
    let hole = cfg.hole_timeout_ns;
    let mut t = Tracker::new(cfg);
    let (req, ans) = (b"GET /x HTTP/1.1\r\n\r\n", b"HTTP/1.1 204 No\r\n\r\n");
    let (r, a) = (req.len() as u64, ans.len() as u64);
    // The second request is never captured; the third is, then the hole times out.
    let mut ev = run(
        &mut t,
        &[
            k.syn(),
            k.syn_ack(),
            k.c(0, 0, ACK, req),
            k.s(0, r, ACK, ans),
            k.c(2 * r, a, ACK, req),
        ],
    );
    t.tick(6_000 + hole + hole / 4, &mut ev);
    assert!(
        matches!(closes(&ev)[..], [CloseKind::LostData { .. }]),
        "{ev:?}"
    );
    let now = 6_000 + hole + hole / 2;
    let mut out = Vec::new();
    // A resend of the third request: seen before the close, it lingers.
    t.push(now, &k.c(2 * r, a, ACK, req), &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(t.stats().after_close_frames, 1);
    // The fourth request, its answer, the fifth: a session again, counted from its turn.
    for (i, f) in [
        k.c(3 * r, a, ACK, req),
        k.s(a, 4 * r, ACK, ans),
        k.c(4 * r, 2 * a, ACK, req),
        k.c(5 * r, 2 * a, RST, b""),
    ]
    .iter()
    .enumerate()
    {
        t.push(now + 1 + i as u64, f, &mut out);
    }
    assert!(
        matches!(
            out.first(),
            Some(Event::Open {
                syn_seen: false,
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(
        stream(&out, Dir::ClientToServer),
        [&req[..], &req[..]].concat()
    );
    assert!(
        matches!(
            out.last(),
            Some(Event::Close {
                how: CloseKind::Rst,
                requests_seen: 1,
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(t.stats().sessions_joined_mid_stream, 1);
}

#[test]
fn idle_sessions_close_and_closed_ones_are_forgotten_after_the_linger() {
    let k = Conn::new(0, 0);
    let cfg = TrackerConfig::default();
    let (idle, linger) = (cfg.idle_timeout_ns, cfg.closed_linger_ns);
    let mut t = Tracker::new(cfg);
    let mut out = Vec::new();
    t.push(0, &k.c(0, 0, ACK, b"a"), &mut out);
    t.tick(idle - 1, &mut out);
    assert!(closes(&out).is_empty());
    t.tick(idle + idle / 8, &mut out);
    assert_eq!(closes(&out), [CloseKind::Idle]);
    out.clear();
    t.push(idle + idle / 8 + 1, &k.c(1, 0, ACK, b"b"), &mut out);
    assert!(out.is_empty(), "a late frame does not reopen it");
    assert_eq!(t.stats().after_close_frames, 1);
    t.tick(idle + idle / 4 + linger, &mut out);
    t.push(
        idle + idle / 4 + linger + 1,
        &k.c(2, 0, ACK, b"c"),
        &mut out,
    );
    assert!(
        matches!(
            out[0],
            Event::Open {
                syn_seen: false,
                ..
            }
        ),
        "{out:?}"
    );
}

#[test]
fn a_new_syn_on_the_same_4_tuple_is_a_new_session() {
    let k = Conn::new(0, 0);
    let k2 = Conn::new(77_777, 1);
    let mut t = tracker();
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.c(0, 0, ACK, b"one"),
            k.syn(),
            k2.syn(),
            k2.c(0, 0, ACK, b"two"),
            k2.c(3, 0, RST, b""),
        ],
    );
    let opens: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Open { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(
        opens,
        [SessionId(1), SessionId(2)],
        "a repeated SYN is not new"
    );
    assert_eq!(closes(&ev), [CloseKind::Idle, CloseKind::Rst]);
    assert_eq!(stream_of(&ev, SessionId(1), Dir::ClientToServer), b"one");
    assert_eq!(stream_of(&ev, SessionId(2), Dir::ClientToServer), b"two");
}

#[test]
fn syn_ack_without_the_syn_still_starts_both_streams() {
    let k = Conn::new(400, 800);
    let mut t = tracker();
    let ev = run(
        &mut t,
        &[
            k.syn_ack(),
            k.syn(),
            k.c(0, 0, ACK, b"hello"),
            k.s(0, 5, ACK, b"hi"),
        ],
    );
    assert!(matches!(ev[0], Event::Open { client, syn_seen: true, .. } if client == k.c));
    assert_eq!(
        t.stats().sessions_seen,
        1,
        "the SYN retransmission is not a new attempt"
    );
    assert_eq!(stream(&ev, Dir::ClientToServer), b"hello");
    assert_eq!(stream(&ev, Dir::ServerToClient), b"hi");
}

#[test]
fn the_session_table_is_bounded() {
    let mut t = Tracker::new(TrackerConfig {
        max_sessions: 2,
        ..Default::default()
    });
    let conns: Vec<Conn> = (0..3)
        .map(|i| Conn {
            c: SocketAddr::new(addr("10.9.0.1:1").ip(), 2000 + i),
            ..Conn::new(0, 0)
        })
        .collect();
    let ev = run(&mut t, &conns.iter().map(Conn::syn).collect::<Vec<_>>());
    assert_eq!(ev.len(), 2);
    assert_eq!((t.stats().table_full, t.stats().sessions_open), (1, 2));
}

#[test]
fn ipv6_sessions() {
    let k = Conn {
        c: addr("[2001:db8::10]:50000"),
        s: addr("[2001:db8::20]:443"),
        ..Conn::new(3, 4)
    };
    let mut t = tracker();
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.syn_ack(),
            k.c(0, 0, ACK, b"v6 bytes"),
            k.s(0, 8, ACK, b"ok"),
        ],
    );
    assert_eq!(stream(&ev, Dir::ClientToServer), b"v6 bytes");
    assert_eq!(stream(&ev, Dir::ServerToClient), b"ok");
}

#[test]
fn memory_is_counted_and_given_back() {
    let k = Conn::new(0, 0);
    let mut t = tracker();
    let mut ev = run(&mut t, &[k.syn(), k.c(1000, 0, ACK, &[7; 5000])]);
    t.tick(1_000_000_000, &mut ev);
    let held = t.stats().memory_bytes;
    assert!(held >= 5000, "{held}");
    let mut ev = run(&mut t, &[k.c(0, 0, RST, b"")]);
    t.tick(30_000_000_000, &mut ev);
    assert!(
        t.stats().memory_bytes < held - 5000,
        "{} of {held}",
        t.stats().memory_bytes
    );
    let mut out = Vec::new();
    t.finish(&mut out);
    assert_eq!(t.stats().sessions_open, 0);
}

pub(crate) fn stream_of(events: &[Event], want_id: SessionId, want: Dir) -> Vec<u8> {
    let mut v = Vec::new();
    for e in events {
        if let Event::Data {
            id,
            dir,
            offset,
            bytes,
            ..
        } = e
        {
            if (*id, *dir) == (want_id, want) {
                assert_eq!(
                    *offset,
                    v.len() as u64,
                    "{want_id:?} {want:?} not contiguous"
                );
                v.extend_from_slice(bytes);
            }
        }
    }
    v
}

/// Segments per second through `push`: many sessions, in-order MSS-sized segments with the
/// peer's ACKs, as a busy server's capture looks. `cargo test --release -p tcpkit-copy --
/// --ignored --nocapture push_throughput`.
#[test]
#[ignore = "measurement; run in release"]
fn push_throughput() {
    const SESSIONS: u32 = 10_000;
    const ROUNDS: u64 = 40;
    let payload = marker(1448, 0x5a);
    let conns: Vec<Conn> = (0..SESSIONS)
        .map(|i| Conn {
            c: SocketAddr::new(
                std::net::Ipv4Addr::from(0x0a00_0000 + i).into(),
                10_000 + (i % 50_000) as u16,
            ),
            ..Conn::new(i.wrapping_mul(2_654_435_761), i)
        })
        .collect();
    // Frames are built up front: the measurement is of the tracker, not of the builder.
    let mut frames = Vec::new();
    for k in &conns {
        frames.push(k.syn());
        frames.push(k.syn_ack());
    }
    for r in 0..ROUNDS {
        for k in &conns {
            frames.push(k.c(r * 1448, 0, ACK, &payload));
            if r % 2 == 1 {
                frames.push(k.s(0, (r + 1) * 1448, ACK, b""));
            }
        }
    }
    let mut t = Tracker::new(TrackerConfig::default());
    let mut out = Vec::with_capacity(16);
    let mut bytes = 0u64;
    let start = std::time::Instant::now();
    for (i, f) in frames.iter().enumerate() {
        t.push(i as u64 * 1_000, f, &mut out);
        for e in out.drain(..) {
            if let Event::Data { bytes: b, .. } = e {
                bytes += b.len() as u64;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(bytes, u64::from(SESSIONS) * ROUNDS * 1448);
    println!(
        "push: {} frames ({} sessions) in {:.3} s = {:.2} M segments/s, {:.2} Gbit/s of payload; memory {} MiB",
        frames.len(),
        SESSIONS,
        secs,
        frames.len() as f64 / secs / 1e6,
        bytes as f64 * 8.0 / secs / 1e9,
        t.stats().memory_bytes >> 20
    );
}

/// The gaps of `dir` in `events`: (offset, len).
fn gaps(events: &[Event], want: Dir) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Gap {
                dir, offset, len, ..
            } if *dir == want => Some((*offset, *len)),
            _ => None,
        })
        .collect()
}

/// Issue 10 case 13: with `skip_server_holes`, a hole in the server's answer no longer ends
/// the session. The client acknowledging past it proves the capture missed bytes the client
/// got: the hole is passed over at once (a Gap, then the buffered answer), the client's
/// later bytes are delivered, and the session ends as it really did. A hole the client never
/// acknowledged is passed over after the hole timeout; one in the client's own stream still
/// ends the session as lost data.
#[test]
fn server_holes_are_passed_over_and_the_client_stream_goes_on() {
    let k = Conn::new(1000, 5000);
    let cfg = TrackerConfig {
        skip_server_holes: true,
        ..TrackerConfig::default()
    };
    let hole = cfg.hole_timeout_ns;
    let (req1, req2) = (marker(40, 1), marker(30, 2));
    let (head, tail) = (marker(100, 3), marker(70, 5));
    let mut t = Tracker::new(cfg.clone());
    let ev = run(
        &mut t,
        &[
            k.syn(),
            k.syn_ack(),
            k.c(0, 0, ACK, &req1),
            k.s(0, 40, ACK, &head),
            // Server bytes 100..150 never captured; 150..220 buffered behind them.
            k.s(150, 40, ACK, &tail),
            // The client acknowledges all 220 and asks again.
            k.c(40, 220, ACK, &req2),
            k.s(220, 70, ACK, b"second answer"),
            k.c(70, 233, FIN_ACK, b""),
            k.s(233, 71, FIN_ACK, b""),
        ],
    );
    assert_eq!(stream(&ev, Dir::ClientToServer), [req1, req2].concat());
    assert_eq!(gaps(&ev, Dir::ServerToClient), [(100, 50)]);
    let server: Vec<u8> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Data {
                dir: Dir::ServerToClient,
                bytes,
                ..
            } => Some(bytes.to_vec()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(server, [&head[..], &tail, b"second answer"].concat());
    assert_eq!(closes(&ev), [CloseKind::Fin]);
    assert_eq!((t.stats().skipped_holes, t.stats().skipped_bytes), (1, 50));
    assert_eq!(t.stats().buffered_bytes, 0);

    // Not acknowledged (the client's ACK is older): passed over after the hole timeout.
    let mut t = Tracker::new(cfg.clone());
    let mut ev = run(
        &mut t,
        &[
            k.syn(),
            k.syn_ack(),
            k.c(0, 0, ACK, &marker(40, 1)),
            k.s(0, 40, ACK, &marker(100, 3)),
            k.s(150, 40, ACK, &marker(70, 5)),
        ],
    );
    assert!(gaps(&ev, Dir::ServerToClient).is_empty());
    t.tick(6_000 + hole + hole / 8, &mut ev);
    assert_eq!(gaps(&ev, Dir::ServerToClient), [(100, 50)]);
    assert!(closes(&ev).is_empty(), "the session goes on");

    // A hole in the client's stream: lost data, as without the option.
    let mut t = Tracker::new(cfg);
    let mut ev = run(
        &mut t,
        &[
            k.syn(),
            k.c(0, 0, ACK, &marker(100, 1)),
            k.c(200, 0, ACK, &marker(10, 2)),
        ],
    );
    t.tick(4_000 + hole + hole / 8, &mut ev);
    assert!(matches!(
        closes(&ev)[..],
        [CloseKind::LostData {
            dir: Dir::ClientToServer,
            ..
        }]
    ));
}
