//! A checked view of one TCP segment in an Ethernet frame, and its emitter.
//!
//! [`Segment::parse`] is how captured TCP enters tcpkit's session tracking: it finds the IP
//! header (through VLAN tags and MPLS label stacks, as [`crate::flow_key`] does), checks every
//! offset against the frame, and returns the endpoints, sequence numbers, flags, the options
//! the tracker cares about (MSS, window scale, SACK, timestamps) and *where* the payload is,
//! so the caller slices it without copying. Checksums are not verified: frames captured on
//! the sending host carry partial checksums (checksum offload), and they are still real data.
//!
//! A snaplen-cut frame is not an error: [`Segment::payload`] covers the bytes present and
//! [`Segment::payload_len`] what the IP header declares, so a reassembler can see the missing
//! tail as a hole instead of silently losing it. IP fragments are refused ([`SegmentError::
//! Fragment`]): their TCP payload is split over datagrams tcpkit does not reassemble.
//!
//! [`Segment::emit`] builds an Ethernet + IPv4/IPv6 + TCP frame with correct checksums from the
//! parsed form (for tests, fuzzing and synthesized packets); parse(emit(s)) gives back `s`.
//! The `reasm` fuzz target (tcpkit-copy) feeds both emitted and arbitrary frames through
//! [`Segment::parse`].

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

use crate::csum;
use crate::parse::{self, be16, PROTO_TCP};
use crate::rewrite::read_addr;

/// The TCP flag byte (offset 13 of the header: CWR ECE URG ACK PSH RST SYN FIN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Flags(pub u8);

impl Flags {
    /// FIN: the sender has no more data (RFC 9293).
    pub const FIN: Flags = Flags(0x01);
    /// SYN: synchronize sequence numbers, the first segment of each direction.
    pub const SYN: Flags = Flags(0x02);
    /// RST: reset the connection.
    pub const RST: Flags = Flags(0x04);
    /// PSH: push the data to the application.
    pub const PSH: Flags = Flags(0x08);
    /// ACK: the acknowledgment number is significant.
    pub const ACK: Flags = Flags(0x10);
    /// URG: the urgent pointer is significant.
    pub const URG: Flags = Flags(0x20);
    /// ECE: ECN-Echo (RFC 3168).
    pub const ECE: Flags = Flags(0x40);
    /// CWR: congestion window reduced (RFC 3168).
    pub const CWR: Flags = Flags(0x80);

    /// All of `f`'s bits are set.
    pub fn has(self, f: Flags) -> bool {
        self.0 & f.0 == f.0
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }
}

/// The TCP options tcpkit reads. Unknown options are skipped; a malformed option (length
/// below 2 or past the header) ends option parsing, keeping what was read before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// Maximum segment size (kind 2), sent only on SYNs.
    pub mss: Option<u16>,
    /// Window scale shift count (kind 3, RFC 7323), sent only on SYNs.
    pub wscale: Option<u8>,
    /// SACK permitted (kind 4, RFC 2018), sent only on SYNs.
    pub sack_permitted: bool,
    /// SACK blocks (left edge, right edge); only the first `sack_len` are meaningful, the rest
    /// are zero so two equal option sets compare equal.
    pub sack_blocks: [(u32, u32); 4],
    /// How many of `sack_blocks` are present (0 to 4).
    pub sack_len: u8,
    /// (TSval, TSecr).
    pub timestamps: Option<(u32, u32)>,
}

impl Options {
    /// The SACK blocks present.
    pub fn sack(&self) -> &[(u32, u32)] {
        self.sack_blocks
            .get(..usize::from(self.sack_len))
            .unwrap_or(&[])
    }

    /// Bytes [`Segment::emit`] writes for these options (a multiple of 4).
    pub fn emit_len(&self) -> usize {
        let sack = match self.sack_len {
            0 => 0,
            n => 4 + 8 * usize::from(n),
        };
        4 * usize::from(self.mss.is_some())
            + 4 * usize::from(self.wscale.is_some())
            + 4 * usize::from(self.sack_permitted)
            + 12 * usize::from(self.timestamps.is_some())
            + sack
    }

