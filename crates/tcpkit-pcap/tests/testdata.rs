//! The public captures in testdata read as Wireshark reads them: packet counts, link
//! types, timestamps and lengths checked against `tshark -T fields -e frame.time_epoch -e
//! frame.cap_len -e frame.len` (figures below), and every packet's bytes compared with
//! pcap-parser, an independent reader.

use std::path::{Path, PathBuf};

use tcpkit_pcap::{CaptureFile, Format, PcapWriter};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

/// What tshark reports for a file.
struct Expect {
    name: &'static str,
    packets: u64,
    linktype: u32,
    first_ts_ns: u64,
    last_ts_ns: u64,
    /// Sum of all timestamps in ns: pins every one of them, not only the ends.
    sum_ts_ns: u128,
    sum_caplen: u64,
    sum_orig_len: u64,
}

const EXPECT: &[Expect] = &[
    Expect {
        name: "tcpreplay-test.pcap",
        packets: 179,
        linktype: 1,
        first_ts_ns: 1_278_472_579_466_743_000,
        last_ts_ns: 1_278_472_582_723_492_000,
        sum_ts_ns: 228_846_592_060_143_095_000,
        sum_caplen: 69000,
        sum_orig_len: 69000,
    },
    Expect {
        name: "trex-http_get.pcap",
        packets: 47,
        linktype: 1,
        first_ts_ns: 0,
        last_ts_ns: 170_334_000,
        sum_ts_ns: 4_883_127_000,
        sum_caplen: 42005,
        sum_orig_len: 42005,
    },
    Expect {
        name: "zeek-dns-tcp-keepalive.pcap",
        packets: 20,
        linktype: 1,
        first_ts_ns: 1_597_501_603_801_767_000,
        last_ts_ns: 1_597_501_611_633_417_000,
        sum_ts_ns: 31_950_032_154_507_898_000,
        sum_caplen: 1654,
        sum_orig_len: 1654,
    },
    Expect {
        name: "zeek-redis-pipelining-dlt-null.pcap",
        packets: 12,
        linktype: 0,
        first_ts_ns: 1_727_365_291_698_714_000,
        last_ts_ns: 1_727_365_292_695_103_000,
        sum_ts_ns: 20_728_383_504_371_396_000,
        sum_caplen: 975,
        sum_orig_len: 975,
    },
    Expect {
        name: "zeek-redis-django-cloud.pcapng",
        packets: 474,
        linktype: 1,
        first_ts_ns: 1_728_488_976_467_415_000,
        last_ts_ns: 1_728_488_990_007_242_000,
        sum_ts_ns: 819_303_779_189_003_065_000,
        sum_caplen: 50318,
        sum_orig_len: 50318,
    },
];

#[test]
fn public_captures_read_as_tshark_reads_them() {
    for e in EXPECT {
        for file in [
            CaptureFile::open(&testdata(e.name)).unwrap(),
            CaptureFile::read_into_memory(&testdata(e.name)).unwrap(),
        ] {
            let (mut n, mut first, mut last, mut sum_ts, mut cap, mut orig) =
                (0, None, 0, 0u128, 0, 0);
            for p in file.packets() {
                let p = p.unwrap_or_else(|err| panic!("{err}"));
                n += 1;
                assert_eq!(p.number, n, "{}", e.name);
                assert_eq!(p.linktype, e.linktype, "{}", e.name);
                first.get_or_insert(p.ts_ns);
                last = p.ts_ns;
                sum_ts += u128::from(p.ts_ns);
                cap += p.data.len() as u64;
                orig += u64::from(p.orig_len);
            }
            assert_eq!(n, e.packets, "{}", e.name);
            assert_eq!(first, Some(e.first_ts_ns), "{}", e.name);
            assert_eq!(last, e.last_ts_ns, "{}", e.name);
            assert_eq!(sum_ts, e.sum_ts_ns, "{}", e.name);
            assert_eq!(cap, e.sum_caplen, "{}", e.name);
            assert_eq!(orig, e.sum_orig_len, "{}", e.name);
        }
    }
}

#[test]
fn open_maps_and_preload_copies() {
    let path = testdata("tcpreplay-test.pcap");
    let mapped = CaptureFile::open(&path).unwrap();
    let loaded = CaptureFile::read_into_memory(&path).unwrap();
    assert!(mapped.is_mapped());
    assert!(!loaded.is_mapped());
    assert_eq!(mapped.len_bytes(), 71888);
    assert_eq!(mapped.bytes(), loaded.bytes());
    assert_eq!(mapped.path(), path);
    assert_eq!(
        mapped.format(),
        Format::Pcap {
            nanos: false,
            big_endian: false,
            linktype: 1,
            snaplen: 262_144,
            modified: false
        }
    );
    // Zero-copy: packet data points into the mapped bytes.
    let range = mapped.bytes().as_ptr_range();
    for p in mapped.packets() {
        let p = p.unwrap();
        assert!(range.contains(&p.data.as_ptr()));
        let off = p.offset as usize + 16;
        assert_eq!(&mapped.bytes()[off..off + p.data.len()], p.data);
    }
}

#[test]
fn same_packets_as_pcap_parser() {
    for e in EXPECT {
        let file = CaptureFile::open(&testdata(e.name)).unwrap();
        let ours: Vec<_> = file.packets().map(|p| p.unwrap()).collect();
        let theirs: Vec<(&[u8], u32)> = if e.name.ends_with(".pcapng") {
            let cap = pcap_parser::PcapNGCapture::from_file(file.bytes()).unwrap();
            cap.sections
                .iter()
                .flat_map(|s| s.blocks.iter())
                .filter_map(|b| match b {
                    pcap_parser::Block::EnhancedPacket(epb) => {
                        Some((&epb.data[..epb.caplen as usize], epb.origlen))
                    }
                    _ => None,
                })
                .collect()
        } else {
            let cap = pcap_parser::PcapCapture::from_file(file.bytes()).unwrap();
            cap.blocks.iter().map(|b| (b.data, b.origlen)).collect()
        };
        assert_eq!(ours.len(), theirs.len(), "{}", e.name);
        for (p, (data, orig)) in ours.iter().zip(theirs) {
            assert_eq!(p.data, data, "{} packet {}", e.name, p.number);
            assert_eq!(p.orig_len, orig, "{} packet {}", e.name, p.number);
        }
    }
}

#[test]
fn rewriting_a_public_pcap_gives_back_its_bytes() {
    // These files are little-endian pcap 2.4 with thiszone and sigfigs 0, as PcapWriter writes.
    for name in [
        "tcpreplay-test.pcap",
        "zeek-redis-pipelining-dlt-null.pcap",
        "trex-http_get.pcap",
    ] {
        let file = CaptureFile::open(&testdata(name)).unwrap();
        let Format::Pcap {
            nanos,
            linktype,
            snaplen,
            ..
        } = file.format()
        else {
            panic!("{name}")
        };
        let mut w = PcapWriter::new(Vec::new(), linktype, snaplen, nanos).unwrap();
        for p in file.packets() {
            let p = p.unwrap();
            w.write_packet(p.ts_ns, p.data, p.orig_len).unwrap();
        }
        assert!(w.finish().unwrap() == file.bytes(), "{name}");
    }
}
