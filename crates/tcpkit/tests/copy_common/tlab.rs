//! The transparent-mode lab: the copy lab plus an assistant host running `tcpkit intercept`.
//! clients → online (copy) → target (routes the clients' subnet via the assistant) →
//! assistant (intercept); the online host reaches intercept's control port over a management
//! link of its own. The same topology as copy_transparent.rs's, kept here so other test
//! files can build it (that file keeps its own copy while another branch edits it).

use std::process::{Child, Output};
use std::time::Duration;

use serde_json::Value;
use tcpkit_lab::{Host, LinkOpts, Proc};

use super::*;

pub const TGT_A: &str = "198.18.3.1";
pub const ASSIST: &str = "198.18.3.2";
pub const ONLINE_M: &str = "198.18.4.1";
pub const ASSIST_M: &str = "198.18.4.2";

pub struct TLab {
    pub l: CopyLab,
    pub assistant: Host,
    /// The assistant's interface toward the target (where intercept captures).
    pub ast_if: String,
    /// intercept's control port.
    pub port: u16,
    /// intercept's capture filter: the target's answers.
    pub filter: String,
}

impl TLab {
    pub fn new(tag: &str) -> TLab {
        let mut l = CopyLab::new(tag);
        let assistant = l.lab.host("ast").expect("host");
        let target = l.target.clone();
        let online = l.online.clone();
        let tl = l
            .lab
            .link(
                &target,
                &assistant,
                &LinkOpts {
                    addr_a: vec![format!("{TGT_A}/24")],
                    addr_b: vec![format!("{ASSIST}/24")],
                    ..LinkOpts::default()
                },
            )
            .expect("link");
        l.lab
            .link(
                &online,
                &assistant,
                &LinkOpts {
                    addr_a: vec![format!("{ONLINE_M}/24")],
                    addr_b: vec![format!("{ASSIST_M}/24")],
                    ..LinkOpts::default()
                },
            )
            .expect("link");
        // The target answers the clients' subnet through the assistant, and accepts their
        // packets arriving from the online side (strict reverse-path filtering would not).
        target
            .run(&["ip", "route", "add", "198.18.1.0/24", "via", ASSIST])
            .expect("route");
        for k in ["all", "default", &l.tgt_link.b.name] {
            target
                .sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "0")
                .expect("rp_filter");
        }
        assistant
            .sysctl("net.ipv4.ip_forward", "0")
            .expect("sysctl");
        TLab {
            l,
            assistant,
            ast_if: tl.b.name.clone(),
            // Each test owns its namespaces: any port is free there.
            port: 7070,
            filter: "tcp and src host 198.18.2.2".into(),
        }
    }

    /// Starts intercept and waits for its control port.
    pub fn intercept(&mut self, name: &str) -> Proc {
        let listen = self.intercept_addr();
        let argv = [
            tcpkit(),
            "intercept",
            "--capture",
            &self.ast_if,
            "--filter",
            &self.filter,
            "--listen",
            &listen,
            "--json",
        ];
        let assistant = self.assistant.clone();
        let p = assistant
            .spawn(&mut self.l.lab, name, &argv)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_port(&self.assistant, ASSIST_M, self.port, &p);
        p
    }

    pub fn intercept_addr(&self) -> String {
        format!("{ASSIST_M}:{}", self.port)
    }

    /// `tcpkit copy --transparent -x RULE --intercept .. -i .. --json ARGS`, live, returned
    /// once its capture is open.
    pub fn copy(&self, rule: &str, args: &[&str]) -> Child {
        let cap = self.l.capture_if();
        let ia = self.intercept_addr();
        let mut argv = vec![
            "--transparent",
            "-x",
            rule,
            "--intercept",
            &ia,
            "-i",
            &cap,
            "--json",
        ];
        argv.extend_from_slice(args);
        self.l.copy(&argv)
    }

    /// `tcpkit copy --transparent -x RULE --intercept .. --json ARGS` to completion (offline
    /// runs: ARGS name the --input).
    pub fn copy_offline(&self, rule: &str, args: &[&str]) -> Output {
        let ia = self.intercept_addr();
        let mut argv = vec![
            tcpkit(),
            "copy",
            "--transparent",
            "-x",
            rule,
            "--intercept",
            &ia,
            "--json",
        ];
        argv.extend_from_slice(args);
        run_limited(self.l.online.command(&argv), Duration::from_secs(30))
    }
}

/// The report of a transparent copy that exited 0, every copy accounted for, against the
/// committed schema.
pub fn transparent_report(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "copy failed: {} {}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    let r = json(o);
    transparent_accounted(&r);
    check_schema(&r);
    assert_eq!(r["mode"], "transparent", "{r:#}");
    r
}

/// Every copy ended exactly one way ([`accounted`]), and every selected session was copied
/// -n times.
pub fn transparent_accounted(r: &Value) {
    accounted(r);
    assert_eq!(
        u(r, "sessions.copies"),
        u(r, "sessions.selected") * u(r, "copies_per_session"),
        "{r:#}"
    );
    assert_eq!(
        u(r, "sessions.selected") + u(r, "sessions.sampled_out"),
        u(r, "sessions.seen"),
        "{r:#}"
    );
}
