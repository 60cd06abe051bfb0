//! `-R/--per-query FILE`: one CSV line per query and per answer, written by a thread of its
//! own. Event loops hand over fixed-size batches of plain records through a bounded channel and
//! never wait: when the writer is behind, the batch is dropped and counted.
//!
//! Columns (tcpclient's `-R` output extended with the query's identity and both times):
//! `type,timestamp,connection_id,query_id,intended_ns,sent_ns,latency_us,rtt_us`
//! - `type`: `query` (sent), `answer`, `timeout` (unanswered after `--timeout`), `lost`
//!   (its connection closed), `unanswered` (still in flight at the end);
//! - `timestamp`: wall-clock time of the event, `seconds.nanoseconds` since the Unix epoch;
//! - `connection_id`: the connection's number in the run (0..connections), `query_id` the
//!   query's number on that connection (for DNS its ID is the low 16 bits);
//! - `intended_ns`, `sent_ns`: intended and actual send time, ns after the query phase began;
//! - `latency_us`: answer time minus intended send time; `rtt_us`: answer time minus actual
//!   send time (µs, 3 decimals; empty on lines that are not answers).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

pub const HEADER: &str =
    "type,timestamp,connection_id,query_id,intended_ns,sent_ns,latency_us,rtt_us\n";

/// Records per batch, and batches the channel holds: 64 × 1024 records of slack (~3 MiB).
const BATCH: usize = 1024;
const BATCHES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Query,
    Answer,
    Timeout,
    Lost,
    Unanswered,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Query => "query",
            Kind::Answer => "answer",
            Kind::Timeout => "timeout",
            Kind::Lost => "lost",
            Kind::Unanswered => "unanswered",
        }
    }
}

/// One line, as plain numbers (formatting happens on the writer thread).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rec {
    pub kind: Kind,
    pub conn: u64,
    pub seq: u32,
    pub intended: u64,
    pub sent: u64,
    /// When the line's event happened, ns after the start.
    pub at: u64,
}

/// The writer thread and what it counted.
#[derive(Debug)]
pub(crate) struct PerQuery {
    tx: Option<SyncSender<Vec<Rec>>>,
    handle: Option<JoinHandle<std::io::Result<u64>>>,
    dropped: Arc<AtomicU64>,
    path: PathBuf,
}

/// An event loop's end of the channel.
#[derive(Debug)]
pub(crate) struct Sink {
    tx: SyncSender<Vec<Rec>>,
    batch: Vec<Rec>,
    dropped: Arc<AtomicU64>,
}

impl PerQuery {
    /// Creates `path` (header written at once, so a bad path fails before the run) and starts
    /// the writer. Times are turned into wall-clock time from `wall_start_ns`, the wall time of
    /// the query phase's start (set later through the records' offsets).
    pub(crate) fn start(path: &Path, wall_start_ns: Arc<AtomicU64>) -> std::io::Result<PerQuery> {
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        out.write_all(HEADER.as_bytes())?;
        let (tx, rx) = sync_channel::<Vec<Rec>>(BATCHES);
        let handle = std::thread::Builder::new()
            .name("tcpkit-per-query".into())
            .spawn(move || write_all(out, rx, &wall_start_ns))?;
        Ok(PerQuery {
            tx: Some(tx),
            handle: Some(handle),
            dropped: Arc::new(AtomicU64::new(0)),
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn sink(&self) -> Option<Sink> {
        self.tx.as_ref().map(|tx| Sink {
            tx: tx.clone(),
            batch: Vec::with_capacity(BATCH),
            dropped: Arc::clone(&self.dropped),
        })
    }

    /// Waits for the writer (after every sink is dropped); returns (lines written, dropped).
    pub(crate) fn finish(mut self) -> std::io::Result<(u64, u64)> {
        drop(self.tx.take());
        let lines = match self.handle.take().map(JoinHandle::join) {
            Some(Ok(r)) => r?,
            _ => return Err(std::io::Error::other("per-query writer thread panicked")),
        };
        Ok((lines, self.dropped.load(Ordering::Relaxed)))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Sink {
    #[inline]
    pub(crate) fn push(&mut self, r: Rec) {
        self.batch.push(r);
        if self.batch.len() >= BATCH {
            self.flush();
        }
    }

    /// Hands the batch over, or drops and counts it when the writer is behind.
    pub(crate) fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let full = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        match self.tx.try_send(full) {
            Ok(()) => {}
            Err(TrySendError::Full(b)) | Err(TrySendError::Disconnected(b)) => {
                self.dropped.fetch_add(b.len() as u64, Ordering::Relaxed);
                // Keep the allocation: the next batch reuses it.
                self.batch = b;
                self.batch.clear();
            }
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.flush();
    }
}

fn write_all(
    mut out: BufWriter<std::fs::File>,
    rx: Receiver<Vec<Rec>>,
    wall_start: &AtomicU64,
) -> std::io::Result<u64> {
    let mut lines = 0u64;
    let mut line = String::with_capacity(128);
    while let Ok(batch) = rx.recv() {
        let base = wall_start.load(Ordering::Relaxed);
        for r in &batch {
            format_line(&mut line, r, base);
            out.write_all(line.as_bytes())?;
            lines += 1;
        }
    }
    out.flush()?;
    Ok(lines)
}

pub(crate) fn format_line(line: &mut String, r: &Rec, wall_base: u64) {
    use std::fmt::Write as _;
    line.clear();
    let wall = wall_base.saturating_add(r.at);
    let _ = write!(
        line,
        "{},{}.{:09},{},{},{},{},",
        r.kind.name(),
        wall / 1_000_000_000,
        wall % 1_000_000_000,
        r.conn,
        r.seq,
        r.intended,
        r.sent
    );
    if r.kind == Kind::Answer {
        let lat = r.at.saturating_sub(r.intended);
        let rtt = r.at.saturating_sub(r.sent);
        let _ = write!(
            line,
            "{}.{:03},{}.{:03}",
            lat / 1000,
            lat % 1000,
            rtt / 1000,
            rtt % 1000
        );
    } else {
        line.push(',');
    }
    line.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_have_the_documented_columns() {
        let mut s = String::new();
        let r = Rec {
            kind: Kind::Answer,
            conn: 3,
            seq: 9,
            intended: 1_000,
            sent: 1_500,
            at: 81_750,
        };
        format_line(&mut s, &r, 1_700_000_000_000_000_000);
        assert_eq!(
            s,
            "answer,1700000000.000081750,3,9,1000,1500,80.750,80.250\n"
        );
        format_line(
            &mut s,
            &Rec {
                kind: Kind::Query,
                ..r
            },
            0,
        );
        assert_eq!(s, "query,0.000081750,3,9,1000,1500,,\n");
        assert_eq!(HEADER.split(',').count(), s.split(',').count());
    }

    #[test]
    fn writer_counts_lines_and_a_full_channel_drops_not_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.csv");
        let pq = PerQuery::start(&path, Arc::new(AtomicU64::new(0))).unwrap();
        let mut sink = pq.sink().unwrap();
        let rec = Rec {
            kind: Kind::Query,
            conn: 0,
            seq: 0,
            intended: 0,
            sent: 0,
            at: 0,
        };
        let t = std::time::Instant::now();
        for _ in 0..3 * BATCH * BATCHES {
            sink.push(rec);
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "never blocks"
        );
        drop(sink);
        let (lines, dropped) = pq.finish().unwrap();
        assert_eq!(lines + dropped, (3 * BATCH * BATCHES) as u64);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count() as u64, lines + 1);
        assert!(text.starts_with(HEADER));
    }
}
