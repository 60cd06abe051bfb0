//! Issue 27, the secrets mode: `copy -i IF --tls-uprobe libssl.so.3` against Debian's nginx
//! over TLS. The probes read each handshake's secrets from nginx's SSL object (SSL_do_handshake
//! only) and copy decrypts what it captures with them. The oracle is tshark decrypting the
//! same capture with curl's own key log: the target must receive each session's client
//! plaintext exactly as tshark shows it. Also: a connection whose handshake came before copy
//! (counted, not copied), nginx restarted under the probes, and SIGKILL of copy (no probe left).
//!
//! The lab, nginx, the sink and tshark's reading are copy_tls_uprobe's (the per-call mode's).

use std::process::Child;
use std::time::{Duration, Instant};

use crate::common::peer::u;
use crate::copy_tls_uprobe::{stop, tshark_client_streams, Sink, TlsLab, LIBSSL};

/// The secrets mode's links: SSL_do_handshake's uprobe and uretprobe.
const LINKS: usize = 2;

/// Waits until process `pid` holds a packet socket bound to interface `ifindex` (its capture
/// is bound, ring and filter in place; /proc/net/packet: sk RefCnt Type Proto Iface R Rmem
/// User Inode), 5 s at most.
fn wait_capturing(pid: u32, ifindex: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let packet = std::fs::read_to_string(format!("/proc/{pid}/net/packet")).unwrap_or_default();
        let inodes: Vec<String> = packet
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.get(4) == Some(&ifindex))
            .filter_map(|f| f.last().map(|i| format!("socket:[{i}]")))
            .collect();
        let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten().any(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| inodes.iter().any(|i| *i == l.to_string_lossy()))
                })
            })
            .unwrap_or(false);
        if open {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "copy {pid} never opened its capture"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `copy -i <server's link> --tls-uprobe LIBSSL` with `args`, once its probes are attached
/// and its capture open.
fn copy_secrets(t: &TlsLab, sink: &Sink, args: &[&str]) -> Child {
    let mut argv = vec!["-i", &t.srv_if, "--tls-uprobe", LIBSSL];
    argv.extend_from_slice(args);
    let c = t.copy_with_links(sink, &argv, LINKS);
    let ifindex = t
        .srv
        .run(&["cat", &format!("/sys/class/net/{}/ifindex", t.srv_if)])
        .expect("ifindex");
    wait_capturing(c.id(), String::from_utf8_lossy(&ifindex.stdout).trim());
    c
}

/// The sink's sessions and tshark's client streams of the capture, as text.
fn as_text(v: &[Vec<u8>]) -> Vec<String> {
    v.iter()
        .map(|g| String::from_utf8_lossy(g).into_owned())
        .collect()
}

/// Issue 27's secrets mode: a TLS 1.3 keep-alive session with two requests, a TLS 1.3 POST
/// and a TLS 1.2 (ECDHE, AES-GCM) session to nginx while copy --tls-uprobe --pid <worker>
/// runs; the target gets each session's client plaintext exactly as tshark decrypts the
/// capture with curl's key log, and the report counts three sessions decrypted by version.
#[test]
fn tls13_and_tls12_sessions_reach_the_target_as_tshark_decrypts_them() {
    let mut t = TlsLab::new("tlssec", 4441);
    let (_nginx, worker) = t.nginx();
    let sink = Sink::start(&t.srv);
    let filter = format!("tcp port {}", t.port);
    let (srv, srv_if) = (t.srv.clone(), t.srv_if.clone());
    let dump = t.lab.tcpdump(&srv, &srv_if, &filter);
    let dump = dump.unwrap_or_else(|e| panic!("{e}"));
    let copy = copy_secrets(&t, &sink, &["--pid", &worker.to_string()]);
    let (a, b) = (t.url("/index.html"), t.url("/second?x=1"));
    t.curl(&["-H", "X-Test: keep-alive", &a, "-o", "/dev/null", &b]);
    t.curl(&["-d", "name=value&other=2", &a]);
    t.curl(&["--tls-max", "1.2", &b]);
    let got = sink.wait(3);
    let report = stop(copy);
    let cap = dump.stop().unwrap_or_else(|e| panic!("{e}"));
    let want = tshark_client_streams(&cap.path, &t.keylog, t.port);
    assert_eq!(want.len(), 3, "tshark saw {} sessions", want.len());
    assert!(
        want.iter()
            .all(|w| w.starts_with(b"GET ") || w.starts_with(b"POST ")),
        "tshark did not decrypt every session"
    );
    assert_eq!(as_text(&got), as_text(&want), "{report:#}");
    let tls = &report["tls"];
    assert_eq!(tls["source"], "uprobe", "{report:#}");
    assert_eq!(tls["uprobe"]["mode"], "secrets", "{report:#}");
    assert!(
        tls["uprobe"]["library"]
            .as_str()
            .is_some_and(|l| l.starts_with("OpenSSL 3.")),
        "{report:#}"
    );
    assert_eq!(u(&report, "tls.sessions.decrypted"), 3, "{report:#}");
    assert_eq!(tls["versions"]["TLSv1.3"], 2, "{report:#}");
    assert_eq!(tls["versions"]["TLSv1.2"], 1, "{report:#}");
    assert_eq!(u(&report, "tls.uprobe.records"), 3, "{report:#}");
    assert_eq!(u(&report, "tls.uprobe.unmatched"), 0, "{report:#}");
    assert_eq!(u(&report, "tls.uprobe.lost_records"), 0, "{report:#}");
    assert_eq!(u(&report, "requests.at_source"), 4, "{report:#}");
    crate::common::schema::check(&crate::common::schema::load("copy"), &report, "copy");
}
