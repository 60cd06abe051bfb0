//! Issue 27, "From a key log": `tcpkit copy --tls-keylog` decrypts the TLS sessions it
//! reassembles and copies their plaintext requests to a clear target. Production is nginx
//! over TLS (a certificate of the lab's own CA), the clients are curl writing SSLKEYLOGFILE
//! (TLS 1.3 with each of its AEAD suites, TLS 1.2 ECDHE-ECDSA with AES-128-GCM and
//! ChaCha20-Poly1305), the target is a clear HTTP responder in the target host that keeps
//! every byte each connection brought. The oracle is tshark with the same key log: the target
//! must receive each session's client plaintext exactly as tshark decrypts it. A session whose
//! secrets are not in the key log and one on a CBC suite are counted by reason and nothing of
//! them reaches the target.

use crate::copy_common::*;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tcpkit_lab::{NginxConf, TestCa};

type Received = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// A clear HTTP/1.1 responder on TARGET:8080 (its socket made in the target host): each
/// connection's bytes kept, and a short answer to each request (headers, then a
/// Content-Length body).
fn recorder(l: &CopyLab) -> Received {
    let addr: SocketAddr = format!("{TARGET}:8080").parse().unwrap();
    let listener = l.target.enter(|| TcpListener::bind(addr)).expect("bind");
    let conns: Received = Arc::default();
    let all = Arc::clone(&conns);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let got = Arc::new(Mutex::new(Vec::new()));
            all.lock().unwrap().push(Arc::clone(&got));
            std::thread::spawn(move || {
                let mut pending = Vec::new();
                let mut b = [0u8; 16384];
                while let Ok(n @ 1..) = sock::read_some(&mut s, &mut b) {
                    got.lock().unwrap().extend_from_slice(&b[..n]);
                    pending.extend_from_slice(&b[..n]);
                    while let Some(end) = request_end(&pending) {
                        pending.drain(..end);
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                    }
                }
            });
        }
    });
    conns
}

/// Where the first whole HTTP/1.1 request in `b` ends.
fn request_end(b: &[u8]) -> Option<usize> {
    let h = b.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&b[..h]).to_ascii_lowercase();
    let body: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap_or(0));
    (b.len() >= h + body).then_some(h + body)
}

fn received(r: &Received) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = r
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.lock().unwrap().clone())
        .collect();
    v.sort();
    v
}

