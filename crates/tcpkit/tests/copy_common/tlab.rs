//! The transparent-mode lab: the copy lab plus an assistant host running `tcpkit intercept`.
//! clients → online (copy) → target (routes the clients' subnet via the assistant) →
//! assistant (intercept); the online host reaches intercept's control port over a management
//! link of its own. IPv6 beside IPv4 on request ([`TLab::add_v6`]).

use std::path::PathBuf;
use std::process::{Child, Output};
use std::time::Duration;

use serde_json::Value;
use tcpkit_lab::{Host, Link, Proc};

use super::*;

pub const TGT_A: &str = "198.18.3.1";
pub const ASSIST: &str = "198.18.3.2";
pub const ONLINE_M: &str = "198.18.4.1";
pub const ASSIST_M: &str = "198.18.4.2";
pub const CLIENT6: &str = "fd00:18:1::1";
pub const ONLINE6: &str = "fd00:18:1::2";
pub const ONLINE6_T: &str = "fd00:18:2::1";
pub const TARGET6: &str = "fd00:18:2::2";
pub const TGT6_A: &str = "fd00:18:3::1";
pub const ASSIST6: &str = "fd00:18:3::2";
/// A second online host ([`TLab::add_online`]) on its own clients' link (in the clients'
/// subnet, which the target routes via the assistant), its own link to the target and its
/// own management link to the assistant.
pub const CLIENT2: &str = "198.18.1.11";
pub const ONLINE2: &str = "198.18.1.12";
pub const ONLINE2_T: &str = "198.18.5.1";
pub const TGT_2: &str = "198.18.5.2";
pub const ONLINE2_M: &str = "198.18.6.1";
pub const ASSIST2_M: &str = "198.18.6.2";

pub struct TLab {
    pub l: CopyLab,
    pub assistant: Host,
    /// The assistant's interface toward the target (where intercept captures).
    pub ast_if: String,
    /// The target's interface toward the assistant.
    pub tgt_ast_if: String,
    /// intercept's control port.
    pub port: u16,
    /// intercept's capture filter: the target's answers.
    pub filter: String,
    /// The key intercept and every copy of this lab are given (`--auth-key-file`): the
    /// transparent tests run authenticated, as users are told to. None: neither gets one.
    pub key: Option<PathBuf>,
    /// More flags for intercept's command line (e.g. a shorter `--hello-timeout`).
    pub intercept_flags: Vec<String>,
}

/// Writes a key file of `text` (mode 600, as intercept and copy require) at `path`.
pub fn write_key(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

impl TLab {
    pub fn new(tag: &str) -> TLab {
        let mut l = CopyLab::new(tag);
        let assistant = l.lab.host("ast").expect("host");
        let target = l.target.clone();
        let online = l.online.clone();
        let tl = link24(&mut l.lab, &target, &assistant, TGT_A, ASSIST);
        link24(&mut l.lab, &online, &assistant, ONLINE_M, ASSIST_M);
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
        let key = l.dir.path().join("intercept.key");
        write_key(&key, "lab key: 6f1c0e4e2f9a4a0b8c3d\n");
        TLab {
            key: Some(key),
            l,
            assistant,
            ast_if: tl.b.name.clone(),
            tgt_ast_if: tl.a.name.clone(),
            // Each test owns its namespaces: any port is free there.
            port: 7070,
            filter: "tcp and src host 198.18.2.2".into(),
            intercept_flags: Vec::new(),
        }
    }

    /// IPv6 beside IPv4 on every link of the copy path (the control connection stays on the
    /// IPv4 management link): clients CLIENT6, online ONLINE6 / ONLINE6_T, target TARGET6,
    /// which routes the clients' prefix via the assistant ASSIST6.
    pub fn add_v6(&self) {
        let l = &self.l;
        for (h, addr, ifname) in [
            (&l.clients, CLIENT6, &l.cli_link.a.name),
            (&l.online, ONLINE6, &l.cli_link.b.name),
            (&l.online, ONLINE6_T, &l.tgt_link.a.name),
            (&l.target, TARGET6, &l.tgt_link.b.name),
            (&l.target, TGT6_A, &self.tgt_ast_if),
            (&self.assistant, ASSIST6, &self.ast_if),
        ] {
            h.run(&[
                "ip",
                "-6",
                "addr",
                "add",
                &format!("{addr}/64"),
                "dev",
                ifname,
                "nodad",
            ])
            .expect("ip -6 addr");
        }
        l.target
            .run(&["ip", "-6", "route", "add", "fd00:18:1::/64", "via", ASSIST6])
            .expect("route");
        self.assistant
            .sysctl("net.ipv6.conf.all.forwarding", "0")
            .expect("sysctl");
    }

    /// intercept's command line: capture on the assistant's link with [`TLab::filter`].
    pub fn intercept_args(&self) -> Vec<String> {
        vec![
            tcpkit().into(),
            "intercept".into(),
            "--capture".into(),
            self.ast_if.clone(),
            "--filter".into(),
            self.filter.clone(),
            "--listen".into(),
            self.intercept_addr(),
            "--json".into(),
        ]
        .into_iter()
        .chain(self.key_args().into_iter().map(String::from))
        .chain(self.intercept_flags.iter().cloned())
        .collect()
    }

    /// Starts intercept and waits for its control port.
    pub fn intercept(&mut self, name: &str) -> Proc {
        let argv = self.intercept_args();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let assistant = self.assistant.clone();
        let p = assistant
            .spawn(&mut self.l.lab, name, &argv)
            .unwrap_or_else(|e| panic!("{e}"));
        wait_port(&self.assistant, ASSIST_M, self.port, &p);
        p
    }

    /// The key file's path (the lab has one).
    pub fn key_arg(&self) -> &str {
        self.key
            .as_deref()
            .expect("a lab with a key")
            .to_str()
            .unwrap()
    }

    /// `--auth-key-file PATH`, or nothing for a lab without a key.
    pub fn key_args(&self) -> Vec<&str> {
        match &self.key {
            Some(k) => vec!["--auth-key-file", k.to_str().unwrap()],
            None => vec![],
        }
    }

    pub fn intercept_addr(&self) -> String {
        format!("{ASSIST_M}:{}", self.port)
    }

    /// What every transparent copy of this lab is told first: `--transparent -x RULE
    /// --intercept IA` (`ia`: [`TLab::intercept_addr`]) and the lab's key, if any.
    pub fn copy_args<'a>(&'a self, rule: &'a str, ia: &'a str) -> Vec<&'a str> {
        let mut argv = vec!["--transparent", "-x", rule, "--intercept", ia];
        argv.extend(self.key_args());
        argv
    }

    /// `tcpkit copy --transparent -x RULE --intercept .. -i .. --json ARGS`, live, returned
    /// once its capture is open.
    pub fn copy(&self, rule: &str, args: &[&str]) -> Child {
        self.copy_from(&self.l.online, &self.l.cli_link, rule, args)
    }

    /// [`TLab::copy`] in the online host `online`, capturing its clients' link `cli_link`.
    fn copy_from(&self, online: &Host, cli_link: &Link, rule: &str, args: &[&str]) -> Child {
        let ia = self.intercept_addr();
        let mut argv = self.copy_args(rule, &ia);
        argv.extend(["-i", &cli_link.b.name, "--json"]);
        argv.extend_from_slice(args);
        copy_in(online, cli_link.b.ifindex, &argv)
    }

    /// `tcpkit copy --transparent -x RULE --intercept .. --json ARGS` to completion (offline
    /// runs: ARGS name the --input).
    pub fn copy_offline(&self, rule: &str, args: &[&str]) -> Output {
        let ia = self.intercept_addr();
        let mut argv = self.copy_args(rule, &ia);
        argv.push("--json");
        argv.extend_from_slice(args);
        self.l.copy_to_end(&argv, Duration::from_secs(30))
    }
}

