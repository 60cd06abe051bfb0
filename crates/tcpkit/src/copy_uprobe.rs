//! `copy --tls-uprobe` and `--pid` (issue 27): what the user typed (clap) and its resolution
//! into the copy's input; kept apart from copy.rs, which holds the rest of the command.

use std::path::PathBuf;

use clap::Args as ClapArgs;
use tcpkit_copy::feed::Input;

use crate::Failure;

/// Where the plaintext of a TLS server comes from when it is read at its TLS library.
#[derive(Debug, Clone, ClapArgs)]
pub struct UprobeFlags {
    /// Copy a TLS server's plaintext, read live at its own TLS library by BPF uprobes on
    /// SSL_read/SSL_write (and SSL_read_ex/SSL_write_ex), nothing changed on the server: PATH
    /// is the libssl.so.* it maps (see /proc/PID/maps) or a binary with OpenSSL 1.1/3.x or
    /// BoringSSL linked in (repeatable). Every process mapping PATH is covered, those started
    /// later too (a restarted server), or only --pid. The rules' ports say which side is the
    /// server (its reads are the requests); connections open before copy started are joined
    /// mid-stream. No capture interface is used. Needs CAP_BPF and CAP_PERFMON (or root); the
    /// probes go when copy exits, SIGKILL included. Example: tcpkit copy -x 443-10.0.0.9:80
    /// --tls-uprobe /usr/lib/x86_64-linux-gnu/libssl.so.3.
    #[arg(
        long = "tls-uprobe",
        value_name = "PATH",
        conflicts_with_all = ["input", "capture", "filter"]
    )]
    pub tls_uprobe: Vec<PathBuf>,

    /// With --tls-uprobe: probe only this process (its threads included), not every process
    /// mapping PATH.
    #[arg(long, value_name = "PID", requires = "tls_uprobe")]
    pub pid: Option<u32>,
}

impl UprobeFlags {
    /// The copy's input when --tls-uprobe is given.
    pub fn input(&self) -> Result<Option<Input>, Failure> {
        if self.tls_uprobe.is_empty() {
            return Ok(None);
        }
        if self.pid == Some(0) {
            return Err(Failure::Usage("--pid 0: a process id is above 0".into()));
        }
        let mut targets = self.tls_uprobe.clone();
        targets.sort();
        targets.dedup();
        Ok(Some(Input::Uprobe {
            targets,
            pid: self.pid,
        }))
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
    fn tls_uprobe_and_pid_make_the_input() {
        let lib = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
        let (_, r) = parse(&["--tls-uprobe", lib, "--tls-uprobe", "/usr/sbin/nginx"]).unwrap();
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
        let (_, r) = parse(&["--tls-uprobe", lib, "--pid", "4242"]).unwrap();
        assert_eq!(
            r.input,
            Input::Uprobe {
                targets: vec![lib.into()],
                pid: Some(4242)
            }
        );
    }

    #[test]
    fn tls_uprobe_refuses_a_capture_and_pid_needs_it() {
        let lib = "/usr/lib/x86_64-linux-gnu/libssl.so.3";
        for other in [
            &["-i", "eth0"][..],
            &["--input", "x.pcap"],
            &["-F", "net 10.0.0.0/8"],
        ] {
            let e = parse(&[&["--tls-uprobe", lib], other].concat()).unwrap_err();
            assert!(e.contains("--tls-uprobe"), "{other:?}: {e}");
        }
        let e = parse(&["--pid", "7"]).unwrap_err();
        assert!(e.contains("--tls-uprobe"), "{e}");
        let e = parse(&["--tls-uprobe", lib, "--pid", "0"]).unwrap_err();
        assert!(e.contains("--pid 0"), "{e}");
    }
}
