//! HPACK (RFC 7541) as h2 needs it. Decoding is ours: the dynamic table bounded by the size
//! we allow, Huffman strings by a table ([`super::huffman`]), every length checked against
//! the block before anything grows, no allocation per block once warm. (loona-hpack, used
//! before, rebuilt a HashMap per Huffman string and looked each bit up in it: 7x slower
//! than h2load against nginx, which Huffman-codes its response headers.) Encoding is written
//! here from the static table and literals that are never indexed, so the encoder keeps no
//! state and a request's block can be built once and copied for every request.

use std::collections::VecDeque;
use std::fmt;

use super::huffman;
pub use super::huffman::HuffmanError;

/// The dynamic table size we let the peer's encoder use (RFC 7541's default; we never
/// announce another).
pub const TABLE_SIZE: usize = 4096;

/// Static table indexes used here (RFC 7541 Appendix A).
pub mod idx {
    #![allow(missing_docs, reason = "named after the static table's entries")]
    pub const AUTHORITY: usize = 1;
    pub const METHOD_GET: usize = 2;
    pub const METHOD_POST: usize = 3;
    pub const PATH: usize = 4;
    pub const SCHEME_HTTP: usize = 6;
    pub const SCHEME_HTTPS: usize = 7;
    pub const STATUS_200: usize = 8;
    pub const ACCEPT: usize = 19;
    pub const CONTENT_LENGTH: usize = 28;
    pub const CONTENT_TYPE: usize = 31;
    pub const USER_AGENT: usize = 58;
}

/// A connection's HPACK decoder: one per connection, since its dynamic table is the peer
/// encoder's. Strings are decoded into one reused buffer and the table keeps its entries in
/// one byte buffer, so once warmed up a block costs no allocation.
#[derive(Debug, Default)]
pub struct Decoder {
    table: Table,
    /// The largest table size the peer may ask for (what we announced).
    max_allowed: usize,
    /// The field being decoded: its name then its value.
    scratch: Vec<u8>,
}

/// Why a header block was refused (a COMPRESSION_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The block ends inside a field.
    Truncated,
    /// An integer over 2^28 (no length or index we accept comes near).
    Integer,
    /// An index that is 0 or past both tables.
    Index(usize),
    /// A Huffman string that is not one.
    Huffman(HuffmanError),
    /// A table size update over what we allow.
    TableSize(usize),
    /// A table size update after the block's first field.
    LateTableSize,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("the header block ends inside a field"),
            DecodeError::Integer => f.write_str("an integer over 2^28"),
            DecodeError::Index(i) => write!(f, "index {i} is in neither table"),
            DecodeError::Huffman(e) => e.fmt(f),
            DecodeError::TableSize(s) => {
                write!(
                    f,
                    "a table size update to {s}, over the {TABLE_SIZE} allowed"
                )
            }
            DecodeError::LateTableSize => f.write_str("a table size update after a field"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl Decoder {
    /// A decoder with the default table size, bounded by [`TABLE_SIZE`].
    pub fn new() -> Decoder {
        let mut d = Decoder::default();
        d.bound(TABLE_SIZE);
        d
    }

    /// Refuses dynamic table size updates over `size` (a peer cannot grow our memory).
    pub fn bound(&mut self, size: usize) {
        self.max_allowed = size;
        self.table.resize(size);
    }

    /// Decodes one whole header block, calling `field` with each name and value in order.
    /// On error the table may hold part of the block: the connection is then over.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), DecodeError> {
        let mut p = block;
        let mut fields_seen = false;
        while let Some(&b) = p.first() {
            if b & 0x80 != 0 {
                let i = read_integer(&mut p, 7)?;
                let (n, v) = self.table.get(i)?;
                field(n, v);
            } else if b & 0x40 != 0 {
                self.literal(&mut p, 6, true, &mut field)?;
            } else if b & 0x20 != 0 {
                if fields_seen {
                    return Err(DecodeError::LateTableSize);
                }
                let size = read_integer(&mut p, 5)?;
                if size > self.max_allowed {
                    return Err(DecodeError::TableSize(size));
                }
                self.table.resize(size);
                continue;
            } else {
                // Without indexing (0000) and never indexed (0001) read the same.
                self.literal(&mut p, 4, false, &mut field)?;
            }
            fields_seen = true;
        }
        Ok(())
    }

    /// The dynamic table's RFC size and entries, newest first.
    #[cfg(test)]
    pub(crate) fn table(&self) -> (usize, Vec<(String, String)>) {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let entries = (0..self.table.entries.len())
            .map(|j| {
                let (n, v) = self.table.get(STATIC.len() + 1 + j).expect("in the table");
                (text(n), text(v))
            })
            .collect();
        (self.table.size, entries)
    }

    fn literal(
        &mut self,
        p: &mut &[u8],
        prefix: u8,
        index: bool,
        field: &mut impl FnMut(&[u8], &[u8]),
    ) -> Result<(), DecodeError> {
        let i = read_integer(p, prefix)?;
        self.scratch.clear();
        if i == 0 {
            read_string(p, &mut self.scratch)?;
        } else {
            let (n, _) = self.table.get(i)?;
            self.scratch.extend_from_slice(n);
        }
        let name_len = self.scratch.len();
        read_string(p, &mut self.scratch)?;
        let (n, v) = self.scratch.split_at(name_len);
        field(n, v);
        if index {
            self.table.insert(n, v);
        }
        Ok(())
    }
}