/// A second online host feeding the same target and the same intercept as the first: clients2
/// (a clients host of its own) → online2 (`ONLINE2`) → target (`TARGET`, over a link of its
/// own) ; online2 → assistant (its own management link, to intercept's `ASSIST_M`).
pub struct Online {
    pub clients: Host,
    pub online: Host,
    pub cli_link: Link,
    pub tgt_link: Link,
}

impl TLab {
    /// Adds a second online host whose clients host has address `client`: `CLIENT2`, or
    /// `CLIENT` itself in a namespace of its own, so both online hosts see the same client
    /// address (as behind one NAT or load balancer) and the copies may collide on a 4-tuple.
    pub fn add_online(&mut self, client: &str) -> Online {
        let lab = &mut self.l.lab;
        let clients = lab.host("cli2").expect("host");
        let online = lab.host("onl2").expect("host");
        let cli_link = link24(lab, &clients, &online, client, ONLINE2);
        let tgt_link = link24(lab, &online, &self.l.target, ONLINE2_T, TGT_2);
        link24(lab, &online, &self.assistant, ONLINE2_M, ASSIST2_M);
        // The copy's packets go to the target's own address over online2's link, and its
        // control connection to intercept's address over online2's management link.
        for (dst, via) in [(TARGET, TGT_2), (ASSIST_M, ASSIST2_M)] {
            online
                .run(&["ip", "route", "add", &format!("{dst}/32"), "via", via])
                .expect("route");
        }
        // The clients' packets arrive on this link too (their answers leave via the assistant).
        self.l
            .target
            .sysctl(&format!("net.ipv4.conf.{}.rp_filter", tgt_link.b.name), "0")
            .expect("rp_filter");
        Online {
            clients,
            online,
            cli_link,
            tgt_link,
        }
    }

    /// nginx on `o`'s online host ([`CopyLab::nginx`] there).
    pub fn nginx_on(&mut self, o: &Online, log: Log) -> (Proc, PathBuf) {
        self.l.nginx_in(&o.online, ONLINE2, "online2", log, None)
    }

    /// [`TLab::copy`] on `o`'s online host, capturing its clients' link.
    pub fn copy_on(&self, o: &Online, rule: &str, args: &[&str]) -> Child {
        self.copy_from(&o.online, &o.cli_link, rule, args)
    }
}

/// The report of a transparent copy that exited 0, every copy accounted for, against the
/// committed schema ([`mode_report`]).
pub fn transparent_report(o: &Output) -> Value {
    mode_report(o, "transparent")
}

/// The report of a transparent copy that failed by its own figures (issue 10 case 3: exit 1,
/// the reason, containing `why`, last on stderr and in `failure`), every copy accounted for,
/// against the committed schema.
pub fn transparent_report_failed(o: &Output, why: &str) -> Value {
    mode_report_failed(o, why, "transparent")
}

/// Every copy ended exactly one way, control_lost counting among the ways
/// ([`accounted_with`]), and every selected session was copied -n times.
pub fn transparent_accounted(r: &Value) {
    accounted_with(r, u(r, "transparent.control_lost"));
}
