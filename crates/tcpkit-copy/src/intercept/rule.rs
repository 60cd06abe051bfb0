//! The netfilter rule of intercept's on-target mode: the target's answers to the copied
//! sessions (TCP from its server ports, to the clients' addresses when given) queued to
//! intercept from the output hook, installed at start and removed at exit.
//!
//! The rule is an nftables table of its own, `inet tcpkit_intercept_<queue>`, with one
//! output-hook chain whose rules end in `queue num <queue>` (no `bypass`: with nobody
//! reading the queue the kernel drops what the rule queues, so a killed intercept fails
//! closed). Installing replaces a table of that name left by a killed intercept in the same
//! transaction (`add table; delete table; table {...}`).
//!
//! Kernels built without nftables' `queue` expression (CONFIG_NFT_QUEUE; nft then answers
//! "No such file or directory") get the same rule through iptables instead: a chain
//! `TCPKIT-INTERCEPT-<queue>` in the filter table, jumped to first from OUTPUT, ending in the
//! xtables NFQUEUE target (through nf_tables' xtables compatibility with iptables-nft). Both
//! kinds of leftover are cleared before either is installed. iptables-nft creates its
//! `filter` table and the OUTPUT base chain on demand and leaves them when the chain is
//! removed; what the fallback found before installing is noted, and removing the rule also
//! removes the table and chains that were not there then (and hold no rule), so the target's
//! ruleset is left as it was found.
//!
//! Before the rule goes, the target's TCP connections it matches are aborted (`ss -K`), so no
//! copied session outlives intercept and later sends a FIN or a retransmission to a real
//! client: their resets are queued by the rule still in place, and dropped.

use std::io::{self, Write};
use std::net::IpAddr;
use std::process::{Command, Stdio};

use tcpkit_wire::Cidr;

/// What the rule matches and where it queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerRule {
    /// The netfilter queue intercept reads.
    pub queue: u16,
    /// The target's server ports: the answers' source ports.
    pub ports: Vec<u16>,
    /// The clients' addresses (the copies' sources): the answers' destinations. Empty: any
    /// destination.
    pub clients: Vec<Cidr>,
}

/// Which way the rule was installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Its own nftables table.
    Nft,
    /// An iptables chain with the NFQUEUE target (the kernel has no nftables `queue`).
    Iptables,
}

