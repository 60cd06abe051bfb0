//! Netlink, written once for the three protocols tcpkit speaks over it (nfnetlink_queue for
//! intercept, rtnetlink for mpcat's paths, sock_diag for balance's drain): the message header,
//! attributes, the kernel's acknowledgements and refusals, and the socket with its
//! request/answer loop.
//!
//! Kernel replies are read as untrusted bytes: they enter only through [`Msg::parse`] and
//! [`Attrs`], which check every length against the bytes there before using it, and fail with
//! the offset of the field that is wrong. Nothing here allocates per message: nfqueue parses
//! a message per packet. [`begin`], [`put_attr`] and [`finish`] build requests in a caller's
//! buffer; parse(emit(m)) gives back m, and [`fuzz_netlink`] (the `netlink` fuzz target) holds
//! the parsers to that over any input.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::{cvt, SysError};

/// `struct nlmsghdr`: length, type, flags, sequence number, port id.
pub const NLMSG_HDR: usize = 16;
/// `struct nlattr`: length, type.
pub const NLA_HDR: usize = 4;
/// Nothing: skipped.
pub const NLMSG_NOOP: u16 = 1;
/// An acknowledgement (errno 0) or a refusal, with the request's header echoed.
pub const NLMSG_ERROR: u16 = 2;
/// The end of a dump.
pub const NLMSG_DONE: u16 = 3;
/// Every request carries it.
pub const NLM_F_REQUEST: u16 = 1;
/// Asks for an acknowledgement once the request is done.
pub const NLM_F_ACK: u16 = 4;
/// Asks for every object (NLM_F_ROOT | NLM_F_MATCH), ended by NLMSG_DONE.
pub const NLM_F_DUMP: u16 = 0x300;
/// The type bits of an attribute (without NLA_F_NESTED / NLA_F_NET_BYTEORDER).
const NLA_TYPE_MASK: u16 = 0x3fff;

/// `n` rounded up to netlink's 4-byte alignment.
#[inline]
pub fn align4(n: usize) -> usize {
    (n + 3) & !3
}

