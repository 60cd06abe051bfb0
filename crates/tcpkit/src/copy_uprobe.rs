//! `copy --tls-uprobe` and `--pid` (issue 27): what the user typed (clap) and its resolution
//! into the copy's input; kept apart from copy.rs, which holds the rest of the command.

use std::path::PathBuf;

use clap::Args as ClapArgs;
use tcpkit_copy::config::SecretProbe;
use tcpkit_copy::feed::Input;

use crate::Failure;

/// Where a TLS server's plaintext (or its secrets) come from when read at its TLS library.
#[derive(Debug, Clone, ClapArgs)]
pub struct UprobeFlags {
    /// Decrypt and copy a TLS server's sessions with the secrets read from its own TLS
    /// library: a BPF uprobe and uretprobe on SSL_do_handshake read each handshake's secrets
    /// from the library's SSL object when it completes (TLS 1.3, and TLS 1.2's master key),
    /// and the sessions captured on -i are decrypted with them as with --tls-keylog (same
    /// counts, same limits). Nothing is probed on SSL_read/SSL_write: a request on an open
    /// connection costs the server nothing, a new one two traps. PATH is the libssl.so.* the
    /// server maps (see /proc/PID/maps) or a binary with OpenSSL linked in (repeatable); its
    /// OpenSSL version must be one whose layout copy knows (3.0.x, 3.1.x; else exit 2: use
    /// --tls-uprobe-calls). Every process mapping PATH is covered, those started later too,
    /// or only --pid. Connections whose handshake came before copy started are counted, never
    /// copied. Needs CAP_BPF, CAP_PERFMON and CAP_NET_RAW (or root); the probes go when copy
    /// exits, SIGKILL included. Example: tcpkit copy -i eth0 -x 443-10.0.0.9:80 --tls-uprobe
    /// /usr/lib/x86_64-linux-gnu/libssl.so.3.
    #[arg(
        long = "tls-uprobe",
        value_name = "PATH",
        conflicts_with_all = ["input", "tls_keylog", "tls_uprobe_calls"]
    )]
    pub tls_uprobe: Vec<PathBuf>,

    /// Copy a TLS server's plaintext read at every SSL_read/SSL_write (and their _ex forms)
    /// by BPF uprobes and uretprobes, no capture and no secrets: for a library whose layout
    /// --tls-uprobe does not know (OpenSSL 1.1/3.x of any version, BoringSSL) or a server
    /// whose handshake happens inside SSL_read. Costs the server two traps per call (about
    /// 6 per small keep-alive request: its CPU per request doubled or more). PATH as for
    /// --tls-uprobe; the rules' ports say which side is the server; connections open before
    /// copy started are joined mid-stream. Example: tcpkit copy -x 443-10.0.0.9:80
    /// --tls-uprobe-calls /usr/lib/x86_64-linux-gnu/libssl.so.3.
    #[arg(
        long = "tls-uprobe-calls",
        value_name = "PATH",
        conflicts_with_all = ["input", "capture", "filter", "tls_keylog"]
    )]
    pub tls_uprobe_calls: Vec<PathBuf>,

    /// With --tls-uprobe or --tls-uprobe-calls: probe only this process (its threads
    /// included), not every process mapping PATH.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
}

fn sorted(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut targets = paths.to_vec();
    targets.sort();
    targets.dedup();
    targets
}

impl UprobeFlags {
    fn checked_pid(&self) -> Result<Option<u32>, Failure> {
        if self.pid.is_some() && self.tls_uprobe.is_empty() && self.tls_uprobe_calls.is_empty() {
            return Err(Failure::Usage(
                "--pid: only with --tls-uprobe or --tls-uprobe-calls".into(),
            ));
        }
        if self.pid == Some(0) {
            return Err(Failure::Usage("--pid 0: a process id is above 0".into()));
        }
        Ok(self.pid)
    }

