//! The control protocol between `tcpkit copy --transparent` and `tcpkit intercept`: the
//! target's answers, caught by intercept, travel back to copy as their TCP/IP headers (and
//! their payload only when copy asked for it).
//!
//! A connection is a stream of frames, each `type: u8, body length: u16 (big endian), body`.
//! copy opens with [`Msg::Hello`] (magic, version, payload wanted, a fresh nonce). An intercept
//! with a key answers with [`Msg::Challenge`] (its own nonce and its proof of the key), copy
//! answers with [`Msg::Proof`] (see [`crate::auth`]); then, or at once when intercept has no
//! key, intercept sends [`Msg::Welcome`], or [`Msg::Refuse`] with the reason and closes (another
//! version, a wrong proof). Then intercept sends a [`Msg::Packet`] per caught answer and a
//! [`Msg::Ping`] every second, so copy notices a dead intercept even when no answers flow.
//!
//! Bytes from the network enter only through [`Msg::parse`], which checks every length: a
//! frame cut short is [`ControlError::Truncated`] (the reader waits for more bytes), a
//! malformed one names the message type and offset. [`Msg::emit`] appends a frame to a
//! caller's buffer; parse(emit(m)) gives back m. The `control` fuzz target runs
//! [`fuzz_control`], which a stable test also runs over fuzz/corpus/control/.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The protocol version this build speaks. Bumped when a message changes meaning.
/// 2: the Hello carries a nonce; Challenge and Proof authenticate copies.
pub const VERSION: u16 = 2;
/// Opens every Hello and Welcome, so a stray connection (an HTTP client, another protocol)
/// is told apart from an old or new tcpkit.
pub const MAGIC: [u8; 4] = *b"TKIC";
/// intercept's port when `--listen` / `--intercept` give none (tcpcopy's intercept's).
pub const DEFAULT_PORT: u16 = 36524;
/// Bytes before a frame's body.
pub const FRAME_HDR: usize = 3;
/// The longest body a frame carries.
pub const MAX_BODY: usize = u16::MAX as usize;

const T_HELLO: u8 = 1;
const T_WELCOME: u8 = 2;
const T_REFUSE: u8 = 3;
const T_PACKET: u8 = 4;
const T_PING: u8 = 5;
const T_CHALLENGE: u8 = 6;
const T_PROOF: u8 = 7;

/// Nonces (each side draws one per connection) and proofs (HMAC-SHA256 of the key over
/// both nonces): tcpkit-keyfile's, which the fleet barrier shares.
pub use tcpkit_keyfile::proof::{Nonce, Tag, NONCE_LEN, TAG_LEN};

/// Bytes of a [`PacketHdr`] before its payload: family, two addresses, ports, seq, ack,
/// flags, window, MSS, window scale, declared payload length.
pub const fn packet_fixed(v6: bool) -> usize {
    1 + if v6 { 32 } else { 8 } + 4 + 8 + 1 + 2 + 2 + 1 + 2
}

