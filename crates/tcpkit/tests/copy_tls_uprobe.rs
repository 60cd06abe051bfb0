//! Issue 27, live from the server's TLS library: `copy --tls-uprobe-calls` against Debian's nginx
//! over TLS (libssl3), curl making HTTPS requests with SSLKEYLOGFILE. The oracle is tshark
//! decrypting the capture of the same sessions with curl's key log: the target (a sink in the
//! server's host that keeps every connection's bytes) must receive each session's client
//! plaintext exactly as tshark's `follow,tls,raw` shows it. Also: nginx restarted under the
//! probes (new processes: still copied), and copy killed with SIGKILL (no probe left).
//!
//! The probes are system-wide (every process mapping libssl, other tests' too): each test
//! serves on a port of its own, which its copy rule names, and a test that can takes --pid.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tcpkit_lab::{Host, Lab, Nginx, NginxConf, TestCa};

use crate::common::peer::{u, SRV};
use crate::common::{stderr, stdout};

/// The library Debian's nginx maps (checked against its /proc/PID/maps in each test).
pub(crate) const LIBSSL: &str = "/usr/lib/x86_64-linux-gnu/libssl.so.3";

pub(crate) fn tcpkit() -> &'static str {
    env!("CARGO_BIN_EXE_tcpkit")
}

/// The lab: curl in `cli`, nginx over TLS, copy and the sink in `srv`.
pub(crate) struct TlsLab {
    pub(crate) lab: Lab,
    pub(crate) cli: Host,
    pub(crate) srv: Host,
    pub(crate) ca: TestCa,
    pub(crate) port: u16,
    pub(crate) keylog: PathBuf,
    /// The server's end of the link (tcpdump's interface).
    pub(crate) srv_if: String,
}

impl TlsLab {
    pub(crate) fn new(tag: &str, port: u16) -> TlsLab {
        let (lab, cli, srv, link) = Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"));
        let ca =
            TestCa::new(&lab.dir().join("ca"), "tcpkit lab CA").unwrap_or_else(|e| panic!("{e}"));
        let keylog = lab.dir().join("keylog");
        TlsLab {
            lab,
            cli,
            srv,
            ca,
            port,
            keylog,
            srv_if: link.b.name,
        }
    }

    /// nginx (HTTP/1.1 over TLS) on SRV:port, its one worker's pid.
    pub(crate) fn nginx(&mut self) -> (Nginx, u32) {
        let cert = self
            .ca
            .server("server", &["localhost", &SRV.to_string()])
            .unwrap_or_else(|e| panic!("{e}"));
        let mut conf = NginxConf::https(SocketAddr::from((SRV, self.port)), cert);
        conf.http2 = false;
        let n = self
            .lab
            .nginx(&self.srv, &conf)
            .unwrap_or_else(|e| panic!("{e}"));
        let worker = worker_of(n.proc.pid());
        let maps = std::fs::read_to_string(format!("/proc/{worker}/maps")).unwrap();
        assert!(
            maps.contains(LIBSSL),
            "nginx's worker does not map {LIBSSL}"
        );
        (n, worker)
    }

    /// curl in the client host: `args` then the URLs, one connection per run, its key log.
    pub(crate) fn curl(&self, args: &[&str]) {
        let ca = self.ca.cert();
        let mut cmd = self.cli.command(
            &[
                &[
                    "curl",
                    "-sS",
                    "--http1.1",
                    "--cacert",
                    &ca.to_string_lossy(),
                    "-o",
                    "/dev/null",
                ][..],
                args,
            ]
            .concat(),
        );
        cmd.env("SSLKEYLOGFILE", &self.keylog);
        let o = cmd.output().expect("curl");
        assert!(o.status.success(), "curl {args:?}: {}", stderr(&o));
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("https://{SRV}:{}{path}", self.port)
    }

    /// `tcpkit copy --tls-uprobe-calls` in the server host to the sink, with `args`; returns
    /// once its probes are attached (2 raw tracepoints, 5 calls' entries and returns,
    /// SSL_free).
    pub(crate) fn copy(&self, sink: &Sink, args: &[&str]) -> Child {
        self.copy_with_links(sink, args, 13)
    }

    /// `tcpkit copy` in the server host to the sink, with `args`; returns once it holds
    /// `links` BPF links.
    pub(crate) fn copy_with_links(&self, sink: &Sink, args: &[&str], links: usize) -> Child {
        let rule = format!("{}-{}", self.port, sink.addr);
        let mut argv = vec![tcpkit(), "copy", "-x", &rule, "--json", "-q"];
        argv.extend_from_slice(args);
        let mut cmd = self.srv.command(&argv);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("start copy");
        wait_attached(child.id(), links);
        child
    }
}

