//! Every format variant read back, every cut an error, every error message where and why.

use crate::common;

use std::error::Error as _;
use std::io::{self, Write};

use common::*;
use tcpkit_pcap::{CaptureFile, Format, Packet, PcapError, PcapWriter, Reason};

fn read_all(file: &CaptureFile) -> (Vec<Packet<'_>>, Option<PcapError>) {
    let mut ok = Vec::new();
    let mut items = file.packets();
    for item in items.by_ref() {
        match item {
            Ok(p) => ok.push(p),
            Err(e) => {
                // After the first error the iterator ends.
                assert!(items.next().is_none());
                return (ok, Some(e));
            }
        }
    }
    (ok, None)
}

#[test]
fn write_read_write_gives_identical_bytes_us_and_ns() {
    let dir = tempfile::tempdir().unwrap();
    for nanos in [false, true] {
        let path = dir.path().join(format!("rt-{nanos}.pcap"));
        let mut w = PcapWriter::create(&path, 1, 65535, nanos).unwrap();
        let packets = sample_packets(300);
        for (ts, data, orig) in &packets {
            w.write_packet(*ts, data, *orig).unwrap();
        }
        w.finish().unwrap();

        let file = CaptureFile::open(&path).unwrap();
        assert_eq!(
            file.format(),
            Format::Pcap {
                nanos,
                big_endian: false,
                linktype: 1,
                snaplen: 65535,
                modified: false
            }
        );
        let (got, err) = read_all(&file);
        assert!(err.is_none());
        assert_eq!(got.len(), packets.len());
        let mut again = PcapWriter::new(Vec::new(), 1, 65535, nanos).unwrap();
        for (i, (p, (ts, data, orig))) in got.iter().zip(&packets).enumerate() {
            assert_eq!(p.number, i as u64 + 1);
            let want_ts = if nanos { *ts } else { ts / 1000 * 1000 };
            assert_eq!(p.ts_ns, want_ts);
            assert_eq!(p.data, &data[..]);
            assert_eq!(p.orig_len, *orig);
            again.write_packet(p.ts_ns, p.data, p.orig_len).unwrap();
        }
        assert!(again.finish().unwrap() == std::fs::read(&path).unwrap());
    }
}

#[test]
fn big_endian_pcap_in_us_and_ns() {
    for nanos in [false, true] {
        let file = CaptureFile::from_bytes("be.pcap", big_endian_pcap(nanos)).unwrap();
        assert_eq!(
            file.format(),
            Format::Pcap {
                nanos,
                big_endian: true,
                linktype: 101,
                snaplen: 96,
                modified: false
            }
        );
        let (got, err) = read_all(&file);
        assert!(err.is_none());
        let second_ts = if nanos { 2_000_000_001 } else { 2_000_001_000 };
        let summary: Vec<_> = got
            .iter()
            .map(|p| (p.number, p.offset, p.ts_ns, p.data.len(), p.orig_len))
            .collect();
        assert_eq!(
            summary,
            [(1, 24, 1_500_000_000, 4, 20), (2, 44, second_ts, 7, 7)]
        );
        assert_eq!(got[0].data, [0x45, 0, 0, 20]);
        assert!(got.iter().all(|p| p.linktype == 101 && p.snaplen == 96));
    }
}

#[test]
fn modified_pcap_skips_the_extra_record_fields() {
    let file = CaptureFile::from_bytes("mod.pcap", modified_pcap()).unwrap();
    assert!(matches!(
        file.format(),
        Format::Pcap {
            modified: true,
            nanos: false,
            ..
        }
    ));
    let (got, err) = read_all(&file);
    assert!(err.is_none());
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].ts_ns, got[0].data),
        (10_000_020_000, &[1, 2, 3][..])
    );
    assert_eq!(
        (got[1].offset, got[1].ts_ns, got[1].data),
        (24 + 27, 11_000_000_000, &[4; 60][..])
    );
}

