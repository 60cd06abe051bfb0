//! The `replay` report: tcpreplay's summary lines, extended with what tcpreplay does not say
//! (connections, timing error, the interface's own counters), and the same figures as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use tcpkit_stats::{fmt_ns, to_json, Percentiles, Report, Verdict};

/// Bumped whenever a JSON field changes meaning or disappears (docs/schema/replay.schema.json).
pub const REPLAY_SCHEMA_VERSION: u32 = 1;

/// Everything a replay run reports. Field names are the `--json` contract.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    /// [`REPLAY_SCHEMA_VERSION`] when written: which layout of this document a reader holds.
    pub schema_version: u32,
    /// Interface name, or the output file for `-w`.
    pub output: String,
    /// True when `-w` wrote a file instead of sending.
    pub dry_run: bool,
    /// Frames sent whole (tcpreplay's `Actual: N packets`); for `-w`, frames written.
    pub packets: u64,
    /// Bytes of those frames, link-layer headers included, no FCS.
    pub bytes: u64,
    /// The run's duration: from the start to the last frame handed to the kernel; for `-w`, the
    /// span of the timestamps written.
    pub seconds: f64,
    /// Bytes per second over `seconds` (0 when `seconds` is 0).
    pub rate_bps: f64,
    /// Megabits (10^6 bits) per second over `seconds`.
    pub rate_mbps: f64,
    /// Frames per second over `seconds`.
    pub rate_pps: f64,
    /// Passes over the whole capture that every sending thread finished (`--loop`).
    pub loops_completed: u64,
    /// tcpreplay's `Flows:` and our `Connections:` line.
    pub flows: FlowStats,
    /// How late packets left against their intended send time; absent at top speed and for `-w`.
    pub timing: Option<TimingError>,
    /// tcpreplay's "Statistics for network device" block: what the sink did with each frame.
    pub device: DeviceStats,
    /// The interface's own tx counters over the run (what the kernel says it sent).
    pub interface: Option<IfDelta>,
    /// `--mtu-trunc`: what it cut and what it could not; None without it.
    pub mtu_trunc: Option<MtuTrunc>,
    /// Packets that got an Ethernet header because their link type had none.
    pub ethernet_added: u64,
    /// Source MAC written into those added headers and where it came from (`--src-mac`, the
    /// interface's address, or zero); None when no header was added.
    pub ethernet_src: Option<String>,
    /// Destination MAC written into those added headers; None when no header was added.
    pub ethernet_dst: Option<String>,
    /// `--shard K/N`: this agent's part of a replay several hosts share; absent when the
    /// replay is not sharded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<ReplayShard>,
    /// `--intf2`: how the capture was split over the two interfaces; absent with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<ReplaySplit>,
    /// Why the run ended early, if it did (an input error, an interrupt).
    pub stopped_by: Option<String>,
    /// Why the run did not send every packet it was asked to (which errno, how many, what to
    /// do); None when every frame offered was sent whole. Such a run exits 1 with this as its
    /// last line.
    pub failure: Option<String>,
    /// Where this agent stood in a fleet run (`--barrier`); absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<tcpkit_fleet::FleetReport>,
    /// How frames left the interface (AF_PACKET, or AF_XDP with `--xdp`); absent for `-w`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send: Option<SendPath>,
}

/// The kernel interface frames were sent through.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SendPath {
    /// `af_packet` (the default) or `af_xdp` (`--xdp`).
    pub path: String,
    /// With `af_xdp`: `zerocopy` (the driver sends from the UMEM) or `copy` (the kernel copies
    /// each frame into an skb: drivers without AF_XDP support, veth among them); None with
    /// `af_packet`.
    pub xdp_mode: Option<String>,
    /// With `af_xdp`: the transmit queue of each sending thread's socket, in thread order;
    /// empty with `af_packet` (the kernel picks the queue per frame).
    pub queues: Vec<u32>,
}

impl SendPath {
    /// Sent through AF_PACKET sockets.
    pub fn af_packet() -> SendPath {
        SendPath {
            path: "af_packet".into(),
            xdp_mode: None,
            queues: Vec::new(),
        }
    }

    /// Sent through AF_XDP sockets on `queues`, in `mode`.
    pub fn af_xdp(mode: Option<&str>, queues: Vec<u32>) -> SendPath {
        SendPath {
            path: "af_xdp".into(),
            xdp_mode: mode.map(str::to_string),
            queues,
        }
    }
}

