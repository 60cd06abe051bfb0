//! The report's flow counts (tcpreplay's `Flows:` line) at a cost the top-speed path can carry:
//! one table lookup per frame was a tenth of the CPU a 64-byte frame took through AF_XDP. Two
//! savings, neither changing a count:
//! - IPv4 keys are packed into one `u128` (a table entry of 32 bytes instead of 48, hashed in
//!   two multiplies), other keys kept whole in a table of their own; a key and its reverse are
//!   always of one family, so connections are counted exactly as in one table.
//! - A replay whose frames are the same in every loop (no `--unique-ip`/`--unique-ports`,
//!   which change them, and no `--flow-expiry`, which makes an old flow new again) finds no new
//!   flow after the first loop: later loops only count packets, without the table, and without
//!   parsing a frame when the first loop had only flow packets.
//! - With `-K` and frames sent as captured, the table runs once over the inputs while they are
//!   loaded, before sending: each packet gets a byte of marks (its class, whether it opens a
//!   flow, a connection), and sending counts from the marks. The counts are those of the
//!   frames actually sent, a run cut short included, as the marks are per packet; the lookups
//!   are done, once, with the loading instead of in the sending loop.

use std::net::IpAddr;

use tcpkit_pcap::CaptureFile;
use tcpkit_stats::FlowTable;
use tcpkit_wire::{flow_class, FlowClass, FlowKey};

/// Flows, connections and packet classes of what one worker sent.
#[derive(Debug)]
pub(crate) struct LoopFlows {
    v4: FlowTable<u128>,
    other: FlowTable<FlowKey>,
    /// Frames tcpreplay's flow_decode calls invalid (in no `Flows:` count).
    pub(crate) invalid: u64,
    /// Every loop sends the same frames: after the first, the table learns nothing new.
    repeats: bool,
    /// Set when the first loop ended with `repeats`: frames are counted, not looked up.
    counting_only: bool,
    /// The first loop had flow packets only: a later frame is one without being parsed.
    all_flow: bool,
}

/// A mark's bits: the packet's class (neither bit: invalid), and what it opened.
const FLOW: u8 = 1;
const NON_FLOW: u8 = 2;
const NEW_FLOW: u8 = 4;
const NEW_CONNECTION: u8 = 8;

/// Marks for every packet of `files`, in the order one worker sends them (each file in turn),
/// or None where a packet is not Ethernet (it would be given a header first) or unreadable.
/// A flow and its reverse are always on one thread (`shard_hash` is the same both ways), so
/// the marks of one pass over all packets are each thread's too.
pub(crate) fn premark(files: &[CaptureFile]) -> Option<Vec<Vec<u8>>> {
    let mut t = LoopFlows::new(None, false);
    let mut marks = Vec::with_capacity(files.len());
    for f in files {
        let mut m = Vec::new();
        for p in f.packets() {
            let p = p.ok()?;
            if p.linktype != crate::engine::DLT_EN10MB {
                return None;
            }
            m.push(t.mark(p.data));
        }
        marks.push(m);
    }
    Some(marks)
}

/// An IPv4 key as one integer: source, destination, ports, protocol.
fn pack_v4(k: &FlowKey) -> Option<u128> {
    match (k.src, k.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Some(
            u128::from(u32::from(s)) << 96
                | u128::from(u32::from(d)) << 64
                | u128::from(k.src_port) << 48
                | u128::from(k.dst_port) << 32
                | u128::from(k.proto),
        ),
        _ => None,
    }
}

impl LoopFlows {
    /// `expiry_ns` as `FlowTable::new`'s; `repeats`: every loop sends the same frames (see the
    /// module's doc).
    pub(crate) fn new(expiry_ns: Option<u64>, repeats: bool) -> Self {
        LoopFlows {
            v4: FlowTable::new(expiry_ns),
            other: FlowTable::new(expiry_ns),
            invalid: 0,
            repeats: repeats && expiry_ns.is_none(),
            counting_only: false,
            all_flow: false,
        }
    }

