//! The classic pcap format (libpcap's savefile): its file header and record header, each with
//! `parse` and `emit` side by side, and [`PcapWriter`].
//!
//! Magics understood: a1b2c3d4 (µs), a1b23c4d (ns) and a1b2cd34 (Alexey Kuznetzov's "modified
//! pcap", µs, whose record header carries 8 more bytes), each in either byte order.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::bytes::{u16_at, u16_bytes, u32_at, u32_bytes};
use crate::error::{PcapError, Reason};

/// Size of the pcap file header.
pub(crate) const FILE_HEADER_LEN: usize = 24;
/// Size of a standard pcap record header.
pub(crate) const RECORD_HEADER_LEN: usize = 16;
/// Size of a "modified pcap" record header: the standard one plus ifindex, protocol, pkt_type
/// and a pad byte.
pub(crate) const MODIFIED_RECORD_HEADER_LEN: usize = 24;

const MAGIC_US: u32 = 0xa1b2_c3d4;
const MAGIC_NS: u32 = 0xa1b2_3c4d;
const MAGIC_MODIFIED: u32 = 0xa1b2_cd34;

/// libpcap keeps the FCS length in the top bits of the link type field (LT_FCS_LENGTH); the
/// link type itself is the low 26 bits (LT_LINKTYPE).
const LINKTYPE_MASK: u32 = 0x03ff_ffff;

/// The parsed pcap file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileHeader {
    pub nanos: bool,
    pub big_endian: bool,
    pub modified: bool,
    pub version_major: u16,
    pub version_minor: u16,
    /// GMT offset of the timestamps; libpcap has always written 0 and every reader ignores it.
    pub thiszone: u32,
    pub sigfigs: u32,
    pub snaplen: u32,
    /// The whole field, FCS bits included; see [`FileHeader::linktype`].
    pub linktype_field: u32,
}

impl FileHeader {
    /// Whether `first` (the first four bytes of a file) is a pcap magic in either order.
    pub fn is_magic(first: [u8; 4]) -> bool {
        let le = u32::from_le_bytes(first);
        let be = u32::from_be_bytes(first);
        [MAGIC_US, MAGIC_NS, MAGIC_MODIFIED]
            .iter()
            .any(|m| *m == le || *m == be)
    }

    /// Parses the header at the start of `buf`. The caller has checked [`FileHeader::is_magic`].
    pub fn parse(buf: &[u8]) -> Result<FileHeader, Reason> {
        let short = || Reason::TruncatedHeader {
            what: "pcap file header",
            needed: FILE_HEADER_LEN as u64,
            left: buf.len() as u64,
        };
        if buf.len() < FILE_HEADER_LEN {
            return Err(short());
        }
        // The writer stored the magic in its own order: reading it little-endian tells which.
        let le_magic = u32_at(buf, 0, false).ok_or_else(short)?;
        let big_endian = ![MAGIC_US, MAGIC_NS, MAGIC_MODIFIED].contains(&le_magic);
        let magic = u32_at(buf, 0, big_endian).ok_or_else(short)?;
        let be = big_endian;
        let hdr = FileHeader {
            nanos: magic == MAGIC_NS,
            big_endian,
            modified: magic == MAGIC_MODIFIED,
            version_major: u16_at(buf, 4, be).ok_or_else(short)?,
            version_minor: u16_at(buf, 6, be).ok_or_else(short)?,
            thiszone: u32_at(buf, 8, be).ok_or_else(short)?,
            sigfigs: u32_at(buf, 12, be).ok_or_else(short)?,
            snaplen: u32_at(buf, 16, be).ok_or_else(short)?,
            linktype_field: u32_at(buf, 20, be).ok_or_else(short)?,
        };
        // libpcap refuses anything but major version 2; 2.3 and 2.4 differ only in files
        // older than any tool we replace.
        if hdr.version_major != 2 {
            return Err(Reason::UnsupportedPcapVersion {
                major: hdr.version_major,
                minor: hdr.version_minor,
            });
        }
        Ok(hdr)
    }

