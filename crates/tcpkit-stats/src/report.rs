//! The run contract every subcommand goes through: a report knows its human summary, its JSON
//! document and its verdict, and the binary turns the verdict into the exit status (0 the run
//! did what was asked, 1 it did not, with the reason as the last line on stderr). Scripts and
//! CI read only the exit status and `--json`, so those two are decided here, once, not by
//! each job's own tail.

/// Whether a run did what it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Everything asked was done: exit 0.
    Done,
    /// The run finished but did not do what was asked: exit 1, with this reason (one line,
    /// saying what to do where there is something to do) as the last line on stderr.
    Failed(String),
}

impl Verdict {
    /// `Failed(reason)` when the run kept a reason it failed, else `Done`: the verdict of a
    /// report whose only check is whether the run was cut short.
    pub fn from_failure(failure: Option<&str>) -> Verdict {
        failure.map_or(Verdict::Done, |f| Verdict::Failed(f.to_owned()))
    }

    /// `Failed(reason)` when `cond` holds, else `Done`: for verdicts built from checks.
    pub fn fail_if(cond: bool, reason: impl FnOnce() -> String) -> Verdict {
        if cond {
            Verdict::Failed(reason())
        } else {
            Verdict::Done
        }
    }

    /// The first failure of `self` and `other`.
    #[must_use]
    pub fn and(self, other: impl FnOnce() -> Verdict) -> Verdict {
        match self {
            Verdict::Done => other(),
            failed @ Verdict::Failed(_) => failed,
        }
    }

    /// True when the run did what was asked (exit status 0).
    pub fn is_done(&self) -> bool {
        matches!(self, Verdict::Done)
    }
}

/// A job's report. `json` is the `--json` document (its schema is committed under
/// docs/schema/); `human` is the summary in the vocabulary users of the peer tool know.
pub trait Report {
    /// The summary printed on stdout without `--json`.
    fn human(&self) -> String;
    /// The whole `--json` document: stdout holds it and nothing else.
    fn json(&self) -> String;
    /// Did the run do what was asked?
    fn verdict(&self) -> Verdict;
}

/// An error and its sources on one line, each said once: `what: why: underlying cause`, as
/// every error reaches the user (the binary's last line, a report's `failure`, a --check line).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

/// Serialises a report for `--json`, pretty-printed (people read these too).
pub fn to_json<T: serde::Serialize>(v: &T) -> String {
    // Every report type is plain data (numbers, strings, maps with string keys): serde_json
    // cannot fail on it; a failure would be a programming error caught by the schema tests.
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// `s` with control characters (escape sequences, NUL, title changes) written out as `\u{..}`,
/// so a string read from a report file and printed to a terminal shows what it holds instead
/// of doing it (`merge` prints strings from files anyone can write).
pub fn escape_controls(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Why a report file could not be read.
#[derive(Debug)]
pub enum ReadCapped {
    /// Opening or reading it failed.
    Io(std::io::Error),
    /// It holds more than the cap.
    TooBig,
}

/// The bytes of the file at `path`, at most `cap` of them: a file larger than any real report
/// is refused before it is read whole (reports are files anyone can write).
pub fn read_capped(path: &std::path::Path, cap: u64) -> Result<Vec<u8>, ReadCapped> {
    use std::io::Read as _;
    let mut text = Vec::new();
    std::fs::File::open(path)
        .map_err(ReadCapped::Io)?
        .take(cap + 1)
        .read_to_end(&mut text)
        .map_err(ReadCapped::Io)?;
    if text.len() as u64 > cap {
        return Err(ReadCapped::TooBig);
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_says_each_cause_once() {
        let inner = std::io::Error::other("disk full");
        let outer = std::io::Error::other(Wrap(inner));
        assert_eq!(chain(&outer), "write out.pcap: disk full");
    }

    #[derive(Debug)]
    struct Wrap(std::io::Error);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "write out.pcap")
        }
    }
    impl std::error::Error for Wrap {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn first_failure_wins() {
        let v = Verdict::Done
            .and(|| Verdict::fail_if(true, || "a".into()))
            .and(|| Verdict::Failed("b".into()));
        assert_eq!(v, Verdict::Failed("a".into()));
        assert!(Verdict::fail_if(false, String::new).is_done());
    }

    #[test]
    fn a_kept_failure_is_the_verdict() {
        assert_eq!(
            Verdict::from_failure(Some("input ended early")),
            Verdict::Failed("input ended early".into())
        );
        assert!(Verdict::from_failure(None).is_done());
    }
}
