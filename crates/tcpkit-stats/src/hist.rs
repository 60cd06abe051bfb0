//! HDR histograms of nanosecond values (timing error, latency), mergeable per worker, and
//! their serialized forms: HDR V2 (deflate) in base64, the encoding of HdrHistogram interval
//! logs, so a report can carry its histograms to `tcpkit merge` and a log can be read by the
//! HdrHistogram tools.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime};

use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::{Deserializer, Serializer as _, V2DeflateSerializer};
use serde::{Deserialize, Serialize};

/// Values from 1 ns to one hour at 3 significant digits: ~200 KiB, allocated once per worker.
#[derive(Debug, Clone)]
pub struct Histogram {
    inner: hdrhistogram::Histogram<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

const HIGHEST_NS: u64 = 3_600_000_000_000;

impl Histogram {
    /// An empty histogram with the fixed bounds above (all workers' histograms merge).
    pub fn new() -> Histogram {
        let inner = hdrhistogram::Histogram::new_with_bounds(1, HIGHEST_NS, 3)
            .expect("static histogram bounds are valid");
        Histogram { inner }
    }

    /// Records one value in ns; values beyond an hour saturate rather than being lost.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.inner.saturating_record(ns.max(1));
    }

    /// Adds every value of `other` to this one.
    pub fn merge(&mut self, other: &Histogram) {
        // Same bounds on both sides, so addition cannot fail; saturate if it ever did.
        if self.inner.add(&other.inner).is_err() {
            for v in other.inner.iter_recorded() {
                self.inner
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
    }

    /// The hdrhistogram itself, for this crate's own readers (the plot's spectrum).
    pub(crate) fn inner(&self) -> &hdrhistogram::Histogram<u64> {
        &self.inner
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.inner.len()
    }

    /// The value at quantile `q` (0.0 to 1.0), in ns, to 3 significant digits.
    pub fn value_at_quantile(&self, q: f64) -> u64 {
        self.inner.value_at_quantile(q)
    }

    /// Forgets every value (interval histograms are reused, never reallocated).
    pub fn clear(&mut self) {
        self.inner.reset();
    }

    /// HDR V2 compressed encoding in base64: what HdrHistogram interval logs carry, and what
    /// load reports carry so that runs can be merged without losing precision.
    pub fn to_base64(&self) -> String {
        let mut bytes = Vec::new();
        // Serializing into a Vec cannot fail for a histogram of u64 counts; an empty string
        // (decoded as an empty histogram) keeps this total if it ever did.
        if V2DeflateSerializer::new()
            .serialize(&self.inner, &mut bytes)
            .is_err()
        {
            return String::new();
        }
        base64_encode(&bytes)
    }

    /// Reads [`Histogram::to_base64`] (or any HDR V2 / V2-deflate histogram in base64). An empty
    /// string is an empty histogram.
    ///
    /// The text is untrusted (a report file): every length it declares is checked against the
    /// bytes actually there before anything is allocated, since hdrhistogram's reader would
    /// allocate whatever payload length the header claims (4 GiB from a 94-byte histogram).
    pub fn from_base64(text: &str) -> Result<Histogram, HistDecodeError> {
        if text.is_empty() {
            return Ok(Histogram::new());
        }
        if text.len() > MAX_ENCODED {
            return Err(HistDecodeError::Hdr(format!(
                "{} bytes of base64, more than the {MAX_ENCODED} a histogram can take",
                text.len()
            )));
        }
        let bytes = base64_decode(text).ok_or(HistDecodeError::Base64)?;
        let plain = bounded_v2(&bytes).map_err(HistDecodeError::Hdr)?;
        let h: hdrhistogram::Histogram<u64> = Deserializer::new()
            .deserialize(&mut plain.as_slice())
            .map_err(|e| HistDecodeError::Hdr(format!("{e:?}")))?;
        let mut out = Histogram::new();
        // Re-recorded into our bounds, so merging never fails on foreign bounds.
        for v in h.iter_recorded() {
            out.inner
                .saturating_record_n(v.value_iterated_to().max(1), v.count_at_value());
        }
        Ok(out)
    }

    /// The report's summary of the values; all zero when empty.
    pub fn percentiles(&self) -> Percentiles {
        let h = &self.inner;
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            min_ns: h.min(),
            mean_ns: h.mean() as u64,
            stdev_ns: h.stdev() as u64,
            p50_ns: h.value_at_quantile(0.50),
            p90_ns: h.value_at_quantile(0.90),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            p9999_ns: h.value_at_quantile(0.9999),
            max_ns: h.max(),
        }
    }
}

/// The most base64 a histogram may be: ours are a few KiB; this is room for any honest one.
const MAX_ENCODED: usize = 16 << 20;
/// The most an inflated V2 histogram may be (its counts are varints: a few bytes per bucket).
const MAX_INFLATED: u64 = 64 << 20;
/// More significant digits means more buckets: 4 keeps the counts array a few MiB whatever
/// the declared range (hdrhistogram allows 5, which over 1..u64::MAX is ~50 MB).
const MAX_DIGITS: u32 = 4;
const V2_COOKIE: u32 = 0x1c84_9313;
const V2_DEFLATE_COOKIE: u32 = 0x1c84_9314;
const V2_HEADER: usize = 40;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// An HDR V2 histogram (plain, inflated from V2-deflate if need be) whose declared lengths
/// and digits have been checked against what is there, so hdrhistogram's reader allocates no
/// more than the input warrants.
fn bounded_v2(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    if bytes.len() < 8 {
        return Err(format!("{} bytes, shorter than any header", bytes.len()));
    }
    let plain = match be32(bytes, 0) {
        V2_COOKIE => bytes.to_vec(),
        V2_DEFLATE_COOKIE => {
            let declared = be32(bytes, 4) as usize;
            let there = bytes.len() - 8;
            if declared > there {
                return Err(format!(
                    "declares {declared} compressed bytes, {there} are there"
                ));
            }
            let mut out = Vec::new();
            // Grows with what actually inflates, never with what the header says.
            flate2::read::ZlibDecoder::new(&bytes[8..8 + declared])
                .take(MAX_INFLATED + 1)
                .read_to_end(&mut out)
                .map_err(|e| format!("deflate: {e}"))?;
            if out.len() as u64 > MAX_INFLATED {
                return Err(format!("inflates to more than {MAX_INFLATED} bytes"));
            }
            out
        }
        c => return Err(format!("cookie {c:#010x} is not HDR V2")),
    };
    if plain.len() < V2_HEADER || be32(&plain, 0) != V2_COOKIE {
        return Err("no V2 header inside".into());
    }
    let declared = be32(&plain, 4) as usize;
    let there = plain.len() - V2_HEADER;
    if declared > there {
        return Err(format!(
            "declares a {declared}-byte payload, {there} bytes are there"
        ));
    }
    let digits = be32(&plain, 12);
    if digits > MAX_DIGITS {
        return Err(format!(
            "{digits} significant digits, more than {MAX_DIGITS}"
        ));
    }
    Ok(plain)
}

/// Why a serialized histogram could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistDecodeError {
    /// Not standard base64 (RFC 4648).
    Base64,
    /// Base64, but not an HDR V2 deflate histogram (or over the size cap): the reason.
    Hdr(String),
}