/// The first child of `pid` (nginx's one worker), within 5 s.
pub(crate) fn worker_of(pid: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let kids =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(k) = kids.split_whitespace().next() {
            return k.parse().unwrap();
        }
        assert!(Instant::now() < deadline, "nginx {pid} started no worker");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The BPF links process `pid` holds.
pub(crate) fn bpf_links(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy() == "anon_inode:bpf_link")
                .count()
        })
        .unwrap_or(0)
}

/// Waits until copy holds `links` BPF links (every link of its probes).
fn wait_attached(pid: u32, links: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while bpf_links(pid) < links {
        assert!(
            Instant::now() < deadline,
            "copy {pid} never attached its probes ({} links)",
            bpf_links(pid)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGINT to copy, its --json report (it must have succeeded).
pub(crate) fn stop(child: Child) -> Value {
    // SAFETY: kill(2) on the process we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().expect("copy");
    assert!(o.status.success(), "copy: {} {}", stdout(&o), stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)))
}

/// The target: keeps every connection's bytes, and answers each request head with a
/// 200.
pub(crate) struct Sink {
    pub(crate) addr: SocketAddr,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Sink {
    pub(crate) fn start(host: &Host) -> Sink {
        let l = host.enter(|| TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = l.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = Arc::clone(&got);
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let g = Arc::clone(&g);
                std::thread::spawn(move || {
                    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let (mut b, mut answered, mut chunk) = (Vec::new(), 0, [0u8; 16384]);
                    while let Ok(n @ 1..) = c.read(&mut chunk) {
                        b.extend_from_slice(&chunk[..n]);
                        let heads = b.windows(4).filter(|w| w == b"\r\n\r\n").count();
                        for _ in answered..heads {
                            let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                        }
                        answered = heads;
                    }
                    g.lock().unwrap().push(b);
                });
            }
        });
        Sink { addr, got }
    }

    /// The connections closed so far, their bytes sorted.
    pub(crate) fn sessions(&self) -> Vec<Vec<u8>> {
        let mut v = self.got.lock().unwrap().clone();
        v.sort();
        v
    }

    /// Waits (5 s at most) until `n` connections have ended.
    pub(crate) fn wait(&self, n: usize) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.got.lock().unwrap().len() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.sessions()
    }
}

pub(crate) fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The client's plaintext of every TLS session in `pcap` (to server port `port`), as tshark
/// decrypts it with the key log `keylog` (`follow,tls,raw`: one node's lines unindented, the
/// other's after a tab; node 0 is whichever sent the first decrypted bytes, named on its
/// `Node 0:` line), sorted.
pub(crate) fn tshark_client_streams(pcap: &Path, keylog: &Path, port: u16) -> Vec<Vec<u8>> {
    let pcap_s = pcap.to_string_lossy();
    let streams = Command::new("tshark")
        .args([
            "-r",
            &pcap_s,
            "-T",
            "fields",
            "-e",
            "tcp.stream",
            "-Y",
            "tcp.flags.syn==1 && tcp.flags.ack==0",
        ])
        .output()
        .expect("tshark");
    let ids: Vec<String> = String::from_utf8_lossy(&streams.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(!ids.is_empty(), "no TCP session in the capture");
    let mut args = vec![
        "-r".to_string(),
        pcap_s.into_owned(),
        "-o".into(),
        format!("tls.keylog_file:{}", keylog.display()),
        "-q".into(),
    ];
    for id in &ids {
        args.push("-z".into());
        args.push(format!("follow,tls,raw,{id}"));
    }
    let o = Command::new("tshark").args(&args).output().expect("tshark");
    assert!(o.status.success(), "tshark: {}", stderr(&o));
    let server_first = format!(":{port}");
    let mut out = Vec::new();
    // (the client's bytes so far, whether the client's lines are the indented ones)
    let mut cur: Option<(Vec<u8>, bool)> = None;
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        if line.starts_with("Follow:") {
            cur = Some((Vec::new(), false));
        } else if line.starts_with("=====") {
            if let Some((c, _)) = cur.take() {
                out.push(c);
            }
        } else if let Some((c, client_tabbed)) = cur.as_mut() {
            if let Some(n0) = line.strip_prefix("Node 0: ") {
                *client_tabbed = n0.ends_with(&server_first);
            } else if line.starts_with("Filter:") || line.starts_with("Node ") || line.is_empty() {
            } else if line.starts_with('\t') == *client_tabbed {
                c.extend(unhex(line.trim()));
            }
        }
    }
    out.sort();
    out
}

