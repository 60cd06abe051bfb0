//! A host: one network namespace, and the ways to run code inside it (a command to
//! completion, a background process, or a closure on a thread that joined the namespace).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use nix::sched::{setns, CloneFlags};

use crate::link::{query_stats, IfStats};
use crate::proc::Proc;
use crate::sweep::NETNS_DIR;
use crate::{cmd, Lab, LabError};

/// A cheap handle on a namespace created by [`Lab::host`]. It stays valid as long as the lab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub(crate) name: String,
    pub(crate) netns: String,
}

impl Host {
    /// The name the test gave this host.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace's name (as in `ip netns list`).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// `ip netns exec NETNS argv...`, not started, for callers that need control over
    /// stdio or environment. The command becomes its own process-group leader so that
    /// signals reach its children too.
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns]).args(argv);
        c.process_group(0);
        c
    }

    /// Runs `argv` inside the host to completion; Err names the command, its exit status
    /// and the tail of its stderr if it failed.
    pub fn run(&self, argv: &[&str]) -> Result<Output, LabError> {
        if argv.is_empty() {
            return Err(LabError::invalid(format!(
                "run in {}: empty command",
                self.netns
            )));
        }
        cmd::run(self.command(argv))
    }

    /// Starts `argv` in the background inside the host, its stdout and stderr going to
    /// `<lab dir>/<n>-<name>.log`. The lab stops it when the lab is dropped.
    pub fn spawn(&self, lab: &mut Lab, name: &str, argv: &[&str]) -> Result<Proc, LabError> {
        lab.spawn_in(self, name, argv)
    }

    /// Counters of interface `ifname` in this host.
    pub fn ifstats(&self, ifname: &str) -> Result<IfStats, LabError> {
        query_stats(&self.netns, ifname)
    }

    /// Drops everything that arrives on `ifname` (an nftables table `dead_IFNAME` of its own,
    /// hooked before routing): with one on each end, a link carries nothing either way, as a
    /// cable pulled or a switch port gone dead, while both ends keep their carrier and routes.
    pub fn drop_arriving(&self, ifname: &str) -> Result<(), LabError> {
        let table = format!("dead_{ifname}");
        self.run(&["nft", "add", "table", "inet", &table])?;
        self.run(&[
            "nft",
            "add",
            "chain",
            "inet",
            &table,
            "pre",
            "{",
            "type",
            "filter",
            "hook",
            "prerouting",
            "priority",
            "-300",
            ";",
            "}",
        ])?;
        self.run(&[
            "nft", "add", "rule", "inet", &table, "pre", "iifname", ifname, "drop",
        ])?;
        Ok(())
    }

    /// Takes [`Host::drop_arriving`]'s table for `ifname` away again.
    pub fn stop_dropping(&self, ifname: &str) -> Result<(), LabError> {
        self.run(&["nft", "delete", "table", "inet", &format!("dead_{ifname}")])?;
        Ok(())
    }

    /// Runs `f` on a new thread that has joined this host's network namespace, and returns
    /// its result. Sockets created inside stay in the namespace wherever they are used later.
    /// A panic in `f` is propagated to the caller.
    pub fn try_enter<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, LabError> {
        let path = std::path::Path::new(NETNS_DIR).join(&self.netns);
        std::thread::scope(|s| {
            let t = s.spawn(move || -> Result<R, LabError> {
                let ns = File::open(&path)
                    .map_err(|e| LabError::io(format!("open {}", path.display()), e))?;
                // setns on this thread only: the caller's thread stays where it was.
                setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| {
                    LabError::io(
                        format!("setns({}, CLONE_NEWNET)", path.display()),
                        std::io::Error::from(e),
                    )
                })?;
                Ok(f())
            });
            match t.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// [`Host::try_enter`] for tests: joining a namespace the lab created only fails when
    /// the lab is broken, so this panics with the one-line reason instead of returning it.
    pub fn enter<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match self.try_enter(f) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }
}