/// nginx over TLS on ONLINE:443 (HTTP/1.1 only, so curl's requests are what the target
/// gets), with a certificate of a CA made for the test.
fn https_production(l: &mut CopyLab) -> tcpkit_lab::Nginx {
    let ca = TestCa::new(&l.lab.dir().join("ca"), "tcpkit lab CA").unwrap();
    let cert = ca.server("online", &["localhost", ONLINE]).unwrap();
    let mut conf = NginxConf::https(format!("{ONLINE}:443").parse().unwrap(), cert);
    conf.http2 = false;
    conf.access_log = false;
    let online = l.online.clone();
    l.lab
        .nginx(&online, &conf)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// One curl session from the clients to production, its secrets written to `keylog`; `tls`
/// picks the version and suite. Each URL is a request on the one connection.
fn curl(l: &CopyLab, keylog: &Path, tls: &[&str], paths: &[&str]) {
    let mut argv = vec!["curl", "-sk", "--http1.1", "--max-time", "5"];
    argv.extend_from_slice(tls);
    let urls: Vec<String> = paths
        .iter()
        .map(|p| format!("https://{ONLINE}{p}"))
        .collect();
    for u in &urls {
        argv.extend_from_slice(&["-o", "/dev/null", u]);
    }
    let mut cmd = l.clients.command(&argv);
    cmd.env("SSLKEYLOGFILE", keylog);
    let o = run_limited(cmd, Duration::from_secs(10));
    assert!(o.status.success(), "{argv:?}: {o:?}");
}

/// The sessions every test makes: TLS 1.3 with each AEAD suite (the first with two requests
/// and a POST), TLS 1.2 ECDHE-ECDSA with AES-128-GCM and with ChaCha20-Poly1305.
fn decryptable_sessions(l: &CopyLab, keylog: &Path) {
    let post = ["-d", "name=tcpkit&issue=27"];
    let t13 = |suite: &'static str| ["--tlsv1.3", "--tls13-ciphers", suite];
    curl(
        l,
        keylog,
        &t13("TLS_AES_128_GCM_SHA256"),
        &["/index.html", "/two"],
    );
    let mut with_post = t13("TLS_AES_256_GCM_SHA384").to_vec();
    with_post.extend_from_slice(&post);
    curl(l, keylog, &with_post, &["/post"]);
    curl(
        l,
        keylog,
        &t13("TLS_CHACHA20_POLY1305_SHA256"),
        &["/chacha13"],
    );
    let t12 = |c: &'static str| ["--tlsv1.2", "--tls-max", "1.2", "--ciphers", c];
    curl(
        l,
        keylog,
        &t12("ECDHE-ECDSA-AES128-GCM-SHA256"),
        &["/gcm12"],
    );
    curl(
        l,
        keylog,
        &t12("ECDHE-ECDSA-CHACHA20-POLY1305"),
        &["/chacha12"],
    );
}

/// tshark's decryption of `cap` with `keylog`: each TCP stream's client plaintext (one tshark
/// run, a `follow,tls,raw` per stream; the client's lines are the unindented ones).
fn tshark_client_plaintext(cap: &Path, keylog: &Path) -> Vec<Vec<u8>> {
    let cap_s = cap.to_string_lossy();
    let o = Command::new("tshark")
        .args(["-r", &cap_s, "-T", "fields", "-e", "tcp.stream"])
        .output()
        .expect("tshark");
    let streams: std::collections::BTreeSet<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let mut cmd = Command::new("tshark");
    cmd.args(["-r", &cap_s, "-q", "-o"])
        .arg(format!("tls.keylog_file:{}", keylog.display()));
    for s in &streams {
        cmd.args(["-z", &format!("follow,tls,raw,{s}")]);
    }
    let o = cmd.output().expect("tshark");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = Vec::new();
    for block in text.split("Follow: tls,raw").skip(1) {
        // Node 0 is whichever side tshark saw decrypted data from first; the other side's
        // lines are indented.
        let server_first = block
            .lines()
            .find_map(|l| l.strip_prefix("Node 0: "))
            .is_some_and(|n| n.ends_with(":443"));
        let mut client = Vec::new();
        for line in block.lines() {
            let (indented, hex) = match line.strip_prefix('\t') {
                Some(h) => (true, h),
                None => (false, line),
            };
            if indented != server_first
                || hex.is_empty()
                || hex.len() % 2 != 0
                || !hex.bytes().all(|c| c.is_ascii_hexdigit())
            {
                continue;
            }
            client.extend(
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()),
            );
        }
        if !client.is_empty() {
            out.push(client);
        }
    }
    out.sort();
    out
}

fn tls_counts(r: &Value, what: &str) -> BTreeMap<String, u64> {
    serde_json::from_value(r["tls"][what].clone()).unwrap_or_else(|e| panic!("{e}: {r:#}"))
}

/// The report of [`decryptable_sessions`], and `late` more TLS 1.3 AES-128-GCM sessions of
/// one request each.
fn assert_decrypted(r: &Value, late: u64) {
    assert_eq!(u(r, "tls.sessions.decrypted"), 5 + late, "{r:#}");
    let versions = tls_counts(r, "versions");
    assert_eq!(versions["TLSv1.3"], 3 + late, "{r:#}");
    assert_eq!(versions["TLSv1.2"], 2, "{r:#}");
    let ciphers = tls_counts(r, "ciphers");
    for (c, n) in [
        ("TLS_AES_128_GCM_SHA256", 1 + late),
        ("TLS_AES_256_GCM_SHA384", 1),
        ("TLS_CHACHA20_POLY1305_SHA256", 1),
        ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", 1),
        ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", 1),
    ] {
        assert_eq!(ciphers.get(c), Some(&n), "{c}: {r:#}");
    }
    // Six requests in five sessions (and the late ones), each answered by the target.
    assert_eq!(u(r, "requests.at_source"), 6 + late, "{r:#}");
    assert_eq!(u(r, "requests.answered"), 6 + late, "{r:#}");
    assert_eq!(u(r, "sessions.copies"), 5 + late, "{r:#}");
}