#[inline]
fn ne16(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

#[inline]
fn ne32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Why bytes are not a netlink message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NlError {
    /// The bytes end inside a message: `need` bytes from its start, `have` present.
    #[error("message cut short: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the message needs from its start.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A length field that cannot be: `what` at `offset` from the message's start.
    #[error("{what} at offset {offset}")]
    Malformed {
        /// The field that is wrong.
        what: &'static str,
        /// Its offset from the message's start.
        offset: usize,
    },
}

impl From<NlError> for io::Error {
    fn from(e: NlError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// One netlink message, a view into the bytes it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg<'a> {
    /// `nlmsg_type`: NLMSG_ERROR, NLMSG_DONE, or the protocol's own.
    pub ty: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`: the kernel answers with the request's.
    pub seq: u32,
    /// The whole message, header included (`nlmsg_len` bytes).
    bytes: &'a [u8],
}

/// The kernel's answer to a request (NLMSG_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// Sequence number of the request answered (from the request's header the kernel echoes).
    pub seq: u32,
    /// 0 (an acknowledgement), or the errno the request failed with, positive.
    pub errno: i32,
}

impl<'a> Msg<'a> {
    /// Parses the message at the start of `buf`; returns it and the bytes it takes (aligned,
    /// so the next message starts there; at most `buf.len()`).
    #[inline]
    pub fn parse(buf: &'a [u8]) -> Result<(Msg<'a>, usize), NlError> {
        if buf.len() < NLMSG_HDR {
            return Err(NlError::Truncated {
                need: NLMSG_HDR,
                have: buf.len(),
            });
        }
        let len = ne32(buf, 0) as usize;
        if len < NLMSG_HDR {
            return Err(NlError::Malformed {
                what: "nlmsg_len below its header",
                offset: 0,
            });
        }
        let bytes = buf.get(..len).ok_or(NlError::Truncated {
            need: len,
            have: buf.len(),
        })?;
        let m = Msg {
            ty: ne16(bytes, 4),
            flags: ne16(bytes, 6),
            seq: ne32(bytes, 8),
            bytes,
        };
        Ok((m, align4(len).min(buf.len())))
    }

    /// The bytes after the header.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.bytes[NLMSG_HDR..]
    }

    /// The message as it was read, header included.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The protocol's fixed header (`fixed` bytes after the netlink header: nfgenmsg 4,
    /// rtmsg 12, ...) and the attributes after it. `what` names the fixed header in the
    /// error when the message is too short to hold it.
    #[inline]
    pub fn split(
        &self,
        fixed: usize,
        what: &'static str,
    ) -> Result<(&'a [u8], Attrs<'a>), NlError> {
        let head = self
            .bytes
            .get(NLMSG_HDR..NLMSG_HDR + fixed)
            .ok_or(NlError::Malformed {
                what,
                offset: NLMSG_HDR,
            })?;
        Ok((
            head,
            Attrs {
                msg: self.bytes,
                at: NLMSG_HDR + fixed,
            },
        ))
    }

    /// The acknowledgement or refusal this NLMSG_ERROR message carries; None for any other
    /// type.
    #[inline]
    pub fn ack(&self) -> Result<Option<Ack>, NlError> {
        if self.ty != NLMSG_ERROR {
            return Ok(None);
        }
        let code = self
            .bytes
            .get(NLMSG_HDR..NLMSG_HDR + 4)
            .ok_or(NlError::Malformed {
                what: "error message without its code",
                offset: NLMSG_HDR,
            })?;
        let code = i32::from_ne_bytes([code[0], code[1], code[2], code[3]]);
        // The request's header follows the code; its sequence number says what this answers.
        let seq = self
            .bytes
            .get(NLMSG_HDR + 4..NLMSG_HDR + 4 + NLMSG_HDR)
            .map_or(self.seq, |h| ne32(h, 8));
        Ok(Some(Ack {
            seq,
            errno: code.saturating_neg(),
        }))
    }
}

/// One attribute of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr<'a> {
    /// Its type, without the flag bits (NLA_F_NESTED, NLA_F_NET_BYTEORDER).
    pub ty: u16,
    /// Its value (the length field's bytes, padding excluded).
    pub value: &'a [u8],
    /// Its offset from the message's start, for errors about its value.
    pub offset: usize,
}

/// The attributes of a message, in order. Each length is checked against the message before its value is handed out; the first
/// wrong one ends the iteration with its error.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    msg: &'a [u8],
    /// Offset of the next attribute from the message's start.
    at: usize,
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, NlError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let at = self.at;
        if at >= self.msg.len() {
            return None;
        }
        let fail = |what| Some(Err(NlError::Malformed { what, offset: at }));
        // After an error nothing more is read.
        self.at = self.msg.len();
        let Some(h) = self.msg.get(at..at + NLA_HDR) else {
            return fail("attribute header past the message's end");
        };
        let len = usize::from(ne16(h, 0));
        let ty = ne16(h, 2) & NLA_TYPE_MASK;
        if len < NLA_HDR {
            return fail("attribute length below its header");
        }
        let Some(v) = self.msg.get(at + NLA_HDR..at + len) else {
            return fail("attribute past the message's end");
        };
        self.at = at + align4(len);
        Some(Ok(Attr {
            ty,
            value: v,
            offset: at,
        }))
    }
}

/// Appends a message header (its length filled in by [`finish`]); returns where it starts.
pub fn begin(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32) -> usize {
    let start = out.len();
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    start
}

/// The most value bytes one attribute holds (its length is a u16).
pub const MAX_ATTR_VALUE: usize = u16::MAX as usize - NLA_HDR;

/// Appends attribute `ty` with value `v` (at most [`MAX_ATTR_VALUE`] bytes; longer is cut),
/// padded to 4 bytes.
pub fn put_attr(out: &mut Vec<u8>, ty: u16, v: &[u8]) {
    let v = &v[..v.len().min(MAX_ATTR_VALUE)];
    out.extend_from_slice(&((NLA_HDR + v.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(v);
    // Padding counts from the attribute, not the buffer: a message may start anywhere.
    let pad = align4(v.len()) - v.len();
    out.extend_from_slice(&[0; 3][..pad]);
}

/// Writes the length of the message begun at `start` (everything appended since).
pub fn finish(out: &mut [u8], start: usize) {
    let len = u32::try_from(out.len() - start).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// Appends the kernel's answer to a request of type `req_ty` and sequence `seq`: an
/// acknowledgement (errno 0) or a refusal, the request's header echoed as the kernel does.
pub fn emit_ack(out: &mut Vec<u8>, req_ty: u16, seq: u32, errno: i32) {
    let start = begin(out, NLMSG_ERROR, 0, seq);
    out.extend_from_slice(&errno.saturating_neg().to_ne_bytes());
    let req = begin(out, req_ty, NLM_F_REQUEST | NLM_F_ACK, seq);
    out[req..req + 4].copy_from_slice(&(NLMSG_HDR as u32).to_ne_bytes());
    finish(out, start);
}

/// A netlink socket of one protocol (`NETLINK_NETFILTER`, `NETLINK_ROUTE`, `NETLINK_SOCK_DIAG`),
/// bound, talking to the kernel.
#[derive(Debug)]
pub struct Socket {
    fd: OwnedFd,
    portid: u32,
    /// The last request's sequence number (shared so a lookup can take `&self`).
    seq: AtomicU32,
}

impl Socket {
    /// Opens and binds a socket of `protocol` (the kernel picks the port id); nonblocking if
    /// asked. Fails with the call that failed.
    pub fn open(protocol: libc::c_int, nonblocking: bool) -> Result<Socket, SysError> {
        let nb = if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
        // SAFETY: plain socket(2); the descriptor is owned at once below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | nb,
                protocol,
            )
        };
        if raw < 0 {
            return Err(SysError::last(match protocol {
                libc::NETLINK_NETFILTER => "socket(AF_NETLINK, NETLINK_NETFILTER)",
                libc::NETLINK_ROUTE => "socket(AF_NETLINK, NETLINK_ROUTE)",
                libc::NETLINK_SOCK_DIAG => "socket(AF_NETLINK, NETLINK_SOCK_DIAG)",
                _ => "socket(AF_NETLINK)",
            }));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a zeroed sockaddr_nl is valid; port 0 lets the kernel pick.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let mut len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: `sa` is a valid sockaddr_nl of `len` bytes.
        cvt(unsafe { libc::bind(fd.as_raw_fd(), (&raw const sa).cast(), len) }).map_err(
            |source| SysError {
                call: "bind(AF_NETLINK)",
                source,
            },
        )?;
        // SAFETY: `sa` has room for `len` bytes, which the kernel updates.
        cvt(unsafe { libc::getsockname(fd.as_raw_fd(), (&raw mut sa).cast(), &mut len) }).map_err(
            |source| SysError {
                call: "getsockname(AF_NETLINK)",
                source,
            },
        )?;
        Ok(Socket {
            fd,
            portid: sa.nl_pid,
            seq: AtomicU32::new(0),
        })
    }

    /// The port id the kernel gave this socket.
    pub fn portid(&self) -> u32 {
        self.portid
    }

    /// Asks for a receive buffer of `bytes`: forced past net.core.rmem_max with
    /// CAP_NET_ADMIN, else as much as that cap allows.
    pub fn set_rcvbuf(&self, bytes: usize) {
        let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        let set = |name| {
            // SAFETY: an int option of the right size on our socket.
            cvt(unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    name,
                    (&raw const size).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            })
        };
        if set(libc::SO_RCVBUFFORCE).is_err() {
            let _ = set(libc::SO_RCVBUF);
        }
    }

    /// A blocking receive gives up after `d` (WouldBlock), so a kernel that never answers
    /// cannot hang the caller.
    pub fn set_recv_timeout(&self, d: Duration) -> io::Result<()> {
        let tv = libc::timeval {
            tv_sec: d.as_secs().try_into().unwrap_or(libc::time_t::MAX),
            tv_usec: d.subsec_micros().into(),
        };
        // SAFETY: a timeval of the right size on our socket.
        cvt(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// Sends `msg` (one or more messages) to the kernel.
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: a zeroed sockaddr_nl addresses the kernel (port 0).
        let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        loop {
            // SAFETY: `msg` and `to` are valid for the lengths given.
            let rc = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    msg.as_ptr().cast(),
                    msg.len(),
                    0,
                    (&raw const to).cast(),
                    std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if rc >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one datagram into `buf`; returns its length. A datagram longer than `buf`
    /// is cut, which the parse then reports as truncated. Interrupted calls are retried.
    #[inline]
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: `buf` is ours and valid for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Sends the request in `req` (one message begun with [`begin`]) under the next sequence
    /// number, then reads the answers into `buf` and calls `each` with every message that
    /// answers it, until the request is done: the end of a dump (NLM_F_DUMP), the
    /// acknowledgement (NLM_F_ACK), or else the first answer. A refusal is the errno's
    /// `io::Error`; messages of other requests are skipped. A blocking socket with a receive
    /// timeout bounds the wait. One request at a time per socket: two threads asking at once
    /// would each skip the other's answers.
    pub fn request(
        &self,
        req: &mut [u8],
        buf: &mut [u8],
        mut each: impl FnMut(&Msg<'_>) -> io::Result<()>,
    ) -> io::Result<()> {
        if req.len() < NLMSG_HDR {
            return Err(io::Error::from(NlError::Truncated {
                need: NLMSG_HDR,
                have: req.len(),
            }));
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        req[8..12].copy_from_slice(&seq.to_ne_bytes());
        let flags = ne16(req, 6);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let acked = flags & NLM_F_ACK != 0;
        self.send(req)?;
        loop {
            let n = self.recv(buf)?;
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                let (m, used) = Msg::parse(rest)?;
                rest = &rest[used..];
                if m.seq != seq {
                    continue;
                }
                match m.ty {
                    NLMSG_ERROR => {
                        let a = m.ack()?.unwrap_or(Ack { seq, errno: 0 });
                        return match a.errno {
                            0 => Ok(()),
                            e => Err(io::Error::from_raw_os_error(e)),
                        };
                    }
                    NLMSG_DONE => {
                        // A dump that failed part way ends with the (negative) errno.
                        let code = m
                            .payload()
                            .get(..4)
                            .map_or(0, |c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
                        return match code.saturating_neg() {
                            e if e > 0 => Err(io::Error::from_raw_os_error(e)),
                            _ => Ok(()),
                        };
                    }
                    NLMSG_NOOP => {}
                    _ => {
                        each(&m)?;
                        if !dump && !acked {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Body of the `netlink` fuzz target: reads every message of `data` and every attribute of
/// each (after a fixed header of 0 to 12 bytes, chosen by the first byte), then builds the
/// same message again from what was read and checks it reads back the same.
pub fn fuzz_netlink(data: &[u8]) {
    let Some((&pick, mut rest)) = data.split_first() else {
        return;
    };
    let fixed = usize::from(pick % 4) * 4;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (m, used) = match Msg::parse(rest) {
            Ok(x) => x,
            Err(NlError::Truncated { need, have }) => {
                assert!(need > have && have == rest.len());
                return;
            }
            Err(NlError::Malformed { offset, .. }) => {
                assert_eq!(offset, 0);
                rest = &rest[1..];
                continue;
            }
        };
        assert!(used >= NLMSG_HDR && used <= rest.len());
        assert_eq!(m.bytes().len(), ne32(rest, 0) as usize);
        rest = &rest[used..];
        let _ = m.ack();
        let Ok((head, attrs)) = m.split(fixed, "fixed header") else {
            assert!(m.payload().len() < fixed);
            continue;
        };
        out.clear();
        let start = begin(&mut out, m.ty, m.flags, m.seq);
        out.extend_from_slice(head);
        let mut read = Vec::new();
        for a in attrs {
            match a {
                Ok(a) => {
                    assert!(a.value.len() <= MAX_ATTR_VALUE);
                    assert!(a.offset >= NLMSG_HDR + fixed);
                    put_attr(&mut out, a.ty, a.value);
                    read.push((a.ty, a.value));
                }
                Err(NlError::Malformed { offset, .. }) => {
                    assert!(offset >= NLMSG_HDR + fixed && offset < m.bytes().len());
                }
                Err(e) => panic!("attributes are never truncated, only malformed: {e:?}"),
            }
        }
        finish(&mut out, start);
        let (back, n) = Msg::parse(&out).expect("an emitted message parses");
        assert_eq!(n, out.len());
        assert_eq!((back.ty, back.flags, back.seq), (m.ty, m.flags, m.seq));
        let (h2, a2) = back.split(fixed, "fixed header").expect("its fixed header");
        assert_eq!(h2, head);
        let again: Vec<(u16, &[u8])> = a2
            .map(|a| {
                a.map(|a| (a.ty, a.value))
                    .expect("emitted attributes parse")
            })
            .collect();
        assert_eq!(again, read);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message of type 0x1234 with a 4-byte fixed header and three attributes (one needing
    /// padding), after a marker byte so an offset error shows.
    fn sample() -> Vec<u8> {
        let mut out = vec![0xa5];
        let start = begin(&mut out, 0x1234, NLM_F_REQUEST, 77);
        out.extend_from_slice(&[1, 2, 3, 4]);
        put_attr(&mut out, 1, &[9; 5]);
        put_attr(&mut out, 0x8002, b"");
        put_attr(&mut out, 3, &7u32.to_ne_bytes());
        finish(&mut out, start);
        out.remove(0);
        out
    }

    fn attrs_of(m: &Msg<'_>) -> Result<Vec<(u16, Vec<u8>)>, NlError> {
        m.split(4, "fixed header")?
            .1
            .map(|a| a.map(|a| (a.ty, a.value.to_vec())))
            .collect()
    }

    #[test]
    fn a_message_round_trips_and_every_cut_is_truncated() {
        let b = sample();
        assert_eq!(b.len(), 16 + 4 + 12 + 4 + 8);
        let (m, used) = Msg::parse(&b).unwrap();
        assert_eq!(used, b.len());
        assert_eq!((m.ty, m.flags, m.seq), (0x1234, NLM_F_REQUEST, 77));
        assert_eq!(m.split(4, "x").unwrap().0, &[1, 2, 3, 4]);
        assert_eq!(
            attrs_of(&m).unwrap(),
            vec![
                (1, vec![9; 5]),
                // The flag bits (NLA_F_NESTED here) are not the type.
                (2, vec![]),
                (3, 7u32.to_ne_bytes().to_vec())
            ]
        );
        for cut in 0..b.len() {
            match Msg::parse(&b[..cut]) {
                Err(NlError::Truncated { need, have }) => {
                    assert_eq!(have, cut);
                    assert_eq!(need, if cut < 16 { 16 } else { b.len() });
                }
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_message_whose_length_is_cut_short_reads_its_attributes_with_every_length_checked() {
        let full = sample();
        let full_attrs = attrs_of(&Msg::parse(&full).unwrap().0).unwrap();
        // Each cut with the header's length set to it: the attributes that end before the cut
        // are read, then the cut one is named with its offset.
        for cut in 16..full.len() {
            let mut b = full[..cut].to_vec();
            b[..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            let (m, _) = Msg::parse(&b).unwrap();
            let got = attrs_of(&m);
            let bad = |what, offset| Err(NlError::Malformed { what, offset });
            let header = "attribute header past the message's end";
            let value = "attribute past the message's end";
            let want = match cut {
                16..=19 => bad("fixed header", 16),
                20 => Ok(vec![]),
                21..=23 => bad(header, 20),
                24..=28 => bad(value, 20),
                // The first value whole; only its padding is cut.
                29..=32 => Ok(full_attrs[..1].to_vec()),
                33..=35 => bad(header, 32),
                36 => Ok(full_attrs[..2].to_vec()),
                37..=39 => bad(header, 36),
                _ => bad(value, 36),
            };
            assert_eq!(got, want, "cut at {cut}");
        }
    }

    #[test]
    fn bad_lengths_name_the_offset() {
        let mut b = sample();
        // The first attribute's length: below its own header, then past the message.
        for (len, what) in [
            (2u16, "attribute length below its header"),
            (200, "attribute past the message's end"),
        ] {
            b[20..22].copy_from_slice(&len.to_ne_bytes());
            let (m, _) = Msg::parse(&b).unwrap();
            assert_eq!(attrs_of(&m), Err(NlError::Malformed { what, offset: 20 }));
        }
        b[..4].copy_from_slice(&15u32.to_ne_bytes());
        assert_eq!(
            Msg::parse(&b),
            Err(NlError::Malformed {
                what: "nlmsg_len below its header",
                offset: 0
            })
        );
    }

    #[test]
    fn acks_and_refusals_name_the_request_they_answer() {
        let mut out = Vec::new();
        emit_ack(&mut out, 0x0302, 3, 0);
        emit_ack(&mut out, 0x0302, 4, libc::EPERM);
        let (m, n) = Msg::parse(&out).unwrap();
        assert_eq!(m.ack(), Ok(Some(Ack { seq: 3, errno: 0 })));
        let (m, _) = Msg::parse(&out[n..]).unwrap();
        assert_eq!(
            m.ack(),
            Ok(Some(Ack {
                seq: 4,
                errno: libc::EPERM
            }))
        );
        // Cut before the code: malformed; cut inside the echoed header: its own seq.
        let mut e = out[..20].to_vec();
        e[..4].copy_from_slice(&20u32.to_ne_bytes());
        assert_eq!(
            Msg::parse(&e).unwrap().0.ack(),
            Ok(Some(Ack { seq: 3, errno: 0 }))
        );
        e.truncate(18);
        e[..4].copy_from_slice(&18u32.to_ne_bytes());
        assert!(matches!(
            Msg::parse(&e).unwrap().0.ack(),
            Err(NlError::Malformed { offset: 16, .. })
        ));
        let b = sample();
        assert_eq!(Msg::parse(&b).unwrap().0.ack(), Ok(None));
    }

    #[test]
    fn a_request_to_the_kernel_is_answered_and_a_refusal_is_its_errno() {
        // rtnetlink needs no privilege to read: RTM_GETLINK of index 1 answers one message,
        // of a missing index a refusal (ENODEV), and a dump of every link ends with DONE.
        let s = Socket::open(libc::NETLINK_ROUTE, false).unwrap();
        s.set_recv_timeout(Duration::from_secs(5)).unwrap();
        assert_ne!(s.portid(), 0);
        let mut buf = vec![0u8; 32 << 10];
        let link = |index: i32, flags: u16| {
            let mut r = Vec::new();
            let start = begin(&mut r, libc::RTM_GETLINK, NLM_F_REQUEST | flags, 0);
            // struct ifinfomsg: family, pad, type, index, flags, change.
            r.extend_from_slice(&[0; 4]);
            r.extend_from_slice(&index.to_ne_bytes());
            r.extend_from_slice(&[0; 8]);
            finish(&mut r, start);
            r
        };
        let mut types = |mut req: Vec<u8>| {
            let mut got = Vec::new();
            s.request(&mut req, &mut buf, |m| {
                got.push(m.ty);
                Ok(())
            })
            .map(|()| got)
        };
        assert_eq!(types(link(1, 0)).unwrap(), [libc::RTM_NEWLINK]);
        let e = types(link(i32::MAX, NLM_F_ACK)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV));
        let all = types(link(0, NLM_F_DUMP)).unwrap();
        assert!(!all.is_empty() && all.iter().all(|&t| t == libc::RTM_NEWLINK));
        // The caller's error stops the loop and is returned as is.
        let e = s
            .request(&mut link(1, 0), &mut buf, |_| {
                Err(io::Error::other("enough"))
            })
            .unwrap_err();
        assert_eq!(e.to_string(), "enough");
    }

    #[test]
    fn the_fuzz_body_holds_over_the_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("netlink");
        assert!(seeds.len() >= 3, "{} seeds", seeds.len());
        let mut whole = 0;
        for s in &seeds {
            let s = &s.bytes;
            fuzz_netlink(s);
            whole += usize::from(s.len() > 1 && Msg::parse(&s[1..]).is_ok());
        }
        assert!(whole >= 2, "seeds open with a whole message");
    }
}
