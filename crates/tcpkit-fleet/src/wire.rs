//! The barrier's frames, both directions: `type u8 | length u16 BE | body`, the body at most
//! [`MAX_BODY`] bytes and each message's body an exact size or, with a text, bounded by
//! [`MAX_TEXT`]; a frame is refused on its header, before its body is waited for, when its
//! type is unknown or its length is out of bounds. Integers are big-endian; times are Unix ns.
//!
//! The exchange: agent `Hello` → barrier `Challenge` (its nonce and its proof of the key) →
//! agent `Join` (its proof, its shard and host) → barrier `Welcome` (the fleet run's id, the silence
//! after which either side is lost) or
//! `Refuse`. Then `Beat` both ways every [`crate::BEAT`]; the agent's `TimeReq`s, each
//! answered by a `TimeResp` (NTP's four timestamps), then `Ready` with the offset found, or
//! `NotReady` with why; the barrier's `Start` once every agent is ready; the agent's `Done` at
//! the end of its run; the barrier's `Stop` when another agent failed.

use tcpkit_keyfile::proof::{Nonce, Tag, NONCE_LEN, TAG_LEN};

/// The protocol's version, in `Hello` and bound into both proofs.
pub const VERSION: u16 = 2;
/// Bytes of a frame's header.
pub const HDR: usize = 3;
/// Longest text (a host name, a reason) a frame carries, in bytes.
pub const MAX_TEXT: usize = 512;
/// Longest body.
pub const MAX_BODY: usize = 4 + MAX_TEXT + TAG_LEN + 8;
/// Bytes of the fleet run's id.
pub const RUN_ID_LEN: usize = 16;

const T_HELLO: u8 = 1;
const T_CHALLENGE: u8 = 2;
const T_JOIN: u8 = 3;
const T_WELCOME: u8 = 4;
const T_REFUSE: u8 = 5;
const T_TIME_REQ: u8 = 6;
const T_TIME_RESP: u8 = 7;
const T_READY: u8 = 8;
const T_NOT_READY: u8 = 9;
const T_START: u8 = 10;
const T_BEAT: u8 = 11;
const T_DONE: u8 = 12;
const T_STOP: u8 = 13;

/// Agent K of N, as `--shard K/N` says (K from 1): the one type load and replay share it by.
pub use tcpkit_workers::Shard;