/// Offline: a capture taken by tcpdump while curl ran, copied with `-r`. Every decryptable
/// session reaches the target as tshark decrypts it; the session whose secrets went to
/// another key log counts `no_secret`, the TLS 1.2 CBC one counts unsupported by its suite's
/// name, and nothing of either reaches the target.
#[test]
fn offline_capture_copies_each_sessions_plaintext_as_tshark_decrypts_it() {
    let mut l = CopyLab::new("ctkoff");
    let _nginx = https_production(&mut l);
    let got = recorder(&l);
    let keylog = l.dir.path().join("keys.log");
    let other = l.dir.path().join("elsewhere.log");
    let (online, cap_if) = (l.online.clone(), l.capture_if());
    let dump = l.lab.tcpdump(&online, &cap_if, "tcp port 443").unwrap();
    decryptable_sessions(&l, &keylog);
    curl(&l, &other, &["--tlsv1.3"], &["/nosecret"]);
    curl(
        &l,
        &keylog,
        &["--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES128-SHA"],
        &["/cbc"],
    );
    let cap = dump.stop().unwrap().path;
    let (cap_s, key_s) = (cap.to_string_lossy(), keylog.to_string_lossy());
    let rule = format!("443-{TARGET}:8080");
    let o = l.copy_to_end(
        &[
            "--input",
            &cap_s,
            "-x",
            &rule,
            "--tls-keylog",
            &key_s,
            "--speed",
            "10",
            "--json",
        ],
        Duration::from_secs(20),
    );
    let r = mode_report(&o, "relay");
    assert_decrypted(&r, 0);
    assert_eq!(u(&r, "tls.sessions.no_secret"), 1, "{r:#}");
    assert_eq!(u(&r, "tls.sessions.not_tls"), 0, "{r:#}");
    let unsupported = r["tls"]["sessions"]["unsupported"].clone();
    assert_eq!(
        unsupported,
        serde_json::json!({"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": 1}),
        "{r:#}"
    );
    // curl (OpenSSL) logs five lines per TLS 1.3 session, four secrets and the exporter's
    // (not needed); one line per TLS 1.2 session (the CBC one too).
    assert_eq!(u(&r, "tls.keylog.lines"), 3 * 5 + 3, "{r:#}");
    assert_eq!(u(&r, "tls.keylog.secrets"), 3 * 4 + 3, "{r:#}");
    assert_eq!(u(&r, "tls.keylog.bad_lines"), 0, "{r:#}");
    let oracle: Vec<Vec<u8>> = tshark_client_plaintext(&cap, &keylog)
        .into_iter()
        .filter(|c| !c.windows(4).any(|w| w == b"/cbc"))
        .collect();
    assert_eq!(oracle.len(), 5);
    let target = received(&got);
    assert_eq!(
        target,
        oracle,
        "the target's connections vs tshark's decryption: {:?}",
        target
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
    );
    for c in &target {
        for never in [&b"/nosecret"[..], b"/cbc", b"\x16\x03"] {
            assert!(!c.windows(never.len()).any(|w| w == never), "{c:?}");
        }
    }
}

/// Live: copy captures while curl runs, and the key log does not exist when copy starts (curl
/// creates it, then appends each session's secrets as it goes). One more session's secrets
/// go to a file of their own first and are appended to the key log only after that session
/// ended: copy holds the session until they come.
#[test]
fn live_capture_decrypts_with_a_key_log_growing_while_copy_runs() {
    let mut l = CopyLab::new("ctklive");
    let _nginx = https_production(&mut l);
    let got = recorder(&l);
    let keylog: PathBuf = l.dir.path().join("live-keys.log");
    let late_keys: PathBuf = l.dir.path().join("late-keys.log");
    let key_s = keylog.to_string_lossy().into_owned();
    let (online, cap_if) = (l.online.clone(), l.capture_if());
    let dump = l.lab.tcpdump(&online, &cap_if, "tcp port 443").unwrap();
    let rule = format!("443-{TARGET}:8080");
    let c = l.copy_rule(&rule, &["--tls-keylog", &key_s, "--json"]);
    decryptable_sessions(&l, &keylog);
    let aes128 = ["--tlsv1.3", "--tls13-ciphers", "TLS_AES_128_GCM_SHA256"];
    curl(&l, &late_keys, &aes128, &["/late"]);
    let late = std::fs::read(&late_keys).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&keylog)
        .and_then(|mut f| f.write_all(&late))
        .unwrap();
    // The capture hands a block over within its retire timeout, and the late session waits
    // for the key log's next read (10 ms). Then SIGINT: copy lets its copies finish.
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) takes no pointers; the pid is the copy's own process, still our child.
    let sent = unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(sent, 0);
    let r = copy_report(c);
    let cap = dump.stop().unwrap().path;
    assert_decrypted(&r, 1);
    assert_eq!(u(&r, "tls.sessions.no_secret"), 0, "{r:#}");
    let oracle = tshark_client_plaintext(&cap, &keylog);
    assert_eq!(oracle.len(), 6);
    assert!(oracle.iter().any(|c| c.starts_with(b"GET /late ")));
    assert_eq!(received(&got), oracle, "{r:#}");
}

