//! tcpprep's cache file (format version 04, as tcpprep and tcpreplay 4.4.3 write and read it):
//! which interface each packet of a capture leaves by, two bits a packet.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "tcpprep\0"
//!      8     4  version "04\0\0" (read as tcpreplay does: the decimal number at its start)
//!     12     8  number of packets, big-endian u64
//!     20     2  packets per byte, big-endian u16: 4 (tcpreplay indexes as if it were)
//!     22     2  comment length, big-endian u16 (at most 65534, tcpreplay's bound)
//!     24     n  comment: tcpprep's arguments, then "\n" and -C's text if given; no NUL
//!   24+n     m  data: ceil(packets / 4) bytes; packet k (1-based) is byte (k-1)/4, bits
//!               2*((k-1)%4)+1 (send: 1 send, 0 don't) and 2*((k-1)%4) (1 primary, 0 secondary)
//! ```
//!
//! tcpreplay reads the header, the comment and exactly `m` data bytes, and ignores anything
//! after them; so does [`PrepCache::parse`]. Every length is checked against the bytes present
//! before anything is allocated: a header claiming 2^64 packets is an error, not an allocation.

use std::fmt;
use std::path::Path;

/// The magic at the start of every cache file, NUL included (tcpreplay compares all 8 bytes).
pub const PREP_MAGIC: &[u8; 8] = b"tcpprep\0";
/// The one format version tcpreplay 4.x reads.
pub const PREP_VERSION: u32 = 4;
/// The fixed header's length.
pub const PREP_HEADER_LEN: usize = 24;
/// The longest comment tcpreplay accepts.
pub const PREP_MAX_COMMENT: usize = 65_534;

/// Where a packet goes, as the cache says (tcpreplay's `tcpr_dir_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrepDir {
    /// Send bit clear: the packet is not sent at all.
    NoSend,
    /// Send, interface bit set: `--intf1`, the client-to-server side (tcpprep's C2S).
    Primary,
    /// Send, interface bit clear: `--intf2`, the server-to-client side (tcpprep's S2C).
    Secondary,
}

/// Why a cache file cannot be used. `Display` is one line without the path (the caller adds
/// it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrepCacheError {
    /// Fewer than 24 bytes.
    #[error("not a full tcpprep cache header: {0} bytes, the header is 24")]
    ShortHeader(usize),
    /// The first 8 bytes are not `tcpprep\0`.
    #[error("not a tcpprep cache file (first bytes {0:02x?})")]
    Magic([u8; 8]),
    /// A version other than 04.
    #[error("cache file version {0:?}: tcpreplay 4.x reads version 04")]
    Version(String),
    /// A comment length above 65534.
    #[error("comment length {0} is over tcpreplay's 65534")]
    CommentLen(u16),
    /// The comment is cut short.
    #[error("comment of {want} bytes, {have} bytes left after the header")]
    ShortComment {
        /// Bytes the header promised.
        want: usize,
        /// Bytes left in the file.
        have: usize,
    },
    /// Packets per byte other than 4.
    #[error("{0} packets per byte: tcpprep writes 4, and tcpreplay indexes every cache as 4")]
    PacketsPerByte(u16),
    /// The data is shorter than the packet count needs.
    #[error(
        "data for {packets} packets needs {want} bytes, the file has {have} after the comment"
    )]
    ShortData {
        /// Packets the header counts.
        packets: u64,
        /// Bytes they need.
        want: u64,
        /// Bytes there are.
        have: usize,
    },
    /// [`PrepCache::emit`] with a comment longer than the format holds.
    #[error("comment of {0} bytes is over the format's 65534")]
    CommentTooLong(usize),
}

/// A whole cache: its comment and two bits per packet.
#[derive(Clone, PartialEq, Eq)]
pub struct PrepCache {
    comment: Vec<u8>,
    packets: u64,
    data: Vec<u8>,
}

impl fmt::Debug for PrepCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrepCache")
            .field("comment", &String::from_utf8_lossy(&self.comment))
            .field("packets", &self.packets)
            .finish()
    }
}

impl PrepCache {
    /// An empty cache with this comment (tcpprep's arguments and -C text, as the caller
    /// builds it).
    pub fn new(comment: Vec<u8>) -> PrepCache {
        PrepCache {
            comment,
            packets: 0,
            data: Vec::new(),
        }
    }

    /// Appends the next packet's direction (tcpprep's `add_cache`).
    pub fn push(&mut self, dir: PrepDir) {
        let k = self.packets;
        if k.is_multiple_of(4) {
            self.data.push(0);
        }
        let bit = (k % 4) as u32 * 2 + 1;
        let byte = self
            .data
            .last_mut()
            .expect("a byte was pushed for this packet");
        match dir {
            PrepDir::NoSend => {}
            PrepDir::Primary => *byte |= (1 << bit) | (1 << (bit - 1)),
            PrepDir::Secondary => *byte |= 1 << bit,
        }
        self.packets += 1;
    }

