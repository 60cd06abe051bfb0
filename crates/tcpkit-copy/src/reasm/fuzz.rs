//! Body of the `reasm` fuzz target, public so a stable test runs it over the seed corpus.
//!
//! The input drives a [`Tracker`] with small limits and short timeouts through four
//! connections (one of them IPv6) near the 2^32 sequence wrap. Most records describe a
//! segment that the body builds with [`Segment::emit`]; its payload bytes are a function of
//! (connection, direction, sequence number), so whatever the order, duplication or overlap,
//! every delivered byte can be checked. Raw-frame records feed arbitrary bytes to the parser;
//! after one, byte values are no longer checked (a raw frame may carry any bytes for a known
//! 4-tuple), the other invariants still are. A broken invariant panics, which is a finding.

use std::collections::HashMap;
use std::net::SocketAddr;

use tcpkit_wire::tcp::{Flags, Options, Segment};

use super::{Dir, Event, SessionId, Tracker, TrackerConfig, TrackerStats};

/// Byte of connection `conn`, direction `dir` (0: from the high port), at sequence `seq`.
pub(crate) fn byte_at(conn: usize, dir: usize, seq: u32) -> u8 {
    (seq.wrapping_mul(31) ^ (seq >> 8).wrapping_mul(7)) as u8 ^ (conn as u8 * 16 + dir as u8)
}

const FLAGS: [Flags; 8] = [
    Flags::ACK,
    Flags(Flags::ACK.0 | Flags::PSH.0),
    Flags::SYN,
    Flags(Flags::SYN.0 | Flags::ACK.0),
    Flags(Flags::FIN.0 | Flags::ACK.0),
    Flags::RST,
    Flags::ACK,
    Flags::FIN,
];

fn endpoints(conn: usize) -> (SocketAddr, SocketAddr) {
    let port = 40000 + conn as u16;
    if conn == 3 {
        (
            SocketAddr::new("2001:db8::1".parse().unwrap_or([0u16; 8].into()), port),
            SocketAddr::new("2001:db8::2".parse().unwrap_or([0u16; 8].into()), 80),
        )
    } else {
        (
            SocketAddr::from(([10, 0, 0, 1], port)),
            SocketAddr::from(([10, 0, 0, 2], 80)),
        )
    }
}

/// What the checker remembers of one session.
#[derive(Debug)]
struct Seen {
    /// Connection index (from the high port) and whether the client has the high port.
    conn: usize,
    client_high: bool,
    next: [Option<(u64, u32)>; 2],
    closed: bool,
}

/// Record layout, one after another until the input ends:
/// - `0b11xx_xxxx len bytes..`: a raw frame of `len` bytes;
/// - `0b10xx_xxxx t`: advance time by `t` ms and tick;
/// - otherwise `op seq_hi seq_lo len ack_hi ack_lo t`: connection `op & 3`, direction
///   `op >> 2 & 1`, flags `FLAGS[op >> 3 & 7]`, sequence `base + seq`, `len` payload bytes,
///   ack `base' + ack`, then time advances `t` ms.
///
/// The first byte picks the configuration: bit 0 `only_full`, bit 1 no server ports, bit 2
/// no retransmission check ring. Must never panic.
pub fn fuzz_reasm(data: &[u8]) {
    run(data);
}

