//! The pcapng format: block framing, the interface description (link type, snaplen,
//! if_tsresol, if_tsoffset) and its timestamp arithmetic, and [`PcapNgWriter`].
//!
//! Blocks read: section header (each section has its own byte order and its own interfaces),
//! interface description, enhanced packet, simple packet and the obsolete packet block. Every
//! other block type is skipped by its length, as the specification asks.

use std::io::{self, Write};

use crate::bytes::{u16_at, u16_bytes, u32_at, u32_bytes, u64_at, u64_bytes};
use crate::error::Reason;

/// Section header block; its type reads the same in both byte orders.
pub(crate) const SHB: u32 = 0x0a0d_0d0a;
/// Interface description block.
pub(crate) const IDB: u32 = 1;
/// Obsolete packet block.
pub(crate) const OPB: u32 = 2;
/// Simple packet block.
pub(crate) const SPB: u32 = 3;
/// Enhanced packet block.
pub(crate) const EPB: u32 = 6;
const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;

const OPT_ENDOFOPT: u16 = 0;
const OPT_IF_TSRESOL: u16 = 9;
const OPT_IF_TSOFFSET: u16 = 14;

/// Smallest total length of a block of this type: header, fixed fields, trailer.
pub(crate) fn min_block_len(block_type: u32) -> u32 {
    match block_type {
        SHB => 28,
        IDB => 20,
        EPB | OPB => 32,
        SPB => 16,
        _ => 12,
    }
}

/// Whether a block of this type carries a packet (and so gets a packet number).
pub(crate) fn is_packet_block(block_type: u32) -> bool {
    matches!(block_type, EPB | SPB | OPB)
}

/// Byte order of a section from its header's byte-order magic (at byte 8 of the block).
pub(crate) fn section_big_endian(block: &[u8]) -> Result<bool, Reason> {
    let bom = u32_at(block, 8, false).ok_or(Reason::TruncatedHeader {
        what: "section header block",
        needed: u64::from(min_block_len(SHB)),
        left: block.len() as u64,
    })?;
    if bom == BYTE_ORDER_MAGIC {
        Ok(false)
    } else if bom.swap_bytes() == BYTE_ORDER_MAGIC {
        Ok(true)
    } else {
        Err(Reason::BadByteOrderMagic(bom))
    }
}

/// How a pcapng timestamp in interface units becomes nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TsScale {
    /// Units of 10^-n s with n <= 9: multiply by 10^(9-n).
    Mul(u64),
    /// Units of 10^-n s with 9 < n <= 47: divide by 10^(n-9) (which fits u128).
    Div(u128),
    /// Units finer than 10^-47 s: any u64 count is below 1 ns.
    Zero,
    /// Units of 2^-n s: multiply by 10^9, shift right by n.
    Shift(u32),
}

impl TsScale {
    /// From the if_tsresol byte: high bit clear is 10^-n, set is 2^-n.
    pub fn from_tsresol(b: u8) -> TsScale {
        let n = u32::from(b & 0x7f);
        if b & 0x80 != 0 {
            TsScale::Shift(n)
        } else if n <= 9 {
            TsScale::Mul(10u64.pow(9 - n))
        } else if n <= 47 {
            TsScale::Div(10u128.pow(n - 9))
        } else {
            TsScale::Zero
        }
    }

    /// The interface's default resolution, µs.
    pub const MICROS: TsScale = TsScale::Mul(1000);

    /// Nanoseconds in `units`; `None` past u64 (year 2554).
    #[inline]
    pub fn to_ns(self, units: u64) -> Option<u64> {
        match self {
            TsScale::Mul(m) => units.checked_mul(m),
            TsScale::Div(d) => u64::try_from(u128::from(units) / d).ok(),
            TsScale::Zero => Some(0),
            TsScale::Shift(n) => u64::try_from((u128::from(units) * 1_000_000_000) >> n).ok(),
        }
    }

