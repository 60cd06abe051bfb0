//! What the mpcat tests share: a transfer's set-up (the multipath lab, its port, the input
//! and output files, the listener and the sender), waiting for a listener or a process and
//! its exit, random inputs and their hashes, key files, the report (checked against its
//! schema) and the checks every verified transfer passes, shaped links.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tcpkit_lab::{Host, Lab, Link, Proc, Tbf, MULTIPATH_B4};

use super::schema;

/// A port for this test process (no fixed ports: the namespaces are new, but two runs of a
/// test binary at once should not meet even if they shared one).
pub fn port() -> u16 {
    20000 + (std::process::id() % 30000) as u16
}

/// Waits until something listens on `port` in `host` (`ss`, not a probe connection, which
/// the receiver would count as a bad handshake).
pub fn wait_listening(host: &Host, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = host
            .run(&["ss", "-Hltn", &format!("sport = :{port}")])
            .unwrap_or_else(|e| panic!("{e}"));
        if !out.stdout.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One transfer's set-up: the `multipath` lab (`a` sends, `b` listens), this test's port,
/// and an input and an output file in the lab's folder (`in.bin` and `out.bin`; a test
/// that writes elsewhere sets `output`, or `input` for one that reads another file).
pub struct Transfer {
    pub lab: Lab,
    pub a: Host,
    pub b: Host,
    pub links: Vec<Link>,
    pub port: u16,
    pub input: PathBuf,
    pub output: PathBuf,
}

impl Transfer {
    /// The lab `tag` with `paths` links, each shaped by `tbf`; the input not yet written.
    pub fn new(tag: &str, paths: usize, tbf: Option<Tbf>) -> Transfer {
        let (lab, a, b, links) = Lab::multipath(tag, paths, tbf).unwrap_or_else(|e| panic!("{e}"));
        let dir = lab.dir().to_path_buf();
        Transfer {
            lab,
            a,
            b,
            links,
            port: port(),
            input: dir.join("in.bin"),
            output: dir.join("out.bin"),
        }
    }

    /// [`Transfer::new`] with `bytes` of random data in the input.
    pub fn with_input(tag: &str, paths: usize, tbf: Option<Tbf>, bytes: u64) -> Transfer {
        let t = Transfer::new(tag, paths, tbf);
        random_file(&t.input, bytes);
        t
    }

    /// The lab's folder, for a test's other files.
    pub fn dir(&self) -> PathBuf {
        self.lab.dir().to_path_buf()
    }

    /// The listener's address and port, for a test that plays a peer itself.
    pub fn to(&self) -> SocketAddr {
        SocketAddr::new(MULTIPATH_B4.parse().unwrap(), self.port)
    }

    /// Starts the receiver writing to the output, `tcpkit mpcat -l -p PORT -o OUTPUT
    /// ARGS...`, in `b` (its log named "rx"), and waits until it listens.
    pub fn listen(&mut self, args: &[&str]) -> Proc {
        self.listen_as("rx", args)
    }

    /// [`Transfer::listen`], its log named `name` (for a test that runs several receivers).
    pub fn listen_as(&mut self, name: &str, args: &[&str]) -> Proc {
        let rx = self.start_listener(name, &[], args);
        wait_listening(&self.b, self.port);
        rx
    }

    /// Starts `WRAP... tcpkit mpcat -l -p PORT -o OUTPUT ARGS...` in `b`, its log named
    /// `name`, and returns at once: for a listener run under another command (`wrap`), or
    /// one that must find something open before it can listen.
    pub fn start_listener(&mut self, name: &str, wrap: &[&str], args: &[&str]) -> Proc {
        let p = self.port.to_string();
        let out = self.output.to_str().unwrap();
        let mpcat = [super::tcpkit(), "mpcat", "-l", "-p", &p, "-o", out];
        let argv = [wrap, &mpcat[..], args].concat();
        self.b
            .spawn(&mut self.lab, name, &argv)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the sender reading the input, `tcpkit mpcat -i INPUT ARGS... B PORT`, in `a`
    /// (its log named "tx").
    pub fn send(&mut self, args: &[&str]) -> Proc {
        self.send_as("tx", args)
    }

    /// [`Transfer::send`], its log named `name` (for a test that runs several senders).
    pub fn send_as(&mut self, name: &str, args: &[&str]) -> Proc {
        self.sender(name, MULTIPATH_B4, args)
    }

    /// [`Transfer::send`] toward `addr`, another of `b`'s addresses.
    pub fn send_to(&mut self, addr: &str, args: &[&str]) -> Proc {
        self.sender("tx", addr, args)
    }

    fn sender(&mut self, name: &str, addr: &str, args: &[&str]) -> Proc {
        let p = self.port.to_string();
        let mpcat = [super::tcpkit(), "mpcat", "-i", self.input.to_str().unwrap()];
        let argv = [&mpcat[..], args, &[addr, &p][..]].concat();
        self.a
            .spawn(&mut self.lab, name, &argv)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The output holds the input, byte for byte (sha256sum, outside tcpkit).
    pub fn identical(&self) {
        assert_eq!(
            sha256(&self.input),
            sha256(&self.output),
            "the stream differs"
        );
    }

    /// The end of every transfer that works: the sender exits 0 (within `tx_secs`), then the
    /// receiver (within `rx_secs`), and the output is [`identical`](Transfer::identical).
    pub fn arrives(&self, tx: &Proc, tx_secs: u64, rx: &Proc, rx_secs: u64) {
        succeeds(tx, tx_secs);
        succeeds(rx, rx_secs);
        self.identical();
    }
}

/// Waits until `output` holds `bytes`, while the sender still runs (10 s at most).
pub fn wait_arrived(output: &Path, bytes: u64, tx: &Proc, rx: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(output).map_or(0, |m| m.len()) < bytes {
        assert!(
            Instant::now() < deadline,
            "nothing arrived:\n{}\n{}",
            tx.log(),
            rx.log()
        );
        assert!(
            tx.try_status().unwrap().is_none(),
            "sender ended early:\n{}",
            tx.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait(p: &Proc, secs: u64) -> std::process::ExitStatus {
    p.wait_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("{} still running after {secs} s:\n{}", p.name(), p.log()))
}

/// Waits for `p` (at most `secs`) and checks that it exited 0.
pub fn succeeds(p: &Proc, secs: u64) {
    let st = wait(p, secs);
    assert!(st.success(), "{}: {st}\n{}", p.name(), p.log());
}

/// Waits for `p` (at most `secs`), checks that it exited 1 (mpcat's failure), and returns
/// its last line (the one-line error).
pub fn fails(p: &Proc, secs: u64) -> String {
    let st = wait(p, secs);
    assert_eq!(st.code(), Some(1), "{}: {st}\n{}", p.name(), p.log());
    last_line(p)
}

pub fn last_line(p: &Proc) -> String {
    p.log().lines().last().unwrap_or_default().to_string()
}

/// `bytes` of random data in `path` (from the kernel's generator, so no two runs share it).
pub fn random_file(path: &Path, bytes: u64) {
    let out = std::process::Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/urandom"])
        .stdout(std::fs::File::create(path).unwrap())
        .status()
        .unwrap();
    assert!(out.success());
    assert_eq!(std::fs::metadata(path).unwrap().len(), bytes);
}

/// A key file (for --psk-file) of `text`, mode 600.
pub fn key_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

pub fn sha256(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// The JSON document a process printed (its log holds stdout then stderr lines; the
/// document is the lines from the first `{` to the matching last `}`).
pub fn json_of(p: &Proc) -> Value {
    let log = p.log();
    let start = log
        .find("{\n")
        .unwrap_or_else(|| panic!("no JSON in:\n{log}"));
    let end = log
        .rfind("\n}")
        .unwrap_or_else(|| panic!("no JSON end in:\n{log}"))
        + 2;
    let v: Value = serde_json::from_str(&log[start..end]).unwrap_or_else(|e| panic!("{e}:\n{log}"));
    schema::check(&schema::load("mpcat"), &v, p.name());
    v
}

/// What every side of a transfer that worked reports: verified, no failure, `bytes` moved.
pub fn assert_verified(j: &Value, bytes: u64) {
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["failure"], Value::Null, "{j}");
    assert_eq!(j["bytes"], bytes, "{j}");
}

/// Both reports of a transfer that worked (sender's, receiver's), each
/// [`assert_verified`].
pub fn verified_reports(tx: &Proc, rx: &Proc, bytes: u64) -> (Value, Value) {
    let (jt, jr) = (json_of(tx), json_of(rx));
    assert_verified(&jt, bytes);
    assert_verified(&jr, bytes);
    (jt, jr)
}

pub fn shaped(mbit: u64) -> Tbf {
    Tbf {
        rate_bit_s: mbit * 1_000_000,
        burst_bytes: 64_000,
        latency_ms: 100,
    }
}
