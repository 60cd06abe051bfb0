//! The cipher suites the decryption knows, their key schedules (TLS 1.3's HKDF-Expand-Label,
//! RFC 8446 7.1/7.3; TLS 1.2's PRF and key block, RFC 5246 5 and 6.3) and the AEAD record
//! protection (nonces and additional data of RFC 8446 5.2-5.3, RFC 5288 3 and RFC 7905 2).
//! Every primitive is ring's; only the glue between them is ours.

use ring::{aead, hkdf, hmac};

/// A protocol version the decryption handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Tls12,
    Tls13,
}

impl Version {
    /// The name tshark and the report use.
    pub fn name(self) -> &'static str {
        match self {
            Version::Tls12 => "TLSv1.2",
            Version::Tls13 => "TLSv1.3",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha384,
}

impl Hash {
    pub fn out_len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
        }
    }
    fn hkdf(self) -> hkdf::Algorithm {
        match self {
            Hash::Sha256 => hkdf::HKDF_SHA256,
            Hash::Sha384 => hkdf::HKDF_SHA384,
        }
    }
    fn hmac(self) -> hmac::Algorithm {
        match self {
            Hash::Sha256 => hmac::HMAC_SHA256,
            Hash::Sha384 => hmac::HMAC_SHA384,
        }
    }
}

/// A cipher suite this decryption handles.
#[derive(Debug, PartialEq, Eq)]
pub struct Suite {
    pub id: u16,
    /// The IANA name.
    pub name: &'static str,
    pub version: Version,
    pub cipher: Cipher,
    pub hash: Hash,
}

const fn s(id: u16, name: &'static str, version: Version, cipher: Cipher, hash: Hash) -> Suite {
    Suite {
        id,
        name,
        version,
        cipher,
        hash,
    }
}

use Cipher::{Aes128Gcm, Aes256Gcm, Chacha20Poly1305};
use Hash::{Sha256, Sha384};
use Version::{Tls12, Tls13};

/// TLS 1.3's AEAD suites (CCM is left out: ring has none and servers do not offer it), and
/// TLS 1.2's ECDHE suites with an AEAD, the ones servers negotiate today.
pub static SUITES: &[Suite] = &[
    s(0x1301, "TLS_AES_128_GCM_SHA256", Tls13, Aes128Gcm, Sha256),
    s(0x1302, "TLS_AES_256_GCM_SHA384", Tls13, Aes256Gcm, Sha384),
    s(
        0x1303,
        "TLS_CHACHA20_POLY1305_SHA256",
        Tls13,
        Chacha20Poly1305,
        Sha256,
    ),
    s(
        0xC02B,
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        Tls12,
        Aes128Gcm,
        Sha256,
    ),
    s(
        0xC02C,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        Tls12,
        Aes256Gcm,
        Sha384,
    ),
    s(
        0xC02F,
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        Tls12,
        Aes128Gcm,
        Sha256,
    ),
    s(
        0xC030,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        Tls12,
        Aes256Gcm,
        Sha384,
    ),
    s(
        0xCCA8,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        Tls12,
        Chacha20Poly1305,
        Sha256,
    ),
    s(
        0xCCA9,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        Tls12,
        Chacha20Poly1305,
        Sha256,
    ),
];

/// The suite `id` negotiated in `version`, if this decryption handles it.
pub fn suite(version: Version, id: u16) -> Option<&'static Suite> {
    SUITES.iter().find(|s| s.id == id && s.version == version)
}

/// The IANA name of suites servers still negotiate that this decryption does not handle
/// (so the report names what it refused), else the suite's number.
pub fn unsupported_name(id: u16) -> String {
    let name = match id {
        0x002F => "TLS_RSA_WITH_AES_128_CBC_SHA",
        0x0035 => "TLS_RSA_WITH_AES_256_CBC_SHA",
        0x003C => "TLS_RSA_WITH_AES_128_CBC_SHA256",
        0x003D => "TLS_RSA_WITH_AES_256_CBC_SHA256",
        0x000A => "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
        0x009C => "TLS_RSA_WITH_AES_128_GCM_SHA256",
        0x009D => "TLS_RSA_WITH_AES_256_GCM_SHA384",
        0x009E => "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256",
        0x009F => "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384",
        0x0033 => "TLS_DHE_RSA_WITH_AES_128_CBC_SHA",
        0x0039 => "TLS_DHE_RSA_WITH_AES_256_CBC_SHA",
        0xC009 => "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
        0xC00A => "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
        0xC013 => "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
        0xC014 => "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
        0xC023 => "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
        0xC024 => "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384",
        0xC027 => "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
        0xC028 => "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384",
        0xCCAA => "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        0x1304 => "TLS_AES_128_CCM_SHA256",
        0x1305 => "TLS_AES_128_CCM_8_SHA256",
        _ => return format!("cipher suite 0x{id:04X}"),
    };
    name.to_string()
}

