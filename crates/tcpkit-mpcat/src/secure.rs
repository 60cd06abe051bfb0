//! `--psk-file`: every connection of a session authenticated and encrypted with a pre-shared
//! key, so only a holder of the key can join a session or read it on the wire.
//!
//! Each connection runs its own Noise handshake (`Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s`,
//! from `snow`): the sender's first message already depends on the key (psk0), so a receiver
//! tells a wrong key from the first 48 bytes and refuses before anything else; fresh
//! ephemeral keys on both sides give every connection its own session keys (forward secrecy
//! for recorded traffic). The two handshake messages travel in [`Frame::Noise`] frames, in
//! the clear like a Hello, so a side without `--psk-file` is told apart from one with another
//! key. After them the connection is a stream of records, `length: u16 (big endian),
//! ciphertext` (at most 65535 bytes, the Noise limit, 16 of them the tag), whose plaintext is
//! the usual frames from the Hello on. A chunk larger than one record is sealed as several.
//!
//! Every connection has its own [`Channel`] (its own keys and nonces), so nothing is shared
//! between connections and no lock is taken on the data path.
//!
//! [`Frame::Noise`]: crate::frame::Frame::Noise

use std::fmt;
use std::path::Path;

use crate::Error;

/// The Noise protocol every `--psk-file` connection speaks.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// Bound into both sides' handshake hash: another program with a Noise handshake of the same
/// pattern and key cannot pass for mpcat.
const PROLOGUE: &[u8] = b"tcpkit mpcat --psk-file v1";
pub use tcpkit_keyfile::{MAX_KEY_LEN, MIN_KEY_LEN};
/// A record's header: the ciphertext's length.
pub const REC_HDR: usize = 2;
/// The authentication tag at the end of every record.
pub const TAG: usize = 16;
/// The longest record's ciphertext (Noise's message limit).
pub const MAX_RECORD: usize = 65535;
/// The most plaintext one record carries.
pub const MAX_PLAIN: usize = MAX_RECORD - TAG;
/// Each handshake message's length: an ephemeral public key and an empty payload's tag.
pub const HANDSHAKE_MSG: usize = 32 + TAG;

/// The pre-shared key, as Noise uses it (32 bytes derived from the key file's bytes). Its
/// Debug form never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Psk([u8; 32]);

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Psk(..)")
    }
}

impl Psk {
    /// The key in `bytes` under tcpkit-keyfile's rules (trailing whitespace left out, at
    /// least [`MIN_KEY_LEN`] bytes), made Noise's 32-byte key by BLAKE3's key derivation.
    pub fn from_bytes(bytes: &[u8]) -> Result<Psk, String> {
        tcpkit_keyfile::key_bytes(bytes).map(Psk::derive)
    }

    fn derive(k: &[u8]) -> Psk {
        Psk(blake3::derive_key(
            "tcpkit mpcat 2026-11 --psk-file Noise psk",
            k,
        ))
    }

    /// Reads the key file under tcpkit-keyfile's rules (the same as intercept's
    /// `--auth-key-file`: owner-only, since whoever reads it reads the stream). Errors name
    /// the flag and the file.
    pub fn from_file(path: &Path) -> Result<Psk, Error> {
        let name = format!("--psk-file {}", path.display());
        match tcpkit_keyfile::read(path) {
            Ok(k) => Ok(Psk::derive(&k)),
            Err(tcpkit_keyfile::KeyFileError::Read(e)) => Err(Error::io(name, e)),
            Err(tcpkit_keyfile::KeyFileError::Bad(why)) => {
                Err(Error::msg(format!("{name}: {why}")))
            }
        }
    }