#[test]
fn pcapng_interfaces_sections_and_block_kinds() {
    let (bytes, want) = multi_pcapng();
    let file = CaptureFile::from_bytes("multi.pcapng", bytes.clone()).unwrap();
    assert_eq!(file.format(), Format::PcapNg);
    let (got, err) = read_all(&file);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), want.len());
    for (i, (p, (linktype, snaplen, ts, data, orig))) in got.iter().zip(&want).enumerate() {
        assert_eq!(p.number, i as u64 + 1);
        assert_eq!(
            (p.linktype, p.snaplen, p.ts_ns, p.orig_len),
            (*linktype, *snaplen, *ts, *orig),
            "packet {}",
            i + 1
        );
        assert_eq!(p.data, &data[..], "packet {}", i + 1);
        // The offset is where the packet's block starts: EPB, EPB, SPB, SPB, OPB, EPB (BE).
        let block_type = [
            [6, 0, 0, 0],
            [6, 0, 0, 0],
            [3, 0, 0, 0],
            [3, 0, 0, 0],
            [2, 0, 0, 0],
            [0, 0, 0, 6],
        ][i];
        assert_eq!(
            bytes[p.offset as usize..p.offset as usize + 4],
            block_type,
            "packet {}",
            i + 1
        );
    }
    // pcap-parser, reading independently, sees the same enhanced packets.
    let cap = pcap_parser::PcapNGCapture::from_file(&bytes).unwrap();
    assert_eq!(cap.sections.len(), 2);
    assert!(cap.sections[1].big_endian);
    let epbs: Vec<&[u8]> = cap
        .sections
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter_map(|b| match b {
            pcap_parser::Block::EnhancedPacket(e) => Some(&e.data[..e.caplen as usize]),
            _ => None,
        })
        .collect();
    assert_eq!(epbs, [got[0].data, got[1].data, got[5].data]);
}

#[test]
fn big_endian_first_section() {
    let mut w = tcpkit_pcap::PcapNgWriter::new(Vec::new(), true).unwrap();
    w.add_interface(1, 0, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    w.write_epb(0, T0, &[1, 2, 3, 4, 5], 5).unwrap();
    let file = CaptureFile::from_bytes("be.pcapng", w.finish().unwrap()).unwrap();
    let (got, err) = read_all(&file);
    assert!(err.is_none());
    assert_eq!(
        (got[0].ts_ns, got[0].data, got[0].linktype),
        (T0, &[1, 2, 3, 4, 5][..], 1)
    );
}

#[test]
fn cut_anywhere_is_an_error_unless_cut_between_records() {
    let captures = [
        ("us.pcap", written_pcap(false, 4)),
        ("be.pcap", big_endian_pcap(true)),
        ("mod.pcap", modified_pcap()),
        ("multi.pcapng", multi_pcapng().0),
    ];
    for (name, full) in captures {
        let bounds = boundaries(&full);
        let all = {
            let f = CaptureFile::from_bytes(name, full.clone()).unwrap();
            let (got, err) = read_all(&f);
            assert!(err.is_none());
            got.len()
        };
        for cut in 0..full.len() {
            let opened = CaptureFile::from_bytes(name, full[..cut].to_vec());
            let failed = match &opened {
                Err(_) => true,
                Ok(f) => {
                    let (got, err) = read_all(f);
                    assert!(got.len() <= all);
                    if let Some(e) = &err {
                        // The error is about the record or block the cut went through.
                        assert!(
                            e.offset().is_some_and(|o| o as usize <= cut),
                            "{name} cut {cut}: {e}"
                        );
                        assert!(!e.to_string().contains('\n'));
                    }
                    err.is_some()
                }
            };
            assert_eq!(
                failed,
                !bounds.contains(&cut) || cut == 0,
                "{name} cut at {cut}"
            );
        }
    }
}

#[test]
fn truncated_final_record_comes_after_the_good_packets() {
    let full = written_pcap(false, 3);
    let (.., third) = {
        let f = CaptureFile::from_bytes("x", full.clone()).unwrap();
        let (got, _) = read_all(&f);
        (got[1].offset, got[2].offset, got[2].data.len())
    };
    let third_off = boundaries(&full)[2];
    let cut = full.len() - 10;
    let file = CaptureFile::from_bytes("capture.pcap", full[..cut].to_vec()).unwrap();
    let (got, err) = read_all(&file);
    assert_eq!(got.len(), 2);
    assert_eq!(
        err.unwrap().to_string(),
        format!(
            "capture.pcap: packet 3 at byte offset {third_off}: truncated record (header says {third} bytes, {} left)",
            third - 10
        )
    );
    let mut items = file.packets();
    items.next();
    assert_eq!(items.offset(), boundaries(&full)[1] as u64);

    let file = CaptureFile::from_bytes("capture.pcap", full[..third_off + 5].to_vec()).unwrap();
    let err = read_all(&file).1.unwrap();
    assert_eq!(
        err.to_string(),
        format!("capture.pcap: packet 3 at byte offset {third_off}: truncated record header (16 bytes needed, 5 left)")
    );
    assert_eq!(
        (err.packet_number(), err.offset()),
        (Some(3), Some(third_off as u64))
    );
}

/// A pcap with snaplen 100 holding one record that claims `caplen` bytes.
fn one_record(caplen: u32) -> Vec<u8> {
    let mut b = PcapWriter::new(Vec::new(), 1, 100, false)
        .unwrap()
        .finish()
        .unwrap();
    for v in [1u32, 0, caplen, caplen] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&[0; 300]);
    b
}

