//! NFQUEUE: the packets a netfilter rule (`queue num N` in nftables, `-j NFQUEUE` in
//! iptables) hands to userspace, read from nfnetlink_queue over a netlink socket, each held
//! by the kernel until it is given a verdict.
//!
//! A capture of another kind than [`crate::Capture`]: an AF_PACKET socket sees what crosses an
//! interface, a queue sees what a rule chose, wherever the rule sits; the output hook sees a
//! host's own packets before they leave. Queueing is also a way to discard a host's own
//! packets without the sender noticing: a packet dropped by a rule's `drop` is reported to
//! the sending socket (EPERM), and TCP then counts it as never sent and sends it again and
//! again; a queued packet counts as sent, whatever its verdict.
//!
//! [`NfQueue::read`] takes what is ready (whole packets from the IP header on, GSO packets
//! unsegmented), calls back with each, and gives every packet it read one verdict in a single
//! batch message. When no socket is bound to the queue, the kernel drops what the rule queues
//! (unless the rule says `bypass`): a reader that dies fails closed. Packets the kernel could
//! not queue (queue full, socket buffer full) are counted in [`NfQueue::stats`].
//!
//! Bytes from the kernel enter only through [`parse_message`], which reads them with
//! tcpkit-kernel's netlink parser (every length checked there); [`QueuedPacket::emit`] builds
//! the same message, parse(emit(p)) gives back p, and [`fuzz_nfqueue`] (the `nfqueue` fuzz
//! target) holds the two to that over any input. The socket, the framing and the
//! acknowledgements are tcpkit-kernel's; what is here is nfnetlink_queue's own.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

pub use tcpkit_kernel::netlink::NlError;
use tcpkit_kernel::netlink::{
    self, align4, begin, finish, put_attr, Msg, Socket, MAX_ATTR_VALUE, NLA_HDR, NLMSG_HDR,
    NLM_F_ACK, NLM_F_REQUEST,
};

/// How long opening a queue bound to another socket waits for it to be let go before it is
/// reported taken (see `NfQueue::bind`).
pub const TAKEN_GRACE: Duration = Duration::from_secs(1);
/// How often the wait tries the bind again.
const TAKEN_POLL: Duration = Duration::from_millis(10);

/// nfnetlink subsystem of nfnetlink_queue (NFNL_SUBSYS_QUEUE).
const SUBSYS_QUEUE: u16 = 3;
const MSG_PACKET: u16 = SUBSYS_QUEUE << 8;
const MSG_CONFIG: u16 = (SUBSYS_QUEUE << 8) | 2;
const MSG_VERDICT_BATCH: u16 = (SUBSYS_QUEUE << 8) | 3;
/// struct nfgenmsg: family, version, resource id (the queue, big endian).
const NFGEN_HDR: usize = 4;

// enum nfqnl_attr_type
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CAP_LEN: u16 = 13;
// enum nfqnl_attr_config
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const CMD_BIND: u8 = 1;
const COPY_PACKET: u8 = 2;
/// Queue GSO packets whole instead of segmenting them first.
const CFG_F_GSO: u32 = 1 << 2;
/// Set when a full queue should let packets through: never, here.
const CFG_F_FAIL_OPEN: u32 = 1 << 0;

/// The most bytes of a packet asked for; the kernel caps it at what one attribute holds.
pub const COPY_RANGE_MAX: u32 = 0xffff;
/// The socket's receive buffer asked for: room for a burst of about 16k small packets while
/// the reader is busy elsewhere (SO_RCVBUFFORCE as root, else capped by net.core.rmem_max).
const RCVBUF: usize = 32 << 20;
/// One datagram: a whole packet of COPY_RANGE_MAX bytes and its headers fit.
const RECV_BUF: usize = 128 << 10;

/// What happens to a queued packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Discarded (NF_DROP).
    Drop,
    /// Let through, on to the rest of the hook (NF_ACCEPT).
    Accept,
}