/// Bytes of a Refuse's reason that fit in a frame, cut at a character boundary.
fn refuse_cut(reason: &str) -> usize {
    let mut n = reason.len().min(MAX_BODY - 2);
    while !reason.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The headers of one answer the target sent toward a client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketHdr {
    /// The target (the answer's source).
    pub src: SocketAddr,
    /// The client address the answer was sent to.
    pub dst: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    /// The TCP flag byte.
    pub flags: u8,
    pub window: u16,
    /// The MSS option (SYN-ACKs), if present.
    pub mss: Option<u16>,
    /// The window scale option, if present.
    pub wscale: Option<u8>,
    /// Payload bytes the segment had (the frame's body may carry fewer, or none).
    pub payload_len: u16,
}

/// One frame of the control protocol. `Packet` borrows its payload from the parsed buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg<'a> {
    /// copy → intercept: the version copy speaks, how many payload bytes of each answer it
    /// wants (0: headers only), and copy's nonce (absent in version 1's Hello, which is parsed
    /// only to be refused with a reason).
    Hello {
        version: u16,
        max_payload: u16,
        nonce: Option<Nonce>,
    },
    /// intercept → copy, when intercept has a key: intercept's nonce, and its proof that it
    /// holds the key (so copy tells a wrong key from a wrong peer).
    Challenge { nonce: Nonce, proof: Tag },
    /// copy → intercept: copy's proof that it holds the key.
    Proof { tag: Tag },
    /// intercept → copy: accepted; the version intercept speaks.
    Welcome { version: u16 },
    /// intercept → copy: not accepted, and why (UTF-8); intercept closes after it.
    Refuse { version: u16, reason: &'a str },
    /// intercept → copy: one caught answer; `payload` holds at most `max_payload` of its bytes.
    Packet { hdr: PacketHdr, payload: &'a [u8] },
    /// intercept → copy: still here.
    Ping,
}

/// Why bytes are not a control frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// The frame is not all there yet: `need` bytes from the frame's start, `have` present.
    #[error("frame cut short: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("unknown message type {ty}")]
    UnknownType { ty: u8 },
    /// The body does not hold what its type needs.
    #[error("{what} at offset {offset}: {why}")]
    Malformed {
        what: &'static str,
        offset: usize,
        why: &'static str,
    },
    #[error("magic {found:02x?} is not tcpkit's control protocol")]
    BadMagic { found: [u8; 4] },
}

/// A checked reader over one frame's body; offsets in errors count from the frame's start.
struct Body<'a> {
    b: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ControlError> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or(ControlError::Malformed {
                what: self.what,
                offset: FRAME_HDR + self.at,
                why: "body too short",
            })?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, ControlError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ControlError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, ControlError> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ControlError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = self.b.get(self.at..).unwrap_or(&[]);
        self.at = self.b.len();
        s
    }
    fn end(&self) -> Result<(), ControlError> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(ControlError::Malformed {
                what: self.what,
                offset: FRAME_HDR + self.at,
                why: "bytes after the body's end",
            })
        }
    }
    fn magic(&mut self) -> Result<(), ControlError> {
        let m = self.take(4)?;
        if m != MAGIC {
            let mut found = [0; 4];
            found.copy_from_slice(m);
            return Err(ControlError::BadMagic { found });
        }
        Ok(())
    }
}

