//! The key copy and intercept share (`--auth-key-file`), and the challenge-response that
//! proves it on each control connection before intercept sends a single answer.
//!
//! copy's Hello carries a fresh nonce; intercept answers with its own nonce and its proof,
//! HMAC-SHA256(key, "tcpkit intercept proof" ‖ version ‖ max_payload ‖ copy's nonce ‖
//! intercept's nonce); copy checks it (a wrong key is told apart from a wrong peer) and answers
//! with its proof over the same fields under another label. Both nonces are new per
//! connection, so a recorded exchange proves nothing on the next; the labels keep one side's
//! proof from ever serving as the other's; `max_payload` is bound in, so a proof for a
//! headers-only copy cannot be replayed to ask for payload. Tags are compared in constant
//! time (`Mac::verify_slice`).
//!
//! The channel itself is not encrypted: what crosses it after the Welcome (the answers'
//! headers, and payload for `copy --diff`) is readable on the path. README's security
//! paragraph says how to keep it on a trusted path.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::control::{Msg, Nonce, Tag, VERSION};

pub use tcpkit_keyfile::{MAX_KEY_LEN, MIN_KEY_LEN};

const INTERCEPT_LABEL: &[u8] = b"tcpkit intercept proof\0";
const COPY_LABEL: &[u8] = b"tcpkit copy proof\0";

/// The shared key (the HMAC itself is tcpkit-keyfile's `proof`, which the fleet barrier
/// uses too). Its Debug form shows its length, never its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(tcpkit_keyfile::proof::Key);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a key file cannot be used. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("--auth-key-file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--auth-key-file {}: {why}", path.display())]
    Bad { path: PathBuf, why: String },
}

/// The fields both proofs cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchange {
    pub max_payload: u16,
    pub copy_nonce: Nonce,
    pub intercept_nonce: Nonce,
}

impl Exchange {
    fn fields(&self) -> [[u8; 2]; 2] {
        [VERSION.to_be_bytes(), self.max_payload.to_be_bytes()]
    }
}

impl Key {
    /// The key in `bytes` under tcpkit-keyfile's rules (trailing whitespace left out, at
    /// least [`MIN_KEY_LEN`] bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Key, String> {
        tcpkit_keyfile::proof::Key::from_bytes(bytes).map(Key)
    }

    /// Reads the key file under tcpkit-keyfile's rules (owner-only, at most [`MAX_KEY_LEN`]
    /// bytes), since whoever reads it reads the target's answers.
    pub fn from_file(path: &Path) -> Result<Key, KeyError> {
        tcpkit_keyfile::proof::Key::from_file(path)
            .map(Key)
            .map_err(|e| match e {
                tcpkit_keyfile::KeyFileError::Read(source) => KeyError::Read {
                    path: path.to_owned(),
                    source,
                },
                tcpkit_keyfile::KeyFileError::Bad(why) => KeyError::Bad {
                    path: path.to_owned(),
                    why,
                },
            })
    }

    fn proof(&self, label: &[u8], x: &Exchange) -> Tag {
        let [v, p] = x.fields();
        self.0
            .proof(label, &[&v, &p, &x.copy_nonce, &x.intercept_nonce])
    }

    fn verify(&self, label: &[u8], x: &Exchange, tag: &Tag) -> bool {
        let [v, p] = x.fields();
        self.0
            .verify(label, &[&v, &p, &x.copy_nonce, &x.intercept_nonce], tag)
    }

    /// intercept's proof, sent in its Challenge.
    pub fn intercept_proof(&self, x: &Exchange) -> Tag {
        self.proof(INTERCEPT_LABEL, x)
    }

    /// copy's proof, sent in its Proof.
    pub fn copy_proof(&self, x: &Exchange) -> Tag {
        self.proof(COPY_LABEL, x)
    }

    /// Whether `tag` is intercept's proof of this key (constant time).
    pub fn verify_intercept(&self, x: &Exchange, tag: &Tag) -> bool {
        self.verify(INTERCEPT_LABEL, x, tag)
    }

    /// Whether `tag` is copy's proof of this key (constant time).
    pub fn verify_copy(&self, x: &Exchange, tag: &Tag) -> bool {
        self.verify(COPY_LABEL, x, tag)
    }
}

/// A fresh nonce from the OS.
pub fn nonce() -> io::Result<Nonce> {
    tcpkit_keyfile::proof::nonce()
}

