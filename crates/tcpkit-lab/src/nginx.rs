//! A real web server in the lab: Debian's nginx (1.22) started by [`Lab::nginx`] in a host, in
//! the foreground, one worker, from a configuration of its own ([`NginxConf`]): HTTP/1.1 in
//! clear, over TLS with a [`CertKey`] of a [`TestCa`](crate::TestCa), and HTTP/2 (by ALPN over
//! TLS, or h2c with prior knowledge in clear: `listen ... http2`), serving files the test
//! gives. Its access log, when asked for, names for every request the protocol, the TLS
//! version, whether the session was resumed, the ALPN and the status ([`Nginx::requests`]):
//! the server's own account of what a client spoke, where nginx cannot write a key log.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::tls::{write, CertKey};
use crate::{Host, Lab, LabError, Proc};

/// Debian's nginx.
pub const NGINX: &str = "/usr/sbin/nginx";

/// How long nginx gets to listen.
const LISTEN_WITHIN: Duration = Duration::from_secs(10);

/// The page every lab nginx serves at `/index.html`: 612 bytes, the size of nginx's own.
pub const INDEX_HTML_LEN: usize = 612;

/// What an nginx of the lab listens on and serves.
#[derive(Debug, Clone)]
pub struct NginxConf {
    /// Where it listens (an address of its host).
    pub addr: SocketAddr,
    /// TLS with this certificate, or clear text.
    pub tls: Option<CertKey>,
    /// HTTP/2 on the listener (nginx 1.22's `listen ... http2`): over TLS, offered by ALPN
    /// beside HTTP/1.1; in clear, h2c with prior knowledge only.
    pub http2: bool,
    /// Files it serves from its root, by name (`/index.html`, [`INDEX_HTML_LEN`] bytes, is
    /// always there).
    pub files: Vec<(String, Vec<u8>)>,
    /// Keep an access log for [`Nginx::requests`] (off for rate runs: a write per request).
    pub access_log: bool,
    /// Connections its one worker holds (`worker_connections`), and its listen backlog (the
    /// default 511 drops SYNs of a client opening thousands at once; the host's
    /// net.core.somaxconn caps it).
    pub max_conns: u32,
}

impl NginxConf {
    /// HTTPS and HTTP/2 on `addr` with `cert`, an access log, up to 1,024 connections.
    pub fn https(addr: SocketAddr, cert: CertKey) -> NginxConf {
        NginxConf {
            addr,
            tls: Some(cert),
            http2: true,
            files: Vec::new(),
            access_log: true,
            max_conns: 1024,
        }
    }

