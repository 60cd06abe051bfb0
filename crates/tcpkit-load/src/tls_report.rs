//! The `tls` object of load's report (absent without `--tls`): handshakes full, resumed and
//! failed, handshakes per second, the handshake-latency distribution (connect done to
//! handshake done, apart from the queries' latency), failures by reason, and what was
//! negotiated. Counted per event-loop thread ([`TlsTally`]), put together per process, and
//! merged across processes and runs as the rest of the report is.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use tcpkit_stats::{fmt_ns, HistDecodeError, Histogram, Percentiles};

/// Handshake counts. Field names are the `--json` contract.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Handshakes {
    pub full: u64,
    pub resumed: u64,
    pub failed: u64,
    /// Completed handshakes (full and resumed) per second of the whole run (opening the
    /// connections included: that is where most of them are when connections are not
    /// reopened).
    pub per_sec: f64,
}

/// The two handshake-latency distributions whole (HDR V2 deflate, base64), for `tcpkit merge`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TlsHistograms {
    pub full: String,
    pub resumed: String,
}

/// The report's `tls` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TlsStats {
    /// `TLSv1.3`, `TLSv1.2`, or `mixed` when connections agreed on different versions; empty
    /// when no handshake completed.
    pub version: String,
    /// The cipher suite's IANA name (`TLS13_AES_256_GCM_SHA384`), or `mixed`.
    pub cipher: String,
    /// The protocol agreed by ALPN; null when none was (or `mixed`).
    pub alpn: Option<String>,
    pub handshakes: Handshakes,
    /// Connect done to handshake done, every completed handshake.
    pub handshake_latency: Percentiles,
    /// The same, full handshakes only and resumed ones only (a resumed one skips the
    /// certificate and its signature: the saving `--tls-resume tickets` buys).
    pub handshake_latency_full: Percentiles,
    pub handshake_latency_resumed: Percentiles,
    /// Failed handshakes by reason (`unknown_ca`, `bad_name`, `expired`,
    /// `no_common_protocol`, `no_alpn`, `handshake_timeout`, `reset`, `other`).
    pub failures: BTreeMap<String, u64>,
    /// The first failure, said in full (the line a run where all failed ends with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    pub histograms: TlsHistograms,
}

/// One thread's (or process's) handshakes as they happen.
#[derive(Debug, Default)]
pub struct TlsTally {
    pub full: u64,
    pub resumed: u64,
    pub failed: u64,
    pub hist_full: Histogram,
    pub hist_resumed: Histogram,
    pub failures: BTreeMap<&'static str, u64>,
    pub first_failure: Option<String>,
    version: Agreed,
    cipher: Agreed,
    alpn: Agreed,
}

/// A value every connection should agree on: the one seen, or "mixed".
#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Agreed {
    #[default]
    None,
    One(String),
    Mixed,
}

impl Agreed {
    fn see(&mut self, v: &str) {
        match self {
            Agreed::None => *self = Agreed::One(v.to_string()),
            Agreed::One(have) if have != v => *self = Agreed::Mixed,
            Agreed::One(_) | Agreed::Mixed => {}
        }
    }

    fn see_text(&mut self, v: &str) {
        if v == "mixed" {
            *self = Agreed::Mixed;
        } else if !v.is_empty() {
            self.see(v);
        }
    }

    fn text(&self) -> Option<String> {
        match self {
            Agreed::None => None,
            Agreed::One(v) => Some(v.clone()),
            Agreed::Mixed => Some("mixed".into()),
        }
    }
}

impl TlsTally {
    /// A completed handshake that took `ns`.
    pub fn done(&mut self, info: &tcpkit_tls::Info, alpn: Option<&[u8]>, ns: u64) {
        if info.resumed {
            self.resumed += 1;
            self.hist_resumed.record(ns);
        } else {
            self.full += 1;
            self.hist_full.record(ns);
        }
        // Compared before allocating: the same values on every connection cost nothing.
        if !matches!(&self.version, Agreed::One(v) if v == info.version) {
            self.version.see(info.version);
        }
        if !matches!(&self.cipher, Agreed::One(v) if v == info.cipher) {
            self.cipher.see(info.cipher);
        }
        let a = alpn.map_or("", |a| std::str::from_utf8(a).unwrap_or("?"));
        if !a.is_empty() && !matches!(&self.alpn, Agreed::One(v) if v == a) {
            self.alpn.see(a);
        }
    }

    pub fn failed(&mut self, f: &tcpkit_tls::Failure) {
        self.failed += 1;
        *self.failures.entry(f.reason.as_str()).or_insert(0) += 1;
        if self.first_failure.is_none() {
            self.first_failure = Some(f.detail.clone());
        }
    }

    /// Adds another thread's tally.
    pub fn absorb(&mut self, o: &TlsTally) {
        self.full += o.full;
        self.resumed += o.resumed;
        self.failed += o.failed;
        self.hist_full.merge(&o.hist_full);
        self.hist_resumed.merge(&o.hist_resumed);
        for (k, v) in &o.failures {
            *self.failures.entry(k).or_insert(0) += v;
        }
        if self.first_failure.is_none() {
            self.first_failure.clone_from(&o.first_failure);
        }
        for (mine, theirs) in [
            (&mut self.version, &o.version),
            (&mut self.cipher, &o.cipher),
            (&mut self.alpn, &o.alpn),
        ] {
            if let Some(t) = theirs.text() {
                mine.see_text(&t);
            }
        }
    }

