//! Issue 24, item 15: one exit-status rule for every subcommand (README, "Exit status and
//! output"). A file the command line names that cannot be used as given (missing, a key file
//! others can read, not the expected format) is a usage error: exit 2, ONE line on stderr
//! naming the flag and the file, nothing run and nothing on stdout. So is everything clap
//! refuses. Each case runs the real binary inside a fresh network namespace holding only `lo`,
//! so a subcommand that went on to use the network despite the bad file touches nothing.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Output, Stdio};

use common::{stderr, stdout, tcpkit, testdata};
use tcpkit_lab::{Host, Lab};

/// Runs `tcpkit ARGS` in `h` with stdin closed; a run past 10 s is killed (exit 124, which
/// the rule's check reports): a usage error is found before anything runs.
fn run_in(h: &Host, args: &[&str]) -> Output {
    let mut argv = vec!["timeout", "10", tcpkit()];
    argv.extend_from_slice(args);
    h.command(&argv)
        .stdin(Stdio::null())
        .output()
        .expect("run timeout tcpkit")
}

/// One case: the subcommand (as it names itself on stderr), its arguments, the file that is
/// wrong and the flag that names it (None for a positional argument).
struct Case {
    sub: &'static str,
    args: Vec<String>,
    file: String,
    flag: Option<&'static str>,
}

/// What is wrong with `o` for `c`, if anything: the whole rule, checked at once so that one
/// run of the test lists every subcommand that breaks it.
fn breaks(c: &Case, o: &Output) -> Option<String> {
    let err = stderr(o);
    let mut why = Vec::new();
    if o.status.code() != Some(2) {
        why.push(format!("exit {:?}, not 2", o.status.code()));
    }
    if err.lines().count() != 1 {
        why.push(format!("{} lines on stderr, not 1", err.lines().count()));
    }
    if !err.starts_with(&format!("tcpkit {}: ", c.sub)) {
        why.push(format!("stderr does not start 'tcpkit {}: '", c.sub));
    }
    if !err.contains(&c.file) {
        why.push("stderr does not name the file".into());
    }
    if let Some(f) = c.flag {
        if !err.contains(f) {
            why.push(format!("stderr does not name {f}"));
        }
    }
    if !o.stdout.is_empty() {
        why.push(format!("stdout not empty: {:?}", stdout(o)));
    }
    (!why.is_empty()).then(|| {
        format!(
            "tcpkit {}: {}\n    stderr: {}",
            c.args.join(" "),
            why.join("; "),
            err.trim_end()
        )
    })
}

fn case(sub: &'static str, args: &[&str], file: &Path, flag: Option<&'static str>) -> Case {
    Case {
        sub,
        args: args.iter().map(|a| a.to_string()).collect(),
        file: file.display().to_string(),
        flag,
    }
}

