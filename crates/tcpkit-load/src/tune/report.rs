//! What `tcpkit tune` prints: one line per setting, what `--apply` did, and a last line that
//! says whether the host can hold the connections; or the same as one JSON document
//! (docs/schema/tune.schema.json).

use serde::Serialize;
use serde_json::json;
use tcpkit_stats::{Report, Verdict};

use super::{Applied, Check, Evaluation, Fix, NotApplied, Status, TuneConfig};

/// Changes when a field of `--json` changes meaning or disappears.
pub const TUNE_SCHEMA_VERSION: u32 = 1;

/// One run: the checks as found, and with `--apply` what was done and the checks after.
#[derive(Debug, Clone)]
pub struct TuneReport {
    pub config: TuneConfig,
    pub found: Evaluation,
    /// `--apply`: the changes made, those not made, and the checks read again afterwards.
    pub applied: Option<(Vec<Applied>, Vec<NotApplied>, Evaluation)>,
    /// Given as JSON (`--json`): the last line points into the document, since no lines are
    /// printed above it.
    pub json: bool,
}

/// One setting's line: `STATUS setting = current, want wanted: why; run: command`.
pub fn line(c: &Check) -> String {
    let current = c.current.as_deref().unwrap_or("not shown here");
    let mut s = format!(
        "{:<6} {} = {current}, want {}: {}",
        c.status.word(),
        c.setting,
        c.wanted,
        c.why
    );
    if let (Some(cmd), false) = (&c.command, c.status == Status::Ok) {
        s.push_str("; run: ");
        s.push_str(cmd);
        if let Some(keep) = persist(c) {
            s.push_str(" (lost at reboot; to keep it: ");
            s.push_str(&keep);
            s.push(')');
        }
    }
    s
}

/// The file a CHANGE's command is written to so that it outlives a reboot: `sysctl -w` and
/// `ulimit` only change the running host or shell.
pub fn persist(c: &Check) -> Option<String> {
    if c.status != Status::Change {
        return None;
    }
    match &c.fix {
        Some(Fix::Sysctl { key, value }) => Some(format!(
            "echo '{key} = {value}' >> /etc/sysctl.d/90-tcpkit.conf"
        )),
        _ if c.setting.starts_with("RLIMIT_NOFILE") => {
            let n = c.wanted.trim_start_matches(">= ");
            let kind = if c.setting.contains("hard") {
                "hard"
            } else {
                "soft"
            };
            Some(format!(
                "LimitNOFILE={n} in the server's systemd unit, or '* {kind} nofile {n}' in /etc/security/limits.conf"
            ))
        }
        _ => None,
    }
}

fn settings(n: usize) -> String {
    format!("{n} setting{}", if n == 1 { "" } else { "s" })
}

#[derive(Serialize)]
struct CheckJson<'a> {
    setting: &'a str,
    status: Status,
    current: Option<&'a str>,
    wanted: &'a str,
    why: &'a str,
    command: Option<&'a str>,
    /// How to make the change outlive a reboot.
    persist: Option<String>,
    /// Whether `--apply` can make this change (a sysctl write).
    appliable: bool,
}

fn checks_json(e: &Evaluation) -> serde_json::Value {
    let v: Vec<CheckJson> = e
        .checks
        .iter()
        .map(|c| CheckJson {
            setting: &c.setting,
            status: c.status,
            current: c.current.as_deref(),
            wanted: &c.wanted,
            why: &c.why,
            command: c.command.as_deref(),
            persist: persist(c),
            appliable: c.status == Status::Change && matches!(c.fix, Some(Fix::Sysctl { .. })),
        })
        .collect();
    json!(v)
}

impl TuneReport {
    /// The checks that decide the verdict: after `--apply` if it ran.
    pub fn last(&self) -> &Evaluation {
        self.applied.as_ref().map_or(&self.found, |(_, _, e)| e)
    }

    fn changes_needed(&self) -> usize {
        self.last().changes()
    }

    /// The commands that make the changes still needed, in the order of the checks.
    pub fn commands(&self) -> Vec<&str> {
        self.last()
            .checks
            .iter()
            .filter(|c| c.status == Status::Change)
            .filter_map(|c| c.command.as_deref())
            .collect()
    }

