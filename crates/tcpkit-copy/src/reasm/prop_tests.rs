//! Property tests: random streams cut into random segments, reordered, duplicated, with
//! overlapping retransmissions and initial sequence numbers near 2^32, must come out exactly;
//! a segment lost from the capture must end the session at the right place, never with
//! wrong bytes.

use proptest::prelude::*;

use super::tests::{closes, stream, Conn, ACK, FIN_ACK};
use super::*;

/// A stream and the (offset, len) segments that carry it: a cover cut at random points, plus
/// random retransmissions of random ranges (overlapping the cover's boundaries), shuffled.
fn segments() -> impl Strategy<Value = (Vec<u8>, Vec<(usize, usize)>)> {
    (1usize..4000)
        .prop_flat_map(|n| {
            (
                proptest::collection::vec(any::<u8>(), n),
                proptest::collection::vec(1usize..1500, 1..40),
                proptest::collection::vec((0..n, 1usize..2000), 0..12),
            )
        })
        .prop_flat_map(|(data, cuts, retx)| {
            let n = data.len();
            let mut segs = Vec::new();
            let mut at = 0;
            for c in cuts.iter().cycle() {
                if at >= n {
                    break;
                }
                let len = (*c).min(n - at);
                segs.push((at, len));
                at += len;
            }
            segs.extend(retx.into_iter().map(|(a, l)| (a, l.min(n - a))));
            (Just(data), Just(segs).prop_shuffle())
        })
}