    /// The report's object, `seconds` being the whole run's (opening included).
    pub fn stats(&self, seconds: f64) -> TlsStats {
        let mut all = self.hist_full.clone();
        all.merge(&self.hist_resumed);
        let done = self.full + self.resumed;
        TlsStats {
            version: self.version.text().unwrap_or_default(),
            cipher: self.cipher.text().unwrap_or_default(),
            alpn: self.alpn.text(),
            handshakes: Handshakes {
                full: self.full,
                resumed: self.resumed,
                failed: self.failed,
                per_sec: if seconds > 0.0 {
                    done as f64 / seconds
                } else {
                    0.0
                },
            },
            handshake_latency: all.percentiles(),
            handshake_latency_full: self.hist_full.percentiles(),
            handshake_latency_resumed: self.hist_resumed.percentiles(),
            failures: self
                .failures
                .iter()
                .map(|(k, v)| ((*k).to_string(), *v))
                .collect(),
            first_failure: self.first_failure.clone(),
            histograms: TlsHistograms {
                full: self.hist_full.to_base64(),
                resumed: self.hist_resumed.to_base64(),
            },
        }
    }
}

impl TlsStats {
    /// Several runs' (or processes') objects as one: counts added, distributions merged,
    /// `per_sec` added (the runs ran side by side), version/cipher/ALPN "mixed" when they
    /// differ.
    pub fn merge(parts: &[&TlsStats]) -> Result<TlsStats, HistDecodeError> {
        let mut full = Histogram::new();
        let mut resumed = Histogram::new();
        let mut m = TlsStats::default();
        let (mut version, mut cipher, mut alpn) = (Agreed::None, Agreed::None, Agreed::None);
        for p in parts {
            full.merge(&Histogram::from_base64(&p.histograms.full)?);
            resumed.merge(&Histogram::from_base64(&p.histograms.resumed)?);
            let h = &mut m.handshakes;
            h.full = h.full.saturating_add(p.handshakes.full);
            h.resumed = h.resumed.saturating_add(p.handshakes.resumed);
            h.failed = h.failed.saturating_add(p.handshakes.failed);
            h.per_sec += p.handshakes.per_sec;
            for (k, v) in &p.failures {
                let e = m.failures.entry(k.clone()).or_insert(0);
                *e = e.saturating_add(*v);
            }
            if m.first_failure.is_none() {
                m.first_failure.clone_from(&p.first_failure);
            }
            version.see_text(&p.version);
            cipher.see_text(&p.cipher);
            if let Some(a) = &p.alpn {
                alpn.see_text(a);
            }
        }
        let mut all = full.clone();
        all.merge(&resumed);
        m.version = version.text().unwrap_or_default();
        m.cipher = cipher.text().unwrap_or_default();
        m.alpn = alpn.text();
        m.handshake_latency = all.percentiles();
        m.handshake_latency_full = full.percentiles();
        m.handshake_latency_resumed = resumed.percentiles();
        m.histograms = TlsHistograms {
            full: full.to_base64(),
            resumed: resumed.to_base64(),
        };
        Ok(m)
    }

    /// The summary's TLS block, in the style of the rest: counts on one line, then the
    /// handshake latency as the query latency is printed.
    pub fn human(&self, s: &mut String) {
        let h = &self.handshakes;
        let neg = if self.version.is_empty() {
            "no handshake completed".to_string()
        } else {
            format!(
                "{}, {}, ALPN {}",
                self.version,
                self.cipher,
                self.alpn.as_deref().unwrap_or("none")
            )
        };
        let _ = writeln!(s, "TLS: {neg}");
        let _ = writeln!(
            s,
            "Handshakes: {} full, {} resumed, {} failed, {:.1}/s",
            h.full, h.resumed, h.failed, h.per_sec
        );
        if !self.failures.is_empty() {
            let f: Vec<String> = self
                .failures
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(s, "Handshake failures: {}", f.join(", "));
        }
        let p = &self.handshake_latency;
        if p.count > 0 {
            let part = |name: &str, q: &Percentiles| {
                if q.count == 0 {
                    String::new()
                } else {
                    format!("; {name} p50 {}", fmt_ns(q.p50_ns).trim_start())
                }
            };
            let _ = writeln!(
                s,
                "Handshake latency (connect done to handshake done): p50 {}, p90 {}, p99 {}, max {}{}{}",
                fmt_ns(p.p50_ns).trim_start(),
                fmt_ns(p.p90_ns).trim_start(),
                fmt_ns(p.p99_ns).trim_start(),
                fmt_ns(p.max_ns).trim_start(),
                part("full", &self.handshake_latency_full),
                part("resumed", &self.handshake_latency_resumed),
            );
        }
    }
}