    /// The report's last line.
    pub fn last_line(&self) -> String {
        let e = self.last();
        let cfg = &self.config;
        let what = format!("{} {} connections", cfg.connections, cfg.role.name());
        let changes = e.changes();
        let mut s = if changes == 0 {
            let procs = if e.procs_needed > 1 {
                format!(" with --procs {}", e.procs_needed)
            } else {
                String::new()
            };
            format!("ready for {what}{procs}")
        } else {
            let names: Vec<&str> = e
                .checks
                .iter()
                .filter(|c| c.status == Status::Change)
                .map(|c| c.setting.as_str())
                .collect();
            let verb = if changes == 1 { "needs" } else { "need" };
            let lead = if self.applied.is_some() {
                format!("after --apply {} still {verb}", settings(changes))
            } else {
                format!("{} {verb}", settings(changes))
            };
            let how = match (self.applied.is_some(), self.json) {
                (true, false) => "see why above",
                (true, true) => "see why in the report's `not_applied`",
                (false, false) => "run the commands above or tcpkit tune --apply",
                (false, true) => "run the report's `commands` or tcpkit tune --apply",
            };
            format!(
                "not ready for {what}: {lead} a change ({}): {how}",
                names.join(", ")
            )
        };
        let hidden = e.count(Status::Check);
        if hidden > 0 {
            s.push_str(&format!(
                "; {} not shown here (CHECK): read them on the host",
                settings(hidden)
            ));
        }
        s
    }
}

impl Report for TuneReport {
    /// Ready, or not with the reason (the last line).
    fn verdict(&self) -> Verdict {
        Verdict::fail_if(self.changes_needed() > 0, || self.last_line())
    }

    /// The human report, ending with a newline.
    fn human(&self) -> String {
        let cfg = &self.config;
        let mut out = format!(
            "tcpkit tune: {} role, {} connections, port {}\n",
            cfg.role.name(),
            cfg.connections,
            cfg.port
        );
        for c in &self.found.checks {
            out.push_str(&line(c));
            out.push('\n');
        }
        if let Some((done, not, _)) = &self.applied {
            if done.is_empty() && not.is_empty() {
                out.push_str("applied: nothing needed a change\n");
            }
            for a in done {
                out.push_str(&format!(
                    "applied: {} {} -> {} ({})\n",
                    a.setting, a.from, a.to, a.command
                ));
            }
            for n in not {
                out.push_str(&format!("not applied: {}: {}\n", n.setting, n.reason));
            }
        }
        // Not ready: the last line is the reason, which goes to stderr as every failed run's
        // does; printing it here too said it twice.
        if self.changes_needed() == 0 {
            out.push_str(&self.last_line());
            out.push('\n');
        }
        out
    }