    /// Counts one frame as it leaves (after `--unique-ip` and rewriting), sent at `ts_ns`.
    pub(crate) fn observe(&mut self, frame: &[u8], ts_ns: u64) {
        if self.counting_only {
            if self.all_flow {
                self.v4.flow_packets += 1;
                return;
            }
            match flow_class(frame) {
                FlowClass::Flow(_) => self.v4.flow_packets += 1,
                FlowClass::NonFlow => self.v4.non_flow_packets += 1,
                FlowClass::Invalid => self.invalid += 1,
            }
            return;
        }
        match flow_class(frame) {
            FlowClass::Flow(k) => match pack_v4(&k) {
                Some(p) => {
                    let rev = pack_v4(&k.reversed()).unwrap_or(p);
                    self.v4.observe(Some((p, rev)), ts_ns);
                }
                None => {
                    self.other.observe(Some((k, k.reversed())), ts_ns);
                }
            },
            FlowClass::NonFlow => {
                self.v4.observe(None, ts_ns);
            }
            FlowClass::Invalid => self.invalid += 1,
        }
    }

    /// Counts `frame` and says how, as a mark.
    fn mark(&mut self, frame: &[u8]) -> u8 {
        let before = (self.flows(), self.connections(), self.flow_packets());
        let invalid = self.invalid;
        self.observe(frame, 0);
        let mut m = if self.flow_packets() > before.2 {
            FLOW
        } else if self.invalid > invalid {
            0
        } else {
            NON_FLOW
        };
        if self.flows() > before.0 {
            m |= NEW_FLOW;
        }
        if self.connections() > before.1 {
            m |= NEW_CONNECTION;
        }
        m
    }

    /// Counts a frame from its mark (see [`premark`]).
    pub(crate) fn observe_marked(&mut self, m: u8) {
        if m & FLOW != 0 {
            self.v4.flow_packets += 1;
        } else if m & NON_FLOW != 0 {
            self.v4.non_flow_packets += 1;
        } else {
            self.invalid += 1;
        }
        if !self.counting_only {
            self.v4.flows += u64::from(m & NEW_FLOW != 0);
            self.v4.connections += u64::from(m & NEW_CONNECTION != 0);
        }
    }

    /// A pass over the inputs is done: from here on, with `repeats`, frames are only counted.
    pub(crate) fn loop_done(&mut self) {
        if self.repeats && !self.counting_only {
            self.counting_only = true;
            self.all_flow = self.non_flow_packets() == 0 && self.invalid == 0;
        }
    }

    pub(crate) fn flows(&self) -> u64 {
        self.v4.flows + self.other.flows
    }

    pub(crate) fn connections(&self) -> u64 {
        self.v4.connections + self.other.connections
    }

    pub(crate) fn flow_packets(&self) -> u64 {
        self.v4.flow_packets + self.other.flow_packets
    }

    pub(crate) fn non_flow_packets(&self) -> u64 {
        self.v4.non_flow_packets + self.other.non_flow_packets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame: IPv4 UDP from 10.0.0.`s`:`sp` to 10.0.0.`d`:`dp`, or IPv6 (fd00::)
    /// if `v6`.
    fn udp(s: u8, d: u8, sp: u16, dp: u16, v6: bool) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        if v6 {
            f.extend([0x86, 0xdd, 0x60, 0, 0, 0, 0, 8, 17, 64]);
            f.extend([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, s]);
            f.extend([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, d]);
        } else {
            f.extend([0x08, 0x00, 0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0]);
            f.extend([10, 0, 0, s, 10, 0, 0, d]);
        }
        f.extend(sp.to_be_bytes());
        f.extend(dp.to_be_bytes());
        f.extend([0, 8, 0, 0]);
        f
    }