    /// Units in `ns` (rounded down); `None` if they do not fit 64 bits.
    pub fn units_in(self, ns: u64) -> Option<u64> {
        match self {
            TsScale::Mul(m) => Some(ns / m),
            TsScale::Div(d) => u64::try_from(u128::from(ns).checked_mul(d)?).ok(),
            TsScale::Zero => None,
            TsScale::Shift(n) => {
                let scaled = u128::from(ns).checked_shl(n)?;
                // checked_shl only refuses n >= 128; check that no bit fell off the top.
                if scaled >> n != u128::from(ns) {
                    return None;
                }
                u64::try_from(scaled / 1_000_000_000).ok()
            }
        }
    }
}

/// What a packet needs from its interface description block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interface {
    pub linktype: u32,
    pub snaplen: u32,
    pub scale: TsScale,
    /// if_tsoffset: seconds added to every timestamp of the interface.
    pub offset_s: i64,
}

impl Interface {
    /// Parses the body (between length fields) of an interface description block.
    pub fn parse(body: &[u8], be: bool) -> Result<Interface, Reason> {
        let short = || Reason::TruncatedHeader {
            what: "interface description block",
            needed: 8,
            left: body.len() as u64,
        };
        let mut iface = Interface {
            linktype: u32::from(u16_at(body, 0, be).ok_or_else(short)?),
            snaplen: u32_at(body, 4, be).ok_or_else(short)?,
            scale: TsScale::MICROS,
            offset_s: 0,
        };
        let mut opts = body.get(8..).unwrap_or_default();
        // An option is code, length, value padded to 4 bytes. The end-of-options option is
        // optional, so running out of bytes ends the list too.
        while let (Some(code), Some(len)) = (u16_at(opts, 0, be), u16_at(opts, 2, be)) {
            if code == OPT_ENDOFOPT {
                break;
            }
            let padded = (usize::from(len) + 3) & !3;
            let Some(value) = opts.get(4..4 + usize::from(len)) else {
                return Err(Reason::BadOption { code, len });
            };
            match (code, value) {
                (OPT_IF_TSRESOL, [b, ..]) => iface.scale = TsScale::from_tsresol(*b),
                (OPT_IF_TSOFFSET, v) if v.len() == 8 => {
                    iface.offset_s = u64_at(v, 0, be).map_or(0, |o| o as i64);
                }
                _ => {}
            }
            opts = opts.get(4 + padded..).unwrap_or_default();
        }
        Ok(iface)
    }

    /// Nanoseconds since the epoch of a timestamp in this interface's units.
    #[inline]
    pub fn ts_ns(&self, units: u64) -> Result<u64, Reason> {
        let ns = self.scale.to_ns(units).ok_or(Reason::TimestampOutOfRange)?;
        if self.offset_s == 0 {
            return Ok(ns);
        }
        let total = i128::from(ns) + i128::from(self.offset_s) * 1_000_000_000;
        u64::try_from(total).map_err(|_| Reason::TimestampOutOfRange)
    }
}

/// A pcapng timestamp resolution (the if_tsresol option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsResolution {
    /// Units of 10^-n seconds (n = 6 is µs, the default; 9 is ns).
    Pow10(u8),
    /// Units of 2^-n seconds.
    Pow2(u8),
}

impl TsResolution {
    /// The option byte; `None` if `n` does not fit its 7 bits.
    fn byte(self) -> Option<u8> {
        match self {
            TsResolution::Pow10(n) if n < 0x80 => Some(n),
            TsResolution::Pow2(n) if n < 0x80 => Some(0x80 | n),
            _ => None,
        }
    }
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Writes pcapng: section headers (either byte order), interface descriptions with if_tsresol
/// and if_tsoffset, enhanced, simple and obsolete packet blocks, and raw blocks of any type
/// (to make files with blocks a reader must skip).
///
/// Packet blocks are written from a header on the stack plus the caller's bytes: no allocation
/// per packet.
#[derive(Debug)]
pub struct PcapNgWriter<W: Write> {
    w: W,
    be: bool,
    /// Interfaces of the current section, to convert timestamps and refuse unknown ids.
    interfaces: Vec<Interface>,
}

impl<W: Write> PcapNgWriter<W> {
    /// Writes a section header block in the chosen byte order.
    pub fn new(w: W, big_endian: bool) -> io::Result<Self> {
        let mut me = PcapNgWriter {
            w,
            be: big_endian,
            interfaces: Vec::new(),
        };
        me.new_section(big_endian)?;
        Ok(me)
    }

