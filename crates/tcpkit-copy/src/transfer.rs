//! The `-x` copy rules (tcpcopy's "transfers"): which production server ports are copied,
//! and to which target.
//!
//! A rule reads `[srcIP:]port-targetIP:port` (tcpcopy's syntax): sessions whose server is
//! `port` (on `srcIP` only, when given) are replayed to `targetIP:port`. Several rules are
//! separated by commas or given in several `-x`. IPv6 addresses go in brackets:
//! `[fd00::1]:80-[fd00::2]:8080`. From the rules come the server ports the reassembler tracks
//! and the kernel filter expression of the live capture, which also leaves out the copy's own
//! connections to the targets (a target on a copied port would otherwise be copied again).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// One `-x` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Only sessions to this server address (the online host's), when given.
    pub server_ip: Option<IpAddr>,
    /// The production server port.
    pub port: u16,
    /// Where the sessions are replayed.
    pub target: SocketAddr,
}

/// Why a rule does not parse; `Display` quotes the rule and says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule '{rule}': {why}")]
pub struct RuleError {
    pub rule: String,
    pub why: String,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.server_ip {
            Some(IpAddr::V4(ip)) => write!(f, "{ip}:")?,
            Some(IpAddr::V6(ip)) => write!(f, "[{ip}]:")?,
            None => {}
        }
        write!(f, "{}-{}", self.port, self.target)
    }
}

fn port(text: &str, what: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("{what} '{text}' is not a port from 1 to 65535")),
        Ok(p) => Ok(p),
    }
}

impl Rule {
    /// Parses one rule (no commas).
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let err = |why: String| RuleError {
            rule: text.to_string(),
            why,
        };
        let expected = "expected [srcIP:]port-targetIP:port, like 80-10.0.1.5:8080";
        // The '-' that separates source from target: IPv6 addresses contain no '-'.
        let (src, dst) = text
            .split_once('-')
            .ok_or_else(|| err(format!("no '-' between source and target; {expected}")))?;
        let (server_ip, port) = if src.is_empty() {
            return Err(err(format!("no source port; {expected}")));
        } else if let Ok(p) = src.parse::<u16>() {
            (None, port(&p.to_string(), "source port").map_err(err)?)
        } else {
            let sa = src.parse::<SocketAddr>().map_err(|_| {
                err(format!(
                    "source '{src}' is neither a port nor IP:port; {expected}"
                ))
            })?;
            if sa.port() == 0 {
                return Err(err("source port 0 is not a port from 1 to 65535".into()));
            }
            (Some(sa.ip()), sa.port())
        };
        let target = dst.parse::<SocketAddr>().map_err(|_| {
            err(format!(
                "target '{dst}' is not IP:port ([IPv6]:port); {expected}"
            ))
        })?;
        if target.port() == 0 {
            return Err(err("target port 0 is not a port from 1 to 65535".into()));
        }
        if target.ip().is_unspecified() || target.ip().is_multicast() {
            return Err(err(format!(
                "target address {} cannot be connected to",
                target.ip()
            )));
        }
        Ok(Rule {
            server_ip,
            port,
            target,
        })
    }

    /// Whether a session to `server` is copied by this rule.
    pub fn matches(&self, server: SocketAddr) -> bool {
        server.port() == self.port && self.server_ip.is_none_or(|ip| ip == server.ip())
    }
}

/// Parses comma-separated rules (from one or several `-x`); an empty list is an error, and so
/// is a server both copied and a target (the copy would copy itself).
pub fn parse_rules<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<Vec<Rule>, RuleError> {
    let mut rules = Vec::new();
    for text in texts {
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(RuleError {
                    rule: text.to_string(),
                    why: "empty rule between commas".into(),
                });
            }
            let r = Rule::parse(part)?;
            if let Some(prev) = rules.iter().find(|p: &&Rule| overlap(p, &r)) {
                return Err(RuleError {
                    rule: part.to_string(),
                    why: format!("copies the same server as rule '{prev}'"),
                });
            }
            rules.push(r);
        }
    }
    if rules.is_empty() {
        return Err(RuleError {
            rule: String::new(),
            why: "no rule given".into(),
        });
    }
    for r in &rules {
        if let Some(loop_rule) = rules
            .iter()
            .find(|o| o.matches(r.target) && o.server_ip.is_some())
        {
            return Err(RuleError {
                rule: loop_rule.to_string(),
                why: format!("copies the target {} of rule '{r}' to itself", r.target),
            });
        }
    }
    Ok(rules)
}

fn overlap(a: &Rule, b: &Rule) -> bool {
    a.port == b.port
        && match (a.server_ip, b.server_ip) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        }
}

/// The rule copying sessions to `server`, if any. Sessions to one of the targets are never
/// copied (they are the copy's own connections, or another copy's).
pub fn rule_for(rules: &[Rule], server: SocketAddr) -> Option<&Rule> {
    if rules.iter().any(|r| r.target == server) {
        return None;
    }
    rules.iter().find(|r| r.matches(server))
}

/// The server ports the reassembler tracks.
pub fn server_ports(rules: &[Rule]) -> Vec<u16> {
    let mut p: Vec<u16> = rules.iter().map(|r| r.port).collect();
    p.sort_unstable();
    p.dedup();
    p
}