    fn arp() -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend([2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        f.extend([0; 28]);
        f
    }

    /// The counts `FlowTable` gives over the same frames with whole keys: the reference.
    fn reference(frames: &[Vec<u8>], loops: usize) -> (u64, u64, u64, u64) {
        let mut t = FlowTable::new(None);
        for _ in 0..loops {
            for f in frames {
                match flow_class(f) {
                    FlowClass::Flow(k) => {
                        t.observe(Some((k, k.reversed())), 0);
                    }
                    FlowClass::NonFlow => {
                        t.observe(None, 0);
                    }
                    FlowClass::Invalid => {}
                }
            }
        }
        (t.flows, t.connections, t.flow_packets, t.non_flow_packets)
    }

    fn counts(l: &LoopFlows) -> (u64, u64, u64, u64) {
        (
            l.flows(),
            l.connections(),
            l.flow_packets(),
            l.non_flow_packets(),
        )
    }

    #[test]
    fn packed_keys_count_as_whole_keys_do_over_loops() {
        // Both directions of a connection, a port that differs only in its low byte, IPv6
        // beside IPv4, non-flow and invalid frames.
        let frames = vec![
            udp(1, 2, 1000, 9, false),
            udp(2, 1, 9, 1000, false),
            udp(1, 2, 1001, 9, false),
            udp(1, 2, 1000, 9, true),
            udp(2, 1, 9, 1000, true),
            arp(),
            vec![0; 10],
            udp(3, 4, 1000, 9, false),
        ];
        for repeats in [false, true] {
            let mut l = LoopFlows::new(None, repeats);
            for _ in 0..3 {
                for f in &frames {
                    l.observe(f, 0);
                }
                l.loop_done();
            }
            assert_eq!(counts(&l), reference(&frames, 3), "repeats {repeats}");
            assert_eq!(counts(&l), (6, 4, 18, 3));
            assert_eq!(l.invalid, 3);
        }
    }

    #[test]
    fn later_loops_of_flow_packets_only_are_counted_without_the_table() {
        let frames: Vec<_> = (0..4).map(|i| udp(i, 9, 1000, 9, false)).collect();
        let mut l = LoopFlows::new(None, true);
        for f in &frames {
            l.observe(f, 0);
        }
        l.loop_done();
        // A frame the first loop never had is not looked up: with `repeats` the caller
        // promises the same frames, and counting it as a flow packet is all that is done.
        l.observe(&udp(200, 9, 1000, 9, false), 0);
        l.observe(&frames[0], 0);
        assert_eq!(counts(&l), (4, 4, 6, 0));
    }

    #[test]
    fn marks_count_as_the_table_does_and_a_cut_run_counts_what_it_sent() {
        let frames = [
            udp(1, 2, 1000, 9, false),
            udp(2, 1, 9, 1000, false),
            arp(),
            vec![0; 10],
            udp(1, 2, 1000, 9, true),
            udp(1, 2, 1000, 9, false),
        ];
        let mut t = LoopFlows::new(None, false);
        let marks: Vec<u8> = frames.iter().map(|f| t.mark(f)).collect();
        for (loops, cut) in [(2, frames.len()), (1, 3), (2, 1)] {
            let (mut a, mut b) = (LoopFlows::new(None, true), LoopFlows::new(None, true));
            for l in 0..loops {
                let n = if l + 1 == loops { cut } else { frames.len() };
                for (f, &m) in frames.iter().zip(&marks).take(n) {
                    a.observe(f, 0);
                    b.observe_marked(m);
                }
                a.loop_done();
                b.loop_done();
            }
            assert_eq!(
                counts(&a),
                counts(&b),
                "{loops} loops, the last cut at {cut}"
            );
            assert_eq!(a.invalid, b.invalid);
        }
        assert_eq!(
            marks,
            [
                FLOW | NEW_FLOW | NEW_CONNECTION,
                FLOW | NEW_FLOW,
                NON_FLOW,
                0,
                FLOW | NEW_FLOW | NEW_CONNECTION,
                FLOW
            ]
        );
    }

    #[test]
    fn with_an_expiry_every_loop_goes_through_the_table() {
        let mut l = LoopFlows::new(Some(1_000), true);
        let f = udp(1, 2, 1000, 9, false);
        l.observe(&f, 0);
        l.loop_done();
        l.observe(&f, 5_000);
        assert_eq!(
            l.flows(),
            2,
            "the flow came back after its expiry: new again"
        );
    }
}