impl Verdict {
    fn code(self) -> u32 {
        match self {
            Verdict::Drop => 0,
            Verdict::Accept => 1,
        }
    }
}

/// How to open an [`NfQueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NfQueueOpts {
    /// Packets the kernel holds for the reader at most; past it, new ones are dropped (and
    /// counted), never let through.
    pub max_len: u32,
}

impl Default for NfQueueOpts {
    /// 16384 packets: at 20k packets/s, most of a second of a stalled reader.
    fn default() -> Self {
        NfQueueOpts { max_len: 16384 }
    }
}

/// Why a queue cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NfQueueError {
    /// A syscall on the netlink socket failed.
    #[error("netfilter queue {queue}: {call}{}", hint(source))]
    Sys {
        /// The queue number (`--queue-num` of the rule).
        queue: u16,
        /// The syscall: `socket(AF_NETLINK)`, `recv(AF_NETLINK)`.
        call: &'static str,
        /// The error the kernel or the syscall returned.
        #[source]
        source: io::Error,
    },
    /// The kernel refused a configuration command.
    #[error(
        "netfilter queue {queue}: {what} refused by the kernel{}",
        hint(source)
    )]
    Config {
        /// The queue number.
        queue: u16,
        /// The command: `bind`, `copy mode`, ...
        what: &'static str,
        /// The error the kernel or the syscall returned.
        #[source]
        source: io::Error,
    },
    /// Another socket (another process) is bound to the queue.
    #[error("netfilter queue {queue} is taken by another reader (netlink port {portid}); stop it or choose another queue")]
    Taken {
        /// The queue number.
        queue: u16,
        /// The netlink port id of the socket that holds it.
        portid: u32,
    },
    /// The kernel sent bytes that are not a netlink message. Never expected.
    #[error("netfilter queue {queue}: {error}")]
    Malformed {
        /// The queue number.
        queue: u16,
        /// What was wrong with the bytes.
        error: NlError,
    },
}

impl NfQueueError {
    /// The errno behind this error, if the kernel or a syscall gave one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            NfQueueError::Sys { source, .. } | NfQueueError::Config { source, .. } => {
                source.raw_os_error()
            }
            _ => None,
        }
    }
}

fn hint(e: &io::Error) -> &'static str {
    if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
        " (needs root or CAP_NET_ADMIN)"
    } else {
        ""
    }
}

/// One packet the rule queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedPacket<'a> {
    /// The queue it waits in.
    pub queue: u16,
    /// Its id in the queue: verdicts name it.
    pub id: u32,
    /// The packet's protocol as an ethertype (0x0800, 0x86dd), 0 when the kernel had none.
    pub hw_protocol: u16,
    /// The netfilter hook that queued it (NF_INET_LOCAL_OUT is 3).
    pub hook: u8,
    /// The packet's whole length when the payload was cut to the copy range.
    pub cap_len: Option<u32>,
    /// The network-layer bytes (from the IP header on).
    pub payload: &'a [u8],
}