    /// The copy's input when --tls-uprobe-calls is given.
    pub fn input(&self) -> Result<Option<Input>, Failure> {
        let pid = self.checked_pid()?;
        if self.tls_uprobe_calls.is_empty() {
            return Ok(None);
        }
        Ok(Some(Input::Uprobe {
            targets: sorted(&self.tls_uprobe_calls),
            pid,
        }))
    }

    /// --tls-uprobe's probes, each library's version checked against the layouts known (a
    /// library without one is a usage error: nothing would be decrypted).
    pub fn secrets(&self) -> Result<Option<SecretProbe>, Failure> {
        let pid = self.checked_pid()?;
        if self.tls_uprobe.is_empty() {
            return Ok(None);
        }
        let p = SecretProbe {
            targets: sorted(&self.tls_uprobe),
            pid,
        };
        p.layout_known()
            .map_err(|e| Failure::Usage(format!("--tls-uprobe {e}")))?;
        Ok(Some(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common;
    use crate::copy::{resolve, Run};
    use tcpkit_copy::config::CopyConfig;

    fn parse(args: &[&str]) -> Result<(CopyConfig, Run), String> {
        common::resolved(
            &[&["copy", "-x", "443-10.0.0.9:80"], args].concat(),
            resolve,
        )
    }

    #[test]
    fn tls_uprobe_calls_and_pid_make_the_input() {
        let lib = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
        let (c, r) = parse(&[
            "--tls-uprobe-calls",
            lib,
            "--tls-uprobe-calls",
            "/usr/sbin/nginx",
        ])
        .unwrap();
        assert_eq!(
            r.input,
            Input::Uprobe {
                targets: vec![
                    "/usr/lib/x86_64-linux-gnu/libssl.so.3".into(),
                    "/usr/sbin/nginx".into()
                ],
                pid: None
            }
        );
        assert_eq!(c.tls_secrets, None);
        let (_, r) = parse(&["--tls-uprobe-calls", lib, "--pid", "4242"]).unwrap();
        assert_eq!(
            r.input,
            Input::Uprobe {
                targets: vec![lib.into()],
                pid: Some(4242)
            }
        );
    }

    #[test]
    fn tls_uprobe_reads_secrets_beside_a_capture() {
        let lib = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
        let (c, r) = parse(&["-i", "eth0", "--tls-uprobe", lib, "--pid", "9"]).unwrap();
        assert_eq!(
            r.input,
            Input::Live {
                ifname: "eth0".into()
            }
        );
        assert_eq!(
            c.tls_secrets,
            Some(SecretProbe {
                targets: vec![lib.into()],
                pid: Some(9)
            })
        );
        // A file that is no OpenSSL of a known layout: refused before anything runs.
        let e = parse(&["--tls-uprobe", "/bin/true"]).unwrap_err();
        assert!(e.contains("--tls-uprobe /bin/true"), "{e}");
        assert!(e.contains("--tls-uprobe-calls"), "{e}");
    }

    #[test]
    fn the_uprobe_flags_refuse_what_they_cannot_use() {
        let lib = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
        for other in [
            &["-i", "eth0"][..],
            &["--input", "x.pcap"],
            &["-F", "net 10.0.0.0/8"],
            &["--tls-keylog", "/tmp/keys"],
            &["--tls-uprobe", lib],
        ] {
            let e = parse(&[&["--tls-uprobe-calls", lib], other].concat()).unwrap_err();
            assert!(e.contains("--tls-uprobe"), "{other:?}: {e}");
        }
        for other in [&["--input", "x.pcap"][..], &["--tls-keylog", "/tmp/keys"]] {
            let e = parse(&[&["--tls-uprobe", lib], other].concat()).unwrap_err();
            assert!(e.contains("--tls-uprobe"), "{other:?}: {e}");
        }
        let e = parse(&["--pid", "7"]).unwrap_err();
        assert!(e.contains("--tls-uprobe"), "{e}");
        let e = parse(&["--tls-uprobe-calls", lib, "--pid", "0"]).unwrap_err();
        assert!(e.contains("--pid 0"), "{e}");
    }
}