/// Flow and connection counts over the frames sent, keyed as tcpreplay keys them.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FlowStats {
    /// Flows as tcpreplay counts them: per direction.
    pub flows: u64,
    /// `flows` per second of the run.
    pub flows_per_sec: f64,
    /// Frames that had a flow key: IPv4 or IPv6 of any protocol (tcpreplay's "flow packets").
    pub flow_packets: u64,
    /// Frames without a flow key: ARP, LLDP and anything else not IP.
    pub non_flow_packets: u64,
    /// Frames tcpreplay 4.4.3 counts as neither (its "invalid" packets, which it does not
    /// print): 802.3 frames, link headers it cannot walk (an MPLS GACH label, an unknown
    /// payload under the bottom label, cut tags or labels), cut IP headers.
    pub invalid_packets: u64,
    /// A flow and its reverse counted once.
    pub connections: u64,
    /// `connections` per second of the run.
    pub connections_per_sec: f64,
}

/// Which shard of a shared replay this was, and what it left to the others.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ReplayShard {
    /// K of `--shard K/N`.
    pub index: u32,
    /// N of `--shard K/N`.
    pub count: u32,
    /// Frames of the replay (all loops) not sent here: the other shards' flows.
    pub frames_to_others: u64,
    /// Flows this shard sent, a connection's two directions counted once (the unit shards
    /// split by; equals `flows.connections`).
    pub flows_kept: u64,
}

/// `--intf2`: what left by each side. tcpprep's primary side (client to server) is `--intf1`,
/// its secondary side (server to client) `--intf2`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplaySplit {
    /// `--intf1`, the primary (client) side.
    pub intf1: String,
    /// `--intf2`, the secondary (server) side.
    pub intf2: String,
    /// What decided each packet's side: `cache FILE` (`--cachefile`) or `auto client` (tcpprep
    /// `--auto=client` computed from each capture).
    pub source: String,
    /// Frames sent whole out of `--intf1`.
    pub intf1_packets: u64,
    /// Their bytes.
    pub intf1_bytes: u64,
    /// Frames sent whole out of `--intf2`.
    pub intf2_packets: u64,
    /// Their bytes.
    pub intf2_bytes: u64,
    /// Packets not sent because the cache says so, or because it ends before the capture
    /// (tcpreplay sends neither).
    pub not_sent: u64,
    /// `--intf2`'s own tx counters over the run (`interface` holds `--intf1`'s).
    pub intf2_interface: Option<IfDelta>,
}

/// What `--mtu-trunc --mtu N` did to the frames offered.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MtuTrunc {
    /// `--mtu`: bytes kept from the IP header on.
    pub mtu: u16,
    /// Frames cut (tcpreplay's "Truncated packets" counts only what the kernel cut, and
    /// stays 0 here, as ours does).
    pub truncated: u64,
    /// Frames longer than an Ethernet header plus `mtu` left whole: not IPv4/IPv6.
    pub too_long_not_ip: u64,
    /// IP frames cut to `mtu` from their IP header and still longer than an Ethernet header
    /// plus `mtu`, their link headers (VLAN tags, MPLS labels) being longer than 14 bytes.
    pub too_long_headers: u64,
}

/// How late paced frames left against their intended send time, measured when the batch
/// holding them was handed to the kernel.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TimingError {
    /// Frames whose lateness was measured: those that had an intended send time.
    pub paced_packets: u64,
    /// Median lateness, nanoseconds.
    pub late_p50_ns: u64,
    /// 99th percentile lateness, nanoseconds.
    pub late_p99_ns: u64,
    /// Largest lateness seen, nanoseconds.
    pub late_max_ns: u64,
    /// Mean lateness, nanoseconds.
    pub late_mean_ns: u64,
}

impl TimingError {
    /// The timing block of a histogram of lateness in nanoseconds.
    pub fn from_percentiles(p: &Percentiles) -> TimingError {
        TimingError {
            paced_packets: p.count,
            late_p50_ns: p.p50_ns,
            late_p99_ns: p.p99_ns,
            late_max_ns: p.max_ns,
            late_mean_ns: p.mean_ns,
        }
    }
}

/// tcpreplay's "Statistics for network device" block.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DeviceStats {
    /// Frames sent whole; equals `packets`.
    pub successful: u64,
    /// Frames not sent (too big, malformed, stuck queue, or another send error).
    pub failed: u64,
    /// Of `failed`: refused with EMSGSIZE (longer than the interface's MTU + header).
    pub failed_too_big: u64,
    /// Of `failed`: refused with EINVAL (shorter than a link-layer header).
    pub failed_malformed: u64,
    /// Of `failed`: given up after the device queue stayed full for over a second.
    pub failed_stuck: u64,
    /// Frames of which the kernel took fewer bytes than asked.
    pub truncated: u64,
    /// Times a send was retried after ENOBUFS (a full device queue); not a loss.
    pub retried_enobufs: u64,
    /// Times a send was retried after EAGAIN (a full socket buffer); not a loss.
    pub retried_eagain: u64,
}