    /// Writes the header into `buf`.
    pub fn emit(&self, buf: &mut [u8; FILE_HEADER_LEN]) {
        let be = self.big_endian;
        let magic = match (self.modified, self.nanos) {
            (true, _) => MAGIC_MODIFIED,
            (false, true) => MAGIC_NS,
            (false, false) => MAGIC_US,
        };
        buf[0..4].copy_from_slice(&u32_bytes(magic, be));
        buf[4..6].copy_from_slice(&u16_bytes(self.version_major, be));
        buf[6..8].copy_from_slice(&u16_bytes(self.version_minor, be));
        buf[8..12].copy_from_slice(&u32_bytes(self.thiszone, be));
        buf[12..16].copy_from_slice(&u32_bytes(self.sigfigs, be));
        buf[16..20].copy_from_slice(&u32_bytes(self.snaplen, be));
        buf[20..24].copy_from_slice(&u32_bytes(self.linktype_field, be));
    }

    /// The link type (DLT) without libpcap's FCS bits.
    pub fn linktype(&self) -> u32 {
        self.linktype_field & LINKTYPE_MASK
    }

    /// Size of each record header in this file.
    pub fn record_header_len(&self) -> usize {
        if self.modified {
            MODIFIED_RECORD_HEADER_LEN
        } else {
            RECORD_HEADER_LEN
        }
    }
}

/// The parsed pcap record header (the fields shared by standard and modified pcap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub ts_sec: u32,
    /// µs or ns, as the file header says.
    pub ts_frac: u32,
    pub caplen: u32,
    pub orig_len: u32,
}

impl RecordHeader {
    /// Parses the first 16 bytes of `buf`; `None` if it is shorter.
    #[inline]
    pub fn parse(buf: &[u8], be: bool) -> Option<RecordHeader> {
        Some(RecordHeader {
            ts_sec: u32_at(buf, 0, be)?,
            ts_frac: u32_at(buf, 4, be)?,
            caplen: u32_at(buf, 8, be)?,
            orig_len: u32_at(buf, 12, be)?,
        })
    }

    /// Writes the standard 16-byte form into `buf`.
    #[inline]
    pub fn emit(&self, buf: &mut [u8; RECORD_HEADER_LEN], be: bool) {
        buf[0..4].copy_from_slice(&u32_bytes(self.ts_sec, be));
        buf[4..8].copy_from_slice(&u32_bytes(self.ts_frac, be));
        buf[8..12].copy_from_slice(&u32_bytes(self.caplen, be));
        buf[12..16].copy_from_slice(&u32_bytes(self.orig_len, be));
    }
}

/// Writes a classic little-endian pcap file (version 2.4), in µs or ns.
///
/// Like a capture, it stores at most `snaplen` bytes of each packet (all of it when `snaplen`
/// is 0), so what it writes is always readable by [`crate::CaptureFile`].
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    w: W,
    snaplen: u32,
    nanos: bool,
}