/// Why the rule cannot be installed.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error(
        "nft not found: the on-target mode installs an nftables rule (apt-get install nftables)"
    )]
    NftMissing,
    #[error("nft refused the rule: {why}")]
    Nft { why: String },
    #[error("this kernel has no nftables queue expression (CONFIG_NFT_QUEUE) and {tool} is not installed for its NFQUEUE target (apt-get install iptables)")]
    NoQueue { tool: &'static str },
    #[error("{cmd}: {why}")]
    Iptables { cmd: String, why: String },
    #[error("run {what}")]
    Spawn {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The network of a prefix (host bits cleared): nft refuses a prefix with host bits set.
fn network(c: &Cidr) -> String {
    let p = c.prefix();
    match c.addr() {
        IpAddr::V4(a) => {
            let m = if p == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(p))
            };
            format!("{}/{p}", std::net::Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = if p == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(p))
            };
            format!("{}/{p}", std::net::Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

impl AnswerRule {
    /// The nftables table's name.
    pub fn table(&self) -> String {
        format!("tcpkit_intercept_{}", self.queue)
    }

    /// The iptables chain's name (fallback).
    pub fn chain(&self) -> String {
        format!("TCPKIT-INTERCEPT-{}", self.queue)
    }

    fn ports_list(&self, sep: &str) -> String {
        self.ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(sep)
    }

    fn clients_of(&self, v6: bool) -> Vec<String> {
        self.clients
            .iter()
            .filter(|c| c.addr().is_ipv6() == v6)
            .map(network)
            .collect()
    }

    /// The match in nftables words, for the report: `tcp sport { 8080 } ip daddr { ... }`.
    pub fn matches(&self) -> Vec<String> {
        let sport = format!("tcp sport {{ {} }}", self.ports_list(", "));
        if self.clients.is_empty() {
            return vec![sport];
        }
        let mut m = Vec::new();
        for (v6, kw) in [(false, "ip"), (true, "ip6")] {
            let c = self.clients_of(v6);
            if !c.is_empty() {
                m.push(format!("{sport} {kw} daddr {{ {} }}", c.join(", ")));
            }
        }
        m
    }

    /// `nft -f -` input: the table, replacing one of the same name in one transaction.
    pub fn nft_script(&self) -> String {
        let t = self.table();
        let mut s = format!(
            "add table inet {t}\ndelete table inet {t}\ntable inet {t} {{\n\tchain answers {{\n\t\ttype filter hook output priority filter; policy accept;\n"
        );
        for m in self.matches() {
            s.push_str(&format!("\t\t{m} queue num {}\n", self.queue));
        }
        s.push_str("\t}\n}\n");
        s
    }

    /// The fallback's rules for one family, as iptables arguments after `-A CHAIN`.
    pub fn iptables_rules(&self, v6: bool) -> Vec<Vec<String>> {
        let base = |dst: Option<String>| {
            let mut a: Vec<String> = ["-p", "tcp", "-m", "multiport", "--sports"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            a.push(self.ports_list(","));
            if let Some(d) = dst {
                a.extend(["-d".to_string(), d]);
            }
            a.extend(
                ["-j", "NFQUEUE", "--queue-num"]
                    .iter()
                    .map(|s| s.to_string()),
            );
            a.push(self.queue.to_string());
            a
        };
        if self.clients.is_empty() {
            vec![base(None)]
        } else {
            self.clients_of(v6)
                .into_iter()
                .map(Some)
                .map(base)
                .collect()
        }
    }

    /// The `ss` filter of the connections the rule catches the answers of.
    pub fn ss_filter(&self) -> Vec<String> {
        let sport: Vec<String> = self.ports.iter().map(|p| format!("sport = :{p}")).collect();
        let mut f = vec![format!("( {} )", sport.join(" or "))];
        if !self.clients.is_empty() {
            let dst: Vec<String> = self
                .clients
                .iter()
                .map(|c| {
                    let n = network(c);
                    match n.split_once('/') {
                        Some((a, p)) if c.addr().is_ipv6() => format!("dst [{a}]/{p}"),
                        _ => format!("dst {n}"),
                    }
                })
                .collect();
            f.push("and".into());
            f.push(format!("( {} )", dst.join(" or ")));
        }
        f
    }

    fn families(&self) -> Vec<bool> {
        if self.clients.is_empty() {
            return vec![false, true];
        }
        [false, true]
            .into_iter()
            .filter(|&v6| self.clients.iter().any(|c| c.addr().is_ipv6() == v6))
            .collect()
    }
}

/// The first line of a tool's complaint.
fn first_line(b: &[u8]) -> String {
    let t = String::from_utf8_lossy(b);
    t.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("failed without a message")
        .to_string()
}

fn run(cmd: &str, args: &[String]) -> io::Result<std::process::Output> {
    Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
}

fn iptables(v6: bool) -> &'static str {
    if v6 {
        "ip6tables"
    } else {
        "iptables"
    }
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Removes the iptables chain for `rule` in one family, if there; true when it was.
fn clear_iptables(rule: &AnswerRule, v6: bool) -> bool {
    let (ipt, ch) = (iptables(v6), rule.chain());
    let ok = |a: &[&str]| run(ipt, &args(a)).is_ok_and(|o| o.status.success());
    let mut found = false;
    // A jump added twice by hand is removed twice.
    while ok(&["-w", "-D", "OUTPUT", "-j", &ch]) {
        found = true;
    }
    if ok(&["-w", "-F", &ch]) {
        found = true;
        ok(&["-w", "-X", &ch]);
    }
    found
}

/// A family's iptables `filter` table as it was before the fallback touched it (iptables-nft
/// keeps it in nftables).
#[derive(Debug, Clone, PartialEq, Eq)]
enum FilterTable {
    /// There was none.
    Absent,
    /// It held these chains.
    Chains(Vec<String>),
    /// nft could not say: nothing of it is removed.
    Unknown,
}

fn nft_family(v6: bool) -> &'static str {
    if v6 {
        "ip6"
    } else {
        "ip"
    }
}

/// The chains of `nft -j list table ...` output, each with its number of rules.
fn chains_of(json: &[u8]) -> Option<Vec<(String, usize)>> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let items = v.get("nftables")?.as_array()?;
    let mut chains: Vec<(String, usize)> = items
        .iter()
        .filter_map(|i| i.get("chain")?.get("name")?.as_str())
        .map(|n| (n.to_string(), 0))
        .collect();
    for chain in items
        .iter()
        .filter_map(|i| i.get("rule")?.get("chain")?.as_str())
    {
        if let Some(c) = chains.iter_mut().find(|(n, _)| n == chain) {
            c.1 += 1;
        }
    }
    Some(chains)
}

/// Whether `chain` in `nft -j list table ...` output is a base chain that lets everything
/// through (policy accept, as iptables-nft creates OUTPUT on demand).
fn accepts(json: &[u8], chain: &str) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(json) else {
        return false;
    };
    v.get("nftables")
        .and_then(|i| i.as_array())
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("chain"))
        .any(|c| {
            c.get("name").and_then(|n| n.as_str()) == Some(chain)
                && c.get("policy").and_then(|p| p.as_str()).unwrap_or("accept") == "accept"
        })
}

