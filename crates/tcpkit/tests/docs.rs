//! Issue 24, item 17: `tcpkit man DIR` and `tcpkit completions bash` as a user installs and
//! uses them: every page a page names exists where `man` looks for it (DIR/man1/), SYNOPSIS
//! lines give each option's value, and bash completes interface flags with the interfaces of
//! the host it runs on, not with file names.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::{stderr, stdout, tcpkit};
use tcpkit_lab::Lab;

fn man_pages(dir: &Path) -> Output {
    Command::new(tcpkit())
        .arg("man")
        .arg(dir)
        .output()
        .expect("run tcpkit man")
}

/// `man ARGS` with MANPATH=dir and a width no line reaches, so text is not wrapped.
fn man(dir: &Path, args: &[&str]) -> Output {
    Command::new("man")
        .args(args)
        .env("MANPATH", dir)
        .env("MANWIDTH", "2000")
        .env("LC_ALL", "C.UTF-8")
        .output()
        .expect("run man (apt-get install man-db)")
}

/// The pages named `tcpkit-…(1)` in `text`.
fn named_pages(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("tcpkit-") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(tail.len());
        if tail[end..].starts_with("(1)") {
            v.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    v
}

#[test]
fn every_page_a_page_names_is_written_under_man1_and_man_finds_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = man_pages(dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let man1 = dir.path().join("man1");
    let mut written: Vec<String> = std::fs::read_dir(&man1)
        .unwrap_or_else(|e| panic!("{}: {e}", man1.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    for page in [
        "tcpkit",
        "tcpkit-replay",
        "tcpkit-balance",
        "tcpkit-balance-up",
        "tcpkit-balance-down",
        "tcpkit-balance-reload",
        "tcpkit-balance-status",
        "tcpkit-balance-run",
    ] {
        assert!(
            written.contains(&format!("{page}.1")),
            "{page}.1 not in {written:?}"
        );
    }
    // Nothing is written beside man1/.
    let top: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(top.len(), 1, "{top:?}");
    // man finds each by name (one man for all of them: it prints a path per name, in order),
    // and groff renders them all without a complaint.
    let names: Vec<&str> = written.iter().map(|f| f.trim_end_matches(".1")).collect();
    let mut args = vec!["-w"];
    args.extend_from_slice(&names);
    let o = man(dir.path(), &args);
    let found: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    let want: Vec<String> = written
        .iter()
        .map(|f| man1.join(f).display().to_string())
        .collect();
    assert_eq!(found, want, "man -w: {}", stderr(&o));
    // One groff run for them all (one per page took 4 s on a loaded machine): the pages
    // one after the other, each starting with its own .TH.
    let all = tempfile::NamedTempFile::new().unwrap();
    let text: Vec<u8> = want
        .iter()
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect();
    std::fs::write(all.path(), text).unwrap();
    let o = man(dir.path(), &["-l", all.path().to_str().unwrap()]);
    assert!(o.status.success(), "man -l: {}", stderr(&o));
    assert_eq!(stderr(&o), "", "man -l");
    let text = stdout(&o);
    for name in &names {
        assert!(text.contains(&format!("{name}(1)")), "{name} not rendered");
    }
    for named in named_pages(&text) {
        assert!(
            written.contains(&format!("{named}.1")),
            "a page names {named}(1), which was not written ({written:?})"
        );
    }
    // A directory already named man1 gets the pages itself (the old usage,
    // `tcpkit man /usr/local/share/man/man1`).
    let o = man_pages(&man1);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!man1.join("man1").exists());
}

/// The SYNOPSIS section of a rendered page, on one line.
fn synopsis(dir: &Path, page: &str) -> String {
    let o = man(dir, &[page]);
    assert!(o.status.success(), "man {page}: {}", stderr(&o));
    let text = stdout(&o);
    let start = text.find("SYNOPSIS").expect("SYNOPSIS") + "SYNOPSIS".len();
    let end = text[start..].find("DESCRIPTION").expect("DESCRIPTION") + start;
    text[start..end]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn synopsis_lines_give_every_value_name() {
    let dir = tempfile::tempdir().unwrap();
    assert!(man_pages(dir.path()).status.success());
    let s = synopsis(dir.path(), "tcpkit-replay");
    for want in [
        "tcpkit replay ",
        "[-i|--intf1 IFACE]",
        "[-w|--write FILE]",
        "[-p|--pps N]",
        "[--json]",
        "[PCAP]...",
    ] {
        assert!(s.contains(want), "replay's SYNOPSIS lacks {want:?}: {s}");
    }
    let s = synopsis(dir.path(), "tcpkit-echo");
    assert!(s.contains("[--port N]"), "{s}");
    assert!(s.contains("[--listen ADDR[:PORT]]"), "{s}");
    let s = synopsis(dir.path(), "tcpkit-balance-up");
    assert!(s.contains("tcpkit balance up "), "{s}");
    assert!(s.contains("<--config FILE>"), "{s}");
    let s = synopsis(dir.path(), "tcpkit-balance-run");
    assert!(s.ends_with(" -- <CMD>..."), "{s}");
    let s = synopsis(dir.path(), "tcpkit-merge");
    assert!(s.contains("<REPORT.json>..."), "{s}");
}

/// Runs the generated bash completion inside a lab host (its own /sys/class/net under
/// `ip netns exec`) for each `words` (the command line so far, completing an empty word after
/// it) and returns one line per case: the candidates, sorted and joined by spaces.
fn complete(h: &tcpkit_lab::Host, cwd: &Path, cases: &[&str]) -> Vec<String> {
    let mut script = format!(
        "set -e\neval \"$({} completions bash)\"\ncomplete -p tcpkit >/dev/null\ncd {}\n",
        tcpkit(),
        cwd.display()
    );
    for words in cases {
        // The word being completed is the last one (possibly empty).
        script.push_str(&format!(
            "COMP_WORDS=(tcpkit {words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=()\n\
             _tcpkit tcpkit \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\" | sort | tr '\\n' ' ' | sed 's/ $//'; echo\n"
        ));
    }
    let o = h
        .command(&["bash", "-c", &script])
        .output()
        .expect("run bash");
    assert!(o.status.success(), "bash: {}", stderr(&o));
    stdout(&o).lines().map(str::to_string).collect()
}

#[test]
fn bash_completes_every_interface_flag_with_interface_names() {
    let (_lab, _a, b, link) = Lab::pair("complif").unwrap_or_else(|e| panic!("{e}"));
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("capture.pcap"), b"").unwrap();
    let mut ifaces = ["lo".to_string(), link.b.name.clone()];
    ifaces.sort();
    let ifaces = ifaces.join(" ");
    let cases = [
        "replay -i ''",
        "replay --intf1 ''",
        "copy -i ''",
        "copy --capture ''",
        "intercept --capture ''",
        "replay -i l",
        "replay -w ''",
    ];
    let got = complete(&b, cwd.path(), &cases);
    assert_eq!(got.len(), cases.len(), "{got:?}");
    for (case, got) in cases[..5].iter().zip(&got) {
        assert_eq!(got, &ifaces, "tcpkit {case}<TAB>");
    }
    assert_eq!(got[5], "lo", "tcpkit replay -i l<TAB>");
    // A flag that takes a file still completes files.
    assert_eq!(got[6], "capture.pcap", "tcpkit replay -w <TAB>");
}