    /// `dir/nginx.conf` from these settings, and its root `dir/www` with the files; the
    /// configuration's path.
    fn write(&self, dir: &Path) -> Result<PathBuf, LabError> {
        let root = dir.join("www");
        std::fs::create_dir_all(&root)
            .map_err(|e| LabError::io(format!("create {}", root.display()), e))?;
        let (head, tail) = (
            "<!DOCTYPE html>\n<html><head><title>tcpkit lab</title></head><body>",
            "</body></html>\n",
        );
        let fill = "x".repeat(INDEX_HTML_LEN - head.len() - tail.len());
        let index = format!("{head}{fill}{tail}");
        let mut files = vec![("index.html".to_string(), index.into_bytes())];
        files.extend(self.files.iter().cloned());
        for (name, body) in &files {
            let name = name.trim_start_matches('/');
            if name.is_empty() || name.contains("..") || name.contains('/') {
                return Err(LabError::invalid(format!(
                    "nginx: file name {name:?}: one path segment, no '..'"
                )));
            }
            let p = root.join(name);
            std::fs::write(&p, body)
                .map_err(|e| LabError::io(format!("write {}", p.display()), e))?;
        }
        let d = dir.display();
        let listen = match (&self.tls, self.http2) {
            (Some(_), true) => "ssl http2",
            (Some(_), false) => "ssl",
            (None, true) => "http2",
            (None, false) => "",
        };
        let tls = self.tls.as_ref().map_or(String::new(), |c| {
            // Tickets (how TLS 1.3 clients resume) and a session cache (TLS 1.2's session
            // IDs; nginx keeps none by default): every kind of client can resume.
            format!(
                "ssl_certificate {}; ssl_certificate_key {}; ssl_protocols TLSv1.2 TLSv1.3;\n\
                 ssl_session_cache shared:lab:1m; ssl_session_tickets on;\n",
                c.cert.display(),
                c.key.display()
            )
        });
        let log = if self.access_log {
            format!("access_log {d}/access.log lab;")
        } else {
            "access_log off;".to_string()
        };
        // Descriptors: a connection is one, plus the files and logs.
        let conns = self.max_conns.max(16);
        let text = format!(
            "user root; daemon off; worker_processes 1; pid {d}/nginx.pid; error_log stderr;\n\
             worker_rlimit_nofile {fds};\n\
             events {{ worker_connections {conns}; }}\n\
             http {{\n\
             keepalive_requests 1000000; keepalive_timeout 60s;\n\
             client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};\n\
             uwsgi_temp_path {d}; scgi_temp_path {d};\n\
             log_format lab '$server_protocol $ssl_protocol $ssl_session_reused \
             $ssl_alpn_protocol $status';\n\
             {log}\n\
             server {{ listen {addr} {listen} backlog={conns}; root {root}; {tls} }}\n\
             }}\n",
            fds = 2 * conns + 64,
            addr = self.addr,
            root = root.display(),
        );
        let path = dir.join("nginx.conf");
        write(&path, &text)?;
        Ok(path)
    }
}

/// An nginx started by [`Lab::nginx`]; the lab stops it on drop, also after a panic.
#[derive(Debug)]
pub struct Nginx {
    /// The process (its log is nginx's error log).
    pub proc: Proc,
    dir: PathBuf,
    addr: SocketAddr,
}

impl Nginx {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The access log's lines so far, counted: `PROTOCOL TLS-VERSION RESUMED ALPN STATUS`,
    /// e.g. `HTTP/2.0 TLSv1.3 . h2 200` (`r` for a resumed session; `-` where nginx has no
    /// value, as the TLS fields in clear). Empty without [`NginxConf::access_log`].
    pub fn requests(&self) -> Result<BTreeMap<String, u64>, LabError> {
        let path = self.dir.join("access.log");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(LabError::io(format!("read {}", path.display()), e)),
        };
        let mut counts = BTreeMap::new();
        for l in text.lines() {
            *counts.entry(l.to_string()).or_insert(0) += 1;
        }
        Ok(counts)
    }
}

impl Lab {
    /// Starts Debian's nginx in `host` as `conf` says, in the foreground (`daemon off`), its
    /// files in a directory of the lab's; returns once it accepts TCP connections. A missing
    /// nginx is one clear error naming the package.
    pub fn nginx(&mut self, host: &Host, conf: &NginxConf) -> Result<Nginx, LabError> {
        if !Path::new(NGINX).exists() {
            return Err(LabError::invalid(format!(
                "{NGINX} is not installed (apt-get install nginx; scripts/setup.sh does)"
            )));
        }
        let name = format!("nginx-{}", conf.addr.port());
        let dir = self.dir().join(format!("{}-{name}", host.name()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| LabError::io(format!("create {}", dir.display()), e))?;
        let path = conf.write(&dir)?;
        let path_s = path.to_string_lossy().into_owned();
        // -e: the error log before the configuration is read (else /var/log/nginx/error.log).
        let proc = self.spawn_in(host, &name, &[NGINX, "-e", "stderr", "-c", &path_s])?;
        crate::proc::wait_listening(host, &proc, &[conf.addr], LISTEN_WITHIN, "nginx")?;
        Ok(Nginx {
            proc,
            dir,
            addr: conf.addr,
        })
    }
}
