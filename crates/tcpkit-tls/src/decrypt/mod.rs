//! Passive decryption of captured TLS with the session secrets of an NSS key log, sans-IO
//! (issue 27): the caller hands in each direction's reassembled bytes and the key log's
//! lines; out comes each direction's application data in plaintext.
//!
//! - [`keylog`]: the key log, read as it grows.
//! - [`keys`]: the suites handled, TLS 1.3's and TLS 1.2's key schedules, AEAD record
//!   protection; every primitive is ring's.
//! - [`handshake`]: the handshake messages decryption reads, bounded.
//! - [`conn`]: one connection's records, both directions, and the state between them.
//!
//! Handled: TLS 1.3 (AES-128/256-GCM, ChaCha20-Poly1305; HelloRetryRequest, KeyUpdate;
//! rejected early data passed over) and TLS 1.2 with ECDHE and an AEAD suite. Refused by
//! name: other versions and suites, renegotiation, accepted 0-RTT early data.

pub mod conn;
pub mod handshake;
pub mod keylog;
pub mod keys;
#[cfg(test)]
mod tests;

pub use conn::{Conn, Side, Status, Stop};
pub use keylog::KeyLog;
pub use keys::Version;

/// The fuzz target's body (`fuzz/fuzz_targets/tls_decrypt.rs`): a key log, then the two
/// directions' bytes interleaved as the input says, must never panic nor grow past the
/// bounds. Layout: the key log's length (2 bytes, big-endian), the key log, then chunks of
/// (side byte: even for the client, length byte, bytes). Returns the plaintext bytes out.
pub fn fuzz_decrypt(data: &[u8]) -> usize {
    let mut total = 0usize;
    let Some((k, rest)) = data.split_first_chunk::<2>() else {
        return total;
    };
    let (log, mut rest) = rest.split_at((u16::from_be_bytes(*k) as usize).min(rest.len()));
    let mut keys = KeyLog::new();
    keys.feed(log, true);
    let mut conn = Conn::new();
    while let [side, len, tail @ ..] = rest {
        let n = (*len as usize).min(tail.len());
        let side = if side & 1 == 0 {
            Side::Client
        } else {
            Side::Server
        };
        let r = conn.push(side, &tail[..n], &keys, &mut |_, p| total += p.len());
        assert!(conn.buffered() <= 2 * conn::MAX_BUFFER);
        if r.is_err() {
            return total;
        }
        rest = &tail[n..];
    }
    total
}

/// A fuzz input of [`fuzz_decrypt`]'s layout: `log`, then `flow` in chunks of at most 255.
pub fn fuzz_input(log: &str, flow: &[(Side, Vec<u8>)]) -> Vec<u8> {
    let mut data = (log.len() as u16).to_be_bytes().to_vec();
    data.extend_from_slice(log.as_bytes());
    for (side, bytes) in flow {
        for piece in bytes.chunks(255) {
            data.push(*side as u8);
            data.push(piece.len() as u8);
            data.extend_from_slice(piece);
        }
    }
    data
}
