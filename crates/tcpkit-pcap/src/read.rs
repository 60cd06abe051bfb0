//! Iterating the packets of a capture: [`Packets`] walks the bytes of a [`crate::CaptureFile`]
//! record by record (pcap) or block by block (pcapng) and yields [`Packet`]s that borrow their
//! data from those bytes.
//!
//! Every length read from the file is checked against what is left before it is used, so a
//! corrupt file gives one `Err` item (after all the good packets) and then the iterator ends.
//! The only allocation is the interface table of a pcapng section, once per interface
//! description block; nothing is allocated per packet.

use std::iter::FusedIterator;
use std::path::Path;

use crate::bytes::{u16_at, u32_at};
use crate::error::{Location, PcapError, Reason};
use crate::pcap::FileHeader;
use crate::pcapng::{self, Interface};

/// Captured lengths up to this are plausible whatever the snaplen says: it is libpcap's
/// MAXIMUM_SNAPLEN, the most any libpcap-based tool captures of a packet.
pub const MAX_CAPLEN_FLOOR: u32 = 262_144;

/// The largest captured length accepted in a file or interface with this snaplen:
/// `max(262144, snaplen)`. A record claiming more is corrupt (or not really pcap), and refusing
/// it keeps a garbled length from being taken as gigabytes of packet.
pub fn max_caplen(snaplen: u32) -> u32 {
    snaplen.max(MAX_CAPLEN_FLOOR)
}

/// Refuses a captured length that is absurd or above a non-zero snaplen.
#[inline]
fn check_caplen(caplen: u32, snaplen: u32) -> Result<(), Reason> {
    let bound = max_caplen(snaplen);
    if caplen > bound {
        return Err(Reason::AbsurdCaplen { caplen, bound });
    }
    if snaplen != 0 && caplen > snaplen {
        return Err(Reason::CaplenExceedsSnaplen { caplen, snaplen });
    }
    Ok(())
}

/// One packet of a capture; `data` borrows from the capture's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// 1-based packet number in the file, as Wireshark numbers frames.
    pub number: u64,
    /// Byte offset of the record (pcap) or block (pcapng) in the file.
    pub offset: u64,
    /// Nanoseconds since the epoch. A pcapng simple packet block has no timestamp and gets
    /// the previous packet's (0 for the first).
    pub ts_ns: u64,
    /// Link type (DLT) of the packet: the file's, or its pcapng interface's.
    pub linktype: u32,
    /// Snapshot length of its file or interface (0: not given).
    pub snaplen: u32,
    /// Length of the packet on the wire.
    pub orig_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
}

/// Per-format walking state.
#[derive(Debug)]
enum Walk {
    Pcap {
        be: bool,
        nanos: bool,
        rec_len: usize,
        linktype: u32,
        snaplen: u32,
    },
    PcapNg {
        /// Byte order of the current section; `None` before the first section header.
        be: Option<bool>,
        /// Interfaces described so far in the current section, by id.
        interfaces: Vec<Interface>,
    },
}

/// Iterator over the packets of a capture; see [`crate::CaptureFile::packets`].
#[derive(Debug)]
pub struct Packets<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
    /// Packets yielded so far.
    count: u64,
    last_ts_ns: u64,
    done: bool,
    walk: Walk,
}

