//! Running helper commands (`ip`, `tc`, `ethtool`, `tcpdump`) to completion and turning a
//! failure into a one-line [`LabError`] with the command and its stderr tail.

use std::process::{Command, Output, Stdio};

use crate::LabError;

/// How much of a failing command's output goes into the error: enough to show the reason,
/// short enough to stay one readable line.
const TAIL_LINES: usize = 3;
const TAIL_CHARS: usize = 400;

/// The command line as a user would type it, for error messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The last few non-empty lines of `primary` (or of `fallback` when `primary` is empty),
/// joined with " | " and capped in length.
pub(crate) fn tail(primary: &[u8], fallback: &[u8]) -> String {
    let text = if primary.iter().any(|b| !b.is_ascii_whitespace()) {
        String::from_utf8_lossy(primary)
    } else {
        String::from_utf8_lossy(fallback)
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let start = lines.len().saturating_sub(TAIL_LINES);
    let joined = lines[start..].join(" | ");
    if joined.is_empty() {
        return "(no output)".to_string();
    }
    if joined.chars().count() <= TAIL_CHARS {
        return joined;
    }
    // Keep the end: the reason is usually the last thing a tool prints.
    let skip = joined.chars().count() - TAIL_CHARS;
    format!("...{}", joined.chars().skip(skip).collect::<String>())
}

/// Runs `cmd` to completion with stdin closed; Err if it cannot start or exits non-zero.
pub(crate) fn run(mut cmd: Command) -> Result<Output, LabError> {
    let desc = describe(&cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            cmd: desc.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(LabError::Failed {
            cmd: desc,
            status: out.status,
            stderr: tail(&out.stderr, &out.stdout),
        });
    }
    Ok(out)
}

/// Runs `program args...` in the root namespace (used for `ip -n NS ...` and `tc -n NS ...`,
/// which act on a namespace without entering it).
pub(crate) fn run_args(program: &str, args: &[&str]) -> Result<Output, LabError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    run(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_takes_last_lines_of_stderr() {
        assert_eq!(tail(b"a\n\nb\nc\nd\n", b"out"), "b | c | d");
        assert_eq!(tail(b"  \n", b"only stdout\n"), "only stdout");
        assert_eq!(tail(b"", b""), "(no output)");
    }

    #[test]
    fn tail_is_capped_and_keeps_the_end() {
        let long = "x".repeat(1000) + "END";
        let t = tail(long.as_bytes(), b"");
        assert!(t.ends_with("END"));
        assert!(t.chars().count() <= TAIL_CHARS + 3);
    }

    #[test]
    fn failing_command_reports_command_status_and_stderr() {
        let e = run_args("sh", &["-c", "echo boom >&2; exit 3"]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("sh -c echo boom"), "{msg}");
        assert!(msg.contains("boom"), "{msg}");
        assert!(msg.contains('3'), "{msg}");
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let e = run_args("/nonexistent/tcpkit-lab-no-such-tool", &[]).unwrap_err();
        assert!(matches!(e, LabError::Spawn { .. }), "{e}");
    }
}