/// The family's `filter` table now: its chains with their rule counts, None when it is not
/// there, Err when nft could not say.
fn filter_table_now(v6: bool) -> Result<Option<Vec<(String, usize)>>, ()> {
    filter_table_json(v6).map(|t| t.map(|(chains, _)| chains))
}

/// A table's chains with their rule counts, and the `nft -j` listing they were read from.
type Listed = (Vec<(String, usize)>, Vec<u8>);

/// [`filter_table_now`], with the listing it was read from.
fn filter_table_json(v6: bool) -> Result<Option<Listed>, ()> {
    let o = run(
        "nft",
        &args(&["-j", "list", "table", nft_family(v6), "filter"]),
    )
    .map_err(|_| ())?;
    if !o.status.success() {
        return if String::from_utf8_lossy(&o.stderr).contains("No such file or directory") {
            Ok(None)
        } else {
            Err(())
        };
    }
    let chains = chains_of(&o.stdout).ok_or(())?;
    Ok(Some((chains, o.stdout)))
}

/// The family's `filter` table as the rule finds it. `stale`: a killed intercept's chain was
/// just cleared from it, so an empty, accepting OUTPUT chain is taken for the one iptables-nft
/// created for that intercept's jump (and the table for its, when nothing else is in it):
/// removed with this rule, so a kill and a restart leave the ruleset as it was before either.
fn filter_table_before(v6: bool, stale: bool) -> FilterTable {
    match filter_table_json(v6) {
        Ok(None) => FilterTable::Absent,
        Ok(Some((c, json))) => {
            let names: Vec<String> = c
                .into_iter()
                .filter(|(n, rules)| !(stale && n == "OUTPUT" && *rules == 0 && accepts(&json, n)))
                .map(|(n, _)| n)
                .collect();
            if stale && names.is_empty() {
                FilterTable::Absent
            } else {
                FilterTable::Chains(names)
            }
        }
        Err(()) => FilterTable::Unknown,
    }
}

/// Removes what the fallback made iptables-nft create in the family's `filter` table: the
/// chains that were not there `before` and hold no rule, then the table if there was none
/// and no chain is left in it.
fn restore_filter_table(v6: bool, before: &FilterTable) {
    let had: &[String] = match before {
        FilterTable::Absent => &[],
        FilterTable::Chains(c) => c,
        FilterTable::Unknown => return,
    };
    let Ok(Some(now)) = filter_table_now(v6) else {
        return;
    };
    let fam = nft_family(v6);
    let mut left = now.len();
    for (name, rules) in &now {
        if *rules == 0
            && !had.contains(name)
            && run("nft", &args(&["delete", "chain", fam, "filter", name]))
                .is_ok_and(|o| o.status.success())
        {
            left -= 1;
        }
    }
    if *before == FilterTable::Absent && left == 0 {
        let _ = run("nft", &args(&["delete", "table", fam, "filter"]));
    }
}

/// Removes the nftables table for `rule`, if there; true when it was.
fn clear_nft(rule: &AnswerRule) -> bool {
    run("nft", &args(&["delete", "table", "inet", &rule.table()])).is_ok_and(|o| o.status.success())
}

/// The rule, in place until dropped: dropping it aborts the connections it catches the
/// answers of (once it was wholly installed), then removes it.
#[derive(Debug)]
pub struct Installed {
    rule: AnswerRule,
    backend: Backend,
    /// A leftover of a killed intercept was replaced.
    pub replaced_stale: bool,
    /// Installed whole: connections are aborted before removal.
    complete: bool,
    removed: bool,
    /// The fallback's families, with their `filter` table as it was before.
    tables_before: Vec<(bool, FilterTable)>,
}