    /// Packets the cache covers.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// The embedded comment (tcpprep's arguments, then a newline and -C's text).
    pub fn comment(&self) -> &[u8] {
        &self.comment
    }

    /// The direction of packet `number` (1-based, as tcpreplay counts per file), or None past
    /// the cache's end (tcpreplay does not send those either).
    pub fn dir(&self, number: u64) -> Option<PrepDir> {
        if number == 0 || number > self.packets {
            return None;
        }
        let k = number - 1;
        let byte = self.data[(k / 4) as usize];
        let bit = (k % 4) as u32 * 2 + 1;
        Some(if byte & (1 << bit) == 0 {
            PrepDir::NoSend
        } else if byte & (1 << (bit - 1)) != 0 {
            PrepDir::Primary
        } else {
            PrepDir::Secondary
        })
    }

    /// Counts of (primary, secondary, not sent) packets.
    pub fn tally(&self) -> (u64, u64, u64) {
        let mut t = (0, 0, 0);
        for k in 1..=self.packets {
            match self.dir(k) {
                Some(PrepDir::Primary) => t.0 += 1,
                Some(PrepDir::Secondary) => t.1 += 1,
                _ => t.2 += 1,
            }
        }
        t
    }

    /// Reads a cache from its bytes as tcpreplay's `read_cache` does (see the module docs);
    /// bytes after the data are ignored, as tcpreplay ignores them.
    pub fn parse(b: &[u8]) -> Result<PrepCache, PrepCacheError> {
        if b.len() < PREP_HEADER_LEN {
            return Err(PrepCacheError::ShortHeader(b.len()));
        }
        let magic: [u8; 8] = b[0..8].try_into().expect("8 bytes");
        if &magic != PREP_MAGIC {
            return Err(PrepCacheError::Magic(magic));
        }
        let version = &b[8..12];
        if atoi(version) != Some(PREP_VERSION) {
            let shown = version.split(|&c| c == 0).next().unwrap_or_default();
            return Err(PrepCacheError::Version(
                String::from_utf8_lossy(shown).into_owned(),
            ));
        }
        let packets = u64::from_be_bytes(b[12..20].try_into().expect("8 bytes"));
        let per_byte = u16::from_be_bytes([b[20], b[21]]);
        let comment_len = u16::from_be_bytes([b[22], b[23]]);
        if usize::from(comment_len) > PREP_MAX_COMMENT {
            return Err(PrepCacheError::CommentLen(comment_len));
        }
        let rest = &b[PREP_HEADER_LEN..];
        let comment = rest
            .get(..usize::from(comment_len))
            .ok_or(PrepCacheError::ShortComment {
                want: comment_len.into(),
                have: rest.len(),
            })?;
        if per_byte != 4 {
            return Err(PrepCacheError::PacketsPerByte(per_byte));
        }
        let rest = &rest[comment.len()..];
        let want = packets.div_ceil(4);
        // Bounded by the bytes present before anything is allocated.
        let data = usize::try_from(want)
            .ok()
            .and_then(|w| rest.get(..w))
            .ok_or(PrepCacheError::ShortData {
                packets,
                want,
                have: rest.len(),
            })?;
        Ok(PrepCache {
            comment: comment.to_vec(),
            packets,
            data: data.to_vec(),
        })
    }