    /// Starts another section: a new header block, possibly in the other byte order. The
    /// interfaces of the previous section no longer exist.
    pub fn new_section(&mut self, big_endian: bool) -> io::Result<()> {
        self.be = big_endian;
        self.interfaces.clear();
        let be = self.be;
        let mut body = [0; 16];
        body[0..4].copy_from_slice(&u32_bytes(BYTE_ORDER_MAGIC, be));
        body[4..6].copy_from_slice(&u16_bytes(1, be));
        body[6..8].copy_from_slice(&u16_bytes(0, be));
        // Section length -1: not given, as every streaming writer does.
        body[8..16].copy_from_slice(&u64_bytes(u64::MAX, be));
        self.write_block(SHB, &[&body])
    }

    /// Describes an interface and returns its id (0, 1, ... in this section). `linktype` must
    /// fit 16 bits; `tsoffset_s` is the if_tsoffset option, written when non-zero.
    pub fn add_interface(
        &mut self,
        linktype: u32,
        snaplen: u32,
        tsresol: TsResolution,
        tsoffset_s: i64,
    ) -> io::Result<u32> {
        let be = self.be;
        let linktype16 =
            u16::try_from(linktype).map_err(|_| invalid("pcapng link types are 16 bits"))?;
        let resol = tsresol
            .byte()
            .ok_or_else(|| invalid("if_tsresol exponent above 127"))?;
        let mut body = [0; 8 + 8 + 12 + 4];
        body[0..2].copy_from_slice(&u16_bytes(linktype16, be));
        body[4..8].copy_from_slice(&u32_bytes(snaplen, be));
        body[8..10].copy_from_slice(&u16_bytes(OPT_IF_TSRESOL, be));
        body[10..12].copy_from_slice(&u16_bytes(1, be));
        body[12] = resol;
        let mut len = 16;
        if tsoffset_s != 0 {
            body[16..18].copy_from_slice(&u16_bytes(OPT_IF_TSOFFSET, be));
            body[18..20].copy_from_slice(&u16_bytes(8, be));
            body[20..28].copy_from_slice(&u64_bytes(tsoffset_s as u64, be));
            len = 28;
        }
        // End of options: code 0, length 0 (already zero).
        len += 4;
        self.write_block(IDB, &[&body[..len]])?;
        let id =
            u32::try_from(self.interfaces.len()).map_err(|_| invalid("too many interfaces"))?;
        self.interfaces.push(Interface {
            linktype,
            snaplen,
            scale: TsScale::from_tsresol(resol),
            offset_s: tsoffset_s,
        });
        Ok(id)
    }

    fn units(&self, iface: u32, ts_ns: u64) -> io::Result<u64> {
        let i = self
            .interfaces
            .get(iface as usize)
            .ok_or_else(|| invalid("no such interface in this section"))?;
        let rel = i128::from(ts_ns) - i128::from(i.offset_s) * 1_000_000_000;
        let rel = u64::try_from(rel).map_err(|_| invalid("timestamp before the if_tsoffset"))?;
        i.scale
            .units_in(rel)
            .ok_or_else(|| invalid("timestamp does not fit the resolution"))
    }

    /// Writes an enhanced packet block on interface `iface`, `ts_ns` converted (rounded
    /// down) to that interface's resolution.
    pub fn write_epb(
        &mut self,
        iface: u32,
        ts_ns: u64,
        data: &[u8],
        orig_len: u32,
    ) -> io::Result<()> {
        let units = self.units(iface, ts_ns)?;
        let be = self.be;
        let caplen = u32::try_from(data.len()).map_err(|_| invalid("packet longer than 4 GiB"))?;
        let mut hdr = [0; 20];
        hdr[0..4].copy_from_slice(&u32_bytes(iface, be));
        hdr[4..8].copy_from_slice(&u32_bytes((units >> 32) as u32, be));
        hdr[8..12].copy_from_slice(&u32_bytes(units as u32, be));
        hdr[12..16].copy_from_slice(&u32_bytes(caplen, be));
        hdr[16..20].copy_from_slice(&u32_bytes(orig_len, be));
        self.write_block(EPB, &[&hdr, data])
    }