/// Why copy's side of the opening exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeError {
    /// intercept refused, with its reason.
    Refused(String),
    /// intercept asked for a proof and copy has no key.
    KeyWanted,
    /// copy has a key and intercept welcomed it without asking for one.
    NoKeyThere,
    /// intercept's proof is not of copy's key.
    KeyDiffers,
    /// A message that has no place in the exchange.
    Unexpected(String),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Refused(r) => write!(f, "refused this copy: {r}"),
            HandshakeError::KeyWanted => f.write_str(
                "asks copies for a key: give copy --auth-key-file with intercept's key file",
            ),
            HandshakeError::NoKeyThere => f.write_str(
                "does not authenticate copies (started without --auth-key-file) and this copy has a key: give intercept the same --auth-key-file",
            ),
            HandshakeError::KeyDiffers => {
                f.write_str("holds another key than this copy's --auth-key-file")
            }
            HandshakeError::Unexpected(m) => write!(f, "answered {m} during the opening exchange"),
        }
    }
}

/// copy's side of the opening exchange: Hello out, then each message intercept sends until
/// the Welcome. One implementation for the check at start and the event loop's reconnects.
#[derive(Debug, Clone)]
pub struct CopyHandshake {
    max_payload: u16,
    nonce: Nonce,
    proved: bool,
}

impl CopyHandshake {
    /// A new exchange (a fresh nonce) asking for `max_payload` bytes of each answer.
    pub fn new(max_payload: u16) -> io::Result<CopyHandshake> {
        Ok(CopyHandshake {
            max_payload,
            nonce: nonce()?,
            proved: false,
        })
    }

    /// Appends the Hello to `out`.
    pub fn hello(&self, out: &mut Vec<u8>) {
        Msg::Hello {
            version: VERSION,
            max_payload: self.max_payload,
            nonce: Some(self.nonce),
        }
        .emit(out);
    }