    fn parse(b: &[u8]) -> Options {
        let mut o = Options::default();
        let mut i = 0;
        while let Some(&kind) = b.get(i) {
            match kind {
                0 => break,
                1 => {
                    i += 1;
                    continue;
                }
                _ => {}
            }
            let Some(len) = b.get(i + 1).map(|&l| usize::from(l)) else {
                break;
            };
            let Some(body) = b.get(i + 2..i + len).filter(|_| len >= 2) else {
                break;
            };
            let be32 = |at: usize| -> Option<u32> {
                Some(u32::from_be_bytes(body.get(at..at + 4)?.try_into().ok()?))
            };
            match (kind, len) {
                (2, 4) => o.mss = be16(body, 0),
                (3, 3) => o.wscale = body.first().copied(),
                (4, 2) => o.sack_permitted = true,
                (5, 10 | 18 | 26 | 34) => {
                    let n = (len - 2) / 8;
                    for (k, slot) in o.sack_blocks.iter_mut().enumerate().take(n) {
                        if let (Some(l), Some(r)) = (be32(8 * k), be32(8 * k + 4)) {
                            *slot = (l, r);
                        }
                    }
                    o.sack_len = n as u8;
                }
                (8, 10) => o.timestamps = be32(0).zip(be32(4)),
                _ => {}
            }
            i += len;
        }
        o
    }

    fn emit(&self, out: &mut Vec<u8>) {
        if let Some(m) = self.mss {
            out.extend_from_slice(&[2, 4]);
            out.extend_from_slice(&m.to_be_bytes());
        }
        if let Some(w) = self.wscale {
            out.extend_from_slice(&[1, 3, 3, w]);
        }
        if self.sack_permitted {
            out.extend_from_slice(&[1, 1, 4, 2]);
        }
        if let Some((v, e)) = self.timestamps {
            out.extend_from_slice(&[1, 1, 8, 10]);
            out.extend_from_slice(&v.to_be_bytes());
            out.extend_from_slice(&e.to_be_bytes());
        }
        if !self.sack().is_empty() {
            out.extend_from_slice(&[1, 1, 5, 2 + 8 * self.sack_len]);
            for (l, r) in self.sack() {
                out.extend_from_slice(&l.to_be_bytes());
                out.extend_from_slice(&r.to_be_bytes());
            }
        }
    }
}

/// One TCP segment found in an Ethernet frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
    /// Sequence number of the first payload byte (of the SYN itself on a SYN).
    pub seq: u32,
    /// Acknowledgment number: the next byte expected from the peer (meaningful with ACK).
    pub ack: u32,
    /// The flag byte.
    pub flags: Flags,
    /// Receive window as on the wire, not scaled by the window scale option.
    pub window: u16,
    /// The options read from the header.
    pub options: Options,
    /// Where the payload bytes present in the frame are (Ethernet padding excluded).
    pub payload: Range<usize>,
    /// Payload length the IP header declares: more than `payload.len()` when the capture cut
    /// the frame short (snaplen), never less.
    pub payload_len: usize,
}

/// Why a frame is not a usable TCP segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// Not IPv4/IPv6, or IP of another protocol, or the IP header itself is cut or malformed.
    #[error("not a TCP/IP frame")]
    NotTcp,
    /// TCP inside IP fragments; the payload is split over datagrams we do not reassemble.
    #[error("TCP in an IP fragment (IP header at offset {offset})")]
    Fragment {
        /// Byte of the frame where the IP header starts.
        offset: usize,
    },
    /// The TCP header (or its options) is cut short.
    #[error("TCP header truncated at offset {offset}: need {need} bytes, have {have}")]
    Truncated {
        /// Byte of the frame where the TCP header starts.
        offset: usize,
        /// Bytes the header needs (20, or its data offset with options).
        need: usize,
        /// Bytes left from `offset`.
        have: usize,
    },
    /// The data offset field is below 5 words.
    #[error("TCP data offset {words} words at offset {offset} is below the minimum of 5")]
    BadDataOffset {
        /// Byte of the frame where the TCP header starts.
        offset: usize,
        /// The data offset field: header length in 32-bit words.
        words: u8,
    },
}

