//! One TLS connection as a capture shows it, both directions, sans-IO: its bytes in (each
//! direction in order, as reassembled), its application data out in plaintext. The records
//! are cut out and decrypted with the keys the key log's secrets give once the hellos have
//! said the version, the suite and the randoms.
//!
//! What it follows: TLS 1.3 (handshake traffic keys for the encrypted handshake, application
//! traffic keys after each side's Finished, KeyUpdate, HelloRetryRequest, middlebox
//! ChangeCipherSpec; early data the server rejected is passed over as the server passes over
//! it, early data it accepted stops the connection as unsupported) and TLS 1.2 (keys from the
//! master secret after each side's ChangeCipherSpec; renegotiation stops it as unsupported).
//! Every length is bounded before anything is kept: a record at most [`MAX_RECORD`], a kept
//! handshake message at most [`super::handshake::MAX_KEPT`], a direction's unread bytes at
//! most [`MAX_BUFFER`].

use super::handshake::{self as hs, Msg, Reader};
use super::keylog::{KeyLog, Label};
use super::keys::{self, RecordKeys, Suite, Unprotect, Version};

/// A record's fragment at most, encrypted (RFC 8446 5.2: 2^14 + 256).
pub const MAX_RECORD: usize = (1 << 14) + 256;
/// A direction's bytes not yet decrypted at most: a record being completed, or client bytes
/// (early data) waiting for the server's hello.
pub const MAX_BUFFER: usize = 256 << 10;
/// Records of rejected early data passed over at most.
const MAX_SKIPPED_EARLY: u32 = 1024;
const HEADER: usize = 5;

const CHANGE_CIPHER_SPEC: u8 = 20;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

/// The sender of some bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    fn i(self) -> usize {
        self as usize
    }
    fn other(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// Why a connection is no longer decrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Its first bytes are not a TLS handshake.
    NotTls,
    /// A version, suite or feature this decryption does not handle, by name.
    Unsupported(String),
    /// A record did not authenticate, or the protocol went wrong past the hellos.
    Failed(&'static str),
}

/// What a [`Conn`] waits for after a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Running,
    /// A secret the key log does not hold (yet): push again (with no bytes) once it may.
    NeedSecret,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the keys: plaintext hellos.
    Plain,
    /// TLS 1.3: the handshake traffic keys.
    Handshake,
    /// TLS 1.3: the application traffic keys (TLS 1.2 stays in Plain and uses `ccs`).
    App,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    /// The next record is not all in.
    Incomplete,
    /// The peer's hello must be read first.
    NeedPeer,
    NeedSecret,
}

#[derive(Debug)]
struct Half {
    buf: Vec<u8>,
    phase: Phase,
    /// TLS 1.2: ChangeCipherSpec seen, the records after it are encrypted.
    ccs: bool,
    keys: Option<RecordKeys>,
    /// TLS 1.3: the traffic secret `keys` come from (KeyUpdate derives the next).
    secret: Option<Vec<u8>>,
    hs: Reader,
    records: u64,
}

impl Half {
    fn new() -> Half {
        Half {
            buf: Vec::new(),
            phase: Phase::Plain,
            ccs: false,
            keys: None,
            secret: None,
            hs: Reader::default(),
            records: 0,
        }
    }
}

/// One connection's decryption state.
#[derive(Debug)]
pub struct Conn {
    halves: [Half; 2],
    client_random: Option<[u8; 32]>,
    server_random: [u8; 32],
    suite: Option<&'static Suite>,
    early_offered: bool,
    early_accepted: Option<bool>,
    retried: bool,
    authenticated: bool,
    skipped_early: u32,
    stop: Option<Stop>,
    msgs: Vec<Msg>,
}

impl Default for Conn {
    fn default() -> Conn {
        Conn::new()
    }
}

fn failed(reason: &'static str) -> Stop {
    Stop::Failed(reason)
}

impl Conn {
    pub fn new() -> Conn {
        Conn {
            halves: [Half::new(), Half::new()],
            client_random: None,
            server_random: [0; 32],
            suite: None,
            early_offered: false,
            early_accepted: None,
            retried: false,
            authenticated: false,
            skipped_early: 0,
            stop: None,
            msgs: Vec::new(),
        }
    }

