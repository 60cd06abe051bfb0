//! HPACK (RFC 7541) as h2 needs it. Decoding is loona-hpack's (its dynamic table bounded by
//! the size we allow); encoding is written here from the static table and literals that are
//! never indexed, so the encoder keeps no state and a request's block can be built once and
//! copied for every request.

use std::fmt;

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
/// encoder's.
pub struct Decoder(loona_hpack::Decoder<'static>);

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("hpack::Decoder")
    }
}

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder::new()
    }
}

impl Decoder {
    /// A decoder with the default table size, bounded by [`TABLE_SIZE`].
    pub fn new() -> Decoder {
        Decoder(loona_hpack::Decoder::new())
    }

    /// Refuses dynamic table size updates over `size` (a peer cannot grow our memory).
    pub fn bound(&mut self, size: usize) {
        self.0.set_max_allowed_table_size(size);
        self.0.set_max_table_size(size);
    }

    /// Decodes one whole header block, calling `field` with each name and value in order.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), loona_hpack::decoder::DecoderError> {
        self.0.decode_with_cb(block, |n, v| field(&n, &v))
    }
}

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