/// One frame, borrowing its texts from the buffer it was parsed from.
#[expect(missing_docs, reason = "each variant's doc says what its fields are")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg<'a> {
    /// Agent: the first frame.
    Hello { version: u16, nonce: Nonce },
    /// Barrier: its nonce and its proof over both nonces.
    Challenge { nonce: Nonce, proof: Tag },
    /// Agent: its proof over both nonces, its shard and host.
    Join {
        proof: Tag,
        shard: Option<Shard>,
        host: &'a str,
    },
    /// Barrier: admitted into the fleet run `run_id` of `agents` agents; either side not
    /// heard for `lost_after_ms` is lost (`--lost-after`: one bound for both ends).
    Welcome {
        run_id: [u8; RUN_ID_LEN],
        agents: u32,
        lost_after_ms: u32,
    },
    /// Barrier: not admitted, and why.
    Refuse { reason: &'a str },
    /// Agent: a clock sample's first timestamp (agent clock).
    TimeReq { t1: u64 },
    /// Barrier: the sample's `t1` back, with when it arrived (`t2`) and left (`t3`),
    /// barrier clock.
    TimeResp { t1: u64, t2: u64, t3: u64 },
    /// Agent: prepared; its clock minus the barrier's, and the round trip it came from.
    Ready { offset_ns: i64, rtt_ns: u64 },
    /// Agent: cannot get ready, and why.
    NotReady { why: &'a str },
    /// Barrier: start at this instant (barrier clock).
    Start { at_unix_ns: u64 },
    /// Either side: still here.
    Beat,
    /// Agent: its run ended; when its first query or frame went out (agent clock, 0 if
    /// none did) and its failure, if it failed.
    Done {
        actual_start_ns: u64,
        failure: Option<&'a str>,
    },
    /// Barrier: stop now, and why (naming the agent that failed).
    Stop { reason: &'a str },
}

/// Why bytes are not a frame: the type, the length against its bounds, or the field and its
/// offset in the body.
#[expect(missing_docs, reason = "the messages say what the fields are")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("frame type {0} is not one of the barrier's")]
    Type(u8),
    #[error("frame type {kind}: body of {len} bytes, {want}")]
    Length {
        kind: u8,
        len: usize,
        want: &'static str,
    },
    #[error("frame type {kind}: {what} at body offset {at}")]
    Body {
        kind: u8,
        what: &'static str,
        at: usize,
    },
}

/// The longest text `s` holds within [`MAX_TEXT`] bytes, cut at a character boundary.
fn clip(s: &str) -> &str {
    let mut n = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

impl<'a> Msg<'a> {
    fn kind(&self) -> u8 {
        match self {
            Msg::Hello { .. } => T_HELLO,
            Msg::Challenge { .. } => T_CHALLENGE,
            Msg::Join { .. } => T_JOIN,
            Msg::Welcome { .. } => T_WELCOME,
            Msg::Refuse { .. } => T_REFUSE,
            Msg::TimeReq { .. } => T_TIME_REQ,
            Msg::TimeResp { .. } => T_TIME_RESP,
            Msg::Ready { .. } => T_READY,
            Msg::NotReady { .. } => T_NOT_READY,
            Msg::Start { .. } => T_START,
            Msg::Beat => T_BEAT,
            Msg::Done { .. } => T_DONE,
            Msg::Stop { .. } => T_STOP,
        }
    }

    /// Bytes [`Msg::emit`] writes, header included.
    pub fn buffer_len(&self) -> usize {
        let body = match self {
            Msg::Hello { .. } => 2 + NONCE_LEN,
            Msg::Challenge { .. } => NONCE_LEN + TAG_LEN,
            Msg::Join { host, .. } => TAG_LEN + 8 + 2 + clip(host).len(),
            Msg::Welcome { .. } => RUN_ID_LEN + 8,
            Msg::Refuse { reason: t } | Msg::NotReady { why: t } | Msg::Stop { reason: t } => {
                2 + clip(t).len()
            }
            Msg::TimeReq { .. } | Msg::Start { .. } => 8,
            Msg::TimeResp { .. } => 24,
            Msg::Ready { .. } => 16,
            Msg::Beat => 0,
            Msg::Done { failure, .. } => 9 + failure.map_or(0, |f| 2 + clip(f).len()),
        };
        HDR + body
    }

    /// Appends the frame to `out`. Texts longer than [`MAX_TEXT`] are cut (at a character
    /// boundary), so what is emitted always parses.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let len = self.buffer_len() - HDR;
        out.push(self.kind());
        out.extend_from_slice(&(len as u16).to_be_bytes());
        let text = |out: &mut Vec<u8>, t: &str| {
            let t = clip(t);
            out.extend_from_slice(&(t.len() as u16).to_be_bytes());
            out.extend_from_slice(t.as_bytes());
        };
        match *self {
            Msg::Hello { version, nonce } => {
                out.extend_from_slice(&version.to_be_bytes());
                out.extend_from_slice(&nonce);
            }
            Msg::Challenge { nonce, proof } => {
                out.extend_from_slice(&nonce);
                out.extend_from_slice(&proof);
            }
            Msg::Join { proof, shard, host } => {
                out.extend_from_slice(&proof);
                let (k, n) = shard.map_or((0, 0), |s| (s.index, s.count));
                out.extend_from_slice(&k.to_be_bytes());
                out.extend_from_slice(&n.to_be_bytes());
                text(out, host);
            }
            Msg::Welcome {
                run_id,
                agents,
                lost_after_ms,
            } => {
                out.extend_from_slice(&run_id);
                out.extend_from_slice(&agents.to_be_bytes());
                out.extend_from_slice(&lost_after_ms.to_be_bytes());
            }
            Msg::Refuse { reason: t } | Msg::NotReady { why: t } | Msg::Stop { reason: t } => {
                text(out, t);
            }
            Msg::TimeReq { t1 } => out.extend_from_slice(&t1.to_be_bytes()),
            Msg::Start { at_unix_ns } => out.extend_from_slice(&at_unix_ns.to_be_bytes()),
            Msg::TimeResp { t1, t2, t3 } => {
                for t in [t1, t2, t3] {
                    out.extend_from_slice(&t.to_be_bytes());
                }
            }
            Msg::Ready { offset_ns, rtt_ns } => {
                out.extend_from_slice(&offset_ns.to_be_bytes());
                out.extend_from_slice(&rtt_ns.to_be_bytes());
            }
            Msg::Beat => {}
            Msg::Done {
                actual_start_ns,
                failure,
            } => {
                out.extend_from_slice(&actual_start_ns.to_be_bytes());
                match failure {
                    None => out.push(0),
                    Some(f) => {
                        out.push(1);
                        text(out, f);
                    }
                }
            }
        }
    }

    /// The frame at the start of `buf`: `Ok(None)` while it is incomplete (its header, once
    /// there, is checked first, so a bad length is refused before its body arrives), else
    /// the message and the bytes it took.
    pub fn parse(buf: &'a [u8]) -> Result<Option<(Msg<'a>, usize)>, WireError> {
        let Some(hdr) = buf.get(..HDR) else {
            return Ok(None);
        };
        let kind = hdr[0];
        let len = usize::from(u16::from_be_bytes([hdr[1], hdr[2]]));
        let (lo, hi) = bounds(kind)?;
        if len < lo || len > hi {
            return Err(WireError::Length {
                kind,
                len,
                want: if lo == hi {
                    "not this type's size"
                } else {
                    "out of this type's bounds"
                },
            });
        }
        let Some(body) = buf.get(HDR..HDR + len) else {
            return Ok(None);
        };
        let mut r = Reader {
            b: body,
            at: 0,
            kind,
        };
        let m = match kind {
            T_HELLO => Msg::Hello {
                version: r.u16()?,
                nonce: r.array()?,
            },
            T_CHALLENGE => Msg::Challenge {
                nonce: r.array()?,
                proof: r.array()?,
            },
            T_JOIN => {
                let proof = r.array()?;
                let (k, n) = (r.u32()?, r.u32()?);
                let shard = match (k, n) {
                    (0, 0) => None,
                    (k, n) if k >= 1 && k <= n => Some(Shard { index: k, count: n }),
                    _ => return Err(r.bad("shard not K/N with 1 <= K <= N")),
                };
                Msg::Join {
                    proof,
                    shard,
                    host: r.text()?,
                }
            }
            T_WELCOME => Msg::Welcome {
                run_id: r.array()?,
                agents: r.u32()?,
                lost_after_ms: r.u32()?,
            },
            T_REFUSE => Msg::Refuse { reason: r.text()? },
            T_NOT_READY => Msg::NotReady { why: r.text()? },
            T_STOP => Msg::Stop { reason: r.text()? },
            T_TIME_REQ => Msg::TimeReq { t1: r.u64()? },
            T_START => Msg::Start {
                at_unix_ns: r.u64()?,
            },
            T_TIME_RESP => Msg::TimeResp {
                t1: r.u64()?,
                t2: r.u64()?,
                t3: r.u64()?,
            },
            T_READY => Msg::Ready {
                offset_ns: r.u64()? as i64,
                rtt_ns: r.u64()?,
            },
            T_BEAT => Msg::Beat,
            T_DONE => {
                let actual_start_ns = r.u64()?;
                let failure = match r.u8()? {
                    0 => None,
                    1 => Some(r.text()?),
                    _ => return Err(r.bad("done flag not 0 or 1")),
                };
                Msg::Done {
                    actual_start_ns,
                    failure,
                }
            }
            other => return Err(WireError::Type(other)),
        };
        if r.at != body.len() {
            return Err(r.bad("bytes after the message"));
        }
        Ok(Some((m, HDR + len)))
    }
}

/// The smallest and largest body of each type.
fn bounds(kind: u8) -> Result<(usize, usize), WireError> {
    let text = (2, 2 + MAX_TEXT);
    Ok(match kind {
        T_HELLO => (2 + NONCE_LEN, 2 + NONCE_LEN),
        T_CHALLENGE => (NONCE_LEN + TAG_LEN, NONCE_LEN + TAG_LEN),
        T_JOIN => (TAG_LEN + 10, TAG_LEN + 10 + MAX_TEXT),
        T_WELCOME => (RUN_ID_LEN + 8, RUN_ID_LEN + 8),
        T_REFUSE | T_NOT_READY | T_STOP => text,
        T_TIME_REQ | T_START => (8, 8),
        T_TIME_RESP => (24, 24),
        T_READY => (16, 16),
        T_BEAT => (0, 0),
        T_DONE => (9, 11 + MAX_TEXT),
        other => return Err(WireError::Type(other)),
    })
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    kind: u8,
}

impl<'a> Reader<'a> {
    fn bad(&self, what: &'static str) -> WireError {
        WireError::Body {
            kind: self.kind,
            what,
            at: self.at,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or_else(|| self.bad("cut short"))?;
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn text(&mut self) -> Result<&'a str, WireError> {
        let n = usize::from(self.u16()?);
        if n > MAX_TEXT {
            return Err(self.bad("text longer than 512 bytes"));
        }
        let s = self.take(n)?;
        std::str::from_utf8(s).map_err(|_| self.bad("text not UTF-8"))
    }
}

/// The `fleet_frame` fuzz target's body: parses every frame in `data`, and for each one that
/// parses checks that emitting it gives the same bytes and parsing those gives it back.
pub fn fuzz_frames(data: &[u8]) {
    let mut rest = data;
    let mut buf = Vec::new();
    while let Ok(Some((m, used))) = Msg::parse(rest) {
        assert!((HDR..=HDR + MAX_BODY).contains(&used) && used <= rest.len());
        buf.clear();
        m.emit(&mut buf);
        assert_eq!(buf.len(), m.buffer_len());
        assert_eq!(&buf[..], &rest[..used], "emit gives back the bytes parsed");
        assert_eq!(Msg::parse(&buf), Ok(Some((m, used))));
        rest = &rest[used..];
    }
}

#[cfg(test)]
pub(crate) fn samples() -> Vec<Msg<'static>> {
    vec![
        Msg::Hello {
            version: VERSION,
            nonce: [0x11; NONCE_LEN],
        },
        Msg::Challenge {
            nonce: [0x22; NONCE_LEN],
            proof: [0x33; TAG_LEN],
        },
        Msg::Join {
            proof: [0x44; TAG_LEN],
            shard: Some(Shard { index: 2, count: 3 }),
            host: "agent-2",
        },
        Msg::Welcome {
            run_id: [0x55; RUN_ID_LEN],
            agents: 3,
            lost_after_ms: 10_000,
        },
        Msg::Refuse {
            reason: "shard 2/3 is taken",
        },
        Msg::TimeReq { t1: 1 << 60 },
        Msg::TimeResp {
            t1: 1,
            t2: 2,
            t3: u64::MAX,
        },
        Msg::Ready {
            offset_ns: -12_345,
            rtt_ns: 80_000,
        },
        Msg::NotReady {
            why: "--qname-file q.txt: Permission denied",
        },
        Msg::Start { at_unix_ns: 7 },
        Msg::Beat,
        Msg::Done {
            actual_start_ns: 1_700_000_000_000_000_000,
            failure: Some("no answers"),
        },
        Msg::Stop {
            reason: "shard 1/3 on a: lost",
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips_and_is_refused_cut_at_every_length() {
        for m in samples().into_iter().chain([
            Msg::Done {
                actual_start_ns: 0,
                failure: None,
            },
            Msg::Join {
                proof: [0; TAG_LEN],
                shard: None,
                host: "",
            },
        ]) {
            // Over a buffer pre-filled with a marker, so a field not written shows.
            let mut buf = vec![0xEE; 5];
            m.emit(&mut buf);
            let b = &buf[5..];
            assert_eq!(b.len(), m.buffer_len());
            assert_eq!(Msg::parse(b), Ok(Some((m, b.len()))), "{m:?}");
            for cut in 0..b.len() {
                assert_eq!(Msg::parse(&b[..cut]), Ok(None), "{m:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn a_bad_header_is_refused_before_its_body() {
        // An unknown type, a Beat claiming a body, a text frame claiming 60 KB: each refused
        // on the three header bytes alone.
        assert_eq!(Msg::parse(&[99, 0, 0]), Err(WireError::Type(99)));
        assert!(matches!(
            Msg::parse(&[T_BEAT, 0, 1]),
            Err(WireError::Length { len: 1, .. })
        ));
        assert!(matches!(
            Msg::parse(&[T_STOP, 0xEA, 0x60]),
            Err(WireError::Length { len: 60000, .. })
        ));
        const { assert!(MAX_BODY < 1024) };
    }

    #[test]
    fn bodies_are_checked_field_by_field() {
        // A text whose length runs past the body, a text not UTF-8, trailing bytes, a shard 4/3.
        assert!(matches!(
            Msg::parse(&[T_STOP, 0, 3, 0, 5, b'a']),
            Err(WireError::Body {
                what: "cut short",
                ..
            })
        ));
        assert!(matches!(
            Msg::parse(&[T_STOP, 0, 3, 0, 1, 0xFF]),
            Err(WireError::Body {
                what: "text not UTF-8",
                ..
            })
        ));
        assert!(matches!(
            Msg::parse(&[T_STOP, 0, 3, 0, 0, b'x']),
            Err(WireError::Body {
                what: "bytes after the message",
                ..
            })
        ));
        let mut j = Vec::new();
        Msg::Join {
            proof: [0; TAG_LEN],
            shard: Some(Shard { index: 1, count: 3 }),
            host: "h",
        }
        .emit(&mut j);
        j[HDR + TAG_LEN + 3] = 4;
        assert!(matches!(Msg::parse(&j), Err(WireError::Body { .. })));
        assert!(matches!(
            Msg::parse(&[T_DONE, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 2]),
            Err(WireError::Body { .. })
        ));
    }

    #[test]
    fn a_long_text_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_TEXT);
        let mut buf = Vec::new();
        Msg::Stop { reason: &long }.emit(&mut buf);
        let Ok(Some((Msg::Stop { reason }, _))) = Msg::parse(&buf) else {
            panic!()
        };
        assert_eq!(reason.len(), MAX_TEXT);
        assert!(long.starts_with(reason));
    }

    #[test]
    fn shards_parse_as_k_of_n() {
        assert_eq!(Shard::parse("2/3"), Ok(Shard { index: 2, count: 3 }));
        assert_eq!(Shard::parse("1/1").unwrap().to_string(), "1/1");
        for bad in ["0/3", "4/3", "3", "a/3", "1/0", "1/3/1", "-1/3", ""] {
            let e = Shard::parse(bad).unwrap_err();
            assert!(e.starts_with(&format!("--shard '{bad}'")), "{e}");
        }
    }

    #[test]
    fn the_fuzz_body_runs_over_every_message_and_the_seed_corpus() {
        let mut all = Vec::new();
        for m in samples() {
            m.emit(&mut all);
        }
        fuzz_frames(&all);
        let seeds = tcpkit_lab::corpus::seeds("fleet_frame");
        assert!(seeds.len() >= 13, "{} seeds", seeds.len());
        let mut kinds = std::collections::HashSet::new();
        for s in &seeds {
            fuzz_frames(&s.bytes);
            if let Ok(Some((m, _))) = Msg::parse(&s.bytes) {
                kinds.insert(m.kind());
            }
        }
        assert_eq!(kinds.len(), 13, "every frame type has a seed");
    }

    /// Writes the seed corpus (run by hand: `cargo test -p tcpkit-fleet write_frame_corpus
    /// -- --ignored`), kept so the seeds can be made again when a frame changes.
    #[test]
    #[ignore = "writes fuzz/corpus/fleet_frame"]
    fn write_frame_corpus() {
        let names = [
            "hello",
            "challenge",
            "join",
            "welcome",
            "refuse",
            "time-req",
            "time-resp",
            "ready",
            "not-ready",
            "start",
            "beat",
            "done",
            "stop",
        ];
        let mut all = Vec::new();
        for (name, m) in names.iter().zip(samples()) {
            let mut b = Vec::new();
            m.emit(&mut b);
            all.extend_from_slice(&b);
            tcpkit_lab::corpus::write("fleet_frame", name, &b);
        }
        tcpkit_lab::corpus::write("fleet_frame", "session", &all);
    }
}