    fn builder(&self) -> snow::Builder<'_> {
        let params = NOISE_PARAMS.parse().expect("a valid Noise protocol name");
        snow::Builder::new(params)
            .prologue(PROLOGUE)
            .and_then(|b| b.psk(0, &self.0))
            .expect("the prologue and a 32-byte psk at 0 fit NNpsk0")
    }

    /// The sender's side: its first message (into `msg`, [`HANDSHAKE_MSG`] bytes) and the
    /// state that reads the receiver's answer.
    pub fn initiate(&self, msg: &mut [u8; HANDSHAKE_MSG]) -> Result<Initiator, Error> {
        let mut hs = self
            .builder()
            .build_initiator()
            .map_err(|e| Error::msg(format!("Noise handshake: {e}")))?;
        let n = hs
            .write_message(&[], msg)
            .map_err(|e| Error::msg(format!("Noise handshake: {e}")))?;
        debug_assert_eq!(n, HANDSHAKE_MSG);
        Ok(Initiator(Box::new(hs)))
    }

    /// The receiver's side: reads the sender's first message and writes the answer into
    /// `reply`. `Err(None)` means the message does not authenticate under this key (another
    /// key, or not a handshake at all); `Err(Some(e))` a local failure.
    pub fn respond(
        &self,
        msg: &[u8],
        reply: &mut [u8; HANDSHAKE_MSG],
    ) -> Result<Channel, Option<Error>> {
        let mut hs = self
            .builder()
            .build_responder()
            .map_err(|e| Some(Error::msg(format!("Noise handshake: {e}"))))?;
        if msg.len() != HANDSHAKE_MSG {
            return Err(None);
        }
        let mut payload = [0u8; HANDSHAKE_MSG];
        hs.read_message(msg, &mut payload).map_err(|_| None)?;
        hs.write_message(&[], reply)
            .map_err(|e| Some(Error::msg(format!("Noise handshake: {e}"))))?;
        hs.into_transport_mode()
            .map(Channel::new)
            .map_err(|e| Some(Error::msg(format!("Noise handshake: {e}"))))
    }
}

/// A sender's handshake waiting for the receiver's answer.
pub struct Initiator(Box<snow::HandshakeState>);

impl fmt::Debug for Initiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Initiator(..)")
    }
}

impl Initiator {
    /// Reads the receiver's answer; None when it does not authenticate (the receiver holds
    /// another key, or is not what it claims).
    pub fn finish(mut self, reply: &[u8]) -> Option<Channel> {
        if reply.len() != HANDSHAKE_MSG {
            return None;
        }
        let mut payload = [0u8; HANDSHAKE_MSG];
        self.0.read_message(reply, &mut payload).ok()?;
        self.0.into_transport_mode().ok().map(Channel::new)
    }
}

/// Why received records cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("a {len}-byte record, shorter than its tag")]
    Short { len: usize },
    #[error(
        "a record that does not authenticate (altered on the way, or not from the key's holder)"
    )]
    Forged,
    #[error("a record of {len} plaintext bytes, more than the {room} this side holds")]
    TooLong { len: usize, room: usize },
}

/// One connection's keys and nonces after its handshake.
pub struct Channel {
    t: Box<snow::TransportState>,
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Channel(..)")
    }
}

impl Channel {
    fn new(t: snow::TransportState) -> Channel {
        Channel { t: Box::new(t) }
    }

