//! [`CaptureFile`]: the bytes of a whole capture, mapped from a file or held in memory, and
//! the format read from its first bytes.
//!
//! Mapping is the default because replay reads each byte once, in order: the page cache holds
//! the file, no copy is made, and `MADV_SEQUENTIAL` lets the kernel read ahead. `--preload`
//! asks for the bytes in anonymous memory instead, so replaying at line rate never waits on a
//! page fault into the file.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use memmap2::{Advice, Mmap};

use crate::error::{Location, PcapError};
use crate::pcap::FileHeader;
use crate::pcapng;
use crate::read::Packets;

/// Which format a capture is in, from its file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic pcap; link type and snaplen are the file's.
    Pcap {
        /// Timestamps in ns (magic a1b23c4d) rather than µs.
        nanos: bool,
        /// Written big-endian.
        big_endian: bool,
        /// Link type (DLT), without libpcap's FCS-length bits.
        linktype: u32,
        /// Snapshot length (0: not given).
        snaplen: u32,
        /// Kuznetzov's "modified pcap" (magic a1b2cd34), whose records carry 8 more bytes.
        modified: bool,
    },
    /// pcapng; link type and snaplen are per interface, so per packet.
    PcapNg,
}

/// Where the bytes live.
enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

/// A whole capture in memory (mapped or owned), ready to iterate with [`CaptureFile::packets`].
pub struct CaptureFile {
    path: PathBuf,
    storage: Storage,
    format: Format,
    /// The parsed pcap file header, kept so `packets` need not parse it again.
    pcap_header: Option<FileHeader>,
}

impl fmt::Debug for CaptureFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureFile")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("len_bytes", &self.len_bytes())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl CaptureFile {
    /// Maps the file at `path` and reads its header. Something that is not a regular file
    /// (a pipe, `/dev/stdin`) cannot be mapped and is read into memory instead.
    pub fn open(path: &Path) -> Result<CaptureFile, PcapError> {
        let io_err = |what| {
            move |source| PcapError::Io {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        let file = File::open(path).map_err(io_err("cannot open"))?;
        let meta = file.metadata().map_err(io_err("cannot stat (fstat)"))?;
        if !meta.is_file() {
            return Self::read_all(path, file, 0);
        }
        if meta.len() == 0 {
            return Err(PcapError::Empty {
                path: path.to_path_buf(),
            });
        }
        // SAFETY: the map is read-only and private to this process. If another process
        // truncates the file while it is mapped, reading the lost pages raises SIGBUS; that is
        // the accepted cost of mapping (every mmap-based reader shares it), and a capture being
        // replayed is not expected to be rewritten underneath.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err("cannot mmap"))?;
        // Only a hint: a kernel that refuses it reads the file just the same.
        let _ = map.advise(Advice::Sequential);
        Self::from_storage(path.to_path_buf(), Storage::Mapped(map))
    }

    /// Reads the whole file at `path` into anonymous memory (for `--preload`), so that
    /// iterating never touches the file or the page cache again.
    pub fn read_into_memory(path: &Path) -> Result<CaptureFile, PcapError> {
        let io_err = |what| {
            move |source| PcapError::Io {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        let file = File::open(path).map_err(io_err("cannot open"))?;
        let hint = file.metadata().map(|m| m.len()).unwrap_or(0);
        Self::read_all(path, file, usize::try_from(hint).unwrap_or(0))
    }

    fn read_all(path: &Path, mut file: File, hint: usize) -> Result<CaptureFile, PcapError> {
        let mut bytes = Vec::with_capacity(hint);
        file.read_to_end(&mut bytes)
            .map_err(|source| PcapError::Io {
                path: path.to_path_buf(),
                what: "cannot read",
                source,
            })?;
        Self::from_storage(path.to_path_buf(), Storage::Owned(bytes))
    }

    /// A capture from bytes already in memory; `name` stands for the path in errors.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<CaptureFile, PcapError> {
        Self::from_storage(PathBuf::from(name), Storage::Owned(bytes))
    }

    fn from_storage(path: PathBuf, storage: Storage) -> Result<CaptureFile, PcapError> {
        let bytes = match &storage {
            Storage::Mapped(m) => &m[..],
            Storage::Owned(v) => &v[..],
        };
        let Some(first) = bytes.first_chunk::<4>() else {
            if bytes.is_empty() {
                return Err(PcapError::Empty { path });
            }
            return Err(PcapError::NotACapture {
                path,
                first_bytes: bytes.to_vec(),
            });
        };
        let malformed = |at, reason| PcapError::Malformed {
            path: path.clone(),
            at,
            reason,
        };
        let (format, pcap_header) = if FileHeader::is_magic(*first) {
            let hdr = FileHeader::parse(bytes).map_err(|r| malformed(Location::FileHeader, r))?;
            let format = Format::Pcap {
                nanos: hdr.nanos,
                big_endian: hdr.big_endian,
                linktype: hdr.linktype(),
                snaplen: hdr.snaplen,
                modified: hdr.modified,
            };
            (format, Some(hdr))
        } else if u32::from_le_bytes(*first) == pcapng::SHB {
            // Check the byte order now so that a garbled file fails at open, not mid-replay;
            // the rest of the section header is read with the blocks.
            pcapng::section_big_endian(bytes)
                .map_err(|r| malformed(Location::Block { offset: 0 }, r))?;
            (Format::PcapNg, None)
        } else {
            return Err(PcapError::NotACapture {
                path,
                first_bytes: first.to_vec(),
            });
        };
        Ok(CaptureFile {
            path,
            storage,
            format,
            pcap_header,
        })
    }

    /// The path given to `open` (or the name given to `from_bytes`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format read from the file header.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Size of the capture in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes().len()
    }

    /// Whether the bytes are a map of the file (rather than a copy in anonymous memory).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped(_))
    }

    /// The raw bytes of the whole capture.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }

    /// The packets, in file order. After the first `Err` item the iterator ends; the packets
    /// before it are good, so a caller can use them and then report the error.
    pub fn packets(&self) -> Packets<'_> {
        match &self.pcap_header {
            Some(hdr) => Packets::pcap(&self.path, self.bytes(), hdr),
            None => Packets::pcapng(&self.path, self.bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_foreign_files_are_refused_with_what_was_seen() {
        let e = CaptureFile::from_bytes("x.pcap", Vec::new()).unwrap_err();
        assert_eq!(e.to_string(), "x.pcap: empty file");
        let e = CaptureFile::from_bytes("x.pcap", b"<html>".to_vec()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.pcap: not a pcap or pcapng file (first bytes 3c 68 74 6d)"
        );
        let e = CaptureFile::from_bytes("x.pcap", vec![0xd4, 0xc3]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.pcap: not a pcap or pcapng file (first bytes d4 c3)"
        );
        let e = CaptureFile::from_bytes("x.pcap", vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.pcap: file header: truncated pcap file header (24 bytes needed, 6 left)"
        );
        let e = CaptureFile::from_bytes(
            "x.pcapng",
            vec![0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0, 1, 2, 3, 4],
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.pcapng: block at byte offset 0: bad byte-order magic 04030201 in section header"
        );
    }
}