#[test]
fn caplen_above_snaplen_or_absurd() {
    let file = CaptureFile::from_bytes("x.pcap", one_record(300)).unwrap();
    assert_eq!(
        read_all(&file).1.unwrap().to_string(),
        "x.pcap: packet 1 at byte offset 24: captured length 300 exceeds the snaplen 100"
    );
    let file = CaptureFile::from_bytes("x.pcap", one_record(4_000_000_000)).unwrap();
    assert_eq!(
        read_all(&file).1.unwrap().to_string(),
        "x.pcap: packet 1 at byte offset 24: captured length 4000000000 is absurd (more than 262144)"
    );
    // pcapng: the interface's snaplen bounds its enhanced packets.
    let mut w = tcpkit_pcap::PcapNgWriter::new(Vec::new(), false).unwrap();
    w.add_interface(1, 10, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    w.write_epb(0, 0, &[0; 11], 11).unwrap();
    let file = CaptureFile::from_bytes("x.pcapng", w.finish().unwrap()).unwrap();
    let err = read_all(&file).1.unwrap();
    assert_eq!(
        err.reason(),
        Some(&Reason::CaplenExceedsSnaplen {
            caplen: 11,
            snaplen: 10
        })
    );
    assert_eq!(
        err.to_string(),
        "x.pcapng: packet 1 at byte offset 60: captured length 11 exceeds the snaplen 10"
    );
}

#[test]
fn pcapng_structural_errors() {
    // An enhanced packet on an interface the section does not describe; interfaces of an
    // earlier section do not count.
    let mut w = tcpkit_pcap::PcapNgWriter::new(Vec::new(), false).unwrap();
    w.add_interface(1, 0, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    w.add_interface(1, 0, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    w.write_epb(1, 0, &[1], 1).unwrap();
    w.new_section(false).unwrap();
    w.add_interface(1, 0, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    let mut bytes = w.finish().unwrap();
    let epb_at = bytes.len();
    let mut other = tcpkit_pcap::PcapNgWriter::new(Vec::new(), false).unwrap();
    other
        .add_interface(1, 0, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    other
        .add_interface(1, 0, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    other.write_epb(1, 0, &[2], 1).unwrap();
    let other = other.finish().unwrap();
    bytes.extend_from_slice(&other[other.len() - 36..]);
    let file = CaptureFile::from_bytes("x.pcapng", bytes.clone()).unwrap();
    let (got, err) = read_all(&file);
    assert_eq!(got.len(), 1);
    assert_eq!(
        err.unwrap().to_string(),
        format!("x.pcapng: packet 2 at byte offset {epb_at}: interface 1 does not exist (1 described in this section)")
    );

    // The length at the end of a block differs from the one at its start.
    let last = bytes.len() - 4;
    bytes[last] = 40;
    let file = CaptureFile::from_bytes("x.pcapng", bytes.clone()).unwrap();
    let err = read_all(&file).1.unwrap();
    assert_eq!(
        err.reason(),
        Some(&Reason::BlockLengthMismatch {
            header: 36,
            trailer: 40
        })
    );

    // A block length that is not a multiple of 4.
    bytes[epb_at + 4] = 37;
    let file = CaptureFile::from_bytes("x.pcapng", bytes).unwrap();
    let err = read_all(&file).1.unwrap();
    assert_eq!(
        err.reason(),
        Some(&Reason::BadBlockLength {
            block_type: 6,
            len: 37,
            min: 32
        })
    );
    assert_eq!(err.packet_number(), Some(2));

    // A simple packet block holding more than min(orig_len, snaplen): the rest is ignored;
    // holding less (orig_len 9, snaplen 0, 8 bytes held): what it holds.
    let mut w = tcpkit_pcap::PcapNgWriter::new(Vec::new(), false).unwrap();
    w.add_interface(1, 4, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    w.write_raw_block(3, &[6, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    w.new_section(false).unwrap();
    w.add_interface(1, 0, tcpkit_pcap::TsResolution::Pow10(6), 0)
        .unwrap();
    w.write_raw_block(3, &[9, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    let file = CaptureFile::from_bytes("x.pcapng", w.finish().unwrap()).unwrap();
    let (got, err) = read_all(&file);
    assert!(err.is_none());
    assert_eq!(got[0].data, [1, 2, 3, 4]);
    assert_eq!(
        (got[1].data, got[1].orig_len),
        (&[1, 2, 3, 4, 5, 6, 7, 8][..], 9)
    );

    // A simple packet block with no interface 0.
    let mut w = tcpkit_pcap::PcapNgWriter::new(Vec::new(), false).unwrap();
    w.write_raw_block(3, &[1, 0, 0, 0, 9, 0, 0, 0]).unwrap();
    let file = CaptureFile::from_bytes("x.pcapng", w.finish().unwrap()).unwrap();
    assert_eq!(
        read_all(&file).1.unwrap().to_string(),
        "x.pcapng: packet 1 at byte offset 28: interface 0 does not exist (0 described in this section)"
    );

    // A section of a version we do not know.
    let mut bytes = tcpkit_pcap::PcapNgWriter::new(Vec::new(), false)
        .unwrap()
        .finish()
        .unwrap();
    bytes[12] = 2;
    let file = CaptureFile::from_bytes("x.pcapng", bytes).unwrap();
    assert_eq!(
        read_all(&file).1.unwrap().to_string(),
        "x.pcapng: block at byte offset 0: unsupported pcapng section version 2.0"
    );
}

#[test]
fn open_errors_name_the_file_and_keep_the_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pcap");
    let err = CaptureFile::open(&missing).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{}: cannot open", missing.display())
    );
    let source = err.source().unwrap().downcast_ref::<io::Error>().unwrap();
    assert_eq!(source.kind(), io::ErrorKind::NotFound);
    assert!(CaptureFile::read_into_memory(&missing).is_err());

    let empty = dir.path().join("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    for err in [
        CaptureFile::open(&empty).unwrap_err(),
        CaptureFile::read_into_memory(&empty).unwrap_err(),
    ] {
        assert_eq!(err.to_string(), format!("{}: empty file", empty.display()));
    }

    let html = dir.path().join("x.pcap");
    std::fs::write(&html, b"<html><body>").unwrap();
    assert_eq!(
        CaptureFile::open(&html).unwrap_err().to_string(),
        format!(
            "{}: not a pcap or pcapng file (first bytes 3c 68 74 6d)",
            html.display()
        )
    );

    let nowhere = dir.path().join("no/such/dir/out.pcap");
    let err = PcapWriter::create(&nowhere, 1, 0, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{}: cannot create", nowhere.display())
    );
    assert_eq!(err.path(), nowhere);
    assert!(err.source().is_some());

    // A directory opens but cannot be read.
    let err = CaptureFile::open(dir.path()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{}: cannot read", dir.path().display())
    );
    assert!(err.source().is_some());
}

#[test]
fn a_pipe_is_read_into_memory() {
    let (reader, mut writer) = io::pipe().unwrap();
    let bytes = written_pcap(true, 5);
    // Five small packets fit the pipe's buffer, so writing before reading cannot block.
    assert!(bytes.len() < 16 * 1024);
    writer.write_all(&bytes).unwrap();
    drop(writer);
    use std::os::fd::AsRawFd;
    let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", reader.as_raw_fd()));
    let file = CaptureFile::open(&path).unwrap();
    assert!(!file.is_mapped());
    assert_eq!(file.bytes(), &bytes[..]);
    assert_eq!(file.packets().count(), 5);
}