impl<'a> Packets<'a> {
    /// Starts after the pcap file header described by `hdr`.
    pub(crate) fn pcap(path: &'a Path, bytes: &'a [u8], hdr: &FileHeader) -> Packets<'a> {
        Packets {
            path,
            bytes,
            pos: crate::pcap::FILE_HEADER_LEN,
            count: 0,
            last_ts_ns: 0,
            done: false,
            walk: Walk::Pcap {
                be: hdr.big_endian,
                nanos: hdr.nanos,
                rec_len: hdr.record_header_len(),
                linktype: hdr.linktype(),
                snaplen: hdr.snaplen,
            },
        }
    }

    /// Starts at the first block of a pcapng file.
    pub(crate) fn pcapng(path: &'a Path, bytes: &'a [u8]) -> Packets<'a> {
        Packets {
            path,
            bytes,
            pos: 0,
            count: 0,
            last_ts_ns: 0,
            done: false,
            walk: Walk::PcapNg {
                be: None,
                interfaces: Vec::new(),
            },
        }
    }

    /// Byte offset where the next record or block starts.
    pub fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn next_pcap(&mut self) -> Result<Option<Packet<'a>>, (Location, Reason)> {
        let Walk::Pcap {
            be,
            nanos,
            rec_len,
            linktype,
            snaplen,
        } = self.walk
        else {
            return Ok(None);
        };
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        if rest.is_empty() {
            return Ok(None);
        }
        let number = self.count + 1;
        let at = Location::Packet {
            number,
            offset: self.pos as u64,
        };
        let (Some(hdr), Some(body)) = (
            crate::pcap::RecordHeader::parse(rest, be),
            rest.get(rec_len..),
        ) else {
            let left = rest.len() as u64;
            return Err((
                at,
                Reason::TruncatedHeader {
                    what: "record header",
                    needed: rec_len as u64,
                    left,
                },
            ));
        };
        check_caplen(hdr.caplen, snaplen).map_err(|r| (at, r))?;
        let caplen = hdr.caplen as usize;
        let Some(data) = body.get(..caplen) else {
            let reason = Reason::TruncatedBody {
                what: "record",
                says: caplen as u64,
                left: body.len() as u64,
            };
            return Err((at, reason));
        };
        // u32 seconds times 10^9 plus a u32 fraction times 1000 stays below 2^64.
        let frac_ns = if nanos {
            u64::from(hdr.ts_frac)
        } else {
            u64::from(hdr.ts_frac) * 1000
        };
        let ts_ns = u64::from(hdr.ts_sec) * 1_000_000_000 + frac_ns;
        let packet = Packet {
            number,
            offset: self.pos as u64,
            ts_ns,
            linktype,
            snaplen,
            orig_len: hdr.orig_len,
            data,
        };
        self.pos += rec_len + caplen;
        Ok(Some(packet))
    }

    fn next_pcapng(&mut self) -> Result<Option<Packet<'a>>, (Location, Reason)> {
        let Walk::PcapNg {
            be: section_be,
            interfaces,
        } = &mut self.walk
        else {
            return Ok(None);
        };
        loop {
            let offset = self.pos as u64;
            let rest = self.bytes.get(self.pos..).unwrap_or_default();
            if rest.is_empty() {
                return Ok(None);
            }
            let block_at = Location::Block { offset };
            // A block header cut short: placed at the block, or at the packet once its type
            // says it holds one.
            let cut_header = |at| {
                let left = rest.len() as u64;
                let what = "block header";
                (
                    at,
                    Reason::TruncatedHeader {
                        what,
                        needed: 8,
                        left,
                    },
                )
            };
            let Some(block_type) = u32_at(rest, 0, false) else {
                return Err(cut_header(block_at));
            };
            // The section header's type is a palindrome so that it reads the same before the
            // byte order is known; its byte-order magic gives the order of everything after.
            let be = if block_type == pcapng::SHB {
                pcapng::section_big_endian(rest).map_err(|r| (block_at, r))?
            } else {
                match *section_be {
                    Some(be) => be,
                    None => return Err((block_at, Reason::NoSectionHeader(block_type))),
                }
            };
            let block_type = u32_at(rest, 0, be).unwrap_or(block_type);
            let number = self.count + 1;
            let at = if pcapng::is_packet_block(block_type) {
                Location::Packet { number, offset }
            } else {
                block_at
            };
            let Some(len) = u32_at(rest, 4, be) else {
                return Err(cut_header(at));
            };
            let min = pcapng::min_block_len(block_type);
            if len < min || len % 4 != 0 {
                return Err((
                    at,
                    Reason::BadBlockLength {
                        block_type,
                        len,
                        min,
                    },
                ));
            }
            let Some(block) = rest.get(..len as usize) else {
                let reason = Reason::TruncatedBody {
                    what: "block",
                    says: u64::from(len),
                    left: rest.len() as u64,
                };
                return Err((at, reason));
            };
            let trailer = u32_at(block, block.len() - 4, be).unwrap_or(0);
            if trailer != len {
                return Err((
                    at,
                    Reason::BlockLengthMismatch {
                        header: len,
                        trailer,
                    },
                ));
            }
            // `len >= 12` was checked, so the body slice exists.
            let body = block.get(8..block.len() - 4).unwrap_or_default();
            self.pos += len as usize;
            let (iface_id, units, caplen, orig_len, data_at) = match block_type {
                pcapng::SHB => {
                    let major = u16_at(body, 4, be).unwrap_or(0);
                    if major != 1 {
                        let minor = u16_at(body, 6, be).unwrap_or(0);
                        return Err((at, Reason::UnsupportedPcapNgVersion { major, minor }));
                    }
                    *section_be = Some(be);
                    interfaces.clear();
                    continue;
                }
                pcapng::IDB => {
                    interfaces.push(Interface::parse(body, be).map_err(|r| (at, r))?);
                    continue;
                }
                pcapng::EPB | pcapng::OPB => {
                    let iface_id = if block_type == pcapng::EPB {
                        u32_at(body, 0, be)
                    } else {
                        u16_at(body, 0, be).map(u32::from)
                    };
                    let fields = (
                        iface_id,
                        u32_at(body, 4, be),
                        u32_at(body, 8, be),
                        u32_at(body, 12, be),
                        u32_at(body, 16, be),
                    );
                    // The minimum block length guarantees these fields.
                    let (Some(id), Some(hi), Some(lo), Some(caplen), Some(orig_len)) = fields
                    else {
                        return Err((
                            at,
                            Reason::BadBlockLength {
                                block_type,
                                len,
                                min,
                            },
                        ));
                    };
                    (
                        id,
                        Some((u64::from(hi) << 32) | u64::from(lo)),
                        caplen,
                        orig_len,
                        20,
                    )
                }
                pcapng::SPB => {
                    let orig_len = u32_at(body, 0, be).unwrap_or(0);
                    let iface = interfaces
                        .first()
                        .ok_or((at, Reason::UnknownInterface { id: 0, count: 0 }))?;
                    // A simple packet block holds min(orig_len, snaplen) bytes, then padding.
                    let held = u32::try_from(body.len() - 4).unwrap_or(u32::MAX);
                    let mut caplen = orig_len.min(held);
                    if iface.snaplen != 0 {
                        caplen = caplen.min(iface.snaplen);
                    }
                    (0, None, caplen, orig_len, 4)
                }
                _ => continue,
            };
            let count = u32::try_from(interfaces.len()).unwrap_or(u32::MAX);
            let Some(iface) = interfaces.get(iface_id as usize) else {
                return Err((
                    at,
                    Reason::UnknownInterface {
                        id: iface_id,
                        count,
                    },
                ));
            };
            check_caplen(caplen, iface.snaplen).map_err(|r| (at, r))?;
            let held = body.get(data_at..).unwrap_or_default();
            let Some(data) = held.get(..caplen as usize) else {
                let reason = Reason::TruncatedBody {
                    what: "packet data in block",
                    says: u64::from(caplen),
                    left: held.len() as u64,
                };
                return Err((at, reason));
            };
            let ts_ns = match units {
                Some(units) => iface.ts_ns(units).map_err(|r| (at, r))?,
                None => self.last_ts_ns,
            };
            return Ok(Some(Packet {
                number,
                offset,
                ts_ns,
                linktype: iface.linktype,
                snaplen: iface.snaplen,
                orig_len,
                data,
            }));
        }
    }
}