/// The interface's own tx counters (`/proc/net/dev` of its namespace), after minus before.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct IfDelta {
    /// Frames the interface says it sent during the run (other senders on it included).
    pub tx_packets: u64,
    /// Bytes the interface says it sent during the run.
    pub tx_bytes: u64,
    /// Frames the interface dropped on transmit during the run.
    pub tx_dropped: u64,
    /// Transmit errors the interface counted during the run.
    pub tx_errors: u64,
}

impl Report for ReplayReport {
    /// The human summary, in tcpreplay's words where tcpreplay has words.
    fn human(&self) -> String {
        let mut s = String::new();
        // tcpreplay 4.4.3's decimals: seconds to the microsecond under one second, to the
        // hundredth above; Mbps to three decimals under 1 Mbps, two above. Truncated, not
        // rounded, as its integer arithmetic does.
        let secs_decimals = if self.seconds >= 1.0 { 2 } else { 6 };
        let _ = writeln!(
            s,
            "Actual: {} packets ({} bytes) sent in {} seconds",
            self.packets,
            self.bytes,
            truncated(self.seconds, secs_decimals)
        );
        let mbps_decimals = if self.rate_mbps >= 1.0 { 2 } else { 3 };
        let _ = writeln!(
            s,
            "Rated: {} Bps, {} Mbps, {} pps",
            truncated(self.rate_bps, 1),
            truncated(self.rate_mbps, mbps_decimals),
            truncated(self.rate_pps, 2)
        );
        let f = &self.flows;
        let _ = writeln!(
            s,
            "Flows: {} flows, {} fps, {} unique flow packets, {} unique non-flow packets",
            f.flows,
            truncated(f.flows_per_sec, 2),
            f.flow_packets,
            f.non_flow_packets
        );
        let _ = writeln!(
            s,
            "Connections: {} connections, {} cps",
            f.connections,
            truncated(f.connections_per_sec, 2)
        );
        if let Some(sh) = &self.shard {
            let _ = writeln!(
                s,
                "Shard: {}/{}, the frames of {} flows sent here, {} frames left to the other shards",
                sh.index, sh.count, sh.flows_kept, sh.frames_to_others
            );
        }
        if let Some(sp) = &self.split {
            let _ = writeln!(
                s,
                "Split: {} packets ({} bytes) out of {} (client side), {} packets ({} bytes) out of {} (server side), {} not sent; by {}",
                sp.intf1_packets,
                sp.intf1_bytes,
                sp.intf1,
                sp.intf2_packets,
                sp.intf2_bytes,
                sp.intf2,
                sp.not_sent,
                sp.source
            );
        }
        match &self.timing {
            Some(t) => {
                let _ = writeln!(
                    s,
                    "Timing: {} paced packets, late by p50 {}, p99 {}, max {}",
                    t.paced_packets,
                    fmt_ns(t.late_p50_ns),
                    fmt_ns(t.late_p99_ns),
                    fmt_ns(t.late_max_ns)
                );
            }
            None if self.dry_run => {
                let _ = writeln!(s, "Timing: dry run, timestamps written as scheduled");
            }
            None => {
                let _ = writeln!(s, "Timing: top speed, not paced");
            }
        }
        if let Some(m) = &self.mtu_trunc {
            let _ = write!(
                s,
                "Truncated by --mtu-trunc: {} packets to --mtu {}",
                m.truncated, m.mtu
            );
            if m.too_long_not_ip > 0 {
                let _ = write!(s, "; {} longer ones not IP, left whole", m.too_long_not_ip);
            }
            if m.too_long_headers > 0 {
                let _ = write!(
                    s,
                    "; {} still longer than the MTU by their link headers",
                    m.too_long_headers
                );
            }
            s.push('\n');
        }
        if self.ethernet_added > 0 {
            let _ = writeln!(
                s,
                "Ethernet: header added to {} packets (src {}, dst {})",
                self.ethernet_added,
                self.ethernet_src.as_deref().unwrap_or("?"),
                self.ethernet_dst.as_deref().unwrap_or("?")
            );
        }
        if self.dry_run {
            let _ = writeln!(s, "Written to file: {}", self.output);
        } else {
            let _ = writeln!(s, "Statistics for network device: {}", self.output);
        }
        let d = &self.device;
        let _ = writeln!(s, "\tSuccessful packets:        {}", d.successful);
        let _ = writeln!(s, "\tFailed packets:            {}", d.failed);
        let _ = writeln!(s, "\tTruncated packets:         {}", d.truncated);
        let _ = writeln!(s, "\tRetried packets (ENOBUFS): {}", d.retried_enobufs);
        let _ = writeln!(s, "\tRetried packets (EAGAIN):  {}", d.retried_eagain);
        if let Some(p) = self.send.as_ref().filter(|p| p.path == "af_xdp") {
            let queues: Vec<String> = p.queues.iter().map(u32::to_string).collect();
            let _ = writeln!(
                s,
                "Sent through AF_XDP ({} mode) on queue{} {}",
                p.xdp_mode.as_deref().unwrap_or("?"),
                if queues.len() == 1 { "" } else { "s" },
                queues.join(", ")
            );
        }
        if let Some(i) = &self.interface {
            let _ = writeln!(
                s,
                "Interface counters over the run: tx_packets {}, tx_bytes {}, tx_dropped {}, tx_errors {}",
                i.tx_packets, i.tx_bytes, i.tx_dropped, i.tx_errors
            );
        }
        if let Some(why) = &self.stopped_by {
            let _ = writeln!(s, "Stopped early: {why}");
        }
        s
    }

