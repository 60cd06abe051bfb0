//! One lab over both of copy's transports, so that a test body says what copy does once and
//! runs in relay mode (copy's own TCP connections to the target) and in transparent mode
//! (the clients' addresses kept, answers caught by intercept on the assistant) alike.

use std::path::PathBuf;
use std::process::{Child, Output};
use std::time::Duration;

use serde_json::Value;
use tcpkit_lab::{Proc, Tcpdump};

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

    /// The lab for port 8080 with nginx on the online host and on the target
    /// ([`CopyLab::nginx_pair`]), and the rule between them ([`rule_8080`]): the lab, the
    /// rule, and the two access logs, online's first.
    pub fn http(tag: &str, mode: Mode) -> (ModeLab, String, PathBuf, PathBuf) {
        let mut m = ModeLab::new(tag, mode, 8080);
        let (on_log, tg_log) = m.l_mut().nginx_pair();
        (m, rule_8080(), on_log, tg_log)
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
        let ia;
        let mut argv = match &self.lab {
            Inner::Relay(_) => vec!["-x", rule],
            Inner::Transparent(t, _) => {
                ia = t.intercept_addr();
                t.copy_args(rule, &ia)
            }
        };
        argv.extend_from_slice(args);
        self.l().copy_to_end(&argv, Duration::from_secs(30))
    }

    /// The mode as reports name it.
    fn name(&self) -> &'static str {
        match self.mode {
            Mode::Relay => "relay",
            Mode::Transparent => "transparent",
        }
    }

    /// The report of a copy that must succeed: every copy accounted for, the schema kept.
    pub fn report(&self, o: &Output) -> Value {
        mode_report(o, self.name())
    }

    /// The report of a copy that must fail by its own figures, `why` in its reason (exit 1,
    /// the reason last on stderr and in `failure`), every copy accounted for.
    pub fn report_failed(&self, o: &Output, why: &str) -> Value {
        mode_report_failed(o, why, self.name())
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
        stop_intercept(icp, tcpkit_lab::Signal::SIGINT);
        Some(super::intercept_report(icp))
    }

    /// The address the target sees copied requests come from: the copy host's own in relay
    /// mode, the clients' in transparent mode.
    pub fn seen_from(&self) -> &'static str {
        match self.mode {
            Mode::Relay => ONLINE_T,
            Mode::Transparent => CLIENT,
        }
    }

    /// What `dump` of the clients' link ([`CopyLab::watch_clients`]) saw: more than `min`
    /// packets, and nothing from beyond the online host.
    pub fn assert_nothing_beyond_online(&self, dump: Tcpdump, min: usize) {
        let beyond: &[&str] = match self.mode {
            Mode::Relay => &[TARGET, ONLINE_T],
            Mode::Transparent => &[TARGET, TGT_A, ASSIST, ASSIST_M, ONLINE_T, ONLINE_M],
        };
        assert_none_from(dump, beyond, min);
    }
}