    /// Appends `plain` to `out` as records of at most [`MAX_PLAIN`] bytes each. `out` keeps
    /// its capacity between calls, so a sender reusing it allocates nothing per chunk.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        for piece in plain.chunks(MAX_PLAIN) {
            let at = out.len();
            let len = piece.len() + TAG;
            out.resize(at + REC_HDR + len, 0);
            out[at..at + REC_HDR].copy_from_slice(&(len as u16).to_be_bytes());
            let n = self
                .t
                .write_message(piece, &mut out[at + REC_HDR..])
                .expect("a record within Noise's limit, and 2^64 nonces are never reached");
            debug_assert_eq!(n, len);
        }
    }

    /// Opens the complete records at the start of `raw` into `plain[*plain_len..]`, as many
    /// as fit; returns the raw bytes used (the caller drops them). A record whose plaintext
    /// could never fit in `plain` is an error, not a wait.
    pub fn open(
        &mut self,
        raw: &[u8],
        plain: &mut [u8],
        plain_len: &mut usize,
    ) -> Result<usize, RecordError> {
        let mut at = 0;
        while let Some(h) = raw.get(at..at + REC_HDR) {
            let len = usize::from(u16::from_be_bytes([h[0], h[1]]));
            if len < TAG {
                return Err(RecordError::Short { len });
            }
            let p = len - TAG;
            if p > plain.len() {
                return Err(RecordError::TooLong {
                    len: p,
                    room: plain.len(),
                });
            }
            let Some(rec) = raw.get(at + REC_HDR..at + REC_HDR + len) else {
                break;
            };
            if plain.len() - *plain_len < p {
                break;
            }
            let n = self
                .t
                .read_message(rec, &mut plain[*plain_len..*plain_len + p])
                .map_err(|_| RecordError::Forged)?;
            *plain_len += n;
            at += REC_HDR + len;
        }
        Ok(at)
    }
}