#[derive(Debug)]
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label(secret, label, "", out.len()) of RFC 8446 7.1.
pub fn expand_label(hash: Hash, secret: &[u8], label: &[u8], out: &mut [u8]) {
    expand_label_ctx(hash, secret, label, &[], out);
}

/// HKDF-Expand-Label(secret, label, context, out.len()) of RFC 8446 7.1 (`context` a
/// transcript hash, at most 255 bytes).
pub fn expand_label_ctx(hash: Hash, secret: &[u8], label: &[u8], context: &[u8], out: &mut [u8]) {
    let prk = hkdf::Prk::new_less_safe(hash.hkdf(), secret);
    // Every output here is a key, an IV or a secret: at most 48 bytes, far under HKDF's
    // 255 * hash length, so expand cannot fail; the labels are ours and short.
    let len = (out.len() as u16).to_be_bytes();
    let label_len = [(6 + label.len()) as u8];
    let context = &context[..context.len().min(255)];
    let context_len = [context.len() as u8];
    let info: [&[u8]; 6] = [&len, &label_len, b"tls13 ", label, &context_len, context];
    let filled = prk
        .expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out));
    debug_assert!(filled.is_ok());
}

/// TLS 1.2's PRF (RFC 5246 5): P_hash(secret, label + seed) filling `out`.
pub fn prf(hash: Hash, secret: &[u8], label: &[u8], seed: &[&[u8]], out: &mut [u8]) {
    let key = hmac::Key::new(hash.hmac(), secret);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(label);
    seed.iter().for_each(|s| ctx.update(s));
    let mut a = ctx.sign();
    for chunk in out.chunks_mut(hash.out_len()) {
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(a.as_ref());
        ctx.update(label);
        seed.iter().for_each(|s| ctx.update(s));
        let t = ctx.sign();
        chunk.copy_from_slice(&t.as_ref()[..chunk.len()]);
        a = hmac::sign(&key, a.as_ref());
    }
}

/// How a record's nonce is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nonces {
    /// The IV XOR the sequence number (TLS 1.3, and TLS 1.2 ChaCha20-Poly1305).
    Xor,
    /// The 4-byte implicit salt and the record's 8-byte explicit nonce (TLS 1.2 AES-GCM).
    Explicit,
}

/// One direction's record protection: its key, IV and sequence number.
#[derive(Debug)]
pub struct RecordKeys {
    key: aead::LessSafeKey,
    iv: [u8; 12],
    nonces: Nonces,
    version: Version,
    seq: u64,
}

/// Why a record did not decrypt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unprotect {
    /// Too short to hold the nonce and tag.
    Short,
    /// The tag did not verify: wrong keys, or the bytes were changed.
    BadMac,
    /// TLS 1.3: the plaintext is all padding (no content type).
    NoType,
}

fn unbound(cipher: Cipher, key: &[u8]) -> Option<aead::LessSafeKey> {
    let alg = match cipher {
        Aes128Gcm => &aead::AES_128_GCM,
        Aes256Gcm => &aead::AES_256_GCM,
        Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
    };
    aead::UnboundKey::new(alg, key)
        .ok()
        .map(aead::LessSafeKey::new)
}

fn key_len(cipher: Cipher) -> usize {
    match cipher {
        Aes128Gcm => 16,
        Aes256Gcm | Chacha20Poly1305 => 32,
    }
}

const TAG: usize = 16;

impl RecordKeys {
    /// TLS 1.3: a direction's keys from its traffic secret (RFC 8446 7.3).
    pub fn tls13(suite: &Suite, secret: &[u8]) -> Option<RecordKeys> {
        let mut key = [0u8; 32];
        let key = &mut key[..key_len(suite.cipher)];
        expand_label(suite.hash, secret, b"key", key);
        let mut iv = [0u8; 12];
        expand_label(suite.hash, secret, b"iv", &mut iv);
        Some(RecordKeys {
            key: unbound(suite.cipher, key)?,
            iv,
            nonces: Nonces::Xor,
            version: Version::Tls13,
            seq: 0,
        })
    }