/// The fuzz body, returning the tracker's counters so tests can see what a seed exercised.
fn run(data: &[u8]) -> TrackerStats {
    let [cfg_bits, rest @ ..] = data else {
        return TrackerStats::default();
    };
    let mut t = Tracker::new(TrackerConfig {
        server_ports: if cfg_bits & 2 == 0 {
            vec![80]
        } else {
            Vec::new()
        },
        only_full: cfg_bits & 1 != 0,
        max_buffered_per_dir: 3000,
        max_buffered_total: 8000,
        max_sessions: 3,
        hole_timeout_ns: 40_000_000,
        idle_timeout_ns: 200_000_000,
        closed_linger_ns: 100_000_000,
        recheck_bytes: if cfg_bits & 4 == 0 { 100 } else { 0 },
        skip_server_holes: cfg_bits & 8 != 0,
    });
    // Sequence bases near the wrap, different per direction.
    let base = |conn: usize, dir: usize| 0xffff_ff00u32.wrapping_add((conn * 2 + dir) as u32 * 77);
    let mut now = 0u64;
    let mut out = Vec::new();
    let mut frame = Vec::with_capacity(2048);
    let mut payload = Vec::with_capacity(256);
    let mut seen: HashMap<SessionId, Seen> = HashMap::new();
    let mut raw_seen = false;
    let mut rest = rest;
    while let [op, tail @ ..] = rest {
        rest = tail;
        match op >> 6 {
            3 => {
                let [len, tail @ ..] = rest else { break };
                let n = usize::from(*len).min(tail.len());
                let (f, tail) = tail.split_at(n);
                rest = tail;
                raw_seen = true;
                t.push(now, f, &mut out);
            }
            2 => {
                let [dt, tail @ ..] = rest else { break };
                rest = tail;
                now += u64::from(*dt) * 1_000_000;
                t.tick(now, &mut out);
            }
            _ => {
                let [sh, sl, len, ah, al, dt, tail @ ..] = rest else {
                    break;
                };
                rest = tail;
                let conn = usize::from(op & 3);
                let dir = usize::from(op >> 2 & 1);
                let (a, b) = endpoints(conn);
                let (src, dst) = if dir == 0 { (a, b) } else { (b, a) };
                let seq = base(conn, dir).wrapping_add(u32::from(u16::from_be_bytes([*sh, *sl])));
                let ack =
                    base(conn, 1 - dir).wrapping_add(u32::from(u16::from_be_bytes([*ah, *al])));
                let flags = FLAGS[usize::from(op >> 3 & 7)];
                // A SYN's data starts one past its sequence number.
                let first = seq.wrapping_add(u32::from(flags.has(Flags::SYN)));
                payload.clear();
                payload.extend(
                    (0..u32::from(*len)).map(|i| byte_at(conn, dir, first.wrapping_add(i))),
                );
                let s = Segment {
                    src,
                    dst,
                    seq,
                    ack,
                    flags,
                    window: 65535,
                    options: Options::default(),
                    payload: 0..0,
                    payload_len: 0,
                };
                frame.clear();
                if s.emit(&payload, &mut frame).is_ok() {
                    t.push(now, &frame, &mut out);
                }
                now += u64::from(*dt) * 1_000_000;
            }
        }
        check(&mut seen, out.drain(..), !raw_seen);
    }
    t.finish(&mut out);
    check(&mut seen, out.drain(..), !raw_seen);
    assert!(
        seen.values().all(|s| s.closed),
        "a session was never closed"
    );
    assert_eq!(t.stats().sessions_open, 0);
    assert_eq!(t.stats().buffered_bytes, 0);
    t.stats().clone()
}

