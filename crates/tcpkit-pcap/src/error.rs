//! The one error type of this crate: every failure names the capture, and a failure inside the
//! file also says which packet (1-based, like Wireshark's frame number) or block, and at which
//! byte offset.
//!
//! Following the Rust API guidelines, an error either shows its source in its `Display` or
//! returns it from `source()`, never both: the `io::Error` of a failed syscall is the `source()`,
//! so print the chain (`{:#}` with anyhow) to get `x.pcap: cannot open: No such file or
//! directory (os error 2)` on one line.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Why reading a capture failed. The user sees one line: `Display` of this error (plus the
/// `io::Error` source of [`PcapError::Io`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PcapError {
    /// A syscall on the file failed; `what` says which (`cannot open`, `cannot mmap`, ...).
    #[error("{}: {what}", path.display())]
    Io {
        /// The capture's path.
        path: PathBuf,
        /// The operation that failed, e.g. `cannot open (open)`.
        what: &'static str,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// The file has no bytes at all.
    #[error("{}: empty file", path.display())]
    Empty {
        /// The capture's path.
        path: PathBuf,
    },
    /// The first four bytes are no pcap or pcapng magic number.
    #[error("{}: not a pcap or pcapng file (first bytes {})", path.display(), HexBytes(first_bytes))]
    NotACapture {
        /// The capture's path.
        path: PathBuf,
        /// Up to the first four bytes of the file.
        first_bytes: Vec<u8>,
    },
    /// The bytes break the format at a known place.
    #[error("{}: {at}{reason}", path.display())]
    Malformed {
        /// The capture's path.
        path: PathBuf,
        /// Where in the file.
        at: Location,
        /// What is wrong there.
        reason: Reason,
    },
}

impl PcapError {
    /// The path (or name given to [`crate::CaptureFile::from_bytes`]) of the capture.
    pub fn path(&self) -> &Path {
        match self {
            PcapError::Io { path, .. }
            | PcapError::Empty { path }
            | PcapError::NotACapture { path, .. }
            | PcapError::Malformed { path, .. } => path,
        }
    }

    /// The 1-based number of the packet being read when the error happened, if any.
    pub fn packet_number(&self) -> Option<u64> {
        match self {
            PcapError::Malformed {
                at: Location::Packet { number, .. },
                ..
            } => Some(*number),
            _ => None,
        }
    }

    /// The byte offset of the record, block or header the error is in, if any.
    pub fn offset(&self) -> Option<u64> {
        match self {
            PcapError::Malformed { at, .. } => match at {
                Location::FileHeader => Some(0),
                Location::Packet { offset, .. } | Location::Block { offset } => Some(*offset),
            },
            _ => None,
        }
    }

    /// What is wrong, for errors inside the file.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            PcapError::Malformed { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// Where in the file an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// The pcap file header (pcapng files start with a block instead).
    FileHeader,
    /// A packet record (pcap) or packet block (pcapng).
    Packet {
        /// 1-based packet number in the file.
        number: u64,
        /// Byte offset of the record or block.
        offset: u64,
    },
    /// A pcapng block that holds no packet (section header, interface description, ...), or
    /// a block whose type could not be read.
    Block {
        /// Byte offset of the block.
        offset: u64,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::FileHeader => f.write_str("file header: "),
            Location::Packet { number, offset } => {
                write!(f, "packet {number} at byte offset {offset}: ")
            }
            Location::Block { offset } => write!(f, "block at byte offset {offset}: "),
        }
    }
}