/// The tcpdump expression of the live capture: TCP to or from each copied server, and not
/// the copy's own connections to the targets; and `extra` (`-F`) when given.
pub fn capture_filter(rules: &[Rule], extra: Option<&str>) -> String {
    let wanted: Vec<String> = rules
        .iter()
        .map(|r| match r.server_ip {
            Some(ip) => format!("(host {ip} and port {})", r.port),
            None => format!("port {}", r.port),
        })
        .collect();
    let mut targets: Vec<String> = rules
        .iter()
        .map(|r| format!("(host {} and port {})", r.target.ip(), r.target.port()))
        .collect();
    targets.sort();
    targets.dedup();
    let own = format!(
        "tcp and ({}) and not ({})",
        wanted.join(" or "),
        targets.join(" or ")
    );
    match extra.map(str::trim).filter(|e| !e.is_empty()) {
        Some(e) => format!("({own}) and ({e})"),
        None => own,
    }
}

/// Whether `-F`'s expression compiles (as part of the capture's filter), so a bad one is a
/// usage error before anything opens; libpcap's reason when it does not.
pub fn check_filter(rules: &[Rule], expr: &str) -> Result<(), String> {
    tcpkit_capture::compile_filter(
        &capture_filter(rules, Some(expr)),
        tcpkit_capture::LINKTYPE_ETHERNET,
        65535,
    )
    .map(drop)
    .map_err(|e| match e {
        tcpkit_capture::CaptureError::Filter { reason, .. } => reason,
        e => e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn port_and_address_forms_parse() {
        let r = Rule::parse("80-10.0.1.5:8080").unwrap();
        assert_eq!(
            r,
            Rule {
                server_ip: None,
                port: 80,
                target: sa("10.0.1.5:8080")
            }
        );
        assert_eq!(r.to_string(), "80-10.0.1.5:8080");
        let r = Rule::parse("10.0.0.1:80-10.0.1.5:80").unwrap();
        assert_eq!(r.server_ip, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(r.to_string(), "10.0.0.1:80-10.0.1.5:80");
        let r = Rule::parse("[fd00::1]:443-[fd00::2]:8443").unwrap();
        assert_eq!(r.target, sa("[fd00::2]:8443"));
        assert_eq!(r.to_string(), "[fd00::1]:443-[fd00::2]:8443");
        let rs =
            parse_rules(["80-10.0.1.5:8080, 6379-10.0.1.5:6379", "3306-10.0.1.6:3306"]).unwrap();
        assert_eq!(rs.len(), 3);
        assert_eq!(server_ports(&rs), vec![80, 3306, 6379]);
    }

    #[test]
    fn bad_rules_say_what_was_expected() {
        let e = |t: &str| parse_rules([t]).unwrap_err().to_string();
        assert!(e("80").contains("no '-'"), "{}", e("80"));
        assert!(e("-1.2.3.4:80").contains("no source port"));
        assert!(e("x-1.2.3.4:80").contains("source 'x'"));
        assert!(e("0-1.2.3.4:80").contains("source port"));
        assert!(e("70000-1.2.3.4:80").contains("source"));
        assert!(e("80-1.2.3.4").contains("target '1.2.3.4' is not IP:port"));
        assert!(e("80-1.2.3.4:0").contains("target port 0"));
        assert!(e("80-0.0.0.0:80").contains("cannot be connected to"));
        assert!(e("80-1.2.3.4:80,").contains("empty rule"));
        assert!(e("80-1.2.3.4:80,80-1.2.3.5:80").contains("same server"));
        assert!(e("1.2.3.4:80-1.2.3.4:80").contains("to itself"));
        assert_eq!(
            e("80-x:1"),
            "rule '80-x:1': target 'x:1' is not IP:port ([IPv6]:port); expected [srcIP:]port-targetIP:port, like 80-10.0.1.5:8080"
        );
        assert!(parse_rules([]).unwrap_err().to_string().contains("no rule"));
    }

    #[test]
    fn matching_and_the_copy_never_copies_its_own_connections() {
        let rs = parse_rules(["10.0.0.1:80-10.0.1.5:80,6379-10.0.1.5:6379"]).unwrap();
        assert_eq!(
            rule_for(&rs, sa("10.0.0.1:80")).unwrap().target,
            sa("10.0.1.5:80")
        );
        assert!(rule_for(&rs, sa("10.0.0.2:80")).is_none());
        assert_eq!(rule_for(&rs, sa("10.9.9.9:6379")).unwrap().port, 6379);
        // The target itself listens on a copied port: its sessions are the copy's own.
        assert!(rule_for(&rs, sa("10.0.1.5:6379")).is_none());
        assert_eq!(
            capture_filter(&rs, None),
            "tcp and ((host 10.0.0.1 and port 80) or port 6379) and not \
             ((host 10.0.1.5 and port 6379) or (host 10.0.1.5 and port 80))"
        );
        // -F narrows it; whatever its `or`s, the rules' part still holds.
        assert_eq!(
            capture_filter(&rs, Some("src net 10.1.0.0/16 or src host 10.2.0.1")),
            "(tcp and ((host 10.0.0.1 and port 80) or port 6379) and not \
             ((host 10.0.1.5 and port 6379) or (host 10.0.1.5 and port 80))) and \
             (src net 10.1.0.0/16 or src host 10.2.0.1)"
        );
        assert_eq!(capture_filter(&rs, Some(" ")), capture_filter(&rs, None));
    }

    #[test]
    fn the_filter_compiles() {
        let rs = parse_rules(["[fd00::1]:80-[fd00::2]:80,8080-198.18.0.2:8080"]).unwrap();
        tcpkit_capture::compile_filter(
            &capture_filter(&rs, Some("not host 10.9.9.9")),
            tcpkit_capture::LINKTYPE_ETHERNET,
            65535,
        )
        .unwrap();
    }
}