    /// Writes an obsolete packet block (pcapng's first packet block, 16-bit interface id and
    /// drop count), as old tools wrote it.
    pub fn write_opb(
        &mut self,
        iface: u16,
        ts_ns: u64,
        data: &[u8],
        orig_len: u32,
    ) -> io::Result<()> {
        let units = self.units(u32::from(iface), ts_ns)?;
        let be = self.be;
        let caplen = u32::try_from(data.len()).map_err(|_| invalid("packet longer than 4 GiB"))?;
        let mut hdr = [0; 20];
        hdr[0..2].copy_from_slice(&u16_bytes(iface, be));
        hdr[4..8].copy_from_slice(&u32_bytes((units >> 32) as u32, be));
        hdr[8..12].copy_from_slice(&u32_bytes(units as u32, be));
        hdr[12..16].copy_from_slice(&u32_bytes(caplen, be));
        hdr[16..20].copy_from_slice(&u32_bytes(orig_len, be));
        self.write_block(OPB, &[&hdr, data])
    }

    /// Writes a simple packet block (interface 0, no timestamp). It stores
    /// `min(orig_len, snaplen)` bytes, as readers expect: `data` longer than interface 0's
    /// snaplen is cut to it, and `data` shorter than that amount is refused (readers would
    /// take the padding for packet bytes).
    pub fn write_spb(&mut self, data: &[u8], orig_len: u32) -> io::Result<()> {
        let Some(iface) = self.interfaces.first() else {
            return Err(invalid("a simple packet block needs interface 0"));
        };
        let mut keep = data.len();
        let mut want = orig_len as usize;
        if iface.snaplen != 0 {
            keep = keep.min(iface.snaplen as usize);
            want = want.min(iface.snaplen as usize);
        }
        if keep != want {
            return Err(invalid(
                "a simple packet block holds min(orig_len, snaplen) bytes",
            ));
        }
        let data = data.get(..keep).unwrap_or(data);
        self.write_block(SPB, &[&u32_bytes(orig_len, self.be), data])
    }

    /// Writes a block of any type with `body` (padded to 4 bytes), e.g. one a reader does not
    /// know and must skip.
    pub fn write_raw_block(&mut self, block_type: u32, body: &[u8]) -> io::Result<()> {
        self.write_block(block_type, &[body])
    }

