//! The `pcap_read` fuzz target's body over its seed corpus (and byte-level mutations of it) on
//! every `cargo test`, the generator of that corpus, and an iteration-speed measurement.

use crate::common;

use std::path::Path;
use std::time::Instant;

use common::*;
use tcpkit_lab::corpus;
use tcpkit_pcap::{fuzz_read, CaptureFile, PcapWriter};

#[test]
fn fuzz_read_survives_the_seed_corpus() {
    let seeds = corpus::seeds("pcap_read");
    assert!(seeds.len() >= 10, "{} seeds", seeds.len());
    for s in &seeds {
        eprintln!("{}", s.name);
        fuzz_read(&s.bytes);
    }
}

#[test]
fn fuzz_read_pcapng_survives_its_corpus() {
    let seeds = corpus::seeds("pcapng");
    for s in &seeds {
        tcpkit_pcap::fuzz_read_pcapng(&s.bytes);
    }
    assert!(seeds.len() >= 3, "{} seeds", seeds.len());
}

/// A small stand-in for the fuzzer that runs on stable: every seed with bytes overwritten at
/// pseudo-random places (xorshift, fixed seed, so failures reproduce).
#[test]
fn fuzz_read_survives_mutated_seeds() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for corpus::Seed { bytes: seed, .. } in corpus::seeds("pcap_read") {
        if seed.is_empty() {
            continue;
        }
        for _ in 0..300 {
            let mut m = seed.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % m.len() as u64) as usize;
                // Mostly lengths-breaking values: 0, 0xff, small numbers, random.
                m[at] = match next() % 4 {
                    0 => 0,
                    1 => 0xff,
                    2 => (next() % 8) as u8,
                    _ => next() as u8,
                };
            }
            fuzz_read(&m);
        }
    }
}

/// Writes the seed corpus. Run with `cargo test -p tcpkit-pcap --test corpus -- --ignored
/// write_seed_corpus` after changing the builders, and commit the files.
#[test]
#[ignore = "regenerates fuzz/corpus/pcap_read"]
fn write_seed_corpus() {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let us = written_pcap(false, 6);
    let ng = multi_pcapng().0;
    let mut absurd = PcapWriter::new(Vec::new(), 1, 0, false)
        .unwrap()
        .finish()
        .unwrap();
    for v in [1u32, 0, 4_000_000_000, 60] {
        absurd.extend_from_slice(&v.to_le_bytes());
    }
    let mut bad_trailer = ng.clone();
    let n = bad_trailer.len();
    bad_trailer[n - 1] ^= 0x40;
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("us.pcap", us.clone()),
        ("ns.pcap", written_pcap(true, 4)),
        ("be-us.pcap", big_endian_pcap(false)),
        ("be-ns.pcap", big_endian_pcap(true)),
        ("modified.pcap", modified_pcap()),
        ("multi.pcapng", ng.clone()),
        (
            "dlt-null.pcap",
            std::fs::read(testdata.join("zeek-redis-pipelining-dlt-null.pcap")).unwrap(),
        ),
        (
            "dns-keepalive.pcap",
            std::fs::read(testdata.join("zeek-dns-tcp-keepalive.pcap")).unwrap(),
        ),
        ("truncated-record.pcap", us[..us.len() - 7].to_vec()),
        ("truncated-block.pcapng", ng[..ng.len() - 30].to_vec()),
        ("bad-trailer.pcapng", bad_trailer),
        ("absurd-caplen.pcap", absurd),
        ("header-only.pcap", us[..24].to_vec()),
        ("short-header.pcap", us[..11].to_vec()),
        (
            "html.bin",
            b"<html><body>not a capture</body></html>".to_vec(),
        ),
    ];
    for (name, bytes) in files {
        corpus::write("pcap_read", name, &bytes);
    }
}

/// Iterator speed over a generated million-packet file (64-byte packets, the worst case per
/// byte). Run with `cargo test --release -p tcpkit-pcap --test corpus -- --ignored --nocapture
/// iterate_a_million`.
#[test]
#[ignore = "measurement; run in release"]
fn iterate_a_million_packets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("million.pcap");
    let mut w = PcapWriter::create(&path, 1, 65535, true).unwrap();
    let data = [0x5a; 64];
    for i in 0..1_000_000u64 {
        w.write_packet(T0 + i * 1000, &data, 64).unwrap();
    }
    w.finish().unwrap();
    let ng_path = dir.path().join("million.pcapng");
    let out = std::io::BufWriter::new(std::fs::File::create(&ng_path).unwrap());
    let mut w = tcpkit_pcap::PcapNgWriter::new(out, false).unwrap();
    w.add_interface(1, 65535, tcpkit_pcap::TsResolution::Pow10(9), 0)
        .unwrap();
    for i in 0..1_000_000u64 {
        w.write_epb(0, T0 + i * 1000, &data, 64).unwrap();
    }
    w.finish().unwrap();
    for (path, preload) in [(&path, false), (&path, true), (&ng_path, false)] {
        let file = if preload {
            CaptureFile::read_into_memory(path).unwrap()
        } else {
            CaptureFile::open(path).unwrap()
        };
        for round in 0..3 {
            let start = Instant::now();
            let (mut n, mut bytes, mut ts) = (0u64, 0usize, 0u64);
            for p in file.packets() {
                let p = p.unwrap();
                n += 1;
                bytes += p.data.len();
                ts ^= p.ts_ns;
            }
            let secs = start.elapsed().as_secs_f64();
            assert_eq!((n, bytes), (1_000_000, 64_000_000));
            std::hint::black_box(ts);
            eprintln!(
                "{} preload={preload} round {round}: {n} packets in {:.1} ms = {:.1} Mpackets/s",
                path.display(),
                secs * 1e3,
                n as f64 / secs / 1e6
            );
        }
    }
}

/// The `prep_cache` fuzz target's body over its seeds (tcpprep's own caches among them), each
/// also cut at every length.
#[test]
fn fuzz_prep_cache_survives_its_corpus() {
    let seeds = corpus::seeds("prep_cache");
    assert!(seeds.len() >= 3, "{} seeds", seeds.len());
    for s in &seeds {
        for n in 0..=s.bytes.len() {
            tcpkit_pcap::fuzz_prep_cache(&s.bytes[..n]);
        }
    }
}