fn check(seen: &mut HashMap<SessionId, Seen>, events: impl Iterator<Item = Event>, bytes: bool) {
    for e in events {
        match e {
            Event::Open {
                id, client, server, ..
            } => {
                let high = client.port().max(server.port());
                let fresh = seen
                    .insert(
                        id,
                        Seen {
                            conn: usize::from(high.saturating_sub(40000)).min(3),
                            client_high: client.port() == high,
                            next: [None, None],
                            closed: false,
                        },
                    )
                    .is_none();
                assert!(fresh, "{id:?} opened twice");
            }
            Event::Data {
                id,
                dir,
                seq,
                offset,
                bytes: b,
                ..
            } => {
                let s = seen.get_mut(&id).expect("data before open");
                assert!(!s.closed, "data after close");
                assert!(!b.is_empty(), "empty data event");
                let next = &mut s.next[dir.index()];
                if let Some((o, q)) = *next {
                    assert_eq!((offset, seq), (o, q), "{id:?} {dir:?} not contiguous");
                }
                *next = Some((offset + b.len() as u64, seq.wrapping_add(b.len() as u32)));
                if bytes {
                    // Generator direction 0 is from the high port: the client's, unless a SYN
                    // from port 80 made the low port the client.
                    let gen_dir = match (dir, s.client_high) {
                        (Dir::ClientToServer, true) | (Dir::ServerToClient, false) => 0,
                        _ => 1,
                    };
                    let conn = s.conn;
                    for (i, &x) in b.iter().enumerate() {
                        let q = seq.wrapping_add(i as u32);
                        assert_eq!(
                            x,
                            byte_at(conn, gen_dir, q),
                            "{id:?} {dir:?} wrong byte at seq {q}"
                        );
                    }
                }
            }
            Event::Gap {
                id,
                dir,
                seq,
                offset,
                len,
                ..
            } => {
                let s = seen.get_mut(&id).expect("gap before open");
                assert!(!s.closed, "gap after close");
                let next = &mut s.next[dir.index()];
                if let Some((o, q)) = *next {
                    assert_eq!((offset, seq), (o, q), "{id:?} {dir:?} gap not contiguous");
                }
                *next = Some((offset + len, seq.wrapping_add(len as u32)));
            }
            Event::Close { id, .. } => {
                let s = seen.get_mut(&id).expect("close before open");
                assert!(!s.closed, "{id:?} closed twice");
                s.closed = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds reach every way a session ends and every kind of odd segment; a corpus that
    /// stopped doing so would leave the fuzzer far from them.
    #[test]
    fn the_seed_corpus_exercises_every_outcome() {
        let mut all = TrackerStats::default();
        for seed in tcpkit_lab::corpus::seeds("reasm") {
            let s = run(&seed.bytes);
            all.closed_fin += s.closed_fin;
            all.closed_rst += s.closed_rst;
            all.closed_idle += s.closed_idle;
            all.closed_lost_data += s.closed_lost_data;
            all.closed_shed += s.closed_shed;
            all.table_full += s.table_full;
            all.sessions_joined_mid_stream += s.sessions_joined_mid_stream;
            all.conflicting_bytes += s.conflicting_bytes;
            all.conflicting_fins += s.conflicting_fins;
            all.out_of_order_segments += s.out_of_order_segments;
            all.retransmitted_bytes += s.retransmitted_bytes;
            all.truncated_segments += s.truncated_segments;
            all.untracked_frames += s.untracked_frames;
            all.not_tcp_frames += s.not_tcp_frames;
            all.after_close_frames += s.after_close_frames;
            all.out_of_window_segments += s.out_of_window_segments;
            all.skipped_holes += s.skipped_holes;
            all.skipped_bytes += s.skipped_bytes;
        }
        let zero: Vec<_> = format!("{all:?}")
            .trim_start_matches("TrackerStats { ")
            .trim_end_matches(" }")
            .split(", ")
            .filter(|f| f.ends_with(": 0"))
            .map(str::to_owned)
            .collect();
        let expected_zero = [
            "frames: 0",
            "fragment_frames: 0",
            "sessions_seen: 0",
            "sessions_open: 0",
            "bytes_client_to_server: 0",
            "bytes_server_to_client: 0",
            "overlapping_bytes: 0",
            "undelivered_bytes: 0",
            "buffered_bytes: 0",
            "memory_bytes: 0",
        ];
        let missed: Vec<_> = zero
            .iter()
            .filter(|f| !expected_zero.contains(&f.as_str()))
            .collect();
        assert!(missed.is_empty(), "no seed reaches {missed:?}");
    }

    #[test]
    #[should_panic(expected = "wrong byte")]
    fn the_checker_catches_a_wrong_byte() {
        let (client, server) = endpoints(0);
        let id = SessionId(1);
        let open = Event::Open {
            id,
            client,
            server,
            syn_seen: true,
            ts_ns: 0,
        };
        let seq = 77;
        let data = Event::Data {
            id,
            dir: Dir::ClientToServer,
            seq,
            offset: 0,
            bytes: bytes::Bytes::from(vec![byte_at(0, 0, seq), !byte_at(0, 0, seq + 1)]),
            ts_ns: 0,
        };
        check(&mut HashMap::new(), [open, data].into_iter(), true);
    }

    #[test]
    #[should_panic(expected = "not contiguous")]
    fn the_checker_catches_a_gap() {
        let (client, server) = endpoints(0);
        let id = SessionId(1);
        let open = Event::Open {
            id,
            client,
            server,
            syn_seen: true,
            ts_ns: 0,
        };
        let data = |seq: u32, offset| Event::Data {
            id,
            dir: Dir::ClientToServer,
            seq,
            offset,
            bytes: bytes::Bytes::from(vec![byte_at(0, 0, seq)]),
            ts_ns: 0,
        };
        check(
            &mut HashMap::new(),
            [open, data(5, 0), data(7, 2)].into_iter(),
            true,
        );
    }
}