/// A netlink message from nfnetlink_queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// A packet waiting for its verdict (NFQNL_MSG_PACKET).
    Packet(QueuedPacket<'a>),
    /// The answer to a request: `errno` 0 is an acknowledgement.
    Ack {
        /// Sequence number of the request answered.
        seq: u32,
        /// 0, or the errno the request failed with (positive).
        errno: i32,
    },
    /// Anything else (NLMSG_DONE, NLMSG_NOOP, another message type): skipped.
    Other {
        /// The netlink message type (`nlmsg_type`).
        ty: u16,
    },
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Parses the netlink message at the start of `buf`; returns it and the bytes it takes
/// (aligned, so the next message starts there).
#[inline]
pub fn parse_message(buf: &[u8]) -> Result<(Message<'_>, usize), NlError> {
    let (msg, used) = Msg::parse(buf)?;
    // Packets first: they are the hot path, acknowledgements come only while configuring.
    if msg.ty != MSG_PACKET {
        return Ok((
            match msg.ack()? {
                Some(a) => Message::Ack {
                    seq: a.seq,
                    errno: a.errno,
                },
                None => Message::Other { ty: msg.ty },
            },
            used,
        ));
    }
    let (gen, attrs) = msg.split(NFGEN_HDR, "packet message without its nfgenmsg")?;
    let mut p = QueuedPacket {
        queue: u16::from_be_bytes([gen[2], gen[3]]),
        id: 0,
        hw_protocol: 0,
        hook: 0,
        cap_len: None,
        payload: &[],
    };
    let mut have_hdr = false;
    for a in attrs {
        let a = a?;
        let v = a.value;
        match a.ty {
            NFQA_PACKET_HDR if v.len() >= 7 => {
                p.id = be32(v);
                p.hw_protocol = u16::from_be_bytes([v[4], v[5]]);
                p.hook = v[6];
                have_hdr = true;
            }
            NFQA_CAP_LEN if v.len() >= 4 => p.cap_len = Some(be32(v)),
            NFQA_PAYLOAD => p.payload = v,
            NFQA_PACKET_HDR | NFQA_CAP_LEN => {
                return Err(NlError::Malformed {
                    what: "attribute too short for its type",
                    offset: a.offset,
                })
            }
            _ => {}
        }
    }
    // Without its id a packet cannot be given a verdict.
    if !have_hdr {
        return Err(NlError::Malformed {
            what: "packet message without its packet header",
            offset: NLMSG_HDR + NFGEN_HDR,
        });
    }
    Ok((Message::Packet(p), used))
}

fn put_gen(out: &mut Vec<u8>, queue: u16) {
    out.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
    out.extend_from_slice(&queue.to_be_bytes());
}

impl QueuedPacket<'_> {
    /// Appends this packet as the kernel sends it (packet header, cut length, payload).
    /// Payloads longer than an attribute holds (65531 bytes) are cut.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let start = begin(out, MSG_PACKET, 0, 0);
        put_gen(out, self.queue);
        let mut hdr = [0u8; 7];
        hdr[..4].copy_from_slice(&self.id.to_be_bytes());
        hdr[4..6].copy_from_slice(&self.hw_protocol.to_be_bytes());
        hdr[6] = self.hook;
        put_attr(out, NFQA_PACKET_HDR, &hdr);
        if let Some(c) = self.cap_len {
            put_attr(out, NFQA_CAP_LEN, &c.to_be_bytes());
        }
        let cut = self.payload.len().min(MAX_ATTR_VALUE);
        put_attr(out, NFQA_PAYLOAD, &self.payload[..cut]);
        finish(out, start);
    }

    /// Bytes [`QueuedPacket::emit`] appends.
    pub fn buffer_len(&self) -> usize {
        let cut = self.payload.len().min(MAX_ATTR_VALUE);
        NLMSG_HDR
            + NFGEN_HDR
            + 12
            + if self.cap_len.is_some() { 8 } else { 0 }
            + align4(NLA_HDR + cut)
    }
}

/// Appends the kernel's answer to configuration request `seq`: an acknowledgement (errno 0)
/// or a refusal.
pub fn emit_ack(seq: u32, errno: i32, out: &mut Vec<u8>) {
    netlink::emit_ack(out, MSG_CONFIG, seq, errno);
}

/// A configuration request for `queue` with its attributes.
fn config(queue: u16, seq: u32, attrs: &[(u16, &[u8])], out: &mut Vec<u8>) {
    out.clear();
    let start = begin(out, MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, seq);
    put_gen(out, queue);
    for (ty, v) in attrs {
        put_attr(out, *ty, v);
    }
    finish(out, start);
}