    /// TLS 1.2: both directions' keys (client's, server's) from the master secret and the
    /// hellos' randoms (RFC 5246 6.3; AEAD suites have no MAC keys).
    pub fn tls12(
        suite: &Suite,
        master: &[u8],
        client_random: &[u8; 32],
        server_random: &[u8; 32],
    ) -> Option<(RecordKeys, RecordKeys)> {
        let kl = key_len(suite.cipher);
        let (ivl, nonces) = match suite.cipher {
            Chacha20Poly1305 => (12, Nonces::Xor),
            Aes128Gcm | Aes256Gcm => (4, Nonces::Explicit),
        };
        let mut block = [0u8; 2 * 32 + 2 * 12];
        let block = &mut block[..2 * (kl + ivl)];
        prf(
            suite.hash,
            master,
            b"key expansion",
            &[server_random, client_random],
            block,
        );
        let (ck, rest) = block.split_at(kl);
        let (sk, rest) = rest.split_at(kl);
        let (civ, siv) = rest.split_at(ivl);
        let mk = |k: &[u8], iv: &[u8]| {
            let mut full = [0u8; 12];
            full[..iv.len()].copy_from_slice(iv);
            Some(RecordKeys {
                key: unbound(suite.cipher, k)?,
                iv: full,
                nonces,
                version: Version::Tls12,
                seq: 0,
            })
        };
        Some((mk(ck, civ)?, mk(sk, siv)?))
    }

    /// Decrypts one record in place: `header` is its 5-byte header, `payload` its fragment.
    /// Returns the content type and where the plaintext is in `payload`. The sequence number
    /// moves on only when the record authenticated.
    pub fn open(
        &mut self,
        header: [u8; 5],
        payload: &mut [u8],
    ) -> Result<(u8, std::ops::Range<usize>), Unprotect> {
        let mut nonce = self.iv;
        let explicit = match self.nonces {
            Nonces::Xor => 0,
            Nonces::Explicit => 8,
        };
        if payload.len() < explicit + TAG {
            return Err(Unprotect::Short);
        }
        match self.nonces {
            Nonces::Xor => {
                for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
                    *n ^= s;
                }
            }
            Nonces::Explicit => nonce[4..].copy_from_slice(&payload[..8]),
        }
        let plain_len = payload.len() - explicit - TAG;
        let mut aad_buf = [0u8; 13];
        let aad: &[u8] = match self.version {
            Version::Tls13 => &header,
            Version::Tls12 => {
                aad_buf[..8].copy_from_slice(&self.seq.to_be_bytes());
                aad_buf[8..11].copy_from_slice(&header[..3]);
                aad_buf[11..].copy_from_slice(&(plain_len as u16).to_be_bytes());
                &aad_buf
            }
        };
        let plain = self
            .key
            .open_in_place(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(aad),
                &mut payload[explicit..],
            )
            .map_err(|_| Unprotect::BadMac)?;
        let n = plain.len();
        self.seq += 1;
        match self.version {
            Version::Tls12 => Ok((header[0], explicit..explicit + n)),
            Version::Tls13 => {
                // TLSInnerPlaintext: content, the real type, then zero padding.
                let end = plain
                    .iter()
                    .rposition(|&b| b != 0)
                    .ok_or(Unprotect::NoType)?;
                Ok((plain[end], 0..end))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn tls13_traffic_keys_match_rfc8448() {
        // RFC 8448 3, "Simple 1-RTT Handshake": the server's handshake traffic secret and the
        // key and IV it derives.
        let secret = hex("b6 7b 7d 69 0c c1 6c 4e 75 e5 42 13 cb 2d 37 b4 e9 c9 12 bc de d9 10 5d 42 be fd 59 d3 91 ad 38");
        let mut key = [0u8; 16];
        expand_label(Hash::Sha256, &secret, b"key", &mut key);
        assert_eq!(
            key.to_vec(),
            hex("3f ce 51 60 09 c2 17 27 d0 f2 e4 e8 6e e4 03 bc")
        );
        let mut iv = [0u8; 12];
        expand_label(Hash::Sha256, &secret, b"iv", &mut iv);
        assert_eq!(iv.to_vec(), hex("5d 31 3e b2 67 12 76 ee 13 00 0b 30"));
    }

    #[test]
    fn tls12_prf_matches_the_known_sha256_vector() {
        // The TLS 1.2 PRF-SHA256 test vector (IETF TLS WG, as used by Go's and NSS's tests).
        let secret = hex("9b be 43 6b a9 40 f0 17 b1 76 52 84 9a 71 db 35");
        let seed = hex("a0 ba 9f 93 6c da 31 18 27 a6 f7 96 ff d5 19 8c");
        let mut out = [0u8; 100];
        prf(Hash::Sha256, &secret, b"test label", &[&seed], &mut out);
        assert_eq!(
            out.to_vec(),
            hex("e3 f2 29 ba 72 7b e1 7b 8d 12 26 20 55 7c d4 53 c2 aa b2 1d 07 c3 d4 95 32 9b 52 d4 e6 1e db 5a 6b 30 17 91 e9 0d 35 c9 c9 a4 6b 4e 14 ba f9 af 0f a0 22 f7 07 7d ef 17 ab fd 37 97 c0 56 4b ab 4f bc 91 66 6e 9d ef 9b 97 fc e3 4f 79 67 89 ba a4 80 82 d1 22 ee 42 c5 a7 2e 5a 51 10 ff f7 01 87 34 7b 66")
        );
    }
}
