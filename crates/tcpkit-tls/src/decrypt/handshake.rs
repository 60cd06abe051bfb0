//! The handshake messages decryption needs, cut out of a direction's handshake stream
//! (messages may span records and records may hold several): ClientHello's random and
//! whether it offers early data, ServerHello's version, suite and random (and whether it is a
//! HelloRetryRequest), EncryptedExtensions' early data answer, Finished and KeyUpdate. The
//! bodies of other messages (certificates, which may be long) are passed over unbuffered.

/// A kept message's body, at most (a ClientHello with post-quantum key shares is ~2 KB;
/// the protocol's own limit for one is 2^16).
pub const MAX_KEPT: usize = 1 << 16;

pub const CLIENT_HELLO: u8 = 1;
pub const SERVER_HELLO: u8 = 2;
pub const END_OF_EARLY_DATA: u8 = 5;
pub const ENCRYPTED_EXTENSIONS: u8 = 8;
pub const FINISHED: u8 = 20;
pub const KEY_UPDATE: u8 = 24;
const HELLO_REQUEST: u8 = 0;

const EXT_EARLY_DATA: u16 = 42;
const EXT_SUPPORTED_VERSIONS: u16 = 43;

/// SHA-256("HelloRetryRequest"), the random of a HelloRetryRequest (RFC 8446 4.1.3).
const HRR_RANDOM: [u8; 32] = [
    0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
    0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C,
];

/// One direction's handshake stream, cut into messages.
#[derive(Debug, Default)]
pub struct Reader {
    hdr: [u8; 4],
    hdr_len: usize,
    /// Body bytes still to come of the current message.
    left: usize,
    keep: bool,
    body: Vec<u8>,
}

/// A message decryption reads is longer than [`MAX_KEPT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLong;

/// A whole message: its type, and its body when it is one decryption reads.
#[derive(Debug)]
pub struct Msg {
    pub typ: u8,
    pub body: Vec<u8>,
}

fn kept(typ: u8) -> bool {
    matches!(
        typ,
        CLIENT_HELLO | SERVER_HELLO | ENCRYPTED_EXTENSIONS | KEY_UPDATE | HELLO_REQUEST
    )
}

impl Reader {
    /// Feeds a record's handshake bytes; whole messages go to `msgs`. Err: a message
    /// decryption reads is longer than [`MAX_KEPT`].
    pub fn feed(&mut self, mut data: &[u8], msgs: &mut Vec<Msg>) -> Result<(), TooLong> {
        while !data.is_empty() {
            if self.hdr_len < 4 {
                let n = (4 - self.hdr_len).min(data.len());
                self.hdr[self.hdr_len..self.hdr_len + n].copy_from_slice(&data[..n]);
                self.hdr_len += n;
                data = &data[n..];
                if self.hdr_len < 4 {
                    return Ok(());
                }
                self.left = u32::from_be_bytes([0, self.hdr[1], self.hdr[2], self.hdr[3]]) as usize;
                self.keep = kept(self.hdr[0]);
                if self.keep && self.left > MAX_KEPT {
                    return Err(TooLong);
                }
                self.body.clear();
            }
            let n = self.left.min(data.len());
            if self.keep {
                self.body.extend_from_slice(&data[..n]);
            }
            self.left -= n;
            data = &data[n..];
            if self.left == 0 {
                self.hdr_len = 0;
                msgs.push(Msg {
                    typ: self.hdr[0],
                    body: std::mem::take(&mut self.body),
                });
            }
        }
        Ok(())
    }

    /// A message is cut between records (a key change must not fall inside one).
    pub fn mid_message(&self) -> bool {
        self.hdr_len > 0
    }
}

/// A bounds-checked cursor over a message body.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()? as usize;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn random(&mut self) -> Option<[u8; 32]> {
        let mut r = [0u8; 32];
        r.copy_from_slice(self.take(32)?);
        Some(r)
    }
}

/// Extensions as (type, body), in order.
fn extensions(mut c: Cur<'_>) -> Option<Vec<(u16, &[u8])>> {
    if c.0.is_empty() {
        return Some(Vec::new());
    }
    let mut e = Cur(c.vec16()?);
    let mut out = Vec::new();
    while !e.0.is_empty() {
        let t = e.u16()?;
        out.push((t, e.vec16()?));
    }
    Some(out)
}

#[derive(Debug)]
pub struct ClientHello {
    pub random: [u8; 32],
    pub early_data: bool,
}

pub fn client_hello(body: &[u8]) -> Option<ClientHello> {
    let mut c = Cur(body);
    c.u16()?;
    let random = c.random()?;
    c.vec8()?; // session id
    c.vec16()?; // cipher suites
    c.vec8()?; // compression methods
    let early_data = extensions(c)?.iter().any(|(t, _)| *t == EXT_EARLY_DATA);
    Some(ClientHello { random, early_data })
}

#[derive(Debug)]
pub struct ServerHello {
    /// The version negotiated: supported_versions' when present, else legacy_version.
    pub version: u16,
    pub random: [u8; 32],
    pub suite: u16,
    pub retry: bool,
}

pub fn server_hello(body: &[u8]) -> Option<ServerHello> {
    let mut c = Cur(body);
    let legacy = c.u16()?;
    let random = c.random()?;
    c.vec8()?;
    let suite = c.u16()?;
    c.u8()?;
    let mut version = legacy;
    for (t, b) in extensions(c)? {
        if t == EXT_SUPPORTED_VERSIONS {
            version = Cur(b).u16()?;
        }
    }
    Some(ServerHello {
        version,
        random,
        suite,
        retry: random == HRR_RANDOM,
    })
}

/// Whether EncryptedExtensions accepts the client's early data.
pub fn accepts_early_data(body: &[u8]) -> Option<bool> {
    Some(
        extensions(Cur(body))?
            .iter()
            .any(|(t, _)| *t == EXT_EARLY_DATA),
    )
}

pub fn is_hello_request(typ: u8) -> bool {
    typ == HELLO_REQUEST
}