/// What is wrong with the bytes at a [`Location`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reason {
    /// A fixed-size header is cut short.
    #[error("truncated {what} ({needed} bytes needed, {left} left)")]
    TruncatedHeader {
        /// Which header.
        what: &'static str,
        /// Its size.
        needed: u64,
        /// Bytes left in the file (or block).
        left: u64,
    },
    /// A record or block whose header gives a length the file does not hold.
    #[error("truncated {what} (header says {says} bytes, {left} left)")]
    TruncatedBody {
        /// `record` or `block`.
        what: &'static str,
        /// Length in its header.
        says: u64,
        /// Bytes left in the file (or block).
        left: u64,
    },
    /// The captured length is above the snapshot length of its file or interface.
    #[error("captured length {caplen} exceeds the snaplen {snaplen}")]
    CaplenExceedsSnaplen {
        /// Captured length from the record.
        caplen: u32,
        /// Snapshot length of the file or interface.
        snaplen: u32,
    },
    /// The captured length is beyond [`crate::max_caplen`]: the file is corrupt or not
    /// what its magic says.
    #[error("captured length {caplen} is absurd (more than {bound})")]
    AbsurdCaplen {
        /// Captured length from the record.
        caplen: u32,
        /// The bound it broke.
        bound: u32,
    },
    /// The pcap version is not 2.x.
    #[error("unsupported pcap version {major}.{minor}")]
    UnsupportedPcapVersion {
        /// Major version.
        major: u16,
        /// Minor version.
        minor: u16,
    },
    /// The pcapng section version is not 1.x.
    #[error("unsupported pcapng section version {major}.{minor}")]
    UnsupportedPcapNgVersion {
        /// Major version.
        major: u16,
        /// Minor version.
        minor: u16,
    },
    /// The byte-order magic of a pcapng section header is neither 1a2b3c4d nor 4d3c2b1a.
    #[error("bad byte-order magic {0:08x} in section header")]
    BadByteOrderMagic(u32),
    /// A pcapng block length below the minimum for its type, or not a multiple of 4.
    #[error(
        "bad block length {len} for block type {block_type:#x} (minimum {min}, multiple of 4)"
    )]
    BadBlockLength {
        /// Block type.
        block_type: u32,
        /// Length in the block header.
        len: u32,
        /// Minimum length of that block type.
        min: u32,
    },
    /// The length at the end of a pcapng block differs from the one at its start.
    #[error("block length {trailer} at the end differs from {header} at the start")]
    BlockLengthMismatch {
        /// Length in the header.
        header: u32,
        /// Length in the trailer.
        trailer: u32,
    },
    /// A pcapng file whose first block is not a section header.
    #[error("first block is type {0:#x}, not a section header")]
    NoSectionHeader(u32),
    /// A pcapng packet block names an interface its section did not describe.
    #[error("interface {id} does not exist ({count} described in this section)")]
    UnknownInterface {
        /// Interface id in the packet block.
        id: u32,
        /// Interfaces described so far in this section.
        count: u32,
    },
    /// A pcapng option runs past the end of its block.
    #[error("option {code} of length {len} runs past the end of the block")]
    BadOption {
        /// Option code.
        code: u16,
        /// Option length.
        len: u16,
    },
    /// A timestamp (with its interface's if_tsoffset) is before 1970 or after 2554.
    #[error("timestamp is out of range (before 1970 or after 2554)")]
    TimestampOutOfRange,
}

/// Shows bytes as `3c 68 74 6d`.
struct HexBytes<'a>(&'a [u8]);

impl fmt::Display for HexBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn messages_are_one_line_and_say_where() {
        let e = PcapError::Malformed {
            path: "capture.pcap".into(),
            at: Location::Packet {
                number: 17,
                offset: 18231,
            },
            reason: Reason::TruncatedBody {
                what: "record",
                says: 1514,
                left: 200,
            },
        };
        assert_eq!(
            e.to_string(),
            "capture.pcap: packet 17 at byte offset 18231: truncated record (header says 1514 bytes, 200 left)"
        );
        assert_eq!(e.packet_number(), Some(17));
        assert_eq!(e.offset(), Some(18231));
        let e = PcapError::NotACapture {
            path: "x.pcap".into(),
            first_bytes: vec![0x3c, 0x68, 0x74, 0x6d],
        };
        assert_eq!(
            e.to_string(),
            "x.pcap: not a pcap or pcapng file (first bytes 3c 68 74 6d)"
        );
        assert_eq!(e.packet_number(), None);
    }

    #[test]
    fn io_error_is_the_source_not_repeated() {
        let e = PcapError::Io {
            path: "x.pcap".into(),
            what: "cannot open",
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert_eq!(e.to_string(), "x.pcap: cannot open");
        assert!(e.source().is_some());
    }
}
