//! The pcap file sink: frames written to a capture file with the timestamps they would have
//! had, for dry runs, `-w out.pcap` and tests.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tcpkit_pcap::PcapWriter;

use crate::{Frame, SendCounters, SendError, Sink};

/// The file behind the pcap writer, shared so that [`Sink::flush`] can reach it:
/// `PcapWriter` only flushes in `finish(self)`. The lock is never contended (one sink, one
/// thread), which costs a few ns per write.
#[derive(Clone, Debug)]
struct SharedFile(Arc<Mutex<BufWriter<File>>>);

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush()
    }
}

/// Writes frames to a pcap file (ns timestamps, whole frames).
#[derive(Debug)]
pub struct PcapFileSink {
    path: PathBuf,
    writer: PcapWriter<SharedFile>,
    file: SharedFile,
    counters: SendCounters,
}

impl PcapFileSink {
    /// Creates (or truncates) `path` as a pcap file of link type `linktype` (1 = Ethernet) and
    /// snap length `snaplen` in its header.
    pub fn create(path: &Path, linktype: u32, snaplen: u32) -> Result<Self, SendError> {
        let io_err = |what| {
            move |source| SendError::File {
                path: path.to_path_buf(),
                what,
                source,
            }
        };
        let f = File::create(path).map_err(io_err("cannot create"))?;
        // 256 KiB batches small records into few write(2)s.
        let file = SharedFile(Arc::new(Mutex::new(BufWriter::with_capacity(
            256 * 1024,
            f,
        ))));
        // The caller's snap length (readers such as Wireshark take 0 as "unknown" and some
        // refuse it); every frame is written whole.
        let writer = PcapWriter::new(file.clone(), linktype, snaplen, true)
            .map_err(io_err("cannot write the file header"))?;
        Ok(PcapFileSink {
            path: path.to_path_buf(),
            writer,
            file,
            counters: SendCounters::default(),
        })
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Sink for PcapFileSink {
    fn send_batch(&mut self, frames: &[Frame<'_>]) -> Result<(), SendError> {
        for (i, f) in frames.iter().enumerate() {
            let orig_len = u32::try_from(f.data.len()).unwrap_or(u32::MAX);
            if let Err(source) = self.writer.write_packet(f.ts_ns, f.data, orig_len) {
                if source.kind() == io::ErrorKind::InvalidInput {
                    // This frame cannot be stored (timestamp after 2106, > 4 GiB): skip it.
                    self.counters.failed += 1;
                    continue;
                }
                self.counters.failed += (frames.len() - i) as u64;
                return Err(SendError::File {
                    path: self.path.clone(),
                    what: "cannot write",
                    source,
                });
            }
            self.counters.successful += 1;
            self.counters.bytes += f.data.len() as u64;
        }
        Ok(())
    }

    fn counters(&self) -> SendCounters {
        self.counters
    }

    fn flush(&mut self) -> Result<(), SendError> {
        self.file.flush().map_err(|source| SendError::File {
            path: self.path.clone(),
            what: "cannot write",
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpkit_pcap::CaptureFile;

    #[test]
    fn writes_frames_with_their_timestamps() {
        let dir = std::env::temp_dir().join(format!("tkpcapsink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("out.pcap");
        let mut sink = PcapFileSink::create(&path, 1, 65535).expect("create");
        let a = vec![0x11u8; 60];
        let b = vec![0x22u8; 1514];
        let frames = [
            Frame {
                data: &a,
                ts_ns: 1_700_000_000_123_456_789,
            },
            Frame {
                data: &b,
                ts_ns: 1_700_000_001_000_000_001,
            },
            // After 2106: cannot be stored, counted as failed, the rest goes on.
            Frame {
                data: &a,
                ts_ns: u64::MAX,
            },
            Frame { data: &a, ts_ns: 5 },
        ];
        sink.send_batch(&frames).expect("write");
        sink.flush().expect("flush");
        let c = sink.counters();
        assert_eq!((c.successful, c.failed, c.bytes), (3, 1, 60 + 1514 + 60));

        // Flushed: readable while the sink is still open.
        let cap = CaptureFile::read_into_memory(&path).expect("read back");
        let got: Vec<(u64, Vec<u8>)> = cap
            .packets()
            .map(|p| p.map(|p| (p.ts_ns, p.data.to_vec())))
            .collect::<Result<_, _>>()
            .expect("packets");
        assert_eq!(
            got,
            vec![
                (1_700_000_000_123_456_789, a.clone()),
                (1_700_000_001_000_000_001, b.clone()),
                (5, a.clone()),
            ]
        );
        drop(sink);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn create_error_names_the_path() {
        let e = PcapFileSink::create(Path::new("/nonexistent-dir/x.pcap"), 1, 65535)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(e, Err("/nonexistent-dir/x.pcap: cannot create".into()));
    }
}
