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

    /// Forgets every value (interval histograms are reused, never reallocated). An empty one
    /// is left as it is: resetting writes all 270 KiB of counts, and load clears its
    /// interval histograms every second whether or not they were used.
    pub fn clear(&mut self) {
        if !self.inner.is_empty() {
            self.inner.reset();
        }
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
        let mut out = Histogram::new();
        out.add_base64(text)?;
        Ok(out)
    }

    /// Adds the histogram `text` holds (read as [`Histogram::from_base64`] reads it) to this
    /// one. One with our own bounds (every histogram tcpkit wrote) is added count by count
    /// straight from its encoding, with no histogram of its own: load merges its old seconds
    /// this way once a second on a long run, and a 256 KiB histogram made and dropped each
    /// time would be a step in its memory. Others go through hdrhistogram's reader. On error
    /// this histogram may hold part of `text`'s counts.
    pub fn add_base64(&mut self, text: &str) -> Result<(), HistDecodeError> {
        self.add_base64_within(text, 64)
    }

    /// [`Histogram::add_base64`] with each value kept to its `bits` most significant bits
    /// (at least 2; 64 keeps it whole), counts exact: 8 bits is within 0.8 %, and a histogram
    /// of a long interval whose values spread over decades takes an eighth of the buckets
    /// and a third of the bytes of one at full precision (load's merged old seconds).
    pub fn add_base64_within(&mut self, text: &str, bits: u32) -> Result<(), HistDecodeError> {
        let bits = bits.clamp(2, 64);
        let keep = move |v: u64| {
            let shift = (64 - v.leading_zeros()).saturating_sub(bits);
            (v >> shift) << shift
        };
        if text.is_empty() {
            return Ok(());
        }
        if text.len() > MAX_ENCODED {
            return Err(HistDecodeError::Hdr(format!(
                "{} bytes of base64, more than the {MAX_ENCODED} a histogram can take",
                text.len()
            )));
        }
        let bytes = base64_decode(text).ok_or(HistDecodeError::Base64)?;
        let plain = bounded_v2(&bytes).map_err(HistDecodeError::Hdr)?;
        if self
            .add_own_v2(&plain, keep)
            .map_err(HistDecodeError::Hdr)?
        {
            return Ok(());
        }
        let h: hdrhistogram::Histogram<u64> = Deserializer::new()
            .deserialize(&mut plain.as_slice())
            .map_err(|e| HistDecodeError::Hdr(format!("{e:?}")))?;
        // Re-recorded into our bounds, so merging never fails on foreign bounds.
        for v in h.iter_recorded() {
            self.inner
                .saturating_record_n(keep(v.value_iterated_to()).max(1), v.count_at_value());
        }
        Ok(())
    }

    /// Adds a plain V2 histogram (checked by [`bounded_v2`]) if it has our bounds, index by
    /// index as hdrhistogram's reader would place them; false (nothing added) if not ours.
    fn add_own_v2(&mut self, plain: &[u8], keep: impl Fn(u64) -> u64) -> Result<bool, String> {
        let be64 = |at: usize| u64::from_be_bytes(plain[at..at + 8].try_into().unwrap_or([0; 8]));
        let ours = be32(plain, 8) == 0
            && be32(plain, 12) == u32::from(self.inner.sigfig())
            && be64(16) == self.inner.low()
            && be64(24) == self.inner.high()
            && f64::from_bits(be64(32)) == 1.0;
        if !ours || self.inner.low() != 1 {
            return Ok(false);
        }
        let payload = &plain[V2_HEADER..V2_HEADER + be32(plain, 4) as usize];
        let len = self.inner.distinct_values();
        // With a lowest value of 1 (unit magnitude 0), index i is value
        // `sub << bucket`, as hdrhistogram's `value_for` computes it.
        let half_mag = (2 * 10u64.pow(u32::from(self.inner.sigfig())))
            .next_power_of_two()
            .trailing_zeros()
            - 1;
        let half = 1usize << half_mag;
        let value_for = |i: usize| -> u64 {
            let bucket = (i >> half_mag).saturating_sub(1);
            let sub = if i >> half_mag == 0 {
                i
            } else {
                (i & (half - 1)) + half
            };
            (sub as u64) << bucket
        };
        let mut at = 0;
        let mut index = 0usize;
        while at < payload.len() {
            let (zz, n) = varint(&payload[at..]).ok_or("a count cut short")?;
            at += n;
            let v = ((zz >> 1) as i64) ^ -((zz & 1) as i64);
            if v < 0 {
                index = index.saturating_add(v.unsigned_abs() as usize);
                continue;
            }
            if v > 0 {
                if index >= len {
                    return Err(format!(
                        "a count at index {index}, past the {len} there are"
                    ));
                }
                self.inner
                    .saturating_record_n(keep(value_for(index)).max(1), v as u64);
            }
            // A hostile run of zeros may have pushed the index to usize::MAX already: a
            // zero count after it must not overflow (a panic under debug assertions, the
            // fuzz build's).
            index = index.saturating_add(1);
        }
        Ok(true)
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

/// One LEB128 varint of HDR V2 (at most 9 bytes, the ninth taken whole) and its length; None
/// if `b` ends first.
fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (k, &byte) in b.iter().take(9).enumerate() {
        if k == 8 {
            return Some((v | (u64::from(byte) << 56), 9));
        }
        v |= u64::from(byte & 0x7f) << (7 * k);
        if byte & 0x80 == 0 {
            return Some((v, k + 1));
        }
    }
    None
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
/// as a dependency: twenty lines, used off the hot path (load merges its old seconds once a
/// second on a long run, so decoding is by range, not by a search of the alphabet).
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
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        let v = u32::from(v);
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

    /// Our own histograms are added straight from their encoding: the same counts at the
    /// same values as hdrhistogram's reader gives, over the whole range (both ends of the
    /// first bucket, the top), added to what is there; foreign bounds still read through
    /// hdrhistogram; a count past the range or cut short is refused.
    #[test]
    fn added_from_the_encoding_as_hdrhistogram_reads_it() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for round in 0..40u64 {
            let mut h = Histogram::new();
            for k in 0..(round * 37 % 500) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Values of every magnitude, some repeated.
                h.record((x >> (x % 60)) % (HIGHEST_NS + 10));
                if k.is_multiple_of(7) {
                    h.record(k);
                }
            }
            h.record(1 + round);
            h.record(1023 + round);
            h.record(2047 + round);
            let text = h.to_base64();
            let plain = bounded_v2(&base64_decode(&text).unwrap()).unwrap();
            let theirs: hdrhistogram::Histogram<u64> = Deserializer::new()
                .deserialize(&mut plain.as_slice())
                .unwrap();
            let mut ours = Histogram::new();
            ours.record(77);
            ours.add_base64(&text).unwrap();
            let got: Vec<(u64, u64)> = ours
                .inner
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect();
            let mut want: Vec<(u64, u64)> = theirs
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect();
            let at = want.iter().position(|&(v, _)| v >= 77);
            match at {
                Some(i) if want[i].0 == 77 => want[i].1 += 1,
                Some(i) => want.insert(i, (77, 1)),
                None => want.push((77, 1)),
            }
            assert_eq!(got, want, "round {round}");
            assert_eq!(ours.count(), h.count() + 1);
        }
        // Kept to 8 bits: the same count, within 0.8 %, far fewer buckets.
        let mut wide = Histogram::new();
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            wide.record(50_000 + x % 5_000_000);
        }
        let mut coarse = Histogram::new();
        coarse.add_base64_within(&wide.to_base64(), 8).unwrap();
        assert_eq!(coarse.count(), wide.count());
        for q in [0.01, 0.5, 0.99] {
            let (a, b) = (wide.value_at_quantile(q), coarse.value_at_quantile(q));
            assert!(a.abs_diff(b) * 1000 <= a * 8, "q {q}: {a} vs {b}");
        }
        let (w, c) = (wide.to_base64().len(), coarse.to_base64().len());
        assert!(c * 2 < w, "{c} bytes kept to 8 bits, {w} whole");
        // Other bounds (1 us to 1 s, 2 digits) read through hdrhistogram, re-recorded.
        let mut foreign =
            hdrhistogram::Histogram::<u64>::new_with_bounds(1_000, 1_000_000_000, 2).unwrap();
        foreign.record(5_000_000).unwrap();
        let mut bytes = Vec::new();
        V2DeflateSerializer::new()
            .serialize(&foreign, &mut bytes)
            .unwrap();
        let back = Histogram::from_base64(&base64_encode(&bytes)).unwrap();
        assert_eq!(back.count(), 1);
        assert!(back.value_at_quantile(0.5).abs_diff(5_000_000) < 100_000);
        // Ours, with a count past the last index, and with a varint cut short.
        let mut v2 = Vec::new();
        v2.extend_from_slice(&V2_COOKIE.to_be_bytes());
        v2.extend_from_slice(&4u32.to_be_bytes());
        v2.extend_from_slice(&0u32.to_be_bytes());
        v2.extend_from_slice(&3u32.to_be_bytes());
        v2.extend_from_slice(&1u64.to_be_bytes());
        v2.extend_from_slice(&HIGHEST_NS.to_be_bytes());
        v2.extend_from_slice(&1.0f64.to_be_bytes());
        // A run of 2^20 zeros (zigzag 2^21 - 1), then a count of 1.
        v2.extend_from_slice(&[0xff, 0xff, 0x7f, 2]);
        let e = Histogram::from_base64(&base64_encode(&v2)).unwrap_err();
        assert!(e.to_string().contains("past the"), "{e}");
        v2[4..8].copy_from_slice(&2u32.to_be_bytes());
        let e = Histogram::from_base64(&base64_encode(&v2[..v2.len() - 2])).unwrap_err();
        assert!(e.to_string().contains("cut short"), "{e}");
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
