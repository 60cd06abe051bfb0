//! OpenSSH inside the lab: [`SshKeys`] (a host key and a client key made for one lab, with
//! the `known_hosts` and config files a client needs) and [`Lab::sshd`], Debian's sshd started
//! in a host on a port the test picks, as root, without PAM, from a config of its own: what
//! an engine that drives hosts over SSH (ansible-playbook, pdsh) needs to reach the lab's
//! hosts as it reaches real ones. Nothing of the system's ssh configuration is read or changed.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{cmd, Host, Lab, LabError, Proc};

/// Debian's sshd (openssh-server). It insists on being started by its absolute path.
pub const SSHD: &str = "/usr/sbin/sshd";

/// How long an sshd gets to listen.
const LISTEN_WITHIN: Duration = Duration::from_secs(10);

/// sshd's privilege-separation directory: it refuses to start without it. The package's
/// systemd unit makes it at boot; a machine without systemd (a container) does not have it.
const PRIVSEP_DIR: &str = "/run/sshd";

/// Keys made for one lab, in a directory of the lab's: one host key every sshd of the lab
/// presents, and one client key every sshd accepts for root.
#[derive(Debug, Clone)]
pub struct SshKeys {
    dir: PathBuf,
    host_pub: String,
}

impl SshKeys {
    /// Makes an ed25519 host key and client key (no passphrase) in `dir` (created if missing).
    pub fn new(dir: &Path) -> Result<SshKeys, LabError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| LabError::io(format!("create {}", dir.display()), e))?;
        for name in ["host_ed25519", "client_ed25519"] {
            let key = dir.join(name);
            let key_s = key.to_string_lossy();
            cmd::run_args(
                "ssh-keygen",
                &["-q", "-t", "ed25519", "-N", "", "-C", name, "-f", &key_s],
            )?;
        }
        let client_pub = read(&dir.join("client_ed25519.pub"))?;
        write(&dir.join("authorized_keys"), &client_pub)?;
        let host_pub = read(&dir.join("host_ed25519.pub"))?;
        // "TYPE BASE64 COMMENT": known_hosts wants TYPE BASE64.
        let host_pub = host_pub
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        Ok(SshKeys {
            dir: dir.to_path_buf(),
            host_pub,
        })
    }

    /// The directory holding the keys and the files written from them.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The client's private key (for `ssh -i`, ansible's `ansible_ssh_private_key_file`).
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client_ed25519")
    }

    /// The host key's private half, which every sshd of the lab presents.
    pub fn host_key(&self) -> PathBuf {
        self.dir.join("host_ed25519")
    }

    /// Writes `known_hosts` naming every address in `addrs` with the lab's host key, and
    /// returns its path: a client then checks the host key (StrictHostKeyChecking=yes)
    /// instead of trusting whatever answers.
    pub fn known_hosts(&self, addrs: &[SocketAddr]) -> Result<PathBuf, LabError> {
        let mut s = String::new();
        for a in addrs {
            // `[host]:port` is how known_hosts names a host on a port other than 22.
            let _ = writeln!(s, "[{}]:{} {}", a.ip(), a.port(), self.host_pub);
        }
        let path = self.dir.join("known_hosts");
        write(&path, &s)?;
        Ok(path)
    }

    /// The `ssh` options that reach a lab sshd as root with these keys and check its host
    /// key against `known_hosts` (from [`SshKeys::known_hosts`]), reading no user or system
    /// config beyond them: for `ssh`, or ansible's `ansible_ssh_common_args`.
    pub fn client_options(&self, known_hosts: &Path) -> Vec<String> {
        [
            "-F".to_string(),
            "/dev/null".into(),
            "-i".into(),
            self.client_key().to_string_lossy().into_owned(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
            "-o".into(),
            format!("UserKnownHostsFile={}", known_hosts.display()),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-l".into(),
            "root".into(),
        ]
        .into()
    }

    fn sshd_config(&self, addr: SocketAddr) -> Result<PathBuf, LabError> {
        let path = self
            .dir
            .join(format!("sshd_config-{}-{}", addr.ip(), addr.port()));
        let d = self.dir.display();
        // UsePAM no: root logs in by key alone, with no PAM stack to consult. StrictModes no:
        // the keys live in a temporary directory sshd would otherwise judge.
        let conf = format!(
            "ListenAddress {addr}\n\
             HostKey {d}/host_ed25519\n\
             AuthorizedKeysFile {d}/authorized_keys\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             UsePAM no\n\
             StrictModes no\n\
             PidFile none\n\
             MaxStartups 100:30:200\n\
             MaxSessions 100\n\
             Subsystem sftp /usr/lib/openssh/sftp-server\n"
        );
        write(&path, &conf)?;
        Ok(path)
    }
}

fn read(path: &Path) -> Result<String, LabError> {
    std::fs::read_to_string(path).map_err(|e| LabError::io(format!("read {}", path.display()), e))
}

fn write(path: &Path, s: &str) -> Result<(), LabError> {
    std::fs::write(path, s).map_err(|e| LabError::io(format!("write {}", path.display()), e))
}

impl Lab {
    /// Starts Debian's sshd in `host`, listening on `addr` alone (an address of `host`),
    /// presenting `keys`' host key and letting root in with its client key, in the
    /// foreground (`-D -e`: its log is the process's log); returns once it accepts
    /// connections. The lab stops it on drop, also after a panic.
    pub fn sshd(
        &mut self,
        host: &Host,
        keys: &SshKeys,
        addr: SocketAddr,
    ) -> Result<Proc, LabError> {
        if !Path::new(SSHD).exists() {
            return Err(LabError::invalid(format!(
                "{SSHD} is not installed (apt-get install openssh-server; scripts/setup.sh does)"
            )));
        }
        std::fs::create_dir_all(PRIVSEP_DIR)
            .map_err(|e| LabError::io(format!("create {PRIVSEP_DIR}"), e))?;
        let conf = keys.sshd_config(addr)?;
        let conf = conf.to_string_lossy();
        let name = format!("sshd-{}", addr.port());
        let p = self.spawn_in(host, &name, &[SSHD, "-D", "-e", "-f", &conf])?;
        crate::proc::wait_listening(host, &p, &[addr], LISTEN_WITHIN, "sshd")?;
        Ok(p)
    }
}