/// Three curl sessions (TLS 1.3 keep-alive with two requests, a TLS 1.3 POST, TLS 1.2) to
/// nginx over TLS while the copy `start` gives runs (given the lab, the sink and nginx's
/// worker; started once tcpdump runs): the target must get each session's client plaintext
/// exactly as tshark decrypts the capture with curl's key log. Returns the copy's report.
pub(crate) fn three_sessions_as_tshark_decrypts_them(
    tag: &str,
    port: u16,
    start: impl Fn(&TlsLab, &Sink, u32) -> Child,
) -> Value {
    let mut t = TlsLab::new(tag, port);
    let (_nginx, worker) = t.nginx();
    let sink = Sink::start(&t.srv);
    let filter = format!("tcp port {}", t.port);
    let (srv, srv_if) = (t.srv.clone(), t.srv_if.clone());
    let dump = t.lab.tcpdump(&srv, &srv_if, &filter);
    let dump = dump.unwrap_or_else(|e| panic!("{e}"));
    let copy = start(&t, &sink, worker);
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
    assert_eq!(u(&report, "tls.sessions.decrypted"), 3, "{report:#}");
    assert_eq!(u(&report, "tls.uprobe.lost_records"), 0, "{report:#}");
    assert_eq!(u(&report, "requests.at_source"), 4, "{report:#}");
    crate::common::schema::check(&crate::common::schema::load("copy"), &report, "copy");
    report
}

/// Sessions (or plaintext streams) as text, for readable failures.
pub(crate) fn as_text(v: &[Vec<u8>]) -> Vec<String> {
    v.iter()
        .map(|g| String::from_utf8_lossy(g).into_owned())
        .collect()
}

/// Issue 27's uprobe mode: three curl sessions while copy --tls-uprobe-calls --pid <nginx's
/// worker> runs reach the target as tshark decrypts them, three copied connections, none
/// lost.
#[test]
fn target_gets_each_sessions_plaintext_as_tshark_decrypts_it() {
    let report = three_sessions_as_tshark_decrypts_them("tlsupr", 4431, |t, sink, worker| {
        t.copy(
            sink,
            &["--tls-uprobe-calls", LIBSSL, "--pid", &worker.to_string()],
        )
    });
    let tls = &report["tls"];
    assert_eq!(tls["source"], "uprobe", "{report:#}");
    assert_eq!(u(&report, "tls.uprobe.pids"), 1, "{report:#}");
    assert_eq!(tls["uprobe"]["targets"][0], LIBSSL, "{report:#}");
    assert_eq!(tls["uprobe"]["mode"], "calls", "{report:#}");
}

/// nginx restarted under the copy `start` gives (no --pid: its probes are on the library's
/// file, not on processes): a session before and one after the restart (another worker)
/// must reach the target as tshark decrypts them. Returns the copy's report.
pub(crate) fn sessions_around_a_restart(
    tag: &str,
    port: u16,
    start: impl Fn(&TlsLab, &Sink) -> Child,
) -> Value {
    let mut t = TlsLab::new(tag, port);
    let (first, worker1) = t.nginx();
    let sink = Sink::start(&t.srv);
    let filter = format!("tcp port {}", t.port);
    let (srv, srv_if) = (t.srv.clone(), t.srv_if.clone());
    let dump = t.lab.tcpdump(&srv, &srv_if, &filter);
    let dump = dump.unwrap_or_else(|e| panic!("{e}"));
    let copy = start(&t, &sink);
    t.curl(&["-H", "X-Run: before", &t.url("/index.html")]);
    first.proc.stop().unwrap_or_else(|e| panic!("{e}"));
    let (_second, worker2) = t.nginx();
    assert_ne!(worker1, worker2);
    t.curl(&["-H", "X-Run: after", &t.url("/after")]);
    let got = sink.wait(2);
    let report = stop(copy);
    let cap = dump.stop().unwrap_or_else(|e| panic!("{e}"));
    let want = tshark_client_streams(&cap.path, &t.keylog, t.port);
    assert_eq!(want.len(), 2, "tshark saw {} sessions", want.len());
    assert!(String::from_utf8_lossy(&want[1]).contains("X-Run: before"));
    assert_eq!(as_text(&got), as_text(&want), "{report:#}");
    assert_eq!(u(&report, "tls.sessions.decrypted"), 2, "{report:#}");
    assert_eq!(u(&report, "tls.uprobe.lost_records"), 0, "{report:#}");
    report
}