    /// The report as one JSON document (docs/schema/tune.schema.json), without a newline.
    fn json(&self) -> String {
        let cfg = &self.config;
        let e = &self.found;
        let (applied, not_applied, after) = match &self.applied {
            Some((d, n, a)) => (json!(d), json!(n), checks_json(a)),
            None => (json!([]), json!([]), serde_json::Value::Null),
        };
        json!({
            "schema_version": TUNE_SCHEMA_VERSION,
            "role": cfg.role,
            "connections": cfg.connections,
            "port": cfg.port,
            "procs_needed": e.procs_needed,
            "sources_needed": e.sources_needed,
            "memory_pages": e.memory_pages,
            "checks": checks_json(e),
            "applied": applied,
            "not_applied": not_applied,
            "after_apply": after,
            "changes_needed": self.last().changes(),
            "commands": self.commands(),
            "verdict": self.last_line(),
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::{Facts, Role};

    fn somaxconn(status: Status, current: &str) -> Check {
        Check {
            setting: "net.core.somaxconn".into(),
            status,
            current: Some(current.into()),
            wanted: ">= 65535".into(),
            why: "a listener's accept queue is cut to this".into(),
            command: Some("sysctl -w net.core.somaxconn=65535".into()),
            fix: Some(Fix::Sysctl {
                key: "net.core.somaxconn".into(),
                value: "65535".into(),
            }),
        }
    }

    #[test]
    fn one_line_per_setting_exactly() {
        assert_eq!(
            line(&somaxconn(Status::Change, "128")),
            "CHANGE net.core.somaxconn = 128, want >= 65535: a listener's accept queue is cut to this; run: sysctl -w net.core.somaxconn=65535 (lost at reboot; to keep it: echo 'net.core.somaxconn = 65535' >> /etc/sysctl.d/90-tcpkit.conf)"
        );
        // OK lines have nothing to run.
        assert_eq!(
            line(&somaxconn(Status::Ok, "65535")),
            "OK     net.core.somaxconn = 65535, want >= 65535: a listener's accept queue is cut to this"
        );
        let mut hidden = somaxconn(Status::Check, "");
        hidden.current = None;
        hidden.command = Some("sysctl net.core.somaxconn".into());
        assert_eq!(
            line(&hidden),
            "CHECK  net.core.somaxconn = not shown here, want >= 65535: a listener's accept queue is cut to this; run: sysctl net.core.somaxconn"
        );
    }

    fn eval(checks: Vec<Check>, procs: u64) -> Evaluation {
        Evaluation {
            checks,
            procs_needed: procs,
            sources_needed: None,
            memory_pages: 2,
        }
    }

    fn report(applied: Option<(Vec<Applied>, Vec<NotApplied>, Evaluation)>) -> TuneReport {
        TuneReport {
            config: TuneConfig {
                role: Role::Server,
                connections: 1000,
                port: 53,
            },
            found: eval(vec![somaxconn(Status::Change, "128")], 1),
            applied,
            json: false,
        }
    }

    #[test]
    fn whole_report_before_and_after_apply() {
        let r = report(None);
        assert_eq!(
            r.human(),
            "tcpkit tune: server role, 1000 connections, port 53\n\
             CHANGE net.core.somaxconn = 128, want >= 65535: a listener's accept queue is cut to this; run: sysctl -w net.core.somaxconn=65535 (lost at reboot; to keep it: echo 'net.core.somaxconn = 65535' >> /etc/sysctl.d/90-tcpkit.conf)\n"
        );
        // The reason is the last line on stderr (the run failed), not on stdout as well.
        assert_eq!(
            r.verdict(),
            Verdict::Failed(
                "not ready for 1000 server connections: 1 setting needs a change (net.core.somaxconn): run the commands above or tcpkit tune --apply".into()
            )
        );
        let done = vec![Applied {
            setting: "net.core.somaxconn".into(),
            from: "128".into(),
            to: "65535".into(),
            command: "sysctl -w net.core.somaxconn=65535".into(),
        }];
        let not = vec![NotApplied {
            setting: "RLIMIT_NOFILE (soft)".into(),
            reason: "run it in the shell".into(),
        }];
        let mut hidden = somaxconn(Status::Check, "");
        hidden.setting = "net.ipv4.tcp_mem".into();
        let after = eval(vec![somaxconn(Status::Ok, "65535"), hidden], 3);
        let r = report(Some((done, not, after)));
        assert_eq!(
            r.human(),
            "tcpkit tune: server role, 1000 connections, port 53\n\
             CHANGE net.core.somaxconn = 128, want >= 65535: a listener's accept queue is cut to this; run: sysctl -w net.core.somaxconn=65535 (lost at reboot; to keep it: echo 'net.core.somaxconn = 65535' >> /etc/sysctl.d/90-tcpkit.conf)\n\
             applied: net.core.somaxconn 128 -> 65535 (sysctl -w net.core.somaxconn=65535)\n\
             not applied: RLIMIT_NOFILE (soft): run it in the shell\n\
             ready for 1000 server connections with --procs 3; 1 setting not shown here (CHECK): read them on the host\n"
        );
        assert_eq!(r.verdict(), Verdict::Done);
        let still = eval(vec![somaxconn(Status::Change, "128")], 1);
        let r = report(Some((vec![], vec![], still)));
        assert!(r.human().contains("applied: nothing needed a change\n"));
        assert_eq!(
            r.verdict(),
            Verdict::Failed(
                "not ready for 1000 server connections: after --apply 1 setting still needs a change (net.core.somaxconn): see why above".into()
            )
        );
    }

    /// Issue 24, item 18: with --json nothing is printed above the last line, so it points
    /// into the document instead.
    #[test]
    fn with_json_the_last_line_points_into_the_document() {
        let mut r = report(None);
        r.json = true;
        assert_eq!(
            r.verdict(),
            Verdict::Failed(
                "not ready for 1000 server connections: 1 setting needs a change (net.core.somaxconn): run the report's `commands` or tcpkit tune --apply".into()
            )
        );
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["commands"], json!(["sysctl -w net.core.somaxconn=65535"]));
        let still = eval(vec![somaxconn(Status::Change, "128")], 1);
        let mut r = report(Some((vec![], vec![], still)));
        r.json = true;
        assert!(r.last_line().ends_with(
            "still needs a change (net.core.somaxconn): see why in the report's `not_applied`"
        ));
        let after = eval(vec![somaxconn(Status::Ok, "65535")], 1);
        let r = report(Some((vec![], vec![], after)));
        assert_eq!(r.commands(), Vec::<&str>::new());
    }

    #[test]
    fn json_fields() {
        let f = Facts::fixture(&[("net.core.somaxconn", "128")]);
        let cfg = TuneConfig {
            role: Role::Client,
            connections: 10,
            port: 4242,
        };
        let r = TuneReport {
            config: cfg,
            found: crate::tune::evaluate(&cfg, &f),
            applied: None,
            json: false,
        };
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["schema_version"], 1);
        assert_eq!(v["role"], "client");
        assert_eq!(v["connections"], 10);
        assert_eq!(v["after_apply"], serde_json::Value::Null);
        assert_eq!(v["applied"], json!([]));
        assert_eq!(v["checks"][0]["setting"], "RLIMIT_NOFILE (soft)");
        assert_eq!(v["checks"][0]["status"], "OK");
        let hidden = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["setting"] == "net.ipv4.tcp_mem")
            .unwrap();
        assert_eq!(hidden["status"], "CHECK");
        assert_eq!(hidden["current"], serde_json::Value::Null);
        assert_eq!(hidden["appliable"], false);
        assert_eq!(v["verdict"], r.last_line());
    }
}