impl<'a> Msg<'a> {
    /// Parses the frame at the start of `buf`; returns it and the bytes it took.
    pub fn parse(buf: &'a [u8]) -> Result<(Msg<'a>, usize), ControlError> {
        let hdr = buf.get(..FRAME_HDR).ok_or(ControlError::Truncated {
            need: FRAME_HDR,
            have: buf.len(),
        })?;
        let ty = hdr[0];
        let len = usize::from(u16::from_be_bytes([hdr[1], hdr[2]]));
        let total = FRAME_HDR + len;
        let body = buf.get(FRAME_HDR..total).ok_or(ControlError::Truncated {
            need: total,
            have: buf.len(),
        })?;
        let what = match ty {
            T_HELLO => "hello",
            T_WELCOME => "welcome",
            T_REFUSE => "refuse",
            T_PACKET => "packet",
            T_PING => "ping",
            T_CHALLENGE => "challenge",
            T_PROOF => "proof",
            _ => return Err(ControlError::UnknownType { ty }),
        };
        let mut b = Body {
            b: body,
            at: 0,
            what,
        };
        let msg = match ty {
            T_HELLO => {
                b.magic()?;
                let version = b.u16()?;
                let max_payload = b.u16()?;
                // Version 1's Hello ends here; later ones carry the nonce.
                let nonce = if b.at == b.b.len() {
                    None
                } else {
                    Some(b.array()?)
                };
                b.end()?;
                Msg::Hello {
                    version,
                    max_payload,
                    nonce,
                }
            }
            T_CHALLENGE => {
                let nonce = b.array()?;
                let proof = b.array()?;
                b.end()?;
                Msg::Challenge { nonce, proof }
            }
            T_PROOF => {
                let tag = b.array()?;
                b.end()?;
                Msg::Proof { tag }
            }
            T_WELCOME => {
                b.magic()?;
                let version = b.u16()?;
                b.end()?;
                Msg::Welcome { version }
            }
            T_REFUSE => {
                let version = b.u16()?;
                let at = b.at;
                let reason =
                    std::str::from_utf8(b.rest()).map_err(|_| ControlError::Malformed {
                        what,
                        offset: FRAME_HDR + at,
                        why: "reason is not UTF-8",
                    })?;
                Msg::Refuse { version, reason }
            }
            T_PACKET => {
                let fam = b.u8()?;
                let (src, dst) = match fam {
                    4 => {
                        let s = b.take(4)?;
                        let d = b.take(4)?;
                        let v4 = |x: &[u8]| IpAddr::V4(Ipv4Addr::new(x[0], x[1], x[2], x[3]));
                        (v4(s), v4(d))
                    }
                    6 => {
                        let mut s = [0u8; 16];
                        s.copy_from_slice(b.take(16)?);
                        let mut d = [0u8; 16];
                        d.copy_from_slice(b.take(16)?);
                        (IpAddr::V6(Ipv6Addr::from(s)), IpAddr::V6(Ipv6Addr::from(d)))
                    }
                    _ => {
                        return Err(ControlError::Malformed {
                            what,
                            offset: FRAME_HDR,
                            why: "address family is neither 4 nor 6",
                        })
                    }
                };
                let sport = b.u16()?;
                let dport = b.u16()?;
                let seq = b.u32()?;
                let ack = b.u32()?;
                let flags = b.u8()?;
                let window = b.u16()?;
                let mss = Some(b.u16()?).filter(|&m| m != 0);
                let wscale = Some(b.u8()?).filter(|&w| w != u8::MAX);
                let payload_len = b.u16()?;
                let at = b.at;
                let payload = b.rest();
                if payload.len() > usize::from(payload_len) {
                    return Err(ControlError::Malformed {
                        what,
                        offset: FRAME_HDR + at,
                        why: "more payload than the segment had",
                    });
                }
                Msg::Packet {
                    hdr: PacketHdr {
                        src: SocketAddr::new(src, sport),
                        dst: SocketAddr::new(dst, dport),
                        seq,
                        ack,
                        flags,
                        window,
                        mss,
                        wscale,
                        payload_len,
                    },
                    payload,
                }
            }
            _ => {
                b.end()?;
                Msg::Ping
            }
        };
        Ok((msg, total))
    }