/// Issue 27: nginx restarted under the per-call probes: the new worker is covered from its
/// start, the session after the restart copied as exactly as the one before.
#[test]
fn sessions_after_nginx_restarts_under_the_probes_are_copied() {
    sessions_around_a_restart("tlsuprrs", 4432, |t, sink| {
        t.copy(sink, &["--tls-uprobe-calls", LIBSSL])
    });
}

/// `(link id, prog id)` of each BPF link process `pid` holds, from /proc/PID/fdinfo.
pub(crate) fn links_of(pid: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(l) = std::fs::read_link(e.path()) else {
            continue;
        };
        if l.to_string_lossy() != "anon_inode:bpf_link" {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let field = |k: &str| -> Option<u32> {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse().ok())
        };
        if let (Some(link), Some(prog)) = (field("link_id:"), field("prog_id:")) {
            out.push((link, prog));
        }
    }
    out
}

/// Whether `bpftool OBJ show id ID` still finds the object.
pub(crate) fn bpftool_has(obj: &str, id: u32) -> bool {
    Command::new("bpftool")
        .args([obj, "show", "id", &id.to_string()])
        .output()
        .expect("bpftool")
        .status
        .success()
}

/// Issue 27: copy killed with SIGKILL leaves no probe behind. Its links and the programs on
/// nginx's SSL_read/SSL_write are the kernel's to free once copy's descriptors close: none of
/// them remains (bpftool link/prog/perf), and nginx goes on serving.
#[test]
fn sigkill_of_copy_leaves_no_probe_attached() {
    let mut t = TlsLab::new("tlsuprkl", 4433);
    let (_nginx, worker) = t.nginx();
    let sink = Sink::start(&t.srv);
    let copy = t.copy(
        &sink,
        &["--tls-uprobe-calls", LIBSSL, "--pid", &worker.to_string()],
    );
    t.curl(&[&t.url("/index.html")]);
    assert_eq!(sink.wait(1).len(), 1, "the session was not copied");
    let links = links_of(copy.id());
    assert!(links.len() >= 13, "copy holds {} links", links.len());
    let perf = Command::new("bpftool")
        .args(["-j", "perf"])
        .output()
        .unwrap();
    let ours = |p: &[u8]| -> usize {
        let v: Value = serde_json::from_slice(p).unwrap_or(Value::Null);
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter(|e| {
                        let id = e["prog_id"].as_u64().unwrap_or(0) as u32;
                        links.iter().any(|&(_, p)| p == id)
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    // The raw tracepoints show as perf fds of copy's; the uprobes' perf events are held by
    // their links only (aya closes its own descriptor once the link holds the event).
    assert!(ours(&perf.stdout) >= 2, "bpftool perf: {}", stdout(&perf));
    let shown = Command::new("bpftool")
        .args(["link", "show"])
        .output()
        .unwrap();
    let uprobes = stdout(&shown)
        .lines()
        .filter(|l| {
            l.contains("perf_event")
                && links
                    .iter()
                    .any(|&(id, _)| l.starts_with(&format!("{id}:")))
        })
        .count();
    assert!(uprobes >= 11, "bpftool link show: {}", stdout(&shown));
    let pid = copy.id();
    // SAFETY: kill(2) on the process we started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let mut copy = copy;
    copy.wait().unwrap();
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    // The kernel frees a link and its program after an RCU grace period.
    let deadline = Instant::now() + Duration::from_secs(3);
    while links
        .iter()
        .any(|&(l, p)| bpftool_has("link", l) || bpftool_has("prog", p))
    {
        assert!(
            Instant::now() < deadline,
            "a probe outlived copy: {links:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let perf = Command::new("bpftool")
        .args(["-j", "perf"])
        .output()
        .unwrap();
    assert_eq!(ours(&perf.stdout), 0, "bpftool perf: {}", stdout(&perf));
    t.curl(&[&t.url("/index.html")]);
}

/// CPU time process `pid` has run, in nanoseconds (user and system: /proc/PID/schedstat's
/// first field, exact where /proc/PID/stat counts 10 ms ticks).
pub(crate) fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("/proc/{pid}/schedstat"))
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// SIGINT to copy and its end, whatever its exit status (the measurement's copies may count
/// requests lost at the cut).
pub(crate) fn stop_any(child: Child) {
    // SAFETY: kill(2) on the process we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = child.wait_with_output();
}