    /// Frames `parts` as one block: type, length, parts, padding to 4, length.
    fn write_block(&mut self, block_type: u32, parts: &[&[u8]]) -> io::Result<()> {
        let body_len: usize = parts.iter().map(|p| p.len()).sum();
        let padded = (body_len + 3) & !3;
        let total = u32::try_from(padded + 12).map_err(|_| invalid("block longer than 4 GiB"))?;
        let be = self.be;
        let mut head = [0; 8];
        head[0..4].copy_from_slice(&u32_bytes(block_type, be));
        head[4..8].copy_from_slice(&u32_bytes(total, be));
        self.w.write_all(&head)?;
        for p in parts {
            self.w.write_all(p)?;
        }
        self.w.write_all(&[0; 3][..padded - body_len])?;
        self.w.write_all(&u32_bytes(total, be))
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
    fn tsresol_powers_of_ten_and_two() {
        assert_eq!(
            TsScale::from_tsresol(6).to_ns(1_500_000),
            Some(1_500_000_000)
        );
        assert_eq!(TsScale::from_tsresol(9).to_ns(7), Some(7));
        assert_eq!(TsScale::from_tsresol(0).to_ns(2), Some(2_000_000_000));
        assert_eq!(TsScale::from_tsresol(12).to_ns(5_000), Some(5));
        assert_eq!(TsScale::from_tsresol(100).to_ns(u64::MAX), Some(0));
        // 2^-10 s: 1024 units are one second, one unit is 976562.5 ns, rounded down.
        assert_eq!(TsScale::from_tsresol(0x8a).to_ns(1024), Some(1_000_000_000));
        assert_eq!(TsScale::from_tsresol(0x8a).to_ns(1), Some(976_562));
        assert_eq!(TsScale::from_tsresol(0xff).to_ns(u64::MAX), Some(0));
        // Seconds beyond 2554 do not fit u64 ns.
        assert_eq!(TsScale::from_tsresol(0).to_ns(u64::MAX), None);
        assert_eq!(TsScale::from_tsresol(0x80).to_ns(u64::MAX), None);
    }

    #[test]
    fn from_ns_rounds_down_to_within_one_unit() {
        let ns = 1_700_000_000_123_456_789u64;
        for (b, unit_ns) in [
            (0u8, 1e9),
            (3, 1e6),
            (6, 1e3),
            (9, 1.0),
            (0x80, 1e9),
            (0x8a, 1e9 / 1024.0),
        ] {
            let s = TsScale::from_tsresol(b);
            let back = s.to_ns(s.units_in(ns).unwrap()).unwrap();
            assert!(
                back <= ns && ((ns - back) as f64) < unit_ns,
                "{b:#x}: {back}"
            );
        }
        // Units finer than a nanosecond: exact in both directions while they fit 64 bits.
        assert_eq!(TsScale::from_tsresol(12).units_in(5), Some(5000));
        assert_eq!(TsScale::from_tsresol(12).units_in(ns), None);
        assert_eq!(
            TsScale::from_tsresol(0x9e).units_in(1_000_000_000),
            Some(1 << 30)
        );
        assert_eq!(TsScale::from_tsresol(0xff).units_in(1), None);
        assert_eq!(TsScale::from_tsresol(47).units_in(1), None);
    }

    #[test]
    fn interface_options_and_bad_option() {
        let mut out = Vec::new();
        let mut w = PcapNgWriter::new(&mut out, true).unwrap();
        w.add_interface(228, 1500, TsResolution::Pow2(10), -5)
            .unwrap();
        w.finish().unwrap();
        // SHB is 28 bytes; the IDB body starts after its 8-byte header.
        let idb = &out[28..];
        let len = u32_at(idb, 4, true).unwrap() as usize;
        let body = &idb[8..len - 4];
        let iface = Interface::parse(body, true).unwrap();
        assert_eq!(
            iface,
            Interface {
                linktype: 228,
                snaplen: 1500,
                scale: TsScale::Shift(10),
                offset_s: -5
            }
        );
        assert_eq!(iface.ts_ns(1024 * 6), Ok(1_000_000_000));
        assert_eq!(iface.ts_ns(0), Err(Reason::TimestampOutOfRange));
        // An option whose length runs past the body.
        let mut bad = body[..12].to_vec();
        bad[10..12].copy_from_slice(&40u16.to_be_bytes());
        assert_eq!(
            Interface::parse(&bad, true),
            Err(Reason::BadOption { code: 9, len: 40 })
        );
        for n in 0..8 {
            assert!(matches!(
                Interface::parse(&body[..n], true),
                Err(Reason::TruncatedHeader { .. })
            ));
        }
    }

    #[test]
    fn writer_refuses_what_pcapng_cannot_hold() {
        let mut w = PcapNgWriter::new(Vec::new(), false).unwrap();
        assert!(w.write_spb(&[1], 1).is_err());
        assert!(w.write_epb(0, 0, &[1], 1).is_err());
        assert!(w
            .add_interface(0x1_0000, 0, TsResolution::Pow10(6), 0)
            .is_err());
        assert!(w.add_interface(1, 0, TsResolution::Pow10(200), 0).is_err());
        let id = w.add_interface(1, 0, TsResolution::Pow10(6), 10).unwrap();
        assert_eq!(id, 0);
        assert!(w.write_epb(0, 9_000_000_000, &[1], 1).is_err());
        w.write_epb(0, 10_000_000_000, &[1], 1).unwrap();
        assert!(w.write_spb(&[1, 2], 3).is_err());
        w.write_spb(&[1, 2, 3], 3).unwrap();
    }
}