impl<'a> Iterator for Packets<'a> {
    type Item = Result<Packet<'a>, PcapError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = match self.walk {
            Walk::Pcap { .. } => self.next_pcap(),
            Walk::PcapNg { .. } => self.next_pcapng(),
        };
        match step {
            Ok(Some(p)) => {
                self.count = p.number;
                self.last_ts_ns = p.ts_ns;
                Some(Ok(p))
            }
            Ok(None) => {
                self.done = true;
                None
            }
            Err((at, reason)) => {
                self.done = true;
                Some(Err(PcapError::Malformed {
                    path: self.path.to_path_buf(),
                    at,
                    reason,
                }))
            }
        }
    }
}

impl FusedIterator for Packets<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caplen_bounds() {
        assert_eq!(max_caplen(0), 262_144);
        assert_eq!(max_caplen(524_288), 524_288);
        assert_eq!(check_caplen(262_144, 0), Ok(()));
        assert_eq!(
            check_caplen(262_145, 0),
            Err(Reason::AbsurdCaplen {
                caplen: 262_145,
                bound: 262_144
            })
        );
        assert_eq!(
            check_caplen(1515, 1514),
            Err(Reason::CaplenExceedsSnaplen {
                caplen: 1515,
                snaplen: 1514
            })
        );
        assert_eq!(
            check_caplen(4_000_000_000, 65535),
            Err(Reason::AbsurdCaplen {
                caplen: 4_000_000_000,
                bound: 262_144
            })
        );
    }
}