    fn json(&self) -> String {
        let mut v = self.clone();
        v.schema_version = REPLAY_SCHEMA_VERSION;
        to_json(&v)
    }

    /// Everything asked was sent, or the run says why not: it stopped early (an input error,
    /// an interrupt), or frames were refused by the interface (issue 10, case 2).
    fn verdict(&self) -> Verdict {
        Verdict::from_failure(self.stopped_by.as_deref().or(self.failure.as_deref()))
    }
}

/// `v` with `decimals` decimals, cut rather than rounded (tcpreplay prints integer parts and
/// remainders). The nudge keeps 0.132 from printing as 0.131 through binary fractions.
fn truncated(v: f64, decimals: usize) -> String {
    if !v.is_finite() || v <= 0.0 {
        return format!("{:.*}", decimals, 0.0);
    }
    let scale = 10f64.powi(decimals as i32);
    let cut = ((v * scale) * (1.0 + 1e-12)).floor() / scale;
    format!("{cut:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ReplayReport {
        ReplayReport {
            output: "veth0".into(),
            packets: 179,
            bytes: 69000,
            seconds: 0.5,
            rate_bps: 138000.0,
            rate_mbps: 1.104,
            rate_pps: 358.0,
            loops_completed: 1,
            flows: FlowStats {
                flows: 45,
                flows_per_sec: 90.0,
                flow_packets: 166,
                non_flow_packets: 12,
                invalid_packets: 1,
                connections: 26,
                connections_per_sec: 52.0,
            },
            timing: Some(TimingError {
                paced_packets: 179,
                late_p50_ns: 2_100,
                late_p99_ns: 9_800,
                late_max_ns: 31_000,
                late_mean_ns: 3_000,
            }),
            device: DeviceStats {
                successful: 179,
                ..Default::default()
            },
            interface: Some(IfDelta {
                tx_packets: 179,
                tx_bytes: 69000,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn human_summary_exact_text() {
        let expected = "\
Actual: 179 packets (69000 bytes) sent in 0.500000 seconds
Rated: 138000.0 Bps, 1.10 Mbps, 358.00 pps
Flows: 45 flows, 90.00 fps, 166 unique flow packets, 12 unique non-flow packets
Connections: 26 connections, 52.00 cps
Timing: 179 paced packets, late by p50 2.1 us, p99 9.8 us, max 31.0 us
Statistics for network device: veth0
\tSuccessful packets:        179
\tFailed packets:            0
\tTruncated packets:         0
\tRetried packets (ENOBUFS): 0
\tRetried packets (EAGAIN):  0
Interface counters over the run: tx_packets 179, tx_bytes 69000, tx_dropped 0, tx_errors 0
";
        assert_eq!(sample().human(), expected);
    }

    /// Issue 28: with --intf2 the summary says what left by each side and what decided it;
    /// with one interface there is no `split` in the JSON.
    #[test]
    fn a_split_says_what_left_by_each_side() {
        let mut r = sample();
        assert!(!r.json().contains("\"split\""));
        r.split = Some(ReplaySplit {
            intf1: "veth1".into(),
            intf2: "veth2".into(),
            source: "cache in.cache".into(),
            intf1_packets: 120,
            intf1_bytes: 9000,
            intf2_packets: 59,
            intf2_bytes: 40000,
            not_sent: 13,
            intf2_interface: None,
        });
        let text = r.human();
        assert!(
            text.contains("\nSplit: 120 packets (9000 bytes) out of veth1 (client side), 59 packets (40000 bytes) out of veth2 (server side), 13 not sent; by cache in.cache\n"),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["split"]["not_sent"], 13);
        assert_eq!(v["split"]["source"], "cache in.cache");
    }

    /// Issue 25: a shard says which it is and what it left to the others, after the flows
    /// it sent; an unsharded replay has no `shard` in its JSON.
    #[test]
    fn a_shard_says_which_it_is_and_what_it_left() {
        let mut r = sample();
        assert!(!r.json().contains("\"shard\""));
        r.shard = Some(ReplayShard {
            index: 2,
            count: 3,
            frames_to_others: 358,
            flows_kept: 26,
        });
        let text = r.human();
        assert!(
            text.contains("Connections: 26 connections, 52.00 cps\nShard: 2/3, the frames of 26 flows sent here, 358 frames left to the other shards\nTiming:"),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(
            v["shard"],
            serde_json::json!({"index": 2, "count": 3, "frames_to_others": 358, "flows_kept": 26})
        );
    }

    /// Issue 28: --xdp's summary names the path, its mode and queues after the device block;
    /// AF_PACKET's summary is tcpreplay's as before, and both say their path in the JSON.
    #[test]
    fn the_send_path_is_said() {
        let mut r = sample();
        r.send = Some(SendPath::af_packet());
        let plain = r.human();
        assert!(!plain.contains("AF_XDP"), "{plain}");
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(
            v["send"],
            serde_json::json!({"path": "af_packet", "xdp_mode": null, "queues": []})
        );
        r.send = Some(SendPath::af_xdp(Some("copy"), vec![0, 1]));
        let h = r.human();
        assert!(
            h.contains("\tRetried packets (EAGAIN):  0\nSent through AF_XDP (copy mode) on queues 0, 1\nInterface counters"),
            "{h}"
        );
        r.send = Some(SendPath::af_xdp(Some("zerocopy"), vec![3]));
        assert!(r
            .human()
            .contains("\nSent through AF_XDP (zerocopy mode) on queue 3\n"));
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(
            v["send"],
            serde_json::json!({"path": "af_xdp", "xdp_mode": "zerocopy", "queues": [3]})
        );
    }

    /// Issue 24: "Truncated packets: 0" after --mtu-trunc cut 31 frames; the cut ones get
    /// their own line (the device line stays tcpreplay's: what the kernel cut).
    #[test]
    fn mtu_trunc_says_what_it_cut_and_what_it_could_not() {
        let mut r = sample();
        r.mtu_trunc = Some(MtuTrunc {
            mtu: 1500,
            truncated: 31,
            too_long_not_ip: 2,
            too_long_headers: 1,
        });
        let h = r.human();
        assert!(
            h.contains("\nTruncated by --mtu-trunc: 31 packets to --mtu 1500; 2 longer ones not IP, left whole; 1 still longer than the MTU by their link headers\n"),
            "{h}"
        );
        let j: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(j["mtu_trunc"]["truncated"], 31);
        assert_eq!(j["flows"]["invalid_packets"], 1);
        assert!(!sample().human().contains("--mtu-trunc"));
    }

    #[test]
    fn decimals_follow_tcpreplay() {
        let mut r = sample();
        (r.seconds, r.rate_mbps, r.rate_bps) = (4.156, 0.1329, 16602.87);
        let h = r.human();
        assert!(h.starts_with("Actual: 179 packets (69000 bytes) sent in 4.15 seconds\n"));
        assert!(
            h.contains("Rated: 16602.8 Bps, 0.132 Mbps, 358.00 pps\n"),
            "{h}"
        );
        assert_eq!(truncated(0.132, 3), "0.132");
        assert_eq!(truncated(902.729, 2), "902.72");
        assert_eq!(truncated(0.0, 6), "0.000000");
    }

    #[test]
    fn json_has_stable_fields() {
        let v: serde_json::Value = serde_json::from_str(&sample().json()).unwrap();
        assert_eq!(v["schema_version"], REPLAY_SCHEMA_VERSION);
        assert_eq!(v["packets"], 179);
        assert_eq!(v["flows"]["flows"], 45);
        assert_eq!(v["device"]["successful"], 179);
        assert_eq!(v["timing"]["late_p99_ns"], 9800);
        assert_eq!(v["interface"]["tx_packets"], 179);
    }
}
