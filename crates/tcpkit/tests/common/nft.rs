//! A host that answers nothing on a port: an nftables rule in its input path drops every
//! segment to it, the way a host behind a firewall (or one that is off) looks to a client.

use tcpkit_lab::Host;

/// Drops every TCP segment to `port` arriving at `host`.
pub fn drop_tcp_to(host: &Host, port: u16) {
    let port = port.to_string();
    for rule in [
        &["nft", "add", "table", "inet", "lab"][..],
        &[
            "nft", "add", "chain", "inet", "lab", "in", "{", "type", "filter", "hook", "input",
            "priority", "0", ";", "}",
        ],
        &[
            "nft", "add", "rule", "inet", "lab", "in", "tcp", "dport", &port, "drop",
        ],
    ] {
        host.run(rule).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Takes [`drop_tcp_to`]'s rules away again.
pub fn stop_dropping(host: &Host) {
    host.run(&["nft", "delete", "table", "inet", "lab"])
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A table of a test's own in `host` with one base chain (named after its hook), for the
/// fault a test injects: lost SYNs, lost answer segments, a send refused on the copy's host.
pub struct Chain<'a> {
    host: &'a Host,
    table: String,
    hook: String,
}

impl<'a> Chain<'a> {
    /// Creates table `table` with a filter chain at `hook` (`input`, `output`).
    pub fn new(host: &'a Host, table: &str, hook: &str) -> Chain<'a> {
        let c = Chain {
            host,
            table: table.to_string(),
            hook: hook.to_string(),
        };
        c.nft(&["add", "table", "inet", table]);
        c.nft(&[
            "add", "chain", "inet", table, hook, "{", "type", "filter", "hook", hook, "priority",
            "0", ";", "}",
        ]);
        c
    }

    /// Appends a rule: `words` as nft takes them after `add rule inet TABLE CHAIN`.
    pub fn rule(&self, words: &[&str]) {
        let mut a = vec!["add", "rule", "inet", &self.table, &self.hook];
        a.extend_from_slice(words);
        self.nft(&a);
    }

    /// The packets the chain's first `counter` counted, and the chain's listing (for messages).
    pub fn packets(&self) -> (u64, String) {
        let rules = self.nft(&["list", "chain", "inet", &self.table, &self.hook]);
        let n = rules
            .split("packets ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no counter in {rules}"));
        (n, rules)
    }

    fn nft(&self, args: &[&str]) -> String {
        let mut a = vec!["nft"];
        a.extend_from_slice(args);
        let o = self.host.run(&a).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&o.stdout).to_string()
    }
}