/// Every subcommand that takes a file, given one that does not exist, and the key files given
/// with a mode that lets others read them.
#[test]
fn a_missing_or_unusable_file_is_exit_2_and_one_line_naming_it_in_every_subcommand() {
    let mut lab = Lab::new("exitrule").unwrap_or_else(|e| panic!("{e}"));
    let h = lab.host("h").unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let missing = |name: &str| d.join("missing").join(name);
    let open_key = d.join("key-0644");
    std::fs::write(&open_key, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let pcap = testdata("trex-http_get.pcap");
    let pcap = pcap.to_str().unwrap();
    let out = d.join("out.pcap");
    let out = out.to_str().unwrap();

    let m = |n: &str| missing(n).to_str().unwrap().to_string();
    let (f_pcap, f_names, f_payload, f_input, f_key, f_config, f_report, f_dir) = (
        m("a.pcap"),
        m("names.txt"),
        m("payload.bin"),
        m("in.pcap"),
        m("key"),
        m("balance.toml"),
        m("a.json"),
        "/proc/no-such-dir".to_string(),
    );
    let mut cases = vec![
        // replay FILE (dry run: nothing would leave an interface anyway).
        case(
            "replay",
            &["replay", "-w", out, &f_pcap],
            Path::new(&f_pcap),
            None,
        ),
        case(
            "load",
            &[
                "load",
                "198.18.0.2:53",
                "--dns",
                "--qname-file",
                &f_names,
                "-t",
                "1",
            ],
            Path::new(&f_names),
            Some("--qname-file"),
        ),
        case(
            "load",
            &[
                "load",
                "198.18.0.2:4242",
                "--payload-file",
                &f_payload,
                "-t",
                "1",
            ],
            Path::new(&f_payload),
            Some("--payload-file"),
        ),
        case(
            "copy",
            &["copy", "--copy", "80-198.18.0.2:80", "--input", &f_input],
            Path::new(&f_input),
            Some("--input"),
        ),
        case(
            "mpcat",
            &["mpcat", "-i", &f_input, "198.18.0.2", "5000"],
            Path::new(&f_input),
            Some("-i"),
        ),
        case(
            "balance",
            &["balance", "up", "--config", &f_config],
            Path::new(&f_config),
            Some("--config"),
        ),
        case("merge", &["merge", &f_report], Path::new(&f_report), None),
        case("man", &["man", &f_dir], Path::new(&f_dir), None),
    ];
    // Each key file, missing and readable by others.
    for key in [Path::new(&f_key), open_key.as_path()] {
        let k = key.to_str().unwrap();
        let intercept = ["intercept", "--capture", "lo", "--auth-key-file", k];
        let mpcat = ["mpcat", "-l", "-p", "5000", "--psk-file", k];
        let barrier = [
            "barrier",
            "--listen",
            "127.0.0.1:7300",
            "--agents",
            "2",
            "--key-file",
            k,
        ];
        let agent = [
            "load",
            "198.18.0.2:53",
            "--dns",
            "-r",
            "10",
            "-t",
            "1",
            "--barrier",
            "127.0.0.1:7300",
            "--barrier-key",
            k,
        ];
        let copy = [
            "copy",
            "--copy",
            "80-198.18.0.2:80",
            "--input",
            pcap,
            "--transparent",
            "--intercept",
            "198.18.0.3",
            "--auth-key-file",
            k,
        ];
        cases.push(case("copy", &copy, key, Some("--auth-key-file")));
        cases.push(case("intercept", &intercept, key, Some("--auth-key-file")));
        cases.push(case("mpcat", &mpcat, key, Some("--psk-file")));
        cases.push(case("barrier", &barrier, key, Some("--key-file")));
        cases.push(case("load", &agent, key, Some("--barrier-key")));
    }
    let broken: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
            breaks(c, &run_in(&h, &args))
        })
        .collect();
    assert!(
        broken.is_empty(),
        "{} of {} cases break the rule:\n{}",
        broken.len(),
        cases.len(),
        broken.join("\n")
    );
}

/// Everything clap refuses is exit 2 with one line, in every subcommand at every depth.
#[test]
fn clap_errors_are_exit_2_and_one_line_in_every_subcommand() {
    let (_lab, h) = {
        let mut lab = Lab::new("exitclap").unwrap_or_else(|e| panic!("{e}"));
        let h = lab.host("h").unwrap_or_else(|e| panic!("{e}"));
        (lab, h)
    };
    let subs: [&[&str]; 18] = [
        &[],
        &["completions"],
        &["replay"],
        &["echo"],
        &["load"],
        &["copy"],
        &["intercept"],
        &["mpcat"],
        &["balance"],
        &["balance", "up"],
        &["balance", "down"],
        &["balance", "reload"],
        &["balance", "status"],
        &["balance", "run"],
        &["barrier"],
        &["merge"],
        &["tune"],
        &["man"],
    ];
    let mut broken = Vec::new();
    for sub in subs {
        let mut args = sub.to_vec();
        args.push("--no-such-flag");
        let o = run_in(&h, &args);
        let err = stderr(&o);
        let who = match sub.first() {
            Some(s) => format!("tcpkit {s}: "),
            None => "tcpkit: ".into(),
        };
        if o.status.code() != Some(2)
            || err.lines().count() != 1
            || !err.starts_with(&who)
            || !err.contains("--no-such-flag")
            || !o.stdout.is_empty()
        {
            broken.push(format!("{args:?}: exit {:?}: {err}", o.status.code()));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
