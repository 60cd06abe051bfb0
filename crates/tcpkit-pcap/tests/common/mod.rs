//! Captures built for the tests: by the writers, or byte by byte where the writers cannot
//! (big-endian and modified pcap), so the reader is not only checked against its own writer.

use tcpkit_pcap::{PcapNgWriter, PcapWriter, TsResolution};

/// 1.7e9 s: a timestamp in 2023.
pub const T0: u64 = 1_700_000_000_000_000_000;

/// Packets of assorted sizes (0 to 1514 bytes), each byte saying where it is, with
/// timestamps that use every ns digit.
pub fn sample_packets(n: usize) -> Vec<(u64, Vec<u8>, u32)> {
    (0..n)
        .map(|i| {
            let len = (i * 397) % 1515;
            let data: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
            let ts = T0 + i as u64 * 1_234_567_891;
            (ts, data, len as u32 + (i as u32 % 3))
        })
        .collect()
}

/// A little-endian pcap from [`PcapWriter`].
pub fn written_pcap(nanos: bool, n: usize) -> Vec<u8> {
    let mut w = PcapWriter::new(Vec::new(), 1, 65535, nanos).unwrap();
    for (ts, data, orig) in sample_packets(n) {
        w.write_packet(ts, &data, orig).unwrap();
    }
    w.finish().unwrap()
}

/// A big-endian pcap built by hand: link type 101 (raw IP), snaplen 96, two packets at
/// 1.5 and 2.000001 s (or 2.000000001 s with `nanos`).
pub fn big_endian_pcap(nanos: bool) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(if nanos {
        &[0xa1, 0xb2, 0x3c, 0x4d]
    } else {
        &[0xa1, 0xb2, 0xc3, 0xd4]
    });
    b.extend_from_slice(&2u16.to_be_bytes());
    b.extend_from_slice(&4u16.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&96u32.to_be_bytes());
    b.extend_from_slice(&101u32.to_be_bytes());
    let half = if nanos { 500_000_000u32 } else { 500_000 };
    for (sec, frac, data, orig) in [
        (1u32, half, &[0x45u8, 0, 0, 20][..], 20u32),
        (2, 1, &[0x60; 7][..], 7),
    ] {
        b.extend_from_slice(&sec.to_be_bytes());
        b.extend_from_slice(&frac.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(&orig.to_be_bytes());
        b.extend_from_slice(data);
    }
    b
}

/// A little-endian "modified pcap" (magic a1b2cd34) built by hand: 24-byte record headers.
pub fn modified_pcap() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_cd34u32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&65535u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    for (sec, usec, data) in [(10u32, 20u32, &[1u8, 2, 3][..]), (11, 0, &[4u8; 60][..])] {
        b.extend_from_slice(&sec.to_le_bytes());
        b.extend_from_slice(&usec.to_le_bytes());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        // ifindex, protocol, pkt_type, pad: ignored by readers.
        b.extend_from_slice(&[7, 0, 0, 0, 8, 0, 4, 0]);
        b.extend_from_slice(data);
    }
    b
}

/// What a packet of [`multi_pcapng`] must read as:
/// (linktype, snaplen, ts_ns, data, orig_len).
pub type Want = (u32, u32, u64, Vec<u8>, u32);

/// A pcapng with two sections. The first (little-endian) has interface 0 (Ethernet, snaplen
/// 1514, ns), interface 1 (raw IP, no snaplen, 2^-10 s units, if_tsoffset 100 s), an unknown
/// block, enhanced packets on both interfaces, simple packets and an obsolete packet block.
/// The second (big-endian) has one interface (Linux SLL, µs). Returns the bytes and what each
/// packet must read as.
pub fn multi_pcapng() -> (Vec<u8>, Vec<Want>) {
    let mut want = Vec::new();
    let mut w = PcapNgWriter::new(Vec::new(), false).unwrap();
    assert_eq!(
        w.add_interface(1, 1514, TsResolution::Pow10(9), 0).unwrap(),
        0
    );
    assert_eq!(
        w.add_interface(101, 0, TsResolution::Pow2(10), 100)
            .unwrap(),
        1
    );
    w.write_raw_block(0x0bad_0001, &[1, 2, 3, 4, 5]).unwrap();

    let eth: Vec<u8> = (0..60).collect();
    w.write_epb(0, T0 + 123_456_789, &eth, 60).unwrap();
    want.push((1, 1514, T0 + 123_456_789, eth.clone(), 60));

    // 2^-10 s units: 125 ms is exactly 128 units.
    let ip = vec![0x45; 41];
    w.write_epb(1, T0 + 125_000_000, &ip, 1500).unwrap();
    want.push((101, 0, T0 + 125_000_000, ip.clone(), 1500));

    // A simple packet block carries no timestamp: it gets the previous packet's.
    w.write_spb(&[9, 8, 7], 3).unwrap();
    want.push((1, 1514, T0 + 125_000_000, vec![9, 8, 7], 3));
    // Longer than the snaplen: the writer stores (and a reader takes) min(orig_len, snaplen).
    let big: Vec<u8> = (0..1600).map(|i| i as u8).collect();
    w.write_spb(&big, 1600).unwrap();
    want.push((1, 1514, T0 + 125_000_000, big[..1514].to_vec(), 1600));

    w.write_opb(1, T0 + 2_000_000_000, &[1; 17], 17).unwrap();
    want.push((101, 0, T0 + 2_000_000_000, vec![1; 17], 17));

    w.new_section(true).unwrap();
    assert_eq!(
        w.add_interface(113, 256, TsResolution::Pow10(6), 0)
            .unwrap(),
        0
    );
    let sll = vec![0xee; 256];
    w.write_epb(0, T0 + 5_000_001_999, &sll, 1000).unwrap();
    want.push((113, 256, T0 + 5_000_001_000, sll, 1000));
    w.write_raw_block(0x8000_0000, &[]).unwrap();
    (w.finish().unwrap(), want)
}

/// Offsets where a record (pcap, after the 24-byte header) or block (pcapng) starts, and the
/// end of the file: cutting a capture there leaves a shorter valid capture.
pub fn boundaries(bytes: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let ng = bytes.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]);
    let mut pos = if ng { 0 } else { 24 };
    let mut be = false;
    let (rec_hdr, cap_at) = if bytes.starts_with(&0xa1b2_cd34u32.to_le_bytes()) {
        (24, 8)
    } else {
        (16, 8)
    };
    let pcap_be = bytes.starts_with(&[0xa1, 0xb2]);
    while pos < bytes.len() {
        out.push(pos);
        let u32_at = |at: usize, be: bool| {
            let raw: [u8; 4] = bytes[at..at + 4].try_into().unwrap();
            if be {
                u32::from_be_bytes(raw)
            } else {
                u32::from_le_bytes(raw)
            }
        };
        if ng {
            if u32_at(pos, false) == 0x0a0d_0d0a {
                be = u32_at(pos + 8, false) != 0x1a2b_3c4d;
            }
            pos += u32_at(pos + 4, be) as usize;
        } else {
            pos += rec_hdr + u32_at(pos + cap_at, pcap_be) as usize;
        }
    }
    out.push(bytes.len());
    out
}
