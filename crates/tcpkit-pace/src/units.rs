//! The one way every flag spells a duration or a size, so that `--duration 2s` means the same
//! to every subcommand (it used to be a float to three of them and a string to one), and the
//! one way a flag spells bytes to send or expect ([`unescape`]).
//!
//! Durations: a bare number is seconds (`2`, `0.5`), as tcpreplay and tcpclient take them;
//! anything else goes through humantime (`2s`, `500ms`, `1m`, `1h 30m`, `10us`), with a decimal
//! number before one unit also accepted (`1.5s`, `0.25ms`), which humantime does not take.
//! Sizes: parse-size with binary multiples, as `head -c 64M`, `truncate -s 1G` and pv read
//! them (`64M` = 64 MiB; `64MiB` the same; a bare number is bytes).

use std::time::Duration;

/// Longest duration any flag takes: past it the arithmetic of absolute schedules (nanoseconds in
/// u64 from the start) would be near its end, and no run lasts 31 years.
pub const MAX_DURATION: Duration = Duration::from_secs(1_000_000_000);

/// `text` as a duration; the error says what was wrong, for the caller to prefix with its flag.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bad = || format!("{text:?}: expected a duration like 2, 2s, 500ms or 1m");
    if t.is_empty() {
        return Err(bad());
    }
    let d = if let Ok(secs) = t.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return Err(format!("{text:?}: must be 0 or more seconds"));
        }
        if secs > MAX_DURATION.as_secs_f64() {
            return Err(too_long(text));
        }
        Duration::from_secs_f64(secs)
    } else if let Ok(d) = humantime::parse_duration(t) {
        d
    } else {
        decimal_with_unit(t).ok_or_else(bad)??
    };
    if d > MAX_DURATION {
        return Err(too_long(text));
    }
    Ok(d)
}

fn too_long(text: &str) -> String {
    format!("{text:?}: longer than {} seconds", MAX_DURATION.as_secs())
}

/// `1.5s`, `0.25ms`: one decimal number and one unit. `None` when `t` is not of that form.
fn decimal_with_unit(t: &str) -> Option<Result<Duration, String>> {
    let split = t.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let v: f64 = num.parse().ok()?;
    let scale = match unit {
        "ns" | "nsec" => 1e-9,
        "us" | "µs" | "usec" => 1e-6,
        "ms" | "msec" => 1e-3,
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hr" | "hour" | "hours" => 3600.0,
        _ => return None,
    };
    let secs = v * scale;
    if !secs.is_finite() || secs < 0.0 {
        return Some(Err(format!("{t:?}: must be 0 or more seconds")));
    }
    if secs > MAX_DURATION.as_secs_f64() {
        return Some(Err(too_long(t)));
    }
    Some(Ok(Duration::from_secs_f64(secs)))
}

/// `text` as a number of bytes: `65536`, `64K`, `64M`, `1G`, `1.5GiB` (K, M, G, T are powers
/// of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text.trim())
        .map_err(|e| format!("{text:?}: {e} (expected a size like 65536, 64K, 64M or 1G)"))
}

/// `text` as bytes, with C-style escapes: `\r`, `\n`, `\t`, `\0`, `\\` and `\xHH` (any byte):
/// the one way a flag or a file spells bytes to send or expect (load's `--response-delim`,
/// balance's health probes). The error says what was wrong, for the caller to prefix with
/// its flag or key.
pub fn unescape(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = *b
            .get(i + 1)
            .ok_or("a lone \\ at the end (write \\\\ for one)")?;
        i += 2;
        out.push(match c {
            b'r' => b'\r',
            b'n' => b'\n',
            b't' => b'\t',
            b'0' => 0,
            b'\\' => b'\\',
            b'x' => {
                let hex = b
                    .get(i..i + 2)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or("\\x needs two hex digits")?;
                i += 2;
                hex
            }
            other => {
                return Err(format!(
                    "unknown escape \\{} (\\r \\n \\t \\0 \\\\ \\xHH)",
                    char::from(other).escape_default()
                ))
            }
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_duration_form_parses_to_the_same_value() {
        let two = Duration::from_secs(2);
        for t in ["2", "2.0", "2s", "2sec", " 2s ", "2000ms", "2000000us"] {
            assert_eq!(parse_duration(t), Ok(two), "{t}");
        }
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.25ms"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_say_what_was_wrong() {
        for t in ["", "soon", "-1", "nan", "inf", "2 parsecs", "1e12", "-1s"] {
            let e = parse_duration(t).unwrap_err();
            assert!(e.contains(&format!("{t:?}")), "{t}: {e}");
        }
    }

    #[test]
    fn sizes_are_binary_multiples() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("lots").unwrap_err().contains("\"lots\""));
        assert!(parse_size("-1M").is_err());
    }

    #[test]
    fn escapes_are_c_style_and_say_what_was_wrong() {
        assert_eq!(unescape("PING\\r\\n").unwrap(), b"PING\r\n");
        assert_eq!(
            unescape("\\x12\\x34\\0\\\\\\t").unwrap(),
            [0x12, 0x34, 0, b'\\', b'\t']
        );
        assert_eq!(unescape("+PONG").unwrap(), b"+PONG");
        assert!(unescape("a\\").unwrap_err().contains("lone"));
        assert_eq!(unescape("a\\r\\n\\t\\\\\\x41").unwrap(), b"a\r\n\t\\A");
        assert!(unescape("\\x4").unwrap_err().contains("two hex digits"));
        assert!(unescape("\\xZ1").unwrap_err().contains("two hex digits"));
        assert!(unescape("\\q").unwrap_err().contains("unknown escape \\q"));
    }
}