/// The `mpcat_record` fuzz target's body. Untrusted bytes opened as records give an error or
/// a wait, never a panic nor a read past them; and whatever a sender seals opens to the same
/// bytes, whatever pieces the wire cuts it into (the first byte picks the cut).
pub fn fuzz_records(data: &[u8]) {
    let psk = Psk([7; 32]);
    let pair = || {
        let mut m1 = [0u8; HANDSHAKE_MSG];
        let init = psk.initiate(&mut m1).expect("initiate");
        let mut m2 = [0u8; HANDSHAKE_MSG];
        let r = psk.respond(&m1, &mut m2).expect("the same key");
        (init.finish(&m2).expect("the same key"), r)
    };
    let (_, mut r) = pair();
    let mut plain = vec![0u8; 4096];
    let mut n = 0;
    if let Ok(used) = r.open(data, &mut plain, &mut n) {
        assert!(used <= data.len() && n <= plain.len());
    }
    let (mut s, mut r) = pair();
    let mut wire = Vec::new();
    s.seal(data, &mut wire);
    let step = 1 + usize::from(data.first().copied().unwrap_or(0)) * 257;
    let mut out = vec![0u8; data.len() + MAX_PLAIN];
    let (mut have, mut used, mut got) = (0, 0, 0);
    while used < wire.len() {
        have = (have + step).min(wire.len());
        used += r
            .open(&wire[used..have], &mut out, &mut got)
            .expect("a sealed record opens");
    }
    assert_eq!(&out[..got], data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_fuzz_body_runs_over_the_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("mpcat_record");
        for s in &seeds {
            fuzz_records(&s.bytes);
        }
        assert!(seeds.len() >= 3, "{} seeds", seeds.len());
    }

    /// Writes the seed corpus (by hand: `cargo test -p tcpkit-mpcat write_record_corpus --
    /// --ignored`): a record as a sender seals it, one cut short, one longer than any.
    #[test]
    #[ignore = "writes fuzz/corpus/mpcat_record"]
    fn write_record_corpus() {
        let put = |name: &str, bytes: &[u8]| tcpkit_lab::corpus::write("mpcat_record", name, bytes);
        let k = Psk([7; 32]);
        let mut m1 = [0u8; HANDSHAKE_MSG];
        let init = k.initiate(&mut m1).unwrap();
        let mut m2 = [0u8; HANDSHAKE_MSG];
        k.respond(&m1, &mut m2).unwrap();
        let mut s = init.finish(&m2).unwrap();
        let mut rec = Vec::new();
        s.seal(b"\x04\0\0\0\x0b\0\0\0\0\0\0\0\0abc", &mut rec);
        put("record", &rec);
        put("record-cut", &rec[..rec.len() / 2]);
        put("huge", &[0xff, 0xff, 1, 2, 3]);
        put("short", &[0, 3, 1, 2, 3]);
        put("big-plain", &[0x5a; 70_000]);
    }

    fn pair(a: &Psk, b: &Psk) -> Option<(Channel, Channel)> {
        let mut m1 = [0u8; HANDSHAKE_MSG];
        let init = a.initiate(&mut m1).unwrap();
        let mut m2 = [0u8; HANDSHAKE_MSG];
        let resp = match b.respond(&m1, &mut m2) {
            Ok(c) => c,
            Err(None) => return None,
            Err(Some(e)) => panic!("{e}"),
        };
        Some((init.finish(&m2).expect("the answer authenticates"), resp))
    }

    fn key(s: &str) -> Psk {
        Psk::from_bytes(s.as_bytes()).unwrap()
    }

    #[test]
    fn the_same_key_opens_what_it_sealed_in_records_of_at_most_64k() {
        let k = key("0123456789abcdef-the-key\n");
        let (mut s, mut r) = pair(&k, &k).unwrap();
        let plain: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let mut wire = Vec::new();
        s.seal(&plain[..13], &mut wire);
        s.seal(&plain[13..], &mut wire);
        // 13 bytes, then 199,987 in four records (65,519 at most each).
        assert_eq!(wire.len(), plain.len() + 5 * (REC_HDR + TAG));
        assert!(!wire.windows(64).any(|w| w == &plain[1000..1064]));
        // Fed a byte at a time, nothing opens before its record is whole.
        let mut out = vec![0u8; 300_000];
        let (mut have, mut used, mut got) = (0, 0, 0);
        while used < wire.len() {
            have = (have + 1 + have / 3).min(wire.len());
            used += r.open(&wire[used..have], &mut out, &mut got).unwrap();
        }
        assert_eq!(&out[..got], &plain[..]);
    }

    #[test]
    fn another_key_is_refused_at_the_first_message() {
        assert!(pair(&key("0123456789abcdef"), &key("0123456789abcdeX")).is_none());
        // Trailing whitespace is not part of the key.
        assert!(pair(&key("0123456789abcdef"), &key("0123456789abcdef \n")).is_some());
    }

    #[test]
    fn an_altered_record_is_forged_and_a_short_or_huge_one_refused() {
        let k = key("0123456789abcdef");
        let (mut s, mut r) = pair(&k, &k).unwrap();
        let mut wire = Vec::new();
        s.seal(b"hello there", &mut wire);
        wire[5] ^= 1;
        let mut out = [0u8; 64];
        let mut n = 0;
        assert_eq!(r.open(&wire, &mut out, &mut n), Err(RecordError::Forged));
        assert_eq!(
            r.open(&[0, 3, 1, 2, 3], &mut out, &mut n),
            Err(RecordError::Short { len: 3 })
        );
        assert_eq!(
            r.open(&[0xff, 0xff], &mut out, &mut n),
            Err(RecordError::TooLong {
                len: MAX_PLAIN,
                room: 64
            })
        );
    }

    #[test]
    fn a_record_waits_for_room() {
        let k = key("0123456789abcdef");
        let (mut s, mut r) = pair(&k, &k).unwrap();
        let mut wire = Vec::new();
        s.seal(&[1; 40], &mut wire);
        s.seal(&[2; 40], &mut wire);
        let mut out = [0u8; 64];
        let mut n = 0;
        let used = r.open(&wire, &mut out, &mut n).unwrap();
        assert_eq!((used, n), (REC_HDR + 40 + TAG, 40));
        n = 0;
        assert_eq!(r.open(&wire[used..], &mut out, &mut n).unwrap(), used);
        assert_eq!(out[..40], [2; 40]);
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(Psk::from_bytes(b"short key      \n\n")
            .unwrap_err()
            .contains("9 bytes, at least 16"));
    }
}
