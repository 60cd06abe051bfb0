//! One lab over both of copy's transports, so that a test body says what copy does once and
//! runs in relay mode (copy's own TCP connections to the target) and in transparent mode
//! (the clients' addresses kept, answers caught by intercept on the assistant) alike.

use std::process::{Child, Output};
use std::time::Duration;

use serde_json::Value;
use tcpkit_lab::Proc;

use super::tlab::*;
use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Relay,
    Transparent,
}

/// The copy lab for `mode`: for transparent mode the assistant with intercept running,
/// catching every answer from the rule's target port.
pub struct ModeLab {
    pub mode: Mode,
    lab: Inner,
}

enum Inner {
    Relay(Box<CopyLab>),
    // intercept runs as long as the lab.
    Transparent(Box<TLab>, Proc),
}

impl ModeLab {
    /// The lab, with intercept watching answers from `port` in transparent mode.
    pub fn new(tag: &str, mode: Mode, port: u16) -> ModeLab {
        let lab = match mode {
            Mode::Relay => Inner::Relay(Box::new(CopyLab::new(tag))),
            Mode::Transparent => {
                let mut t = TLab::new(tag);
                t.filter = format!("src port {port}");
                let icp = t.intercept("intercept");
                Inner::Transparent(Box::new(t), icp)
            }
        };
        ModeLab { mode, lab }
    }

    pub fn l(&self) -> &CopyLab {
        match &self.lab {
            Inner::Relay(l) => l,
            Inner::Transparent(t, _) => &t.l,
        }
    }

    pub fn l_mut(&mut self) -> &mut CopyLab {
        match &mut self.lab {
            Inner::Relay(l) => l,
            Inner::Transparent(t, _) => &mut t.l,
        }
    }

    /// `tcpkit copy -x RULE ... --json ARGS` live on the clients' link, returned once its
    /// capture is open.
    pub fn copy(&self, rule: &str, args: &[&str]) -> Child {
        match &self.lab {
            Inner::Relay(l) => l.copy_rule(rule, &[args, &["--json"]].concat()),
            Inner::Transparent(t, _) => t.copy(rule, args),
        }
    }

    /// `tcpkit copy -x RULE ... --json ARGS` to completion (offline: ARGS name the --input).
    pub fn copy_offline(&self, rule: &str, args: &[&str]) -> Output {
        self.offline(rule, &[&["--json"], args].concat())
    }

    /// `tcpkit copy -x RULE ... ARGS` to completion: the human summary on stdout.
    pub fn offline(&self, rule: &str, args: &[&str]) -> Output {
        let mut argv = vec![tcpkit(), "copy", "-x", rule];
        let ia;
        if let Inner::Transparent(t, _) = &self.lab {
            ia = t.intercept_addr();
            argv.extend(["--transparent", "--intercept", &ia]);
            argv.extend(t.key_args());
        }
        argv.extend_from_slice(args);
        run_limited(self.l().online.command(&argv), Duration::from_secs(30))
    }

    /// The report of a copy that must succeed: every copy accounted for, the schema kept.
    pub fn report(&self, o: &Output) -> Value {
        match self.mode {
            Mode::Relay => {
                assert!(
                    o.status.success(),
                    "copy failed: {} {}",
                    String::from_utf8_lossy(&o.stderr),
                    String::from_utf8_lossy(&o.stdout)
                );
                let r = json(o);
                assert_accounted(&r);
                check_schema(&r);
                assert_eq!(r["mode"], "relay", "{r:#}");
                r
            }
            Mode::Transparent => transparent_report(o),
        }
    }

    /// The report of a copy that must fail by its own figures, `why` in its reason (exit 1,
    /// the reason last on stderr and in `failure`), every copy accounted for.
    pub fn report_failed(&self, o: &Output, why: &str) -> Value {
        let r = match self.mode {
            Mode::Relay => failed_report(o, why),
            Mode::Transparent => transparent_report_failed(o, why),
        };
        check_schema(&r);
        r
    }

    /// [`ModeLab::report`] of a live copy, waited for up to 20 s.
    pub fn done(&self, c: Child) -> Value {
        self.report(&wait_limited(c, Duration::from_secs(20)))
    }

    /// Stops intercept (SIGINT) and returns its report, checked against its schema; None in
    /// relay mode.
    pub fn intercept_report(&self) -> Option<Value> {
        let Inner::Transparent(_, icp) = &self.lab else {
            return None;
        };
        icp.signal(tcpkit_lab::Signal::SIGINT).unwrap();
        icp.wait_timeout(Duration::from_secs(5)).unwrap();
        Some(TLab::intercept_report(icp))
    }

    /// The address the target sees copied requests come from: the copy host's own in relay
    /// mode, the clients' in transparent mode.
    pub fn seen_from(&self) -> &'static str {
        match self.mode {
            Mode::Relay => ONLINE_T,
            Mode::Transparent => CLIENT,
        }
    }

    /// Addresses that must never show on the clients' link: everything beyond the online
    /// host.
    pub fn beyond_online(&self) -> &'static [&'static str] {
        match self.mode {
            Mode::Relay => &[TARGET, ONLINE_T],
            Mode::Transparent => &[TARGET, TGT_A, ASSIST, ASSIST_M, ONLINE_T, ONLINE_M],
        }
    }
}
