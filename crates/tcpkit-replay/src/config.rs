//! The resolved run: every cross-flag check has happened before a [`Config`] exists, so the
//! engine never sees a combination it would have to reject.

use std::path::PathBuf;
use std::time::Duration;

use tcpkit_pace::Rate;
use tcpkit_wire::{MacAddr, RewriteConfig};
use tcpkit_workers::Shard;

/// Where frames go.
#[derive(Debug, Clone)]
pub enum Output {
    /// An interface through AF_PACKET.
    Interface { name: String, qdisc_bypass: bool },
    /// `-w`: a pcap file with the timestamps the frames would have had, instead of sending.
    File(PathBuf),
}

/// `--intf2`: a second interface, and what decides each packet's side.
#[derive(Debug, Clone)]
pub struct Intf2 {
    pub name: String,
    pub split: Split,
}

/// What decides which interface a packet leaves by.
#[derive(Debug, Clone)]
pub enum Split {
    /// `--cachefile`: a tcpprep cache, applied to every input from its first packet (as
    /// tcpreplay applies it).
    Cache(PathBuf),
    /// No cache: tcpprep `--auto=client` computed from each input before sending.
    AutoClient,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub inputs: Vec<PathBuf>,
    pub output: Output,
    pub rate: Rate,
    pub max_sleep: Option<Duration>,
    /// 0 = forever.
    pub loops: u64,
    pub loop_delay: Duration,
    /// Stop after this many packets in all.
    pub limit: Option<u64>,
    pub duration: Option<Duration>,
    /// `-K`: the whole input in memory before the first packet leaves.
    pub preload: bool,
    pub unique_ip: bool,
    /// `--unique-ports`: every loop after the first moves each TCP/UDP flow's client port
    /// (`tcpkit_wire::unique_ports`).
    pub unique_ports: bool,
    /// `--intf2`: the server side out of a second interface (AF_PACKET, like the first);
    /// needs `Output::Interface` and one thread.
    pub intf2: Option<Intf2>,
    pub rewrite: RewriteConfig,
    /// Source/destination MAC of the Ethernet header given to frames whose link type has none.
    /// `None`: the interface's own address (zero for `-w`) and broadcast.
    pub l2_src: Option<MacAddr>,
    pub l2_dst: Option<MacAddr>,
    /// Senders at top speed; flows are sharded so order within a connection holds.
    pub threads: usize,
    /// Frames handed to the kernel per call (sendmmsg, a TX ring send, an AF_XDP kick).
    pub batch: usize,
    /// `--xdp`: send through AF_XDP sockets, thread i on transmit queue `Q + i` of the
    /// interface; None sends through AF_PACKET.
    pub xdp_queue: Option<u32>,
    pub flow_expiry: Option<Duration>,
    /// Keep the timing error per interval of this length (for `--plot`); None keeps only the
    /// run's histogram.
    pub timeline: Option<Duration>,
    /// The fleet barrier this run joined (`--barrier`): the first frame leaves at the instant
    /// it gives, once the captures are mapped and the interface is open.
    pub fleet: Option<std::sync::Arc<tcpkit_fleet::Agent>>,
    /// `--shard K/N`: send only the frames of the flows whose key hashes to K
    /// (`tcpkit_wire::flow_shard`), each at its time in the whole replay.
    pub shard: Option<Shard>,
}

impl Config {
    /// The defaults tcpreplay users expect: the capture's own timing, once, one thread.
    pub fn new(inputs: Vec<PathBuf>, output: Output) -> Config {
        Config {
            inputs,
            output,
            rate: Rate::Capture { multiplier: 1.0 },
            max_sleep: None,
            loops: 1,
            loop_delay: Duration::ZERO,
            limit: None,
            duration: None,
            preload: false,
            unique_ip: false,
            unique_ports: false,
            intf2: None,
            rewrite: RewriteConfig::default(),
            l2_src: None,
            l2_dst: None,
            threads: 1,
            batch: 64,
            xdp_queue: None,
            flow_expiry: None,
            timeline: None,
            fleet: None,
            shard: None,
        }
    }
}