impl PcapWriter<BufWriter<File>> {
    /// Creates (or truncates) `path` and writes the file header.
    pub fn create(
        path: &Path,
        linktype: u32,
        snaplen: u32,
        nanos: bool,
    ) -> Result<PcapWriter<BufWriter<File>>, PcapError> {
        let io_err = |what| {
            move |source| PcapError::Io {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        let file = File::create(path).map_err(io_err("cannot create"))?;
        // 256 KiB batches small records into few write(2)s.
        PcapWriter::new(
            BufWriter::with_capacity(256 * 1024, file),
            linktype,
            snaplen,
            nanos,
        )
        .map_err(io_err("cannot write the file header"))
    }
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header to `w`.
    pub fn new(mut w: W, linktype: u32, snaplen: u32, nanos: bool) -> io::Result<Self> {
        let hdr = FileHeader {
            nanos,
            big_endian: false,
            modified: false,
            version_major: 2,
            version_minor: 4,
            thiszone: 0,
            sigfigs: 0,
            snaplen,
            linktype_field: linktype,
        };
        let mut buf = [0; FILE_HEADER_LEN];
        hdr.emit(&mut buf);
        w.write_all(&buf)?;
        Ok(PcapWriter { w, snaplen, nanos })
    }

    /// Appends one packet: `ts_ns` since the epoch (cut to µs unless the file is in ns), the
    /// captured bytes, and the length the packet had on the wire.
    ///
    /// Fails with `InvalidInput` for a timestamp after 2106 (pcap seconds are 32 bits).
    pub fn write_packet(&mut self, ts_ns: u64, data: &[u8], orig_len: u32) -> io::Result<()> {
        let ts_sec = u32::try_from(ts_ns / 1_000_000_000).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "timestamp after 2106 does not fit pcap",
            )
        })?;
        let ns = (ts_ns % 1_000_000_000) as u32;
        let ts_frac = if self.nanos { ns } else { ns / 1000 };
        let keep = match self.snaplen {
            0 => data.len(),
            s => data.len().min(s as usize),
        };
        let caplen = u32::try_from(keep)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "packet longer than 4 GiB"))?;
        let mut buf = [0; RECORD_HEADER_LEN];
        RecordHeader {
            ts_sec,
            ts_frac,
            caplen,
            orig_len,
        }
        .emit(&mut buf, false);
        self.w.write_all(&buf)?;
        self.w.write_all(data.get(..keep).unwrap_or(data))
    }

    /// Pushes what is buffered to the reader (a pipe's reader sees every whole record so far).
    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    /// Flushes and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.w.flush()?;
        Ok(self.w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_header_parse_emit_round_trip_both_orders() {
        for big_endian in [false, true] {
            for (nanos, modified) in [(false, false), (true, false), (false, true)] {
                let hdr = FileHeader {
                    nanos,
                    big_endian,
                    modified,
                    version_major: 2,
                    version_minor: 4,
                    thiszone: 0,
                    sigfigs: 0,
                    snaplen: 65535,
                    linktype_field: 0x1000_0001,
                };
                // Pre-filled with a marker so a field emit forgets shows up.
                let mut buf = [0xa5; FILE_HEADER_LEN];
                hdr.emit(&mut buf);
                assert!(FileHeader::is_magic(buf[..4].try_into().unwrap()));
                let back = FileHeader::parse(&buf).unwrap();
                assert_eq!(back, hdr);
                assert_eq!(back.linktype(), 1);
            }
        }
    }

    #[test]
    fn file_header_cut_at_every_length_is_an_error() {
        let mut buf = [0; FILE_HEADER_LEN];
        FileHeader {
            nanos: false,
            big_endian: true,
            modified: false,
            version_major: 2,
            version_minor: 4,
            thiszone: 0,
            sigfigs: 0,
            snaplen: 0,
            linktype_field: 1,
        }
        .emit(&mut buf);
        for n in 0..FILE_HEADER_LEN {
            assert_eq!(
                FileHeader::parse(&buf[..n]),
                Err(Reason::TruncatedHeader {
                    what: "pcap file header",
                    needed: 24,
                    left: n as u64
                })
            );
        }
    }

    #[test]
    fn version_other_than_2_is_refused() {
        let mut buf = [0; FILE_HEADER_LEN];
        buf[..4].copy_from_slice(&MAGIC_US.to_le_bytes());
        buf[4..6].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(
            FileHeader::parse(&buf),
            Err(Reason::UnsupportedPcapVersion { major: 1, minor: 0 })
        );
    }

    #[test]
    fn record_header_round_trip_and_short_input() {
        let rec = RecordHeader {
            ts_sec: 1,
            ts_frac: 2,
            caplen: 3,
            orig_len: 4,
        };
        let mut buf = [0xa5; RECORD_HEADER_LEN];
        rec.emit(&mut buf, true);
        assert_eq!(RecordHeader::parse(&buf, true), Some(rec));
        for n in 0..RECORD_HEADER_LEN {
            assert_eq!(RecordHeader::parse(&buf[..n], true), None);
        }
    }

    #[test]
    fn writer_cuts_to_snaplen_and_refuses_far_future() {
        let mut w = PcapWriter::new(Vec::new(), 1, 4, true).unwrap();
        w.write_packet(1_500_000_000_123_456_789, &[1, 2, 3, 4, 5, 6], 6)
            .unwrap();
        let err = w.write_packet(u64::MAX, &[], 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let out = w.finish().unwrap();
        assert_eq!(out.len(), FILE_HEADER_LEN + RECORD_HEADER_LEN + 4);
        let rec = RecordHeader::parse(&out[FILE_HEADER_LEN..], false).unwrap();
        assert_eq!(
            rec,
            RecordHeader {
                ts_sec: 1_500_000_000,
                ts_frac: 123_456_789,
                caplen: 4,
                orig_len: 6
            }
        );
        assert_eq!(&out[FILE_HEADER_LEN + RECORD_HEADER_LEN..], &[1, 2, 3, 4]);
    }
}