/// Why [`Segment::emit`] cannot build a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// One end is IPv4 and the other IPv6.
    #[error("source {src} and destination {dst} are not of one address family")]
    MixedFamilies {
        /// The segment's source.
        src: SocketAddr,
        /// The segment's destination.
        dst: SocketAddr,
    },
    /// The options do not fit in the 40 bytes a TCP header has for them.
    #[error("TCP options need {len} bytes, the header has room for 40")]
    OptionsTooLong {
        /// Bytes the options need, padding included.
        len: usize,
    },
    /// The payload does not fit in one IP datagram (total length is 16 bits).
    #[error("payload of {len} bytes does not fit in one IP datagram (at most {max})")]
    PayloadTooLong {
        /// Payload bytes given.
        len: usize,
        /// The most this family's datagram can carry after the IP and TCP headers.
        max: usize,
    },
}

/// Source MAC of emitted frames (locally administered; nothing reads it back).
pub const EMIT_SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// Destination MAC of emitted frames.
pub const EMIT_DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

impl Segment {
    /// Parses the TCP segment of an Ethernet frame, checking every offset.
    pub fn parse(frame: &[u8]) -> Result<Segment, SegmentError> {
        let ip = parse::ip(frame).ok_or(SegmentError::NotTcp)?;
        if ip.proto != PROTO_TCP {
            return Err(SegmentError::NotTcp);
        }
        if ip.fragmented || !ip.has_l4 {
            return Err(SegmentError::Fragment { offset: ip.off });
        }
        let (s, d) = if ip.v6 { (8, 24) } else { (12, 16) };
        let src = read_addr(frame, ip.off + s, ip.v6).ok_or(SegmentError::NotTcp)?;
        let dst = read_addr(frame, ip.off + d, ip.v6).ok_or(SegmentError::NotTcp)?;
        let t = ip.l4;
        let have = ip.end.saturating_sub(t);
        let hdr =
            frame
                .get(t..ip.end)
                .filter(|h| h.len() >= 20)
                .ok_or(SegmentError::Truncated {
                    offset: t,
                    need: 20,
                    have,
                })?;
        let be32 = |at: usize| u32::from_be_bytes([hdr[at], hdr[at + 1], hdr[at + 2], hdr[at + 3]]);
        let words = hdr[12] >> 4;
        if words < 5 {
            return Err(SegmentError::BadDataOffset { offset: t, words });
        }
        let doff = usize::from(words) * 4;
        let opts = hdr.get(20..doff).ok_or(SegmentError::Truncated {
            offset: t,
            need: doff,
            have,
        })?;
        let start = t + doff;
        // The declared end of the datagram; when the capture cut it, more than `ip.end`.
        let declared = if ip.v6 {
            be16(frame, ip.off + 4)
                .filter(|&p| p != 0)
                .map(|p| ip.off + 40 + usize::from(p))
        } else {
            be16(frame, ip.off + 2).map(|l| ip.off + usize::from(l))
        };
        let declared_end = declared.unwrap_or(ip.end).max(ip.end);
        Ok(Segment {
            src: SocketAddr::new(src, u16::from_be_bytes([hdr[0], hdr[1]])),
            dst: SocketAddr::new(dst, u16::from_be_bytes([hdr[2], hdr[3]])),
            seq: be32(4),
            ack: be32(8),
            flags: Flags(hdr[13]),
            window: u16::from_be_bytes([hdr[14], hdr[15]]),
            options: Options::parse(opts),
            payload: start..ip.end,
            payload_len: declared_end - start,
        })
    }