fn isn() -> impl Strategy<Value = u32> {
    prop_oneof![any::<u32>(), (0u32..5000).prop_map(|x| u32::MAX - x)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn one_direction_comes_out_exactly((data, segs) in segments(), c_isn in isn()) {
        let k = Conn::new(c_isn, 1);
        let mut t = Tracker::new(TrackerConfig::default());
        let mut out = Vec::new();
        t.push(1, &k.syn(), &mut out);
        for (i, &(a, l)) in segs.iter().enumerate() {
            t.push(2 + i as u64, &k.c(a as u64, 0, ACK, &data[a..a + l]), &mut out);
        }
        prop_assert_eq!(stream(&out, Dir::ClientToServer), data.clone());
        prop_assert_eq!(t.stats().conflicting_bytes, 0);
        prop_assert_eq!(t.stats().buffered_bytes, 0);
        prop_assert!(closes(&out).is_empty());
    }

    #[test]
    fn both_directions_interleaved((c_data, c_segs) in segments(), (s_data, s_segs) in segments(),
                                   c_isn in isn(), s_isn in isn(), order in any::<u64>()) {
        let k = Conn::new(c_isn, s_isn);
        let mut frames = Vec::new();
        // Each direction keeps its own order; the two are merged at random, FINs last.
        let (mut ci, mut si, mut bits) = (0, 0, order);
        while ci < c_segs.len() || si < s_segs.len() {
            let take_c = si == s_segs.len() || (ci < c_segs.len() && bits & 1 == 0);
            bits = bits.rotate_right(1) ^ 0x9e37_79b9;
            if take_c {
                let (a, l) = c_segs[ci];
                frames.push(k.c(a as u64, 0, ACK, &c_data[a..a + l]));
                ci += 1;
            } else {
                let (a, l) = s_segs[si];
                frames.push(k.s(a as u64, 0, ACK, &s_data[a..a + l]));
                si += 1;
            }
        }
        frames.push(k.c(c_data.len() as u64, s_data.len() as u64, FIN_ACK, b""));
        frames.push(k.s(s_data.len() as u64, c_data.len() as u64 + 1, FIN_ACK, b""));
        let mut t = Tracker::new(TrackerConfig::default());
        let mut out = Vec::new();
        t.push(1, &k.syn(), &mut out);
        t.push(2, &k.syn_ack(), &mut out);
        for (i, f) in frames.iter().enumerate() {
            t.push(3 + i as u64, f, &mut out);
        }
        prop_assert_eq!(stream(&out, Dir::ClientToServer), c_data);
        prop_assert_eq!(stream(&out, Dir::ServerToClient), s_data);
        prop_assert_eq!(closes(&out), vec![CloseKind::Fin]);
    }

    #[test]
    fn a_lost_segment_ends_the_session_at_the_hole((data, segs) in segments(), c_isn in isn(),
                                                    lost in any::<prop::sample::Index>()) {
        let p = lost.index(data.len());
        // Lose every copy of byte `p`: the capture never saw it.
        let kept: Vec<_> = segs.iter().copied().filter(|&(a, l)| !(a..a + l).contains(&p)).collect();
        let k = Conn::new(c_isn, 1);
        let cfg = TrackerConfig::default();
        let hole = cfg.hole_timeout_ns;
        let mut t = Tracker::new(cfg);
        let mut out = Vec::new();
        t.push(1, &k.syn(), &mut out);
        for (i, &(a, l)) in kept.iter().enumerate() {
            t.push(2 + i as u64, &k.c(a as u64, 0, ACK, &data[a..a + l]), &mut out);
        }
        // The FIN shows there is more, even when the lost byte was the last one.
        let end = 10 + kept.len() as u64;
        t.push(end, &k.c(data.len() as u64, 0, FIN_ACK, b""), &mut out);
        prop_assert!(closes(&out).is_empty(), "closed before the timeout");
        t.tick(end + hole + hole / 8, &mut out);
        // Delivered: the prefix up to the first byte no kept segment covers (at most `p`).
        let q = (0..data.len())
            .find(|&x| !kept.iter().any(|&(a, l)| (a..a + l).contains(&x)))
            .unwrap_or(data.len());
        prop_assert!(q <= p);
        prop_assert_eq!(stream(&out, Dir::ClientToServer), data[..q].to_vec());
        prop_assert_eq!(
            closes(&out),
            vec![CloseKind::LostData {
                dir: Dir::ClientToServer,
                at_seq: c_isn.wrapping_add(1).wrapping_add(q as u32),
            }]
        );
        prop_assert_eq!(t.stats().closed_lost_data, 1);
    }

    #[test]
    fn mid_stream_join_takes_the_stream_from_the_first_segment((data, segs) in segments(),
                                                                c_isn in isn()) {
        // The first segment captured starts the stream; the rest arrive in any order.
        let k = Conn::new(c_isn, 1);
        let first = segs[0].0;
        let mut t = Tracker::new(TrackerConfig { server_ports: vec![80], ..Default::default() });
        let mut out = Vec::new();
        for (i, &(a, l)) in segs.iter().enumerate() {
            t.push(1 + i as u64, &k.c(a as u64, 0, ACK, &data[a..a + l]), &mut out);
        }
        let joined = matches!(out[0], Event::Open { syn_seen: false, .. });
        prop_assert!(joined, "not a mid-stream open");
        prop_assert_eq!(stream(&out, Dir::ClientToServer), data[first..].to_vec());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// A stable stand-in for a fuzzing run: random inputs through the fuzz body, whose own
    /// checks (contiguity, byte values, one open and one close per session) must hold.
    #[test]
    fn fuzz_body_holds_on_random_inputs(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        fuzz_reasm(&data);
    }

    /// The same with inputs made only of segment records near one another, which random
    /// bytes rarely produce: many overlaps, FINs, RSTs and SYNs on the same sequence range.
    #[test]
    fn fuzz_body_holds_on_dense_segments(cfg in 0u8..8, recs in proptest::collection::vec(
        (0u8..64, 0u16..600, any::<u8>(), 0u16..600, 0u8..20), 0..200)) {
        let mut data = vec![cfg];
        for (op, seq, len, ack, dt) in recs {
            data.push(op);
            data.extend_from_slice(&seq.to_be_bytes());
            data.push(len);
            data.extend_from_slice(&ack.to_be_bytes());
            data.push(dt);
        }
        fuzz_reasm(&data);
    }
}
