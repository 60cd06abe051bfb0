//! `tcpkit intercept`: what the user typed (clap), the resolved `tcpkit_copy::intercept`
//! configuration, and how the run is shown (live line, `--stats`, summary or `--json`).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tcpkit_copy::control::DEFAULT_PORT;
use tcpkit_copy::intercept::{self, InterceptConfig, InterceptLive};
use tcpkit_stats::{Monitor, MonitorOptions};

use crate::Failure;

/// On the assistant host of `tcpkit copy --transparent`: catch the target's answers to the
/// copied sessions (the target routes the clients' addresses here) and return their TCP/IP
/// headers (and payload, to a copy that asks: `copy --diff`) to the copies that connect. The answers are never forwarded: forwarding must be
/// off in this host (checked at start and every second). Runs until SIGINT/SIGTERM.
#[derive(Debug, Parser)]
pub struct Args {
    /// Interface the target's answers arrive on.
    #[arg(long = "capture", value_name = "IFACE", required = true)]
    pub capture: String,

    /// tcpdump expression choosing the answers (default: all TCP), e.g. 'src port 8080'.
    /// The control port is always left out.
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,

    /// Address and port copies connect to.
    #[arg(long, value_name = "ADDR:PORT", default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)))]
    pub listen: SocketAddr,

    /// Print the report as one JSON document (docs/schema/intercept.schema.json).
    #[arg(long)]
    pub json: bool,

    /// Print a line of counters every N seconds.
    #[arg(long, value_name = "N")]
    pub stats: Option<f64>,
}

/// Every check that involves a value's meaning.
fn resolve(a: &Args) -> Result<(InterceptConfig, Option<Duration>), Failure> {
    if a.capture.is_empty() || a.capture.len() > 15 {
        return Err(Failure::Usage(format!(
            "--capture '{}': an interface name has 1 to 15 characters",
            a.capture
        )));
    }
    if a.filter.as_deref().is_some_and(|f| f.trim().is_empty()) {
        return Err(Failure::Usage("--filter: empty expression".into()));
    }
    let stats = match a.stats {
        Some(s) if !s.is_finite() || !(0.0..=1e9).contains(&s) => {
            return Err(Failure::Usage(format!(
                "--stats {s}: must be a number of seconds from 0 to 1e9"
            )))
        }
        Some(s) if s > 0.0 => Some(Duration::from_secs_f64(s)),
        _ => None,
    };
    Ok((
        InterceptConfig {
            ifname: a.capture.clone(),
            filter: a.filter.clone(),
            listen: a.listen,
        },
        stats,
    ))
}

pub fn main(args: Args, interrupt: &'static AtomicBool) -> Result<(), Failure> {
    let (cfg, stats) = resolve(&args)?;
    let live = Arc::new(InterceptLive::default());
    let mut monitor = {
        let live = Arc::clone(&live);
        Monitor::start(
            MonitorOptions {
                stats_every: stats,
                progress: !args.json,
            },
            move |elapsed| live.line(elapsed),
        )
    };
    let result = intercept::run(&cfg, interrupt, &live);
    monitor.stop();
    let report = result.map_err(|e| Failure::Runtime(crate::chain(&e)))?;
    let text = if args.json {
        report.json() + "\n"
    } else {
        report.human()
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    match report.failure {
        Some(f) => Err(Failure::Runtime(f)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(InterceptConfig, Option<Duration>), String> {
        let mut v = vec!["intercept"];
        v.extend_from_slice(args);
        let a = Args::try_parse_from(v).map_err(|e| e.to_string())?;
        resolve(&a).map_err(|f| match f {
            Failure::Usage(m) | Failure::Runtime(m) => m,
        })
    }

    #[test]
    fn defaults() {
        let (c, s) = parse(&["--capture", "eth1"]).unwrap();
        assert_eq!(c.ifname, "eth1");
        assert_eq!(c.filter, None);
        assert_eq!(c.listen, "0.0.0.0:36524".parse().unwrap());
        assert_eq!(s, None);
    }

    #[test]
    fn every_flag_parses() {
        let a = Args::try_parse_from([
            "intercept",
            "--capture",
            "eth2",
            "--filter",
            "src port 8080",
            "--listen",
            "198.18.3.2:4000",
            "--json",
            "--stats",
            "0.5",
        ])
        .unwrap();
        assert!(a.json);
        let (c, s) = resolve(&a).map_err(|_| ()).unwrap();
        assert_eq!(c.filter.as_deref(), Some("src port 8080"));
        assert_eq!(c.listen, "198.18.3.2:4000".parse().unwrap());
        assert_eq!(s, Some(Duration::from_millis(500)));
    }

    #[test]
    fn bad_values_say_which_flag() {
        assert!(parse(&[]).unwrap_err().contains("--capture"));
        assert!(parse(&["--capture", "a-very-long-interface-name"])
            .unwrap_err()
            .contains("1 to 15"));
        assert!(parse(&["--capture", "e", "--filter", " "])
            .unwrap_err()
            .contains("--filter"));
        assert!(parse(&["--capture", "e", "--listen", "nowhere"])
            .unwrap_err()
            .contains("--listen"));
        assert!(parse(&["--capture", "e", "--stats=-1"])
            .unwrap_err()
            .contains("--stats -1"));
    }
}