    /// Takes one message from intercept; appends what to answer to `out`. Ok(true) once
    /// welcomed: answers follow.
    pub fn on_msg(
        &mut self,
        key: Option<&Key>,
        m: &Msg<'_>,
        out: &mut Vec<u8>,
    ) -> Result<bool, HandshakeError> {
        match *m {
            Msg::Challenge { nonce, proof } if !self.proved => {
                let key = key.ok_or(HandshakeError::KeyWanted)?;
                let x = Exchange {
                    max_payload: self.max_payload,
                    copy_nonce: self.nonce,
                    intercept_nonce: nonce,
                };
                if !key.verify_intercept(&x, &proof) {
                    return Err(HandshakeError::KeyDiffers);
                }
                Msg::Proof {
                    tag: key.copy_proof(&x),
                }
                .emit(out);
                self.proved = true;
                Ok(false)
            }
            Msg::Welcome { version } if version == VERSION => {
                if key.is_some() && !self.proved {
                    return Err(HandshakeError::NoKeyThere);
                }
                Ok(true)
            }
            Msg::Refuse { reason, .. } => Err(HandshakeError::Refused(reason.to_string())),
            ref other => Err(HandshakeError::Unexpected(format!("{other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::NONCE_LEN;

    fn key(b: &[u8]) -> Key {
        Key::from_bytes(b).unwrap()
    }

    /// intercept's side as the event loop runs it, for the exchange tests.
    fn intercept_answer(key: Option<&Key>, hello: &[u8], inonce: Nonce) -> (Vec<u8>, Exchange) {
        let (m, _) = Msg::parse(hello).unwrap();
        let Msg::Hello {
            max_payload,
            nonce: Some(cn),
            ..
        } = m
        else {
            panic!("{m:?}")
        };
        let x = Exchange {
            max_payload,
            copy_nonce: cn,
            intercept_nonce: inonce,
        };
        let mut out = Vec::new();
        match key {
            Some(k) => Msg::Challenge {
                nonce: inonce,
                proof: k.intercept_proof(&x),
            }
            .emit(&mut out),
            None => Msg::Welcome { version: VERSION }.emit(&mut out),
        }
        (out, x)
    }

    #[test]
    fn the_same_key_on_both_sides_is_welcomed_and_each_proof_checks() {
        let k = key(b"0123456789abcdef0123\n");
        let mut c = CopyHandshake::new(1500).unwrap();
        let mut hello = Vec::new();
        c.hello(&mut hello);
        let (challenge, x) = intercept_answer(Some(&k), &hello, [7; NONCE_LEN]);
        let mut out = Vec::new();
        let (m, _) = Msg::parse(&challenge).unwrap();
        assert_eq!(c.on_msg(Some(&k), &m, &mut out), Ok(false));
        let (Msg::Proof { tag }, _) = Msg::parse(&out).unwrap() else {
            panic!()
        };
        assert!(k.verify_copy(&x, &tag));
        // The other side's proof, another max_payload, another nonce: none verifies.
        assert!(!k.verify_intercept(&x, &tag));
        assert!(!k.verify_copy(
            &Exchange {
                max_payload: 0,
                ..x
            },
            &tag
        ));
        assert!(!k.verify_copy(
            &Exchange {
                intercept_nonce: [8; NONCE_LEN],
                ..x
            },
            &tag
        ));
        let mut none = Vec::new();
        let w = Msg::Welcome { version: VERSION };
        assert_eq!(c.on_msg(Some(&k), &w, &mut none), Ok(true));
        assert!(none.is_empty());
    }

    #[test]
    fn each_mismatch_is_named() {
        let k = key(b"0123456789abcdef");
        let other = key(b"0123456789abcdeF");
        let mut hello = Vec::new();
        let c = CopyHandshake::new(0).unwrap();
        c.hello(&mut hello);
        let (challenge, _) = intercept_answer(Some(&k), &hello, [1; NONCE_LEN]);
        let (m, _) = Msg::parse(&challenge).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            c.clone().on_msg(Some(&other), &m, &mut out),
            Err(HandshakeError::KeyDiffers)
        );
        assert_eq!(
            c.clone().on_msg(None, &m, &mut out),
            Err(HandshakeError::KeyWanted)
        );
        assert!(out.is_empty(), "no proof is sent for a key that differs");
        let w = Msg::Welcome { version: VERSION };
        assert_eq!(
            c.clone().on_msg(Some(&k), &w, &mut out),
            Err(HandshakeError::NoKeyThere)
        );
        assert_eq!(c.clone().on_msg(None, &w, &mut out), Ok(true));
        assert!(matches!(
            c.clone().on_msg(None, &Msg::Ping, &mut out),
            Err(HandshakeError::Unexpected(_))
        ));
        // A second challenge after proving is out of place.
        let mut c2 = c.clone();
        c2.on_msg(Some(&k), &m, &mut out).unwrap();
        assert!(matches!(
            c2.on_msg(Some(&k), &m, &mut out),
            Err(HandshakeError::Unexpected(_))
        ));
    }

    #[test]
    fn the_proof_is_the_one_copy_always_sent() {
        // HMAC-SHA256(key, label ‖ version ‖ max_payload ‖ nonces), as before the HMAC moved
        // down into tcpkit-keyfile: an older intercept still verifies a newer copy.
        let k = key(b"0123456789abcdef");
        let x = Exchange {
            max_payload: 0x0102,
            copy_nonce: [3; NONCE_LEN],
            intercept_nonce: [4; NONCE_LEN],
        };
        let mut msg = COPY_LABEL.to_vec();
        msg.extend_from_slice(&VERSION.to_be_bytes());
        msg.extend_from_slice(&[1, 2]);
        msg.extend_from_slice(&[3; NONCE_LEN]);
        msg.extend_from_slice(&[4; NONCE_LEN]);
        let whole = tcpkit_keyfile::proof::Key::from_bytes(b"0123456789abcdef").unwrap();
        assert_eq!(k.copy_proof(&x), whole.proof(&msg, &[]));
    }

    #[test]
    fn nonces_differ_per_exchange() {
        let a = CopyHandshake::new(0).unwrap();
        let b = CopyHandshake::new(0).unwrap();
        assert_ne!(a.nonce, b.nonce);
    }

    #[test]
    fn key_files_are_checked_and_named() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        let write = |bytes: &[u8], mode: u32| {
            std::fs::write(&p, bytes).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(b"0123456789abcdef\r\n \n", 0o600);
        assert_eq!(Key::from_file(&p).unwrap(), key(b"0123456789abcdef"));
        let err = |p: &Path| Key::from_file(p).unwrap_err().to_string();
        write(b"0123456789abcdef", 0o644);
        let e = err(&p);
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        write(b"short\n", 0o600);
        let e = err(&p);
        assert!(
            e.starts_with("--auth-key-file ") && e.contains("5 bytes"),
            "{e}"
        );
        write(&vec![b'x'; MAX_KEY_LEN + 1], 0o400);
        assert!(err(&p).contains("not a key file"));
        let e = Key::from_file(&d.path().join("absent")).unwrap_err();
        assert!(matches!(e, KeyError::Read { .. }));
        assert!(err(d.path()).contains("not a regular file"));
        assert_eq!(format!("{:?}", key(b"0123456789abcdef")), "Key(16 bytes)");
    }
}
