//! Proving a shared key without sending it: HMAC-SHA256 over a label and the exchange's
//! fields, with nonces from the OS. Written once for every channel that authenticates its
//! peers this way (copy ↔ intercept's control channel, the fleet barrier ↔ its agents); each
//! channel chooses its labels (so one side's proof never serves as the other's, and one
//! channel's proof never serves on another) and which fields the proof binds. Tags are
//! checked in constant time (`Mac::verify_slice`).

use std::fmt;
use std::io;
use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::KeyFileError;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof (HMAC-SHA256).
pub const TAG_LEN: usize = 32;
/// A nonce: new per exchange, so a recorded exchange proves nothing on the next.
pub type Nonce = [u8; NONCE_LEN];
/// A proof.
pub type Tag = [u8; TAG_LEN];

/// The shared key. Its Debug form shows its length, never its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Vec<u8>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

impl Key {
    /// The key in `bytes` under the key-file rules (trailing whitespace left out, at least
    /// [`crate::MIN_KEY_LEN`] bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Key, String> {
        crate::key_bytes(bytes).map(|k| Key(k.to_vec()))
    }

    /// Reads the key file at `path` under the key-file rules ([`crate::read`]).
    pub fn from_file(path: &Path) -> Result<Key, KeyFileError> {
        crate::read(path).map(Key)
    }

    fn mac(&self, label: &[u8], fields: &[&[u8]]) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("any key length");
        m.update(label);
        for f in fields {
            m.update(f);
        }
        m
    }

    /// The proof of this key over `label` and `fields`, in order (their bytes concatenated:
    /// fixed-size fields, or each variable one preceded by its length).
    pub fn proof(&self, label: &[u8], fields: &[&[u8]]) -> Tag {
        self.mac(label, fields).finalize().into_bytes().into()
    }

    /// Whether `tag` is [`Key::proof`] of this key over the same label and fields (constant
    /// time).
    pub fn verify(&self, label: &[u8], fields: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(label, fields).verify_slice(tag).is_ok()
    }
}

/// A fresh nonce from the OS.
pub fn nonce() -> io::Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| io::Error::other(format!("getrandom: {e}")))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_binds_key_label_and_every_field() {
        let k = Key::from_bytes(b"0123456789abcdef\n").unwrap();
        let other = Key::from_bytes(b"0123456789abcdeF").unwrap();
        let t = k.proof(b"a\0", &[b"xy", &[1, 2]]);
        assert!(k.verify(b"a\0", &[b"xy", &[1, 2]], &t));
        // The same bytes split otherwise are the same message: callers keep fields fixed-size.
        assert!(k.verify(b"a\0", &[b"xy\x01\x02"], &t));
        assert!(!other.verify(b"a\0", &[b"xy", &[1, 2]], &t));
        assert!(!k.verify(b"b\0", &[b"xy", &[1, 2]], &t));
        assert!(!k.verify(b"a\0", &[b"xy", &[1, 3]], &t));
        assert!(!k.verify(b"a\0", &[b"xy", &[1, 2]], &t[..31]));
        assert_eq!(format!("{k:?}"), "Key(16 bytes)");
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