impl std::fmt::Display for HistDecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HistDecodeError::Base64 => f.write_str("histogram: not valid base64"),
            HistDecodeError::Hdr(why) => write!(f, "histogram: not an HDR V2 histogram: {why}"),
        }
    }
}

impl std::error::Error for HistDecodeError {}

/// An HdrHistogram interval log (the format of `HistogramLogProcessor` and `hdr-plot`):
/// a header with the start time, then one line per interval and tag.
#[derive(Debug)]
pub struct HdrLog {
    out: std::io::BufWriter<std::fs::File>,
}

impl HdrLog {
    /// Creates `path` and writes the header; interval start times are offsets from `start`.
    pub fn create(path: &Path, start: SystemTime) -> std::io::Result<HdrLog> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        let mut ser = V2DeflateSerializer::new();
        IntervalLogWriterBuilder::new()
            .add_comment("tcpkit load: latency in ns; tags: intended (from the intended send time), sent (from the actual send time)")
            .with_start_time(start)
            .with_base_time(start)
            .begin_log_with(&mut out, &mut ser)?;
        Ok(HdrLog { out })
    }

    /// Appends one interval histogram, `offset` after the log's base time, lasting `length`.
    pub fn write(
        &mut self,
        h: &Histogram,
        offset: Duration,
        length: Duration,
        tag: &str,
    ) -> std::io::Result<()> {
        let mut ser = V2DeflateSerializer::new();
        // A builder with no comments and no times writes no header: this only appends.
        let mut w = IntervalLogWriterBuilder::new().begin_log_with(&mut self.out, &mut ser)?;
        w.write_histogram(&h.inner, offset, length, Tag::new(tag))
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Writes out what is buffered; the log is complete only after this.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (RFC 4648), as HdrHistogram logs use. Kept here rather than
/// as a dependency: twenty lines, used only off the hot path.
fn base64_encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                s.push(char::from(B64[(n >> shift) as usize & 63]));
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let t = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(t.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0u32;
    for &b in t {
        let v = B64.iter().position(|&x| x == b)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The percentiles every report prints (wrk2's set), in ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Values recorded (0: no samples, and every other field is 0).
    pub count: u64,
    /// The smallest value and the standard deviation, beside the mean (dnsperf and wrk print
    /// them; a percentile table alone hides a bimodal spread). Absent in reports written
    /// before they were added, hence the defaults.
    #[serde(default)]
    pub min_ns: u64,
    /// Arithmetic mean, truncated to whole ns.
    pub mean_ns: u64,
    /// Standard deviation, truncated to whole ns.
    #[serde(default)]
    pub stdev_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// 99.99th percentile.
    pub p9999_ns: u64,
    /// Largest value recorded.
    pub max_ns: u64,
}

/// Formats ns the way latency tables read best: µs below 10 ms, ms above (every job's report
/// prints its latency tables with it, so they read alike).
pub fn fmt_ns(ns: u64) -> String {
    if ns < 10_000_000 {
        format!("{:.1} us", ns as f64 / 1_000.0)
    } else {
        format!("{:.2} ms", ns as f64 / 1_000_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_values() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p = h.percentiles();
        assert_eq!(p.count, 1000);
        assert_eq!(p.min_ns, 1000);
        // 1..=1000 us: mean 500.5 us, population stdev sqrt((1000^2 - 1) / 12) us = 288.7 us.
        assert!(
            (p.mean_ns as f64 - 500_500.0).abs() / 500_500.0 < 0.002,
            "{p:?}"
        );
        assert!(
            (p.stdev_ns as f64 - 288_675.0).abs() / 288_675.0 < 0.005,
            "{p:?}"
        );
        // 3 significant digits: within 0.1 %.
        assert!(
            (p.p50_ns as f64 - 500_000.0).abs() / 500_000.0 < 0.002,
            "{p:?}"
        );
        assert!(
            (p.p99_ns as f64 - 990_000.0).abs() / 990_000.0 < 0.002,
            "{p:?}"
        );
        assert!(
            (p.max_ns as f64 - 1_000_000.0).abs() / 1_000_000.0 < 0.002,
            "{p:?}"
        );
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        a.record(10);
        b.record(20);
        b.record(u64::MAX);
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert!(a.percentiles().max_ns >= HIGHEST_NS);
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Histogram::new().percentiles(), Percentiles::default());
    }

    #[test]
    fn base64_round_trips_rfc4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), enc);
            assert_eq!(base64_decode(enc).unwrap(), plain.as_bytes());
        }
        assert_eq!(base64_decode("Zm9v!"), None);
    }

    /// A V2 header declaring a 4 GiB payload (plain, and wrapped in deflate as reports carry
    /// it) is refused for what it is, without allocating 4 GiB first; so is a deflate wrapper
    /// declaring more compressed bytes than there are, and a histogram of 5 digits.
    #[test]
    fn declared_lengths_are_bounded_by_the_input() {
        use std::io::Write as _;
        let mut v2 = Vec::new();
        v2.extend_from_slice(&V2_COOKIE.to_be_bytes());
        v2.extend_from_slice(&u32::MAX.to_be_bytes()); // payload length: 4 GiB
        v2.extend_from_slice(&0u32.to_be_bytes()); // normalizing offset
        v2.extend_from_slice(&3u32.to_be_bytes()); // digits
        v2.extend_from_slice(&1u64.to_be_bytes());
        v2.extend_from_slice(&HIGHEST_NS.to_be_bytes());
        v2.extend_from_slice(&1.0f64.to_be_bytes());
        v2.extend_from_slice(&[2, 2, 2]);
        let e = Histogram::from_base64(&base64_encode(&v2)).unwrap_err();
        assert!(
            e.to_string().contains("4294967295-byte payload, 3 bytes"),
            "{e}"
        );
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&v2).unwrap();
        let z = z.finish().unwrap();
        let mut d = Vec::new();
        d.extend_from_slice(&V2_DEFLATE_COOKIE.to_be_bytes());
        d.extend_from_slice(&(z.len() as u32).to_be_bytes());
        d.extend_from_slice(&z);
        let t = std::time::Instant::now();
        let e = Histogram::from_base64(&base64_encode(&d)).unwrap_err();
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(e.to_string().contains("4294967295-byte payload"), "{e}");
        d[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        let e = Histogram::from_base64(&base64_encode(&d)).unwrap_err();
        assert!(
            e.to_string()
                .contains("declares 4294967295 compressed bytes"),
            "{e}"
        );
        v2[4..8].copy_from_slice(&3u32.to_be_bytes());
        v2[12..16].copy_from_slice(&5u32.to_be_bytes());
        let e = Histogram::from_base64(&base64_encode(&v2)).unwrap_err();
        assert!(e.to_string().contains("5 significant digits"), "{e}");
        // The honest form of the same still reads.
        v2[12..16].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(
            Histogram::from_base64(&base64_encode(&v2)).unwrap().count(),
            3
        );
    }

    #[test]
    fn serialized_histogram_round_trips() {
        let mut h = Histogram::new();
        for v in [1u64, 1_000, 250_000, 7_000_000_000] {
            h.record(v);
        }
        let text = h.to_base64();
        let back = Histogram::from_base64(&text).unwrap();
        assert_eq!(back.percentiles(), h.percentiles());
        assert_eq!(Histogram::from_base64("").unwrap().count(), 0);
        assert!(Histogram::from_base64("AAAA").is_err());
        assert!(matches!(
            Histogram::from_base64("not base64!"),
            Err(HistDecodeError::Base64)
        ));
    }

    #[test]
    fn interval_log_is_readable_by_the_hdr_parser() {
        use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
        let dir = std::env::temp_dir().join(format!("tcpkit-hdrlog-{}", std::process::id()));
        let mut h = Histogram::new();
        h.record(5_000);
        h.record(9_000);
        {
            let mut log = HdrLog::create(&dir, SystemTime::now()).unwrap();
            log.write(
                &h,
                Duration::from_secs(1),
                Duration::from_secs(1),
                "intended",
            )
            .unwrap();
            log.write(&h, Duration::from_secs(1), Duration::from_secs(1), "sent")
                .unwrap();
            log.flush().unwrap();
        }
        let text = std::fs::read(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        let mut tags = Vec::new();
        for e in IntervalLogIterator::new(&text) {
            if let Ok(LogEntry::Interval(i)) = e {
                let back = Histogram::from_base64(i.encoded_histogram()).unwrap();
                assert_eq!(back.count(), 2);
                tags.push(i.tag().map(|t| t.as_str().to_string()));
            }
        }
        assert_eq!(tags, [Some("intended".into()), Some("sent".into())]);
    }

    #[test]
    fn fmt_units() {
        assert_eq!(fmt_ns(1500), "1.5 us");
        assert_eq!(fmt_ns(25_000_000), "25.00 ms");
    }
}
