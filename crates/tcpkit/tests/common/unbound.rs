//! A real DNS resolver for tests: Debian's `unbound`, configured to answer from a local zone
//! over TCP, run in the foreground inside a lab host.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The name the local zone answers, and its address.
pub const WWW_EXAMPLE: &str = "www.example";
pub const WWW_EXAMPLE_A: &str = "198.18.0.53";

/// Writes `dir/unbound.conf`: listen on `addr@port` (UDP and TCP), answer `example.` from a
/// static local zone (`www.example. A 198.18.0.53`, NXDOMAIN for other names in it), allow
/// queries from the test ranges, hold up to `tcp_conns` TCP connections, no chroot, no
/// privilege drop, no remote control, logs to stderr. Returns the file's path.
pub fn write_conf(dir: &Path, addr: IpAddr, port: u16, tcp_conns: u32) -> PathBuf {
    let path = dir.join("unbound.conf");
    let text = format!(
        r#"server:
    interface: {addr}@{port}
    port: {port}
    do-ip4: yes
    do-ip6: yes
    do-udp: yes
    do-tcp: yes
    incoming-num-tcp: {tcp_conns}
    num-threads: 1
    chroot: ""
    username: ""
    directory: "{dir}"
    pidfile: "{dir}/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: 1
    access-control: 127.0.0.0/8 allow
    access-control: 198.18.0.0/15 allow
    access-control: ::1 allow
    access-control: fd00::/8 allow
    local-zone: "example." static
    local-data: "{WWW_EXAMPLE}. A {WWW_EXAMPLE_A}"
remote-control:
    control-enable: no
"#,
        dir = dir.display()
    );
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// The command line that runs unbound with `conf` in the foreground (for `Host::spawn`).
pub fn argv(conf: &Path) -> Vec<String> {
    vec![
        "unbound".into(),
        "-d".into(),
        "-c".into(),
        conf.display().to_string(),
    ]
}

/// Fails the test with one clear line when unbound is not installed.
pub fn require() {
    let ok = std::process::Command::new("unbound")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "unbound is not installed: apt-get install -y unbound");
}