/// A batch verdict: `v` for every packet of `queue` with an id up to `id`.
fn verdict_batch(queue: u16, id: u32, v: Verdict, out: &mut Vec<u8>) {
    out.clear();
    let start = begin(out, MSG_VERDICT_BATCH, NLM_F_REQUEST, 0);
    put_gen(out, queue);
    let mut hdr = [0u8; 8];
    hdr[..4].copy_from_slice(&v.code().to_be_bytes());
    hdr[4..].copy_from_slice(&id.to_be_bytes());
    put_attr(out, NFQA_VERDICT_HDR, &hdr);
    finish(out, start);
}

/// Body of the `nfqueue` fuzz target: parses every message of `data` in turn; each packet
/// that parses is emitted again and must parse back to itself.
pub fn fuzz_nfqueue(data: &[u8]) {
    let mut rest = data;
    let mut buf = Vec::new();
    while !rest.is_empty() {
        match parse_message(rest) {
            Ok((m, used)) => {
                assert!(used >= NLMSG_HDR && used <= rest.len());
                if let Message::Packet(p) = m {
                    buf.clear();
                    p.emit(&mut buf);
                    assert_eq!(buf.len(), p.buffer_len());
                    let (back, n) = parse_message(&buf).expect("an emitted message parses");
                    assert_eq!(n, buf.len());
                    assert_eq!(back, Message::Packet(p));
                }
                rest = &rest[used..];
            }
            Err(NlError::Truncated { need, have }) => {
                assert!(need > have && have == rest.len());
                break;
            }
            Err(_) => rest = &rest[1..],
        }
    }
}

/// The kernel's counters for one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Packets waiting for a verdict.
    pub waiting: u64,
    /// Packets dropped because the queue was full.
    pub queue_full: u64,
    /// Packets dropped because the socket's buffer was full.
    pub socket_full: u64,
}

/// The portid and counters of `queue` in the calling thread's network namespace, from
/// /proc/thread-self/net/netfilter/nfnetlink_queue (`queue portid waiting copy_mode
/// copy_range queue_dropped user_dropped id_sequence 1`; /proc/net would show the main
/// thread's namespace).
pub fn queue_state(queue: u16) -> Option<(u32, QueueStats)> {
    let t = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_queue").ok()?;
    t.lines().find_map(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if f.len() < 7 || f[0] != u64::from(queue) {
            return None;
        }
        Some((
            u32::try_from(f[1]).ok()?,
            QueueStats {
                waiting: f[2],
                queue_full: f[5],
                socket_full: f[6],
            },
        ))
    })
}