    /// Length of the frame [`Segment::emit`] builds around `payload_len` payload bytes.
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        parse::ETH_HDR + self.ip_len(payload_len)
    }

    /// Length of the IP packet [`Segment::emit_ip`] builds around `payload_len` payload bytes.
    pub fn ip_len(&self, payload_len: usize) -> usize {
        let ip = if self.src.is_ipv6() { 40 } else { 20 };
        ip + 20 + self.options.emit_len() + payload_len
    }

    /// Appends an Ethernet II + IPv4 (TTL 64, DF) or IPv6 (hop limit 64) + TCP frame carrying
    /// `payload`, with all checksums computed. `self.payload` and `self.payload_len` are not
    /// read: the frame carries exactly `payload`. On error `out` is left as it was.
    pub fn emit(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), EmitError> {
        let start = out.len();
        out.extend_from_slice(&EMIT_DST_MAC);
        out.extend_from_slice(&EMIT_SRC_MAC);
        let ethertype = if self.src.is_ipv6() {
            parse::ETHERTYPE_IPV6
        } else {
            parse::ETHERTYPE_IPV4
        };
        out.extend_from_slice(&ethertype.to_be_bytes());
        self.emit_ip(payload, out)
            .inspect_err(|_| out.truncate(start))
    }

    /// [`Segment::emit`] from the IP header on: the packet a raw IP socket
    /// (`IPPROTO_RAW`, header included) sends as it is. On error `out` is left as it was.
    pub fn emit_ip(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), EmitError> {
        let v6 = match (self.src.ip(), self.dst.ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => false,
            (IpAddr::V6(_), IpAddr::V6(_)) => true,
            _ => {
                return Err(EmitError::MixedFamilies {
                    src: self.src,
                    dst: self.dst,
                })
            }
        };
        let olen = self.options.emit_len();
        if olen > 40 {
            return Err(EmitError::OptionsTooLong { len: olen });
        }
        let tcp_len = 20 + olen + payload.len();
        let max = if v6 { 65535 } else { 65535 - 20 };
        if tcp_len > max {
            return Err(EmitError::PayloadTooLong {
                len: payload.len(),
                max: max - 20 - olen,
            });
        }
        out.reserve(self.ip_len(payload.len()));
        let ip_at = out.len();
        let (src, dst) = (self.src.ip(), self.dst.ip());
        let mut pseudo = 0u32;
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                out.extend_from_slice(&[0x45, 0]);
                out.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
                out.extend_from_slice(&[0, 0, 0x40, 0, 64, PROTO_TCP, 0, 0]);
                out.extend_from_slice(&s.octets());
                out.extend_from_slice(&d.octets());
                let c = csum::finish(csum::sum(0, &out[ip_at..]));
                out[ip_at + 10..ip_at + 12].copy_from_slice(&c.to_be_bytes());
                pseudo = csum::sum(pseudo, &s.octets());
                pseudo = csum::sum(pseudo, &d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                out.extend_from_slice(&[0x60, 0, 0, 0]);
                out.extend_from_slice(&(tcp_len as u16).to_be_bytes());
                out.extend_from_slice(&[PROTO_TCP, 64]);
                out.extend_from_slice(&s.octets());
                out.extend_from_slice(&d.octets());
                pseudo = csum::sum(pseudo, &s.octets());
                pseudo = csum::sum(pseudo, &d.octets());
            }
            _ => unreachable!("families checked above"),
        }
        pseudo = csum::sum(pseudo, &[0, PROTO_TCP]);
        pseudo = csum::sum(pseudo, &(tcp_len as u32).to_be_bytes());
        let t = out.len();
        out.extend_from_slice(&self.src.port().to_be_bytes());
        out.extend_from_slice(&self.dst.port().to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.ack.to_be_bytes());
        out.extend_from_slice(&[(((20 + olen) / 4) as u8) << 4, self.flags.0]);
        out.extend_from_slice(&self.window.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        self.options.emit(out);
        out.extend_from_slice(payload);
        let c = csum::finish(csum::sum(pseudo, &out[t..]));
        out[t + 16..t + 18].copy_from_slice(&c.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(src: &str, dst: &str) -> Segment {
        Segment {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            seq: 0xfffffff0,
            ack: 0x01020304,
            flags: Flags::ACK | Flags::PSH,
            window: 0xa5a5,
            options: Options::default(),
            payload: 0..0,
            payload_len: 0,
        }
    }

    fn full_options() -> Options {
        Options {
            mss: Some(1460),
            wscale: Some(7),
            sack_permitted: true,
            sack_blocks: [(1, 2), (0, 0), (0, 0), (0, 0)],
            sack_len: 1,
            timestamps: Some((0xa5a5a5a5, 0x5a5a5a5a)),
        }
    }

    /// Emits `s` with a marker-byte payload, parses it back and checks every field.
    fn round_trip(mut s: Segment, payload_len: usize) -> Vec<u8> {
        let payload = vec![0xa5; payload_len];
        let mut f = vec![0x5a; 3]; // bytes already in `out` stay: emit appends
        s.emit(&payload, &mut f).unwrap();
        let f = f.split_off(3);
        assert_eq!(f.len(), s.buffer_len(payload_len));
        let p = Segment::parse(&f).unwrap();
        s.payload = f.len() - payload_len..f.len();
        s.payload_len = payload_len;
        assert_eq!(p, s);
        assert_eq!(&f[p.payload.clone()], &payload[..]);
        f
    }

    #[test]
    fn round_trips_v4_and_v6_with_and_without_options() {
        for (a, b) in [
            ("10.0.0.1:1234", "10.0.0.2:80"),
            ("[2001:db8::1]:65535", "[2001:db8::2]:1"),
        ] {
            let mut s = seg(a, b);
            round_trip(s.clone(), 0);
            round_trip(s.clone(), 1449);
            s.options = full_options();
            s.flags = Flags::SYN;
            round_trip(s.clone(), 3);
            s.options.sack_len = 0;
            s.options.sack_blocks = [(0, 0); 4];
            round_trip(s, 0);
        }
    }

    /// emit_ip is emit without the Ethernet header: the same bytes from the IP header on,
    /// appended after what the buffer held, in both families; its errors leave the buffer
    /// as it was.
    #[test]
    fn emit_ip_is_the_frame_from_the_ip_header_on() {
        for (a, b) in [
            ("10.0.0.1:1234", "10.0.0.2:80"),
            ("[2001:db8::1]:5", "[2001:db8::2]:6"),
        ] {
            let mut s = seg(a, b);
            s.options = full_options();
            let mut frame = Vec::new();
            s.emit(b"payload", &mut frame).unwrap();
            let mut ip = vec![0xee];
            s.emit_ip(b"payload", &mut ip).unwrap();
            assert_eq!(ip[1..], frame[parse::ETH_HDR..], "{a}");
            assert_eq!(ip.len() - 1, s.ip_len(7));
            assert_eq!(frame.len(), s.buffer_len(7));
        }
        let s = seg("10.0.0.1:1", "[::1]:2");
        let mut out = vec![1, 2, 3];
        assert!(s.emit_ip(b"x", &mut out).is_err());
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn checksums_are_valid() {
        // The rewriter with fixcsum recomputes every checksum: an emitted frame must come back
        // unchanged.
        for (a, b) in [
            ("10.0.0.1:1234", "10.0.0.2:80"),
            ("[2001:db8::1]:5", "[2001:db8::2]:6"),
        ] {
            let mut s = seg(a, b);
            s.options = full_options();
            let mut f = Vec::new();
            s.emit(b"hello, odd length", &mut f).unwrap();
            let mut c = f.clone();
            crate::Rewriter::new(crate::RewriteConfig {
                fixcsum: true,
                ..Default::default()
            })
            .apply(&mut c)
            .unwrap();
            assert_eq!(c, f, "{a}");
        }
    }

    #[test]
    fn every_truncation_is_an_error_or_a_shorter_payload() {
        let mut s = seg("10.0.0.1:1234", "10.0.0.2:80");
        s.options = full_options();
        let f = round_trip(s.clone(), 100);
        let hdr_end = f.len() - 100;
        for cut in 0..f.len() {
            match Segment::parse(&f[..cut]) {
                Ok(p) => {
                    // Only the payload may be cut; the declared length still shows it all.
                    assert!(cut >= hdr_end, "parsed a header cut at {cut}");
                    assert_eq!(p.payload, hdr_end..cut);
                    assert_eq!(p.payload_len, 100);
                }
                Err(SegmentError::Truncated { offset, .. }) => {
                    assert!(cut < hdr_end);
                    assert_eq!(offset, 34);
                }
                Err(SegmentError::NotTcp) => assert!(cut < 34, "cut {cut}"),
                Err(e) => panic!("cut {cut}: {e}"),
            }
        }
        let mut v6 = seg("[::1]:1", "[::2]:2");
        v6.options = full_options();
        let f = round_trip(v6, 10);
        for cut in 0..f.len() {
            let r = Segment::parse(&f[..cut]);
            assert_eq!(r.is_ok(), cut >= f.len() - 10, "cut {cut}: {r:?}");
        }
    }

    #[test]
    fn ethernet_padding_is_not_payload() {
        let s = seg("10.0.0.1:1234", "10.0.0.2:80");
        let mut f = Vec::new();
        s.emit(b"ab", &mut f).unwrap();
        f.resize(60, 0);
        let p = Segment::parse(&f).unwrap();
        assert_eq!((p.payload.len(), p.payload_len), (2, 2));
    }

    #[test]
    fn refuses_other_protocols_fragments_and_bad_offsets() {
        let s = seg("10.0.0.1:1234", "10.0.0.2:80");
        let mut f = Vec::new();
        s.emit(b"x", &mut f).unwrap();
        let mut udp = f.clone();
        udp[23] = 17;
        assert_eq!(Segment::parse(&udp), Err(SegmentError::NotTcp));
        let mut frag = f.clone();
        frag[20] = 0x20; // more fragments
        assert_eq!(
            Segment::parse(&frag),
            Err(SegmentError::Fragment { offset: 14 })
        );
        let mut bad = f.clone();
        bad[46] = 0x40;
        assert_eq!(
            Segment::parse(&bad),
            Err(SegmentError::BadDataOffset {
                offset: 34,
                words: 4
            })
        );
        assert_eq!(Segment::parse(&[]), Err(SegmentError::NotTcp));
    }

    #[test]
    fn options_parse_skips_unknown_and_stops_at_malformed() {
        let o = Options::parse(&[1, 0xfe, 4, 0xa5, 0xa5, 2, 4, 5, 0xb4, 3, 1]);
        assert_eq!(o.mss, Some(1460));
        assert_eq!(o.wscale, None, "a window scale cut short is not read");
        let o = Options::parse(&[2, 0, 2, 4, 5, 0xb4]);
        assert_eq!(o, Options::default(), "length 0 ends parsing");
        let o = Options::parse(&[3, 3, 9, 0, 2, 4, 5, 0xb4]);
        assert_eq!((o.wscale, o.mss), (Some(9), None), "EOL ends parsing");
    }

    #[test]
    fn emit_errors_leave_the_buffer_alone() {
        let mut s = seg("10.0.0.1:1", "[::1]:2");
        let mut out = vec![0xa5];
        assert!(matches!(
            s.emit(b"", &mut out),
            Err(EmitError::MixedFamilies { .. })
        ));
        s.dst = "10.0.0.2:2".parse().unwrap();
        s.options = full_options();
        s.options.sack_len = 4;
        assert_eq!(
            s.emit(b"", &mut out),
            Err(EmitError::OptionsTooLong { len: 60 })
        );
        s.options = Options::default();
        assert!(matches!(
            s.emit(&vec![0; 65500], &mut out),
            Err(EmitError::PayloadTooLong { .. })
        ));
        assert_eq!(out, [0xa5]);
    }
}