    /// The negotiated suite (its version with it), once the ServerHello was read.
    pub fn suite(&self) -> Option<&'static Suite> {
        self.suite
    }

    /// A record decrypted and authenticated: the key log's secrets are this connection's.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// The ClientHello was read.
    pub fn hello_seen(&self) -> bool {
        self.client_random.is_some()
    }

    /// Bytes held undecrypted.
    pub fn buffered(&self) -> usize {
        self.halves.iter().map(|h| h.buf.len()).sum()
    }

    /// Why the connection stopped, if it did.
    pub fn stopped(&self) -> Option<&Stop> {
        self.stop.as_ref()
    }

    /// The next bytes `side` sent (in order, none lost); the application data they complete
    /// go to `out` in plaintext, with their sender. `keys` is looked up when a secret is
    /// needed; [`Status::NeedSecret`] when it lacks one, and then nothing is lost: push again.
    pub fn push(
        &mut self,
        side: Side,
        data: &[u8],
        keys: &KeyLog,
        out: &mut dyn FnMut(Side, &[u8]),
    ) -> Result<Status, Stop> {
        if let Some(s) = &self.stop {
            return Err(s.clone());
        }
        let r = self.run(side, data, keys, out);
        if let Err(e) = &r {
            self.stop = Some(e.clone());
            self.halves.iter_mut().for_each(|h| h.buf = Vec::new());
        }
        r
    }

    fn run(
        &mut self,
        side: Side,
        data: &[u8],
        keys: &KeyLog,
        out: &mut dyn FnMut(Side, &[u8]),
    ) -> Result<Status, Stop> {
        let h = &mut self.halves[side.i()];
        if h.buf.len() + data.len() > MAX_BUFFER {
            return Err(if self.authenticated {
                failed("buffer_full")
            } else {
                Stop::NotTls
            });
        }
        h.buf.extend_from_slice(data);
        loop {
            let (p1, b1) = self.half(side, keys, out)?;
            let (p2, b2) = self.half(side.other(), keys, out)?;
            if !p1 && !p2 {
                let need = b1 == Block::NeedSecret || b2 == Block::NeedSecret;
                return Ok(if need {
                    Status::NeedSecret
                } else {
                    Status::Running
                });
            }
        }
    }

    /// Reads `side`'s whole records while it can: whether any was read, and what stopped it.
    fn half(
        &mut self,
        side: Side,
        keys: &KeyLog,
        out: &mut dyn FnMut(Side, &[u8]),
    ) -> Result<(bool, Block), Stop> {
        let mut buf = std::mem::take(&mut self.halves[side.i()].buf);
        let mut pos = 0;
        let r = loop {
            match self.record(side, &mut buf[pos..], keys, out) {
                Ok(Ok(n)) => pos += n,
                Ok(Err(b)) => break Ok(b),
                Err(e) => break Err(e),
            }
        };
        buf.drain(..pos);
        self.halves[side.i()].buf = buf;
        r.map(|b| (pos > 0, b))
    }

    /// One record at the start of `avail`: Ok(Ok(its length)) when read, Ok(Err(why not))
    /// when it must wait.
    fn record(
        &mut self,
        side: Side,
        avail: &mut [u8],
        keys: &KeyLog,
        out: &mut dyn FnMut(Side, &[u8]),
    ) -> Result<Result<usize, Block>, Stop> {
        if avail.len() < HEADER {
            return Ok(Err(Block::Incomplete));
        }
        let mut header = [0u8; HEADER];
        header.copy_from_slice(&avail[..HEADER]);
        let typ = header[0];
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        let first = self.halves[side.i()].records == 0;
        if first && (typ != HANDSHAKE && typ != ALERT || header[1] != 3) {
            return Err(Stop::NotTls);
        }
        if len > MAX_RECORD {
            return Err(if self.authenticated {
                failed("record_overflow")
            } else {
                Stop::NotTls
            });
        }
        if avail.len() < HEADER + len {
            return Ok(Err(Block::Incomplete));
        }
        let payload = &mut avail[HEADER..HEADER + len];
        let version = self.suite.map(|s| s.version);
        let tls12_enc = version == Some(Version::Tls12) && self.halves[side.i()].ccs;
        match typ {
            CHANGE_CIPHER_SPEC => {
                if tls12_enc {
                    return Err(failed("unexpected_message"));
                }
                self.halves[side.i()].ccs = true;
            }
            ALERT | HANDSHAKE if tls12_enc => {
                let Some((inner, range)) = self.open(side, header, payload, keys)? else {
                    return Ok(Err(Block::NeedSecret));
                };
                if inner == HANDSHAKE {
                    self.handshake(side, &payload[range])?;
                }
            }
            ALERT => {}
            HANDSHAKE => {
                if self.halves[side.i()].phase != Phase::Plain {
                    return Err(failed("unexpected_message"));
                }
                self.handshake(side, payload)?;
            }
            APPLICATION_DATA => {
                let Some(v) = version else {
                    return match side {
                        Side::Client if self.hello_seen() => Ok(Err(Block::NeedPeer)),
                        _ => Err(failed("unexpected_message")),
                    };
                };
                match v {
                    Version::Tls12 => {
                        if !tls12_enc {
                            return Err(failed("unexpected_message"));
                        }
                        let Some((_, range)) = self.open(side, header, payload, keys)? else {
                            return Ok(Err(Block::NeedSecret));
                        };
                        out(side, &payload[range]);
                    }
                    Version::Tls13 => {
                        if let Some(b) = self.tls13_record(side, header, payload, keys, out)? {
                            return Ok(Err(b));
                        }
                    }
                }
            }
            _ => return Err(failed("unexpected_record_type")),
        }
        self.halves[side.i()].records += 1;
        Ok(Ok(HEADER + len))
    }

    /// A TLS 1.3 encrypted record; Some(why) when it must wait.
    fn tls13_record(
        &mut self,
        side: Side,
        header: [u8; HEADER],
        payload: &mut [u8],
        keys: &KeyLog,
        out: &mut dyn FnMut(Side, &[u8]),
    ) -> Result<Option<Block>, Stop> {
        let phase = self.halves[side.i()].phase;
        if phase == Phase::Plain {
            return Ok(Some(Block::NeedPeer));
        }
        let early = side == Side::Client && phase == Phase::Handshake && self.early_offered;
        let (inner, range) = if early {
            // Early data or the client's first handshake record: only the server's
            // EncryptedExtensions says which to expect, and only a trial tells them apart
            // once it said the early data was rejected.
            match self.early_accepted {
                None => return Ok(Some(Block::NeedPeer)),
                Some(true) => return Err(early_data()),
                Some(false) => {}
            }
            if !self.load_keys(side, keys)? {
                return Ok(Some(Block::NeedSecret));
            }
            let mut trial = payload.to_vec();
            let Some(k) = self.halves[side.i()].keys.as_mut() else {
                return Err(failed("internal"));
            };
            match k.open(header, &mut trial) {
                Ok((inner, range)) => {
                    self.early_offered = false;
                    self.authenticated = true;
                    payload[range.clone()].copy_from_slice(&trial[range.clone()]);
                    (inner, range)
                }
                Err(_) => {
                    self.skipped_early += 1;
                    if self.skipped_early > MAX_SKIPPED_EARLY {
                        return Err(failed("bad_record_mac"));
                    }
                    return Ok(None);
                }
            }
        } else {
            let Some(r) = self.open(side, header, payload, keys)? else {
                return Ok(Some(Block::NeedSecret));
            };
            r
        };
        match inner {
            HANDSHAKE => self.handshake(side, &payload[range])?,
            APPLICATION_DATA if self.halves[side.i()].phase == Phase::App => {
                out(side, &payload[range]);
            }
            ALERT => {}
            _ => return Err(failed("unexpected_message")),
        }
        Ok(None)
    }

    /// Decrypts a record of `side`; None when a secret it needs is missing.
    fn open(
        &mut self,
        side: Side,
        header: [u8; HEADER],
        payload: &mut [u8],
        keys: &KeyLog,
    ) -> Result<Option<(u8, std::ops::Range<usize>)>, Stop> {
        if !self.load_keys(side, keys)? {
            return Ok(None);
        }
        let Some(k) = self.halves[side.i()].keys.as_mut() else {
            return Err(failed("internal"));
        };
        match k.open(header, payload) {
            Ok(r) => {
                self.authenticated = true;
                Ok(Some(r))
            }
            Err(Unprotect::BadMac) => Err(failed("bad_record_mac")),
            Err(Unprotect::Short | Unprotect::NoType) => Err(failed("malformed_record")),
        }
    }

    /// Makes `side`'s current keys from the key log; false when a secret is missing.
    fn load_keys(&mut self, side: Side, keys: &KeyLog) -> Result<bool, Stop> {
        let (Some(suite), Some(random)) = (self.suite, self.client_random) else {
            return Err(failed("internal"));
        };
        if self.halves[side.i()].keys.is_some() {
            return Ok(true);
        }
        match suite.version {
            Version::Tls12 => {
                let Some(master) = keys.get(Label::ClientRandom, &random) else {
                    return Ok(false);
                };
                let (c, s) = RecordKeys::tls12(suite, master, &random, &self.server_random)
                    .ok_or(failed("bad_secret"))?;
                // Both directions' keys come from the one key block: each is made once.
                let [hc, hs] = &mut self.halves;
                if hc.keys.is_none() {
                    hc.keys = Some(c);
                }
                if hs.keys.is_none() {
                    hs.keys = Some(s);
                }
                Ok(self.halves[side.i()].keys.is_some())
            }
            Version::Tls13 => {
                let h = &mut self.halves[side.i()];
                if h.secret.is_none() {
                    let label = match (side, h.phase) {
                        (Side::Client, Phase::Handshake) => Label::ClientHandshake,
                        (Side::Server, Phase::Handshake) => Label::ServerHandshake,
                        (Side::Client, _) => Label::ClientTraffic0,
                        (Side::Server, _) => Label::ServerTraffic0,
                    };
                    let Some(s) = keys.get(label, &random) else {
                        return Ok(false);
                    };
                    if s.len() != suite.hash.out_len() {
                        return Err(failed("bad_secret"));
                    }
                    h.secret = Some(s.to_vec());
                }
                let secret = h.secret.as_deref().unwrap_or_default();
                h.keys = Some(RecordKeys::tls13(suite, secret).ok_or(failed("bad_secret"))?);
                Ok(true)
            }
        }
    }

    /// Handshake bytes of `side`, plaintext.
    fn handshake(&mut self, side: Side, data: &[u8]) -> Result<(), Stop> {
        let mut msgs = std::mem::take(&mut self.msgs);
        let fed = self.halves[side.i()].hs.feed(data, &mut msgs);
        let mut r = fed.map_err(|hs::TooLong| {
            if self.authenticated {
                failed("handshake_too_long")
            } else {
                Stop::NotTls
            }
        });
        for m in msgs.drain(..) {
            if r.is_ok() {
                r = self.message(side, &m);
            }
        }
        self.msgs = msgs;
        r
    }

    fn message(&mut self, side: Side, m: &Msg) -> Result<(), Stop> {
        let version = self.suite.map(|s| s.version);
        match (side, m.typ) {
            (Side::Client, hs::CLIENT_HELLO) => {
                if self.client_random.is_none() {
                    let ch = hs::client_hello(&m.body).ok_or(Stop::NotTls)?;
                    self.client_random = Some(ch.random);
                    self.early_offered = ch.early_data;
                } else if !(self.retried && version.is_none()) {
                    return Err(Stop::Unsupported("renegotiation".into()));
                }
            }
            (Side::Client, _) if self.client_random.is_none() => return Err(Stop::NotTls),
            (Side::Server, hs::SERVER_HELLO) => {
                if self.client_random.is_none() || version.is_some() {
                    return Err(Stop::NotTls);
                }
                let sh = hs::server_hello(&m.body).ok_or(Stop::NotTls)?;
                if sh.retry {
                    if self.retried {
                        return Err(failed("unexpected_message"));
                    }
                    self.retried = true;
                    self.early_accepted = Some(false);
                    return Ok(());
                }
                let v = match sh.version {
                    0x0304 => Version::Tls13,
                    0x0303 => Version::Tls12,
                    0x0302 => return Err(Stop::Unsupported("TLSv1.1".into())),
                    0x0301 => return Err(Stop::Unsupported("TLSv1.0".into())),
                    0x0300 => return Err(Stop::Unsupported("SSLv3".into())),
                    _ => return Err(Stop::NotTls),
                };
                let suite = keys::suite(v, sh.suite)
                    .ok_or_else(|| Stop::Unsupported(keys::unsupported_name(sh.suite)))?;
                self.suite = Some(suite);
                self.server_random = sh.random;
                if v == Version::Tls13 {
                    self.halves
                        .iter_mut()
                        .for_each(|h| h.phase = Phase::Handshake);
                    if self.retried {
                        self.early_offered = false;
                    }
                }
            }
            (Side::Server, _) if version.is_none() => return Err(Stop::NotTls),
            (Side::Server, hs::ENCRYPTED_EXTENSIONS) => {
                let accepted = hs::accepts_early_data(&m.body).ok_or(failed("bad_message"))?;
                self.early_accepted = Some(accepted);
                if accepted && self.early_offered {
                    return Err(early_data());
                }
            }
            (_, hs::FINISHED) if version == Some(Version::Tls13) => {
                let h = &mut self.halves[side.i()];
                if h.phase == Phase::Handshake {
                    h.phase = Phase::App;
                    h.keys = None;
                    h.secret = None;
                }
            }
            (_, hs::KEY_UPDATE) if version == Some(Version::Tls13) => {
                let (Some(suite), h) = (self.suite, &mut self.halves[side.i()]) else {
                    return Err(failed("internal"));
                };
                let Some(cur) = h.secret.as_deref() else {
                    return Err(failed("unexpected_message"));
                };
                if h.phase != Phase::App {
                    return Err(failed("unexpected_message"));
                }
                let mut next = vec![0u8; suite.hash.out_len()];
                keys::expand_label(suite.hash, cur, b"traffic upd", &mut next);
                h.keys = Some(RecordKeys::tls13(suite, &next).ok_or(failed("bad_secret"))?);
                h.secret = Some(next);
            }
            (Side::Client, hs::END_OF_EARLY_DATA) => return Err(early_data()),
            (Side::Server, t) if hs::is_hello_request(t) && version == Some(Version::Tls12) => {
                return Err(Stop::Unsupported("renegotiation".into()));
            }
            _ => {}
        }
        Ok(())
    }
}

fn early_data() -> Stop {
    Stop::Unsupported("TLS 1.3 early data (0-RTT)".into())
}