/// An integer with a `prefix`-bit prefix (RFC 7541 §5.1), `p` advanced past it.
fn read_integer(p: &mut &[u8], prefix: u8) -> Result<usize, DecodeError> {
    let (&first, mut rest) = p.split_first().ok_or(DecodeError::Truncated)?;
    let max = (1usize << prefix) - 1;
    let mut v = usize::from(first) & max;
    if v == max {
        let mut shift = 0;
        loop {
            let (&b, r) = rest.split_first().ok_or(DecodeError::Truncated)?;
            rest = r;
            if shift > 21 {
                return Err(DecodeError::Integer);
            }
            v += usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
    }
    *p = rest;
    Ok(v)
}

/// A string literal (RFC 7541 §5.2) appended to `out`, `p` advanced past it. Its length is
/// checked against the block before anything grows.
fn read_string(p: &mut &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let huffman = p.first().is_some_and(|b| b & 0x80 != 0);
    let len = read_integer(p, 7)?;
    if len > p.len() {
        return Err(DecodeError::Truncated);
    }
    let (s, rest) = p.split_at(len);
    *p = rest;
    if huffman {
        huffman::decode(s, out).map_err(DecodeError::Huffman)
    } else {
        out.extend_from_slice(s);
        Ok(())
    }
}

/// The dynamic table: entries oldest first, their bytes (name then value) in one buffer from
/// `start`, compacted when the evicted front outgrows the table.
#[derive(Debug, Default)]
struct Table {
    bytes: Vec<u8>,
    start: usize,
    /// Each entry's offset in `bytes`, name length, value length.
    entries: VecDeque<(usize, usize, usize)>,
    /// RFC 7541 §4.1's size: name + value + 32 per entry.
    size: usize,
    max: usize,
}

impl Table {
    /// Index `i`: the static table (1..=61), then the dynamic one, newest first.
    fn get(&self, i: usize) -> Result<(&[u8], &[u8]), DecodeError> {
        if i == 0 {
            return Err(DecodeError::Index(0));
        }
        if let Some(&e) = STATIC.get(i - 1) {
            return Ok(e);
        }
        let j = i - 1 - STATIC.len();
        let &(at, n, v) = self
            .entries
            .len()
            .checked_sub(j + 1)
            .and_then(|k| self.entries.get(k))
            .ok_or(DecodeError::Index(i))?;
        Ok((&self.bytes[at..at + n], &self.bytes[at + n..at + n + v]))
    }

    fn resize(&mut self, max: usize) {
        self.max = max;
        self.evict(0);
    }

    /// Evicts the oldest entries until `room` more fits.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            let Some((at, n, v)) = self.entries.pop_front() else {
                break;
            };
            self.size -= n + v + 32;
            self.start = at + n + v;
        }
        if self.entries.is_empty() {
            self.bytes.clear();
            self.start = 0;
        } else if self.start > self.max.max(64) {
            self.bytes.drain(..self.start);
            for e in &mut self.entries {
                e.0 -= self.start;
            }
            self.start = 0;
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            // RFC 7541 §4.4: an entry larger than the table empties it and is not added.
            self.entries.clear();
            self.size = 0;
            self.evict(0);
            return;
        }
        self.evict(size);
        self.entries
            .push_back((self.bytes.len(), name.len(), value.len()));
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self.size += size;
    }
}

/// RFC 7541 Appendix A.
static STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// An integer with an `prefix`-bit prefix, the bits above it taken from `first`.
pub fn integer(out: &mut Vec<u8>, value: usize, prefix: u8, first: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut v = value - max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A string literal without Huffman coding.
pub fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, s.len(), 7, 0);
    out.extend_from_slice(s);
}