impl Installed {
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// What was installed, for the report.
    pub fn describe(&self) -> String {
        match self.backend {
            Backend::Nft => format!("nft table inet {}", self.rule.table()),
            Backend::Iptables => format!(
                "iptables chain {} (this kernel has no nftables queue)",
                self.rule.chain()
            ),
        }
    }

    /// Aborts the connections the rule catches the answers of, then removes the rule.
    /// Returns how many connections `ss` aborted (None when ss could not run).
    pub fn remove(&mut self) -> Option<u64> {
        if self.removed {
            return Some(0);
        }
        self.removed = true;
        let aborted = if self.complete {
            let mut a = args(&["-K", "-H", "-t", "-n", "state", "connected"]);
            a.extend(self.rule.ss_filter());
            run("ss", &a).ok().filter(|o| o.status.success()).map(|o| {
                o.stdout
                    .split(|&b| b == b'\n')
                    .filter(|l| !l.is_empty())
                    .count() as u64
            })
        } else {
            Some(0)
        };
        match self.backend {
            Backend::Nft => {
                clear_nft(&self.rule);
            }
            Backend::Iptables => {
                for (v6, before) in &self.tables_before {
                    clear_iptables(&self.rule, *v6);
                    restore_filter_table(*v6, before);
                }
            }
        }
        aborted
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Installs `rule`, replacing a leftover of either kind; nftables first, iptables when the
/// kernel has no nftables queue.
pub fn install(rule: &AnswerRule) -> Result<Installed, RuleError> {
    // nft is needed in any case; a table of this name is replaced by the script itself.
    let existed = match run("nft", &args(&["list", "table", "inet", &rule.table()])) {
        Ok(o) => o.status.success(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(RuleError::NftMissing),
        Err(source) => {
            return Err(RuleError::Spawn {
                what: "nft",
                source,
            })
        }
    };
    // A leftover of the fallback is cleared here (when iptables exists at all).
    let stale_chain: Vec<bool> = rule
        .families()
        .into_iter()
        .map(|v6| clear_iptables(rule, v6))
        .collect();
    let mut replaced_stale = existed || stale_chain.iter().any(|&s| s);
    let spawned = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let out = spawned
        .and_then(|mut nft| {
            if let Some(mut stdin) = nft.stdin.take() {
                stdin.write_all(rule.nft_script().as_bytes())?;
            }
            nft.wait_with_output()
        })
        .map_err(|source| RuleError::Spawn {
            what: "nft",
            source,
        })?;
    if out.status.success() {
        return Ok(Installed {
            rule: rule.clone(),
            backend: Backend::Nft,
            replaced_stale,
            complete: true,
            removed: false,
            tables_before: Vec::new(),
        });
    }
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    if !err.contains("No such file or directory") {
        return Err(RuleError::Nft {
            why: first_line(err.as_bytes()),
        });
    }
    // No nftables queue in this kernel: the xtables NFQUEUE target instead. The failed
    // transaction left everything as it was, a stale table included: clear that by itself.
    replaced_stale |= clear_nft(rule);
    let mut installed = Installed {
        rule: rule.clone(),
        backend: Backend::Iptables,
        replaced_stale,
        complete: false,
        removed: false,
        tables_before: rule
            .families()
            .into_iter()
            .zip(stale_chain)
            .map(|(v6, stale)| (v6, filter_table_before(v6, stale)))
            .collect(),
    };
    for v6 in rule.families() {
        let ipt = iptables(v6);
        let ch = rule.chain();
        let mut steps = vec![args(&["-w", "-N", &ch])];
        for r in rule.iptables_rules(v6) {
            let mut a = args(&["-w", "-A", &ch]);
            a.extend(r);
            steps.push(a);
        }
        steps.push(args(&["-w", "-I", "OUTPUT", "1", "-j", &ch]));
        for a in steps {
            let o = match run(ipt, &a) {
                Ok(o) => o,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(RuleError::NoQueue { tool: ipt })
                }
                Err(source) => {
                    return Err(RuleError::Spawn {
                        what: "iptables",
                        source,
                    })
                }
            };
            if !o.status.success() {
                // What is in place so far goes when `installed` is dropped.
                return Err(RuleError::Iptables {
                    cmd: format!("{ipt} {}", a.join(" ")),
                    why: first_line(&o.stderr),
                });
            }
        }
    }
    installed.complete = true;
    Ok(installed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(clients: &[&str]) -> AnswerRule {
        AnswerRule {
            queue: 7,
            ports: vec![8080, 80],
            clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn the_nft_table_replaces_its_leftover_and_queues_without_bypass() {
        assert_eq!(
            rule(&["198.18.1.9/24", "fd00:18:1::5/64"]).nft_script(),
            "add table inet tcpkit_intercept_7\n\
             delete table inet tcpkit_intercept_7\n\
             table inet tcpkit_intercept_7 {\n\
             \tchain answers {\n\
             \t\ttype filter hook output priority filter; policy accept;\n\
             \t\ttcp sport { 8080, 80 } ip daddr { 198.18.1.0/24 } queue num 7\n\
             \t\ttcp sport { 8080, 80 } ip6 daddr { fd00:18:1::/64 } queue num 7\n\
             \t}\n\
             }\n"
        );
        let any = rule(&[]).nft_script();
        assert!(
            any.contains("\t\ttcp sport { 8080, 80 } queue num 7\n"),
            "{any}"
        );
        assert!(!any.contains("bypass"));
    }

    #[test]
    fn the_chains_of_a_table_with_their_rules() {
        // `nft -j list table ip filter` after `iptables -A INPUT ...` and the fallback's
        // jump from OUTPUT (trimmed of what is not read).
        let json = br#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "ip", "name": "filter", "handle": 1}},
            {"chain": {"family": "ip", "table": "filter", "name": "INPUT", "handle": 1}},
            {"chain": {"family": "ip", "table": "filter", "name": "OUTPUT", "handle": 3}},
            {"chain": {"family": "ip", "table": "filter", "name": "TCPKIT-INTERCEPT-7"}},
            {"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 2}},
            {"rule": {"family": "ip", "table": "filter", "chain": "OUTPUT", "handle": 4}},
            {"rule": {"family": "ip", "table": "filter", "chain": "OUTPUT", "handle": 5}}]}"#;
        assert_eq!(
            chains_of(json).unwrap(),
            [
                ("INPUT".to_string(), 1),
                ("OUTPUT".to_string(), 2),
                ("TCPKIT-INTERCEPT-7".to_string(), 0)
            ]
        );
        assert_eq!(chains_of(b"not json"), None);
        // No policy given (nft omits it for regular chains) reads as accepting; a base chain
        // that drops does not.
        assert!(accepts(json, "OUTPUT"));
        assert!(!accepts(json, "FORWARD"), "no such chain");
        let drop = br#"{"nftables": [{"chain": {"family": "ip", "table": "filter",
            "name": "OUTPUT", "type": "filter", "hook": "output", "prio": 0, "policy": "drop"}}]}"#;
        assert!(!accepts(drop, "OUTPUT"));
        assert!(!accepts(b"not json", "OUTPUT"));
    }

