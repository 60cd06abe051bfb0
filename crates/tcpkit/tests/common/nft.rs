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
#[allow(
    dead_code,
    reason = "only some of the test files that include this module use it"
)]
pub fn stop_dropping(host: &Host) {
    host.run(&["nft", "delete", "table", "inet", "lab"])
        .unwrap_or_else(|e| panic!("{e}"));
}