/// A field from the static table, name and value.
pub fn indexed(out: &mut Vec<u8>, index: usize) {
    integer(out, index, 7, 0x80);
}

/// A literal field never put in the table: its name from the static table (`name` > 0) or
/// given (`name` 0 and `new_name`).
pub fn literal(out: &mut Vec<u8>, name: usize, new_name: &[u8], value: &[u8]) {
    integer(out, name, 4, 0);
    if name == 0 {
        string(out, new_name);
    }
    string(out, value);
}

/// A request's header block for `method`, `scheme` and `authority`, its `path`, and
/// `headers` (names lowercased as HTTP/2 wants them).
pub fn request_block(
    method: &str,
    scheme: &str,
    authority: &str,
    path: &str,
    headers: &[(String, String)],
) -> Vec<u8> {
    let t = RequestTemplate::new(method, scheme, authority, headers);
    let mut out = Vec::new();
    t.write(&mut out, |o| string(o, path.as_bytes()), None);
    out
}

/// The parts of a request block that do not change from one request to the next, so a
/// request is three copies and its path.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    /// :method, :scheme, :authority.
    pseudo: Vec<u8>,
    /// The regular fields, after the pseudo-fields as RFC 9113 §8.3 wants.
    regular: Vec<u8>,
}

impl RequestTemplate {
    /// `headers` are `(name, value)`; connection-specific ones (RFC 9113 §8.2.2) are left
    /// out, and `host` becomes the `:authority`.
    pub fn new(
        method: &str,
        scheme: &str,
        authority: &str,
        headers: &[(String, String)],
    ) -> RequestTemplate {
        let mut pseudo = Vec::new();
        match method {
            "GET" => indexed(&mut pseudo, idx::METHOD_GET),
            "POST" => indexed(&mut pseudo, idx::METHOD_POST),
            m => literal(&mut pseudo, idx::METHOD_GET, b"", m.as_bytes()),
        }
        match scheme {
            "https" => indexed(&mut pseudo, idx::SCHEME_HTTPS),
            _ => indexed(&mut pseudo, idx::SCHEME_HTTP),
        }
        let host = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("host"))
            .map_or(authority, |(_, v)| v.as_str());
        literal(&mut pseudo, idx::AUTHORITY, b"", host.as_bytes());
        let mut regular = Vec::new();
        let given = |n: &str| headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(n));
        if !given("user-agent") {
            literal(&mut regular, idx::USER_AGENT, b"", b"tcpkit-load");
        }
        for (n, v) in headers {
            let n = n.to_ascii_lowercase();
            if matches!(
                n.as_str(),
                "host"
                    | "connection"
                    | "keep-alive"
                    | "proxy-connection"
                    | "transfer-encoding"
                    | "upgrade"
            ) {
                continue;
            }
            literal(&mut regular, 0, n.as_bytes(), v.trim().as_bytes());
        }
        RequestTemplate { pseudo, regular }
    }

    /// Appends the block: pseudo-fields, `:path` (its value written by `path`, which must
    /// write one string literal), content-length when given, the regular fields.
    pub fn write(
        &self,
        out: &mut Vec<u8>,
        path: impl FnOnce(&mut Vec<u8>),
        content_length: Option<usize>,
    ) {
        out.extend_from_slice(&self.pseudo);
        integer(out, idx::PATH, 4, 0);
        path(out);
        if let Some(n) = content_length {
            let mut digits = [0u8; 20];
            literal(out, idx::CONTENT_LENGTH, b"", decimal(n, &mut digits));
        }
        out.extend_from_slice(&self.regular);
    }
}

/// `n` in decimal, in `buf`.
fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Appends a response block: `:status`, content-type when given, content-length.
pub fn write_status(out: &mut Vec<u8>, status: u16, content_type: Option<&str>, len: usize) {
    let mut digits = [0u8; 20];
    if status == 200 {
        indexed(out, idx::STATUS_200);
    } else {
        literal(
            out,
            idx::STATUS_200,
            b"",
            decimal(usize::from(status), &mut digits),
        );
    }
    if let Some(t) = content_type {
        literal(out, idx::CONTENT_TYPE, b"", t.as_bytes());
    }
    literal(out, idx::CONTENT_LENGTH, b"", decimal(len, &mut digits));
}

/// [`write_status`] into a new buffer.
pub fn status_block(status: u16, content_type: Option<&str>, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    write_status(&mut out, status, content_type, len);
    out
}