    /// Length of the frame [`Msg::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        FRAME_HDR
            + match self {
                Msg::Hello { nonce, .. } => 8 + nonce.map_or(0, |n| n.len()),
                Msg::Challenge { .. } => NONCE_LEN + TAG_LEN,
                Msg::Proof { .. } => TAG_LEN,
                Msg::Welcome { .. } => 6,
                Msg::Refuse { reason, .. } => 2 + refuse_cut(reason),
                Msg::Packet { hdr, payload } => {
                    let fixed = packet_fixed(hdr.src.is_ipv6());
                    fixed + payload.len().min(MAX_BODY - fixed)
                }
                Msg::Ping => 0,
            }
    }

    /// Appends the frame to `out`. A reason or payload longer than a frame holds is cut
    /// (a Refuse at a character boundary); a Packet whose two addresses are of different
    /// families cannot exist on the wire and is written with the source's family for both.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let len = self.buffer_len() - FRAME_HDR;
        out.reserve(FRAME_HDR + len);
        let ty = match self {
            Msg::Hello { .. } => T_HELLO,
            Msg::Challenge { .. } => T_CHALLENGE,
            Msg::Proof { .. } => T_PROOF,
            Msg::Welcome { .. } => T_WELCOME,
            Msg::Refuse { .. } => T_REFUSE,
            Msg::Packet { .. } => T_PACKET,
            Msg::Ping => T_PING,
        };
        out.push(ty);
        out.extend_from_slice(&(len as u16).to_be_bytes());
        match self {
            Msg::Hello {
                version,
                max_payload,
                nonce,
            } => {
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(&version.to_be_bytes());
                out.extend_from_slice(&max_payload.to_be_bytes());
                if let Some(n) = nonce {
                    out.extend_from_slice(n);
                }
            }
            Msg::Challenge { nonce, proof } => {
                out.extend_from_slice(nonce);
                out.extend_from_slice(proof);
            }
            Msg::Proof { tag } => out.extend_from_slice(tag),
            Msg::Welcome { version } => {
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(&version.to_be_bytes());
            }
            Msg::Refuse { version, reason } => {
                out.extend_from_slice(&version.to_be_bytes());
                out.extend_from_slice(&reason.as_bytes()[..refuse_cut(reason)]);
            }
            Msg::Packet { hdr, payload } => {
                let v6 = hdr.src.is_ipv6();
                out.push(if v6 { 6 } else { 4 });
                for ip in [hdr.src.ip(), hdr.dst.ip()] {
                    match (ip, v6) {
                        (IpAddr::V4(a), false) => out.extend_from_slice(&a.octets()),
                        (IpAddr::V6(a), true) => out.extend_from_slice(&a.octets()),
                        (IpAddr::V6(a), false) => out.extend_from_slice(
                            &a.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED).octets(),
                        ),
                        (IpAddr::V4(a), true) => {
                            out.extend_from_slice(&a.to_ipv6_mapped().octets());
                        }
                    }
                }
                out.extend_from_slice(&hdr.src.port().to_be_bytes());
                out.extend_from_slice(&hdr.dst.port().to_be_bytes());
                out.extend_from_slice(&hdr.seq.to_be_bytes());
                out.extend_from_slice(&hdr.ack.to_be_bytes());
                out.push(hdr.flags);
                out.extend_from_slice(&hdr.window.to_be_bytes());
                out.extend_from_slice(&hdr.mss.unwrap_or(0).to_be_bytes());
                out.push(hdr.wscale.unwrap_or(u8::MAX));
                let n = payload.len().min(len - packet_fixed(v6));
                // The declared length is never below what is carried.
                let declared = hdr.payload_len.max(n as u16);
                out.extend_from_slice(&declared.to_be_bytes());
                out.extend_from_slice(&payload[..n]);
            }
            Msg::Ping => {}
        }
    }
}