    /// Reads a cache file; the error line names the path.
    pub fn read(path: &Path) -> Result<PrepCache, String> {
        let b = std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        PrepCache::parse(&b).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The file's length.
    pub fn buffer_len(&self) -> usize {
        PREP_HEADER_LEN + self.comment.len() + self.data.len()
    }

    /// Writes the file as tcpprep's `write_cache` does, byte for byte, into `out`.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), PrepCacheError> {
        if self.comment.len() > PREP_MAX_COMMENT {
            return Err(PrepCacheError::CommentTooLong(self.comment.len()));
        }
        out.reserve(self.buffer_len());
        out.extend_from_slice(PREP_MAGIC);
        out.extend_from_slice(b"04\0\0");
        out.extend_from_slice(&self.packets.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&(self.comment.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.comment);
        out.extend_from_slice(&self.data);
        Ok(())
    }
}

/// C's `atoi` over a field that need not end in NUL: leading spaces, a sign, digits; None
/// when no digit comes first or the number does not fit.
fn atoi(b: &[u8]) -> Option<u32> {
    let mut it = b.iter().copied().skip_while(|c| c.is_ascii_whitespace());
    let mut first = it.next()?;
    if first == b'+' {
        first = it.next()?;
    }
    if !first.is_ascii_digit() {
        return None;
    }
    let mut n = u32::from(first - b'0');
    for c in it.take_while(u8::is_ascii_digit) {
        n = n.checked_mul(10)?.checked_add(u32::from(c - b'0'))?;
    }
    Some(n)
}

/// The body of the `prep_cache` fuzz target: parse `data` as a cache; what parses is read
/// whole, written back and parsed again to the same cache. Must never panic.
pub fn fuzz_prep_cache(data: &[u8]) {
    let Ok(c) = PrepCache::parse(data) else {
        return;
    };
    let _ = c.tally();
    let _ = c.dir(c.packets().saturating_add(1));
    let mut out = Vec::new();
    c.emit(&mut out).expect("a parsed comment fits");
    assert_eq!(out.len(), c.buffer_len());
    assert_eq!(PrepCache::parse(&out).as_ref(), Ok(&c));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PrepCache {
        let mut c = PrepCache::new(b"-a client -i in.pcap -o out.cache".to_vec());
        for d in [
            PrepDir::Primary,
            PrepDir::Secondary,
            PrepDir::NoSend,
            PrepDir::Primary,
            PrepDir::Secondary,
        ] {
            c.push(d);
        }
        c
    }

    #[test]
    fn emit_then_parse_round_trips_and_bits_sit_where_tcpprep_puts_them() {
        let c = sample();
        // Bytes written into a buffer pre-filled with a marker, so a field not written shows.
        let mut out = vec![0xAA; 3];
        c.emit(&mut out).unwrap();
        let out = &out[3..];
        assert_eq!(out.len(), c.buffer_len());
        assert_eq!(&out[..12], b"tcpprep\x0004\0\0");
        assert_eq!(&out[12..20], &5u64.to_be_bytes());
        assert_eq!(&out[20..24], &[0, 4, 0, 33]);
        let data = &out[24 + 33..];
        // Packet 1: send+primary (bits 1,0), 2: send (bit 3), 3: none, 4: bits 7,6; 5: bit 1.
        assert_eq!(data, &[0b1100_1011, 0b0000_0010]);
        let back = PrepCache::parse(out).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.dir(1), Some(PrepDir::Primary));
        assert_eq!(back.dir(2), Some(PrepDir::Secondary));
        assert_eq!(back.dir(3), Some(PrepDir::NoSend));
        assert_eq!(back.dir(6), None);
        assert_eq!(back.dir(0), None);
        assert_eq!(back.tally(), (2, 2, 1));
    }

    #[test]
    fn every_cut_is_refused_with_what_was_missing() {
        let mut out = Vec::new();
        sample().emit(&mut out).unwrap();
        for n in 0..out.len() {
            let e = PrepCache::parse(&out[..n]).unwrap_err();
            let want = match n {
                0..24 => PrepCacheError::ShortHeader(n),
                24..57 => PrepCacheError::ShortComment {
                    want: 33,
                    have: n - 24,
                },
                _ => PrepCacheError::ShortData {
                    packets: 5,
                    want: 2,
                    have: n - 57,
                },
            };
            assert_eq!(e, want, "cut at {n}");
        }
        // Bytes after the data are ignored, as tcpreplay ignores them.
        out.extend_from_slice(b"trailing");
        assert_eq!(PrepCache::parse(&out).unwrap(), sample());
    }

    #[test]
    fn a_huge_count_is_an_error_not_an_allocation() {
        let mut out = Vec::new();
        PrepCache::new(Vec::new()).emit(&mut out).unwrap();
        out[12..20].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(
            PrepCache::parse(&out),
            Err(PrepCacheError::ShortData { .. })
        ));
        let mut bad = out.clone();
        bad[8..12].copy_from_slice(b"03\0\0");
        assert_eq!(
            PrepCache::parse(&bad).unwrap_err().to_string(),
            "cache file version \"03\": tcpreplay 4.x reads version 04"
        );
        let mut bad = out.clone();
        bad[21] = 8;
        assert_eq!(
            PrepCache::parse(&bad),
            Err(PrepCacheError::PacketsPerByte(8))
        );
        let mut bad = out.clone();
        bad[22..24].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(
            PrepCache::parse(&bad),
            Err(PrepCacheError::CommentLen(65535))
        );
        let mut bad = out;
        bad[0] = b'T';
        assert!(matches!(
            PrepCache::parse(&bad),
            Err(PrepCacheError::Magic(_))
        ));
        assert_eq!(atoi(b" +04x"), Some(4));
        assert_eq!(atoi(b"x4"), None);
    }

    #[test]
    fn fuzz_body_holds_for_what_emit_writes() {
        let mut out = Vec::new();
        sample().emit(&mut out).unwrap();
        fuzz_prep_cache(&out);
        fuzz_prep_cache(&out[..30]);
    }
}
