//! Test-only: a network namespace holding one veth pair, deleted on drop (even after a panic),
//! and a way to run code on a thread inside it. tcpkit-lab will own this for the workspace;
//! this crate keeps a minimal copy so its tests do not wait for it.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub(crate) struct TestNet {
    pub ns: String,
    /// Both ends of the veth pair, up, inside `ns`.
    pub a: String,
    pub b: String,
}

impl TestNet {
    pub fn new() -> TestNet {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let net = TestNet {
            ns: format!("tkps{pid}-{n}"),
            a: format!("tka{n}"),
            b: format!("tkb{n}"),
        };
        run(&["ip", "netns", "add", &net.ns]);
        net.ip(&[
            "link", "add", &net.a, "type", "veth", "peer", "name", &net.b,
        ]);
        for dev in [&net.a, &net.b, "lo"] {
            net.ip(&["link", "set", dev, "up"]);
        }
        net
    }

    /// `ip -n <ns> args...`, panicking with the command's stderr on failure.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["ip", "-n", &self.ns];
        all.extend_from_slice(args);
        run(&all);
    }

    /// Runs `f` on a new thread that has entered the namespace; panics in `f` propagate.
    pub fn run_in<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let path = format!("/run/netns/{}", self.ns);
        let handle = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns({path}): {e}"));
            f()
        });
        handle
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair in it.
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.ns])
            .status();
    }
}

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (these tests need iproute2)", args[0]));
    assert!(
        out.status.success(),
        "{} failed (these tests need root): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}
