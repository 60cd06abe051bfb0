//! The NSS key log (the `SSLKEYLOGFILE` format curl, Firefox, Chrome and OpenSSL's keylog
//! callback write): `LABEL <client random, hex> <secret, hex>` lines, read as they come, so a
//! file that grows while it is read (a client still running) is fed piece by piece and a line
//! cut at the end of one read is finished by the next.
//!
//! Bounded: a line longer than any the format has is bad and skipped to its newline; at most
//! [`MAX_RANDOMS`] client randoms are held, the oldest forgotten first.

use std::collections::{HashMap, VecDeque};

/// Which secret of a session a line gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// TLS 1.2 (and older): the master secret.
    ClientRandom,
    ClientHandshake,
    ServerHandshake,
    ClientTraffic0,
    ServerTraffic0,
    ClientEarly,
}

const LABELS: [(&str, Label); 6] = [
    ("CLIENT_RANDOM", Label::ClientRandom),
    ("CLIENT_HANDSHAKE_TRAFFIC_SECRET", Label::ClientHandshake),
    ("SERVER_HANDSHAKE_TRAFFIC_SECRET", Label::ServerHandshake),
    ("CLIENT_TRAFFIC_SECRET_0", Label::ClientTraffic0),
    ("SERVER_TRAFFIC_SECRET_0", Label::ServerTraffic0),
    ("CLIENT_EARLY_TRAFFIC_SECRET", Label::ClientEarly),
];

/// Labels the format has that decryption does not use (read, not counted bad).
const OTHER_LABELS: [&str; 2] = ["EXPORTER_SECRET", "RSA"];

/// The longest line the format has: the longest label, 64 hex digits of random, 96 of a
/// SHA-384 secret (an RSA line's 512-byte pre-master key is longer and is skipped as bad).
pub const MAX_LINE: usize = 256;
/// Client randoms held at most (about 300 bytes each).
pub const MAX_RANDOMS: usize = 1 << 20;

type Secret = ([u8; 48], u8);

/// The secrets read so far, by client random.
#[derive(Debug, Default)]
pub struct KeyLog {
    by_random: HashMap<[u8; 32], [Secret; 6]>,
    order: VecDeque<[u8; 32]>,
    /// The start of a line the last feed cut (never over MAX_LINE).
    partial: Vec<u8>,
    /// The current line is over MAX_LINE: skip to its newline.
    skipping: bool,
    pub lines: u64,
    pub bad_lines: u64,
    /// Secrets read (a line repeating one already held counts again).
    pub secrets: u64,
}

fn unhex(s: &[u8], out: &mut [u8]) -> bool {
    if s.len() != 2 * out.len() {
        return false;
    }
    let d = |c: u8| (c as char).to_digit(16);
    for (o, p) in out.iter_mut().zip(s.chunks_exact(2)) {
        match (d(p[0]), d(p[1])) {
            (Some(h), Some(l)) => *o = (h * 16 + l) as u8,
            _ => return false,
        }
    }
    true
}

impl KeyLog {
    pub fn new() -> KeyLog {
        KeyLog::default()
    }

    /// The secret `label` of the session whose ClientHello carried `random`.
    pub fn get(&self, label: Label, random: &[u8; 32]) -> Option<&[u8]> {
        let (s, n) = self.by_random.get(random)?.get(label as usize)?;
        (*n > 0).then(|| &s[..*n as usize])
    }

    /// Client randoms held.
    pub fn len(&self) -> usize {
        self.by_random.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_random.is_empty()
    }

    /// The next bytes of the file. A line is taken once its newline is in; `end` says the
    /// file ended (its last line may have none).
    pub fn feed(&mut self, mut bytes: &[u8], end: bool) {
        while !bytes.is_empty() {
            let nl = bytes.iter().position(|&b| b == b'\n');
            let (piece, rest) = match nl {
                Some(i) => (&bytes[..i], &bytes[i + 1..]),
                None => (bytes, &[][..]),
            };
            bytes = rest;
            if !self.skipping && self.partial.len() + piece.len() > MAX_LINE {
                self.skipping = true;
                self.partial.clear();
            }
            if !self.skipping {
                self.partial.extend_from_slice(piece);
            }
            if nl.is_some() {
                self.end_line();
            }
        }
        if end && (!self.partial.is_empty() || self.skipping) {
            self.end_line();
        }
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.partial);
        if std::mem::take(&mut self.skipping) {
            self.lines += 1;
            self.bad_lines += 1;
            return;
        }
        let text = line.strip_suffix(b"\r").unwrap_or(&line);
        if text.iter().all(u8::is_ascii_whitespace) {
            self.partial = line;
            self.partial.clear();
            return;
        }
        self.lines += 1;
        if text.first() == Some(&b'#') {
            return;
        }
        if !self.line(text) {
            self.bad_lines += 1;
        }
        // The buffer's allocation serves the next line.
        self.partial = line;
        self.partial.clear();
    }

    fn line(&mut self, text: &[u8]) -> bool {
        let mut f = text.split(|&b| b == b' ').filter(|f| !f.is_empty());
        let (Some(label), Some(random), Some(secret), None) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        let Some(&(_, label)) = LABELS.iter().find(|(n, _)| n.as_bytes() == label) else {
            return OTHER_LABELS.iter().any(|n| n.as_bytes() == label);
        };
        let mut r = [0u8; 32];
        if !unhex(random, &mut r) {
            return false;
        }
        let n = secret.len() / 2;
        let valid = match label {
            Label::ClientRandom => n == 48,
            _ => n == 32 || n == 48,
        };
        let mut s = [0u8; 48];
        if !valid || !unhex(secret, &mut s[..n]) {
            return false;
        }
        if !self.by_random.contains_key(&r) {
            if self.order.len() >= MAX_RANDOMS {
                if let Some(old) = self.order.pop_front() {
                    self.by_random.remove(&old);
                }
            }
            self.order.push_back(r);
        }
        let e = self.by_random.entry(r).or_insert([([0u8; 48], 0); 6]);
        e[label as usize] = (s, n as u8);
        self.secrets += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: &str = "aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899";

    #[test]
    fn lines_are_read_across_feeds_and_bad_ones_counted() {
        let mut k = KeyLog::new();
        let secret = "11".repeat(48);
        let line = format!("# comment\nCLIENT_RANDOM {R} {secret}\nSERVER_TRAFFIC_SECRET_0 {R} ");
        k.feed(line.as_bytes(), false);
        assert_eq!(k.secrets, 1);
        let mut r = [0u8; 32];
        assert!(unhex(R.as_bytes(), &mut r));
        assert_eq!(k.get(Label::ClientRandom, &r), Some(&[0x11u8; 48][..]));
        assert_eq!(k.get(Label::ServerTraffic0, &r), None);
        // The cut line is finished by the next read.
        k.feed(format!("{}\r\n", "22".repeat(32)).as_bytes(), false);
        assert_eq!(k.get(Label::ServerTraffic0, &r), Some(&[0x22u8; 32][..]));
        k.feed(b"CLIENT_RANDOM zz 11\nEXPORTER_SECRET x y\n", false);
        k.feed(&[b'A'; 1000], false);
        k.feed(b"\nCLIENT_RANDOM 00", true);
        assert_eq!((k.lines, k.bad_lines, k.secrets), (7, 3, 2));
    }
}