/// A netlink socket bound to one netfilter queue.
#[derive(Debug)]
pub struct NfQueue {
    sock: Socket,
    queue: u16,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl NfQueue {
    /// Binds to queue `queue` in the calling thread's network namespace: whole packets (up to
    /// the copy range), GSO packets unsegmented, at most `opts.max_len` waiting, never let
    /// through when the queue is full; the socket nonblocking. Fails with
    /// [`NfQueueError::Taken`] when another socket stays bound to the queue for
    /// [`TAKEN_GRACE`] (one that is going away is waited for).
    pub fn open(queue: u16, opts: &NfQueueOpts) -> Result<NfQueue, NfQueueError> {
        let sock = Socket::open(libc::NETLINK_NETFILTER, true).map_err(|e| NfQueueError::Sys {
            queue,
            call: e.call,
            source: e.source,
        })?;
        sock.set_rcvbuf(RCVBUF);
        let mut q = NfQueue {
            sock,
            queue,
            buf: vec![0; RECV_BUF],
            out: Vec::with_capacity(64),
        };
        q.bind()?;
        let mut params = [0u8; 5];
        params[..4].copy_from_slice(&COPY_RANGE_MAX.to_be_bytes());
        params[4] = COPY_PACKET;
        q.configure(2, "copy mode", &[(NFQA_CFG_PARAMS, &params)])?;
        q.configure(
            3,
            "queue length",
            &[(NFQA_CFG_QUEUE_MAXLEN, &opts.max_len.to_be_bytes())],
        )?;
        // GSO on, fail-open off (the mask names both, so both are set as given).
        q.configure(
            4,
            "flags",
            &[
                (NFQA_CFG_MASK, &(CFG_F_GSO | CFG_F_FAIL_OPEN).to_be_bytes()),
                (NFQA_CFG_FLAGS, &CFG_F_GSO.to_be_bytes()),
            ],
        )?;
        Ok(q)
    }

    /// Binds the socket to its queue. A queue held by another socket is waited for, at most
    /// [`TAKEN_GRACE`]: the kernel unbinds a queue only when its reader's socket is released,
    /// which is not when the reader closed it (a child forked meanwhile holds the descriptor
    /// until it execs or exits; the release notifier runs after the port left the netlink
    /// table; a crashed reader's files close as it exits), so a reader restarted right away
    /// would otherwise be told the queue is taken. A reader that stays is reported after the
    /// grace, as [`NfQueueError::Taken`].
    fn bind(&mut self) -> Result<(), NfQueueError> {
        let deadline = Instant::now() + TAKEN_GRACE;
        let mut looked_free = false;
        loop {
            let Err(e) = self.configure(1, "bind", &[(NFQA_CFG_CMD, &[CMD_BIND, 0, 0, 0])]) else {
                return Ok(());
            };
            // nfnetlink_queue answers EPERM both to the unprivileged and to a second reader.
            match queue_state(self.queue).filter(|s| s.0 != self.sock.portid()) {
                Some((portid, _)) if Instant::now() >= deadline => {
                    return Err(NfQueueError::Taken {
                        queue: self.queue,
                        portid,
                    })
                }
                Some(_) => std::thread::sleep(TAKEN_POLL),
                // The other reader let go between the refusal and the look: once more now.
                None if !looked_free => looked_free = true,
                None => return Err(e),
            }
        }
    }

    fn send(&self, call: &'static str) -> Result<(), NfQueueError> {
        self.sock
            .send(&self.out)
            .map_err(|source| NfQueueError::Sys {
                queue: self.queue,
                call,
                source,
            })
    }

    /// Sends one configuration request and waits for its acknowledgement. Packets that
    /// arrive meanwhile (a rule already in place) are dropped: nobody read them.
    fn configure(
        &mut self,
        seq: u32,
        what: &'static str,
        attrs: &[(u16, &[u8])],
    ) -> Result<(), NfQueueError> {
        let queue = self.queue;
        config(queue, seq, attrs, &mut self.out);
        self.send("sendto(AF_NETLINK)")?;
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut last_id = None;
        loop {
            let n = self
                .recv_wait(deadline)
                .map_err(|source| NfQueueError::Sys {
                    queue,
                    call: "recv(AF_NETLINK)",
                    source,
                })?;
            let mut at = 0;
            let mut answer = None;
            while at < n {
                let (m, used) = parse_message(&self.buf[at..n])
                    .map_err(|error| NfQueueError::Malformed { queue, error })?;
                at += used.max(1);
                match m {
                    Message::Ack { seq: s, errno } if s == seq => answer = Some(errno),
                    Message::Packet(p) => last_id = Some(p.id),
                    _ => {}
                }
            }
            if let Some(id) = last_id.take() {
                verdict_batch(queue, id, Verdict::Drop, &mut self.out);
                self.send("sendto(AF_NETLINK) a verdict")?;
            }
            match answer {
                Some(0) => return Ok(()),
                Some(errno) => {
                    return Err(NfQueueError::Config {
                        queue,
                        what,
                        source: io::Error::from_raw_os_error(errno),
                    })
                }
                None => {}
            }
        }
    }

    /// One datagram, waiting until `deadline`.
    fn recv_wait(&mut self, deadline: Instant) -> io::Result<usize> {
        loop {
            match self.recv_once() {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no answer from the kernel in 2 s",
                        ));
                    }
                    let mut pfd = libc::pollfd {
                        fd: self.sock.as_fd().as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    let ms = left.as_millis().min(2000) as libc::c_int;
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut pfd, 1, ms) };
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn recv_once(&mut self) -> io::Result<usize> {
        loop {
            match self.sock.recv(&mut self.buf) {
                // ENOBUFS: the kernel could not queue some packets to us; they were dropped
                // and counted (QueueStats::socket_full). Read on.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                r => return r,
            }
        }
    }