/// Body of the `control` fuzz target: parses every frame of `data` in turn; each one that
/// parses is emitted again and must parse back to itself, taking exactly the bytes emitted.
pub fn fuzz_control(data: &[u8]) {
    let mut rest = data;
    let mut buf = Vec::new();
    while !rest.is_empty() {
        match Msg::parse(rest) {
            Ok((m, used)) => {
                assert!(used >= FRAME_HDR && used <= rest.len());
                buf.clear();
                m.emit(&mut buf);
                assert_eq!(buf.len(), m.buffer_len());
                let (back, n) = Msg::parse(&buf).expect("an emitted frame parses");
                assert_eq!(n, buf.len());
                // A Packet whose declared length was below its payload cannot parse, so the
                // emitted form equals the parsed one field for field.
                assert_eq!(back, m);
                rest = &rest[used..];
            }
            Err(ControlError::Truncated { need, have }) => {
                assert!(need > have && have == rest.len());
                break;
            }
            Err(_) => {
                // Skip a byte and resynchronise, so one seed exercises many frames.
                rest = &rest[1..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Msg<'static>> {
        vec![
            Msg::Hello {
                version: VERSION,
                max_payload: 0,
                nonce: Some([0x11; NONCE_LEN]),
            },
            Msg::Hello {
                version: 1,
                max_payload: 1500,
                nonce: None,
            },
            Msg::Welcome { version: VERSION },
            Msg::Refuse {
                version: VERSION,
                reason: "version 9 is not spoken here: é",
            },
            Msg::Packet {
                hdr: PacketHdr {
                    src: "198.18.2.2:8080".parse().unwrap(),
                    dst: "198.18.1.1:40000".parse().unwrap(),
                    seq: 0xdead_beef,
                    ack: 7,
                    flags: 0x12,
                    window: 64240,
                    mss: Some(1460),
                    wscale: Some(7),
                    payload_len: 0,
                },
                payload: &[],
            },
            Msg::Packet {
                hdr: PacketHdr {
                    src: "[fd00:18:2::2]:8080".parse().unwrap(),
                    dst: "[fd00:18:1::1]:1".parse().unwrap(),
                    seq: 1,
                    ack: u32::MAX,
                    flags: 0x18,
                    window: 0,
                    mss: None,
                    wscale: None,
                    payload_len: 300,
                },
                payload: b"HTTP/1.1 200 OK\r\n",
            },
            Msg::Ping,
            Msg::Challenge {
                nonce: [0xc3; NONCE_LEN],
                proof: [0x5a; TAG_LEN],
            },
            Msg::Proof {
                tag: [0xa5; TAG_LEN],
            },
        ]
    }

    #[test]
    fn round_trip() {
        for m in samples() {
            // A marker byte before the frame shows that emit appends and writes every byte.
            let mut buf = vec![0xa5];
            m.emit(&mut buf);
            assert_eq!(buf.len(), 1 + m.buffer_len(), "{m:?}");
            assert_eq!(Msg::parse(&buf[1..]), Ok((m, m.buffer_len())), "{m:?}");
        }
    }

    #[test]
    fn frames_back_to_back_parse_in_turn() {
        let mut buf = Vec::new();
        for m in samples() {
            m.emit(&mut buf);
        }
        let mut rest = &buf[..];
        for m in samples() {
            let (got, n) = Msg::parse(rest).unwrap();
            assert_eq!(got, m);
            rest = &rest[n..];
        }
        assert!(rest.is_empty());
    }

    #[test]
    fn every_cut_is_truncated_never_a_panic() {
        for m in samples() {
            let mut buf = Vec::new();
            m.emit(&mut buf);
            for cut in 0..buf.len() {
                assert_eq!(
                    Msg::parse(&buf[..cut]),
                    Err(ControlError::Truncated {
                        need: if cut < FRAME_HDR {
                            FRAME_HDR
                        } else {
                            buf.len()
                        },
                        have: cut
                    }),
                    "{m:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn bodies_too_short_for_their_type_name_the_offset() {
        for m in samples() {
            let mut buf = Vec::new();
            m.emit(&mut buf);
            let body = buf.len() - FRAME_HDR;
            for short in 0..body {
                // The frame says it is `short` bytes long: complete, but not a whole message.
                let mut b = buf[..FRAME_HDR + short].to_vec();
                b[1..3].copy_from_slice(&(short as u16).to_be_bytes());
                match (m, Msg::parse(&b)) {
                    // A shorter Refuse is a shorter reason, and a Packet with less payload
                    // is a Packet carrying less of it: both still parse.
                    (Msg::Refuse { .. } | Msg::Packet { .. }, Ok(_)) => {}
                    // A Hello cut where version 1's ended is version 1's Hello.
                    (Msg::Hello { .. }, Ok((Msg::Hello { nonce: None, .. }, _))) if short == 8 => {}
                    (_, Err(ControlError::Malformed { offset, .. })) => {
                        assert!(offset <= FRAME_HDR + short);
                    }
                    (_, other) => panic!("{m:?} with a {short}-byte body: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn bad_frames_are_named() {
        assert_eq!(
            Msg::parse(&[9, 0, 0]),
            Err(ControlError::UnknownType { ty: 9 })
        );
        assert_eq!(
            Msg::parse(b"\x01\x00\x08GET /xy\x00"),
            Err(ControlError::BadMagic { found: *b"GET " })
        );
        assert!(matches!(
            Msg::parse(&[T_PING, 0, 1, 0]),
            Err(ControlError::Malformed {
                what: "ping",
                offset: 3,
                ..
            })
        ));
        let mut p = Vec::new();
        samples()[5].emit(&mut p);
        // Declared payload length (the body's last field before the payload) below what is
        // carried.
        let at = FRAME_HDR + packet_fixed(true) - 2;
        p[at..at + 2].copy_from_slice(&1u16.to_be_bytes());
        assert!(matches!(
            Msg::parse(&p),
            Err(ControlError::Malformed { what: "packet", .. })
        ));
        p[FRAME_HDR] = 5;
        assert!(matches!(
            Msg::parse(&p),
            Err(ControlError::Malformed {
                why: "address family is neither 4 nor 6",
                ..
            })
        ));
    }

    #[test]
    fn oversized_fields_are_cut_to_a_frame() {
        let reason = "é".repeat(40_000);
        let m = Msg::Refuse {
            version: 1,
            reason: &reason,
        };
        let mut buf = Vec::new();
        m.emit(&mut buf);
        let (back, n) = Msg::parse(&buf).unwrap();
        assert_eq!(n, buf.len());
        assert!(matches!(back, Msg::Refuse { reason, .. } if reason.len() == MAX_BODY - 3));
        let payload = vec![7u8; 70_000];
        let mut hdr = match samples()[4] {
            Msg::Packet { hdr, .. } => hdr,
            _ => unreachable!(),
        };
        hdr.payload_len = u16::MAX;
        let m = Msg::Packet {
            hdr,
            payload: &payload,
        };
        buf.clear();
        m.emit(&mut buf);
        assert_eq!(buf.len(), FRAME_HDR + MAX_BODY);
        assert!(Msg::parse(&buf).is_ok());
    }

    #[test]
    fn the_fuzz_body_runs_over_the_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("control");
        assert!(seeds.len() >= 8, "{} seeds", seeds.len());
        let mut kinds = std::collections::HashSet::new();
        for s in &seeds {
            fuzz_control(&s.bytes);
            if let Ok((m, _)) = Msg::parse(&s.bytes) {
                kinds.insert(std::mem::discriminant(&m));
            }
        }
        assert_eq!(kinds.len(), 7, "every message type has a seed");
    }

    #[test]
    fn the_fuzz_body_survives_random_bytes() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..2000 {
            let data: Vec<u8> = (0..len % 97)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly small values, so types and lengths are often valid.
                    (x % 7) as u8
                })
                .collect();
            fuzz_control(&data);
        }
    }

    /// Writes the seed corpus (run once by hand: `cargo test -p tcpkit-copy write_control_corpus
    /// -- --ignored`); kept so the seeds can be regenerated when a message changes.
    #[test]
    #[ignore = "writes fuzz/corpus/control"]
    fn write_control_corpus() {
        let put = |name: &str, bytes: &[u8]| tcpkit_lab::corpus::write("control", name, bytes);
        let names = [
            "hello",
            "hello-v1-payload",
            "welcome",
            "refuse",
            "packet-v4-synack",
            "packet-v6-payload",
            "ping",
            "challenge",
            "proof",
        ];
        let mut all = Vec::new();
        for (m, name) in samples().iter().zip(names) {
            let mut b = Vec::new();
            m.emit(&mut b);
            all.extend_from_slice(&b);
            put(name, &b);
        }
        put("stream-of-all", &all);
        put("cut-packet", &all[..all.len() / 2]);
        put(
            "garbage-then-ping",
            b"\x09\x00\x00GET / HTTP/1.1\r\n\x05\x00\x00",
        );
    }
}
