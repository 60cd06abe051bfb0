//! tcpkit-capture: passive live capture.
//!
//! A [`Capture`] is an AF_PACKET socket bound to one interface (or all of them) with a
//! TPACKET_V3 receive ring shared with the kernel and a tcpdump filter expression compiled to
//! classic BPF by libpcap ([`compile_filter`]) and run by the kernel. Both directions are
//! captured and told apart ([`Direction`]); the VLAN tag the kernel strips from received frames
//! is reported ([`CapturedPacket::vlan_tci`]). Packets are read in place, a block at a time,
//! without a copy or an allocation per packet.
//!
//! Nothing is lost silently: packets the ring had no room for are counted by the kernel and
//! summed by [`Capture::stats`]. Several captures can share the load of one interface with
//! [`CaptureOpts::fanout`], each flow (both directions) going to one of them.
//!
//! [`nfqueue::NfQueue`] is the other way in: the packets a netfilter rule queues to
//! userspace, wherever in the hooks the rule sits, each held until it gets a verdict
//! (intercept's on-target mode reads a host's own outgoing answers there and drops them).

#![warn(missing_docs)]

mod capture;
mod error;
mod filter;
pub mod nfqueue;

pub use capture::Capture;
pub use error::CaptureError;
pub use filter::{compile_filter, LINKTYPE_ETHERNET, LINKTYPE_RAW};
/// A failed syscall on the capture socket ([`CaptureError::Sys`]).
pub use tcpkit_kernel::afpacket::IfError;

/// How to open a [`Capture`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureOpts {
    /// A tcpdump filter expression; None captures everything.
    pub filter: Option<String>,
    /// Bytes kept of each packet (the rest is counted in `orig_len`). The kernel also cuts a
    /// packet to what fits in one ring block.
    pub snaplen: u32,
    /// Bytes per ring block: a multiple of the page size. A block is handed over when full or
    /// `block_timeout_ms` after its first packet.
    pub block_size: u32,
    /// Blocks in the ring. The ring absorbs a burst while the reader is busy; beyond it packets
    /// are dropped (and counted). A block handed over by its timeout is only partly full, so
    /// below `block_size / block_timeout_ms` bytes/s a stalled reader is covered for
    /// `block_count * block_timeout_ms`, not for the ring's size: prefer many blocks.
    pub block_count: u32,
    /// How long a block that is not full waits for more packets before it is handed over; 0
    /// lets the kernel pick from the link speed (about 8 ms).
    pub block_timeout_ms: u32,
    /// Put the interface in promiscuous mode while the capture is open (not with "any").
    pub promisc: bool,
    /// Join fanout group `id` in mode `FanoutMode`: the group's sockets on the interface split
    /// its packets between them instead of each receiving all of them.
    pub fanout: Option<(u16, FanoutMode)>,
    /// Hand over each packet as it arrives (libpcap's immediate mode), for a reader whose
    /// peer waits on every packet: a TPACKET_V2 ring of one frame per packet instead of V3's
    /// blocks, which retire at `block_timeout_ms` at the soonest (1 ms, a jiffy on older
    /// kernels) when packets come slower than they fill a block. Costs a wakeup per packet
    /// at low rates and a whole frame (snaplen) per packet of ring; `block_timeout_ms` is
    /// unused. The ring is the same `block_size * block_count` bytes, cut into frames.
    pub immediate: bool,
}

impl Default for CaptureOpts {
    /// Everything, whole packets, a 64 MiB ring (64 blocks of 1 MiB), 10 ms block timeout:
    /// a reader may stall for 640 ms at any rate, and for 64 MiB of packets at high rates.
    fn default() -> Self {
        CaptureOpts {
            filter: None,
            snaplen: 65535,
            // 64 blocks rather than 16 of 4 MiB: measured, a ring of 16 held only 110k
            // 64-byte frames at 700k frames/s (each block retired a quarter full).
            block_size: 1 << 20,
            block_count: 64,
            // copy replays with the clients' think time: a packet should not sit in a
            // half-empty block for long.
            block_timeout_ms: 10,
            promisc: false,
            fanout: None,
            immediate: false,
        }
    }
}

/// How a fanout group spreads packets over its sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanoutMode {
    /// By a symmetric hash of the flow: both directions of a connection go to the same
    /// socket, which is what TCP reassembly needs.
    Hash,
    /// By the CPU that received the packet: flows stay together only as far as the NIC's
    /// receive hashing keeps them on one CPU.
    Cpu,
}

/// Which way a packet crossed the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Received: addressed to this host, broadcast, multicast, or (in promiscuous mode) to
    /// another host.
    Incoming,
    /// Sent by this host.
    Outgoing,
    /// Looped back or otherwise internal to the kernel.
    Other,
}

impl Direction {
    /// From `sockaddr_ll.sll_pkttype`.
    fn from_pkttype(t: u8) -> Direction {
        match t {
            libc::PACKET_HOST
            | libc::PACKET_BROADCAST
            | libc::PACKET_MULTICAST
            | libc::PACKET_OTHERHOST => Direction::Incoming,
            libc::PACKET_OUTGOING => Direction::Outgoing,
            _ => Direction::Other,
        }
    }
}

/// One packet, viewed in place in the ring.
#[derive(Clone, Copy, Debug)]
pub struct CapturedPacket<'a> {
    /// When the kernel received or sent it, ns since the Unix epoch (CLOCK_REALTIME).
    pub ts_ns: u64,
    /// The captured bytes from the link-layer header on (see [`Capture::linktype`]), at most
    /// `snaplen`; a received VLAN tag is not in them (see `vlan_tci`).
    pub data: &'a [u8],
    /// The packet's length on the wire (without a stripped VLAN tag).
    pub orig_len: u32,
    /// The interface it crossed (useful with "any").
    pub ifindex: u32,
    /// Which way it went.
    pub direction: Direction,
    /// The 802.1Q tag control information (priority, DEI, VLAN id) the kernel or the NIC
    /// stripped from the frame, if it had a tag.
    pub vlan_tci: Option<u16>,
    /// The stripped tag's protocol (0x8100, 0x88a8), when the kernel reports it.
    pub vlan_tpid: Option<u16>,
}

/// Counters of a capture since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Packets the filter accepted, including the dropped ones.
    pub packets: u64,
    /// Packets accepted but dropped because the ring was full.
    pub drops: u64,
    /// Times the ring was found full (the kernel "froze" the queue until a block came back).
    pub freeze_count: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direction_from_every_pkttype() {
        assert_eq!(
            Direction::from_pkttype(libc::PACKET_HOST),
            Direction::Incoming
        );
        assert_eq!(
            Direction::from_pkttype(libc::PACKET_BROADCAST),
            Direction::Incoming
        );
        assert_eq!(
            Direction::from_pkttype(libc::PACKET_MULTICAST),
            Direction::Incoming
        );
        assert_eq!(
            Direction::from_pkttype(libc::PACKET_OTHERHOST),
            Direction::Incoming
        );
        assert_eq!(
            Direction::from_pkttype(libc::PACKET_OUTGOING),
            Direction::Outgoing
        );
        assert_eq!(
            Direction::from_pkttype(libc::PACKET_LOOPBACK),
            Direction::Other
        );
        assert_eq!(Direction::from_pkttype(200), Direction::Other);
    }
}