    #[test]
    fn the_iptables_fallback_and_the_ss_filter() {
        let r = rule(&["198.18.1.9/24", "10.0.0.1"]);
        assert_eq!(
            r.iptables_rules(false),
            vec![
                args(&[
                    "-p",
                    "tcp",
                    "-m",
                    "multiport",
                    "--sports",
                    "8080,80",
                    "-d",
                    "198.18.1.0/24",
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    "7"
                ]),
                args(&[
                    "-p",
                    "tcp",
                    "-m",
                    "multiport",
                    "--sports",
                    "8080,80",
                    "-d",
                    "10.0.0.1/32",
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    "7"
                ]),
            ]
        );
        assert_eq!(r.families(), vec![false]);
        assert_eq!(rule(&[]).families(), vec![false, true]);
        assert_eq!(rule(&[]).iptables_rules(true)[0].len(), 10);
        assert_eq!(
            rule(&["198.18.1.0/24", "fd00::/8"]).ss_filter(),
            args(&[
                "( sport = :8080 or sport = :80 )",
                "and",
                "( dst 198.18.1.0/24 or dst [fd00::]/8 )"
            ])
        );
        assert_eq!(
            rule(&[]).ss_filter(),
            args(&["( sport = :8080 or sport = :80 )"])
        );
        assert_eq!(r.chain(), "TCPKIT-INTERCEPT-7");
    }
}