/// `--tls-keylog` names a file that cannot be read: one line naming the flag and the file,
/// exit 2, nothing run. With -r the file must exist; live, only its directory.
#[test]
fn an_unusable_key_log_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.log");
    let pcap = dir.path().join("empty.pcap");
    // A pcap header and nothing else.
    let mut h = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&65535u32.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    std::fs::write(&pcap, h).unwrap();
    let run = |args: &[&str]| {
        Command::new(tcpkit())
            .arg("copy")
            .args(args)
            .output()
            .unwrap()
    };
    let (m, p) = (missing.to_string_lossy(), pcap.to_string_lossy());
    let o = run(&[
        "--input",
        &p,
        "-x",
        "443-127.0.0.1:8080",
        "--tls-keylog",
        &m,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--tls-keylog") && err.contains("nope.log"),
        "{err}"
    );
    let bad_dir = dir.path().join("no/such/keys.log");
    let b = bad_dir.to_string_lossy();
    let o = run(&["-i", "lo", "-x", "443-127.0.0.1:8080", "--tls-keylog", &b]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tls-keylog") && err.contains("no such directory"),
        "{err}"
    );
    // Two sources of secrets (the file, the probes) together are refused.
    let o = run(&[
        "-x",
        "443-127.0.0.1:8080",
        "--tls-keylog",
        &m,
        "--tls-uprobe",
        "/usr/lib/x86_64-linux-gnu/libssl.so.3",
        // Were the pair let through, the run still ends.
        "--duration",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tls-keylog") && err.contains("--tls-uprobe"),
        "{err}"
    );
    let d = dir.path().to_string_lossy();
    let o = run(&[
        "--input",
        &p,
        "-x",
        "443-127.0.0.1:8080",
        "--tls-keylog",
        &d,
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Transparent mode plays the plaintext as the client's own TCP toward the target's clear
/// port (its flow numbers the bytes it sends, whatever the capture's sequence numbers were)
/// and intercept carries the answers back: the target gets each session's plaintext as
/// tshark decrypts it here too.
#[test]
fn transparent_mode_copies_the_plaintext_too() {
    let mut t = tlab::TLab::new("ctktr");
    let _nginx = https_production(&mut t.l);
    let got = recorder(&t.l);
    let _icp = t.intercept("intercept");
    let keylog = t.l.dir.path().join("keys.log");
    let (online, cap_if) = (t.l.online.clone(), t.l.capture_if());
    let dump = t.l.lab.tcpdump(&online, &cap_if, "tcp port 443").unwrap();
    curl(&t.l, &keylog, &["--tlsv1.3"], &["/t13", "/again"]);
    let t12 = [
        "--tls-max",
        "1.2",
        "--ciphers",
        "ECDHE-ECDSA-AES128-GCM-SHA256",
    ];
    curl(&t.l, &keylog, &t12, &["/t12"]);
    let cap = dump.stop().unwrap().path;
    let (cap_s, key_s) = (cap.to_string_lossy(), keylog.to_string_lossy());
    let rule = format!("443-{TARGET}:8080");
    let o = t.copy_offline(
        &rule,
        &["--input", &cap_s, "--tls-keylog", &key_s, "--speed", "10"],
    );
    let r = tlab::transparent_report(&o);
    assert_eq!(u(&r, "tls.sessions.decrypted"), 2, "{r:#}");
    assert_eq!(u(&r, "requests.answered"), 3, "{r:#}");
    let oracle = tshark_client_plaintext(&cap, &keylog);
    assert_eq!(oracle.len(), 2);
    assert_eq!(received(&got), oracle, "{r:#}");
}
