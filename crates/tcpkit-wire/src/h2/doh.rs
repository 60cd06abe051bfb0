//! DNS over HTTPS (RFC 8484) on HTTP/2: the GET form carries the query in the `dns`
//! parameter of the path, base64url without padding; the POST form carries it as the body,
//! both with the media type below. The DNS message itself is [`crate::dns`]'s.

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

/// The media type of a DNS message in a body, and what a client accepts.
pub const MEDIA_TYPE: &str = "application/dns-message";

/// The path servers use by default.
pub const DEFAULT_PATH: &str = "/dns-query";

/// Base64url, written without padding (RFC 8484 §4.1) and read with or without it.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Base64url characters for `n` bytes without padding.
pub fn encoded_len(n: usize) -> usize {
    (n * 4).div_ceil(3)
}

/// Appends `msg` as base64url without padding.
pub fn encode(out: &mut Vec<u8>, msg: &[u8]) {
    let start = out.len();
    out.resize(start + encoded_len(msg.len()), 0);
    let n = B64.encode_slice(msg, &mut out[start..]).unwrap_or(0);
    out.truncate(start + n);
}

/// The value of the `dns` parameter in `path`'s query string, if there is one.
pub fn dns_param(path: &[u8]) -> Option<&[u8]> {
    let q = path.iter().position(|&b| b == b'?')?;
    path[q + 1..]
        .split(|&b| b == b'&')
        .find_map(|kv| kv.strip_prefix(b"dns="))
}

/// `path` without its query string.
pub fn path_only(path: &[u8]) -> &[u8] {
    let end = path.iter().position(|&b| b == b'?').unwrap_or(path.len());
    &path[..end]
}

/// Decodes a `dns` parameter into `buf`; None when it is not base64url or does not fit.
pub fn decode<'b>(param: &[u8], buf: &'b mut [u8]) -> Option<&'b [u8]> {
    // Checked before decoding: a parameter too long for `buf` is refused unread.
    if param.len() / 4 * 3 > buf.len() + 3 {
        return None;
    }
    let n = B64.decode_slice(param, buf).ok()?;
    Some(&buf[..n])
}
