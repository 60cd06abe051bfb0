//! tcpkit-pcap: reading and writing capture files, pcap and pcapng.
//!
//! [`CaptureFile`] holds a whole capture (a read-only map of the file, or bytes in memory) and
//! [`CaptureFile::packets`] walks it, yielding [`Packet`]s whose data borrows from those bytes:
//! no copy and no allocation per packet. [`PcapWriter`] and [`PcapNgWriter`] write files.
//!
//! Parsing is our own checked code rather than pcap-parser's: every error here names the
//! packet number and byte offset and the lengths involved (`header says 1514 bytes, 200
//! left`), which pcap-parser's nom errors do not carry, and a hand-written walk over the
//! mapped slice is as zero-copy as its slice readers. pcap-parser stays as a dev-dependency,
//! an independent reader the tests compare ours with.
//!
//! [`PrepCache`] reads and writes tcpprep's cache files (which interface each packet leaves by).
//!
//! Link types are raw DLT numbers; what they mean belongs to `tcpkit-wire`.

#![warn(missing_docs)]

mod bytes;
mod error;
mod file;
mod pcap;
mod pcapng;
mod prepcache;
mod read;

pub use error::{Location, PcapError, Reason};
pub use file::{CaptureFile, Format};
pub use pcap::PcapWriter;
pub use pcapng::{PcapNgWriter, TsResolution};
pub use prepcache::{
    fuzz_prep_cache, PrepCache, PrepCacheError, PrepDir, PREP_HEADER_LEN, PREP_MAGIC,
    PREP_MAX_COMMENT, PREP_VERSION,
};
pub use read::{max_caplen, Packet, Packets, MAX_CAPLEN_FLOOR};

/// The body of the `pcapng` fuzz target: [`fuzz_read`] over `data` with its first four bytes
/// set to pcapng's Section Header Block type, so every input the fuzzer tries is read as
/// pcapng (block lengths, options, interface and byte-order handling) rather than most of them
/// being refused at the magic.
pub fn fuzz_read_pcapng(data: &[u8]) {
    let mut d = data.to_vec();
    if let Some(head) = d.get_mut(..4) {
        head.copy_from_slice(&pcapng::SHB.to_le_bytes());
    }
    fuzz_read(&d);
}

/// The body of the `pcap_read` fuzz target: read `data` as a capture and iterate every packet,
/// writing each back out through [`PcapWriter`]. Must never panic, whatever the bytes.
pub fn fuzz_read(data: &[u8]) {
    let Ok(file) = CaptureFile::from_bytes("fuzz-input", data.to_vec()) else {
        return;
    };
    let _ = file.format();
    let Ok(mut out) = PcapWriter::new(std::io::sink(), 1, 0, true) else {
        return;
    };
    for item in file.packets() {
        match item {
            Ok(p) => {
                let _ = out.write_packet(p.ts_ns, p.data, p.orig_len);
            }
            Err(e) => {
                // Rendering the message must not panic either.
                let _ = e.to_string();
            }
        }
    }
}