    /// The queue this socket is bound to.
    pub fn queue(&self) -> u16 {
        self.queue
    }

    /// The kernel's counters for this queue.
    pub fn stats(&self) -> QueueStats {
        queue_state(self.queue).map(|s| s.1).unwrap_or_default()
    }

    /// Reads the datagrams ready now, at most `max`, calling `f` with each queued packet,
    /// then gives all of them `verdict` in one batch message; returns the number of packets
    /// read (0: nothing was ready).
    pub fn read(
        &mut self,
        max: usize,
        verdict: Verdict,
        mut f: impl FnMut(&QueuedPacket<'_>),
    ) -> Result<usize, NfQueueError> {
        let queue = self.queue;
        let mut packets = 0;
        let mut last_id = None;
        let mut result = Ok(());
        for _ in 0..max {
            let n = match self.recv_once() {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(source) => {
                    result = Err(NfQueueError::Sys {
                        queue,
                        call: "recv(AF_NETLINK)",
                        source,
                    });
                    break;
                }
            };
            let mut at = 0;
            while at < n {
                match parse_message(&self.buf[at..n]) {
                    Ok((m, used)) => {
                        at += used.max(1);
                        if let Message::Packet(p) = m {
                            packets += 1;
                            last_id = Some(p.id);
                            f(&p);
                        }
                    }
                    Err(error) => {
                        result = Err(NfQueueError::Malformed { queue, error });
                        break;
                    }
                }
            }
            if result.is_err() {
                break;
            }
        }
        // Every packet read gets its verdict, even when reading then failed: ids grow, so
        // one batch message covers all of them.
        if let Some(id) = last_id {
            verdict_batch(queue, id, verdict, &mut self.out);
            self.send("sendto(AF_NETLINK) a verdict")?;
        }
        result.map(|()| packets)
    }
}

impl AsFd for NfQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(payload: &[u8], cap_len: Option<u32>) -> QueuedPacket<'_> {
        QueuedPacket {
            queue: 36524,
            id: 0x0102_0304,
            hw_protocol: 0x0800,
            hook: 3,
            cap_len,
            payload,
        }
    }

    #[test]
    fn a_packet_round_trips_and_every_cut_is_truncated() {
        let body: Vec<u8> = (0..61u8).collect();
        for cap in [None, Some(70_000)] {
            let p = packet(&body, cap);
            // A marker byte before, so an offset error shows.
            let mut out = vec![0xa5; 3];
            p.emit(&mut out);
            let m = &out[3..];
            assert_eq!(m.len(), p.buffer_len());
            assert_eq!(m.len() % 4, 0, "padded to 4");
            assert_eq!(parse_message(m), Ok((Message::Packet(p), m.len())));
            for cut in 0..m.len() {
                match parse_message(&m[..cut]) {
                    Err(NlError::Truncated { need, have }) => {
                        assert_eq!(have, cut);
                        assert!(need > cut);
                    }
                    other => panic!("cut at {cut}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn two_messages_in_one_datagram_and_foreign_attributes_are_skipped() {
        let mut out = Vec::new();
        packet(b"one", None).emit(&mut out);
        let first = out.len();
        // A packet with a timestamp attribute (type 4) the parser does not want.
        let start = begin(&mut out, MSG_PACKET, 0, 0);
        put_gen(&mut out, 5);
        put_attr(&mut out, NFQA_PACKET_HDR, &[0, 0, 0, 9, 0x86, 0xdd, 3]);
        put_attr(&mut out, 4, &[0; 16]);
        put_attr(&mut out, NFQA_PAYLOAD, b"two");
        finish(&mut out, start);
        let (m, n) = parse_message(&out).unwrap();
        assert_eq!(n, first);
        assert_eq!(m, Message::Packet(packet(b"one", None)));
        let (m, _) = parse_message(&out[n..]).unwrap();
        let Message::Packet(p) = m else {
            panic!("{m:?}")
        };
        assert_eq!(
            (p.queue, p.id, p.hw_protocol, p.payload),
            (5, 9, 0x86dd, &b"two"[..])
        );
    }

    #[test]
    fn acks_and_refusals() {
        let mut out = Vec::new();
        emit_ack(3, 0, &mut out);
        emit_ack(4, libc::EPERM, &mut out);
        let (m, n) = parse_message(&out).unwrap();
        assert_eq!(m, Message::Ack { seq: 3, errno: 0 });
        let (m, _) = parse_message(&out[n..]).unwrap();
        assert_eq!(
            m,
            Message::Ack {
                seq: 4,
                errno: libc::EPERM
            }
        );
    }

    #[test]
    fn bad_lengths_name_the_offset() {
        let mut out = Vec::new();
        packet(b"abc", None).emit(&mut out);
        // The first attribute claims 2 bytes, less than its own header.
        let at = NLMSG_HDR + NFGEN_HDR;
        out[at..at + 2].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(
            parse_message(&out),
            Err(NlError::Malformed {
                what: "attribute length below its header",
                offset: at
            })
        );
        out[..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(matches!(
            parse_message(&out),
            Err(NlError::Malformed { offset: 0, .. })
        ));
        // A packet without its id cannot be given a verdict.
        let mut out = Vec::new();
        let start = begin(&mut out, MSG_PACKET, 0, 0);
        put_gen(&mut out, 1);
        put_attr(&mut out, NFQA_PAYLOAD, b"x");
        finish(&mut out, start);
        assert!(matches!(
            parse_message(&out),
            Err(NlError::Malformed {
                what: "packet message without its packet header",
                ..
            })
        ));
    }

    fn ne16(b: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes([b[at], b[at + 1]])
    }

    fn ne32(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    #[test]
    fn requests_are_what_the_kernel_expects() {
        let mut out = Vec::new();
        config(7, 1, &[(NFQA_CFG_CMD, &[CMD_BIND, 0, 0, 0])], &mut out);
        assert_eq!(out.len(), 16 + 4 + 8);
        assert_eq!(ne32(&out, 0), 28);
        assert_eq!(ne16(&out, 4), 0x0302);
        assert_eq!(ne16(&out, 6), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(ne32(&out, 8), 1, "sequence number");
        assert_eq!(&out[16..20], &[0, 0, 0, 7]);
        assert_eq!(ne16(&out, 20), 8);
        assert_eq!(ne16(&out, 22), NFQA_CFG_CMD);
        assert_eq!(&out[24..28], &[CMD_BIND, 0, 0, 0]);
        verdict_batch(7, 0x0a0b_0c0d, Verdict::Drop, &mut out);
        assert_eq!(out.len(), 16 + 4 + 12);
        assert_eq!(ne16(&out, 4), 0x0303);
        assert_eq!(ne16(&out, 6), NLM_F_REQUEST);
        assert_eq!(ne16(&out, 22), NFQA_VERDICT_HDR);
        assert_eq!(&out[24..32], &[0, 0, 0, 0, 0x0a, 0x0b, 0x0c, 0x0d]);
        verdict_batch(7, 1, Verdict::Accept, &mut out);
        assert_eq!(&out[24..28], &[0, 0, 0, 1]);
    }

    #[test]
    fn the_fuzz_body_holds_over_the_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("nfqueue");
        assert!(seeds.len() >= 3, "{} seeds", seeds.len());
        let mut packets = 0;
        for s in &seeds {
            fuzz_nfqueue(&s.bytes);
            let first = parse_message(&s.bytes);
            packets += usize::from(matches!(first, Ok((Message::Packet(_), _))));
        }
        assert!(packets >= 1, "a seed opens with a packet");
    }
}
