//! `tcpkit barrier`: the controller of a fleet run (tcpkit-fleet's barrier): flags, the key
//! file, the start line on stderr, the report.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::Parser;
use tcpkit_fleet::{BarrierConfig, BarrierReport};

use crate::common::{self, duration_arg, OutputFlags};
use crate::Failure;

/// Start agents on many hosts at one instant, and watch them: waits for --agents N agents
/// (`tcpkit load|replay --barrier HOST:PORT --barrier-key FILE --shard K/N`), authenticated by
/// the shared key, one per shard (a second agent claiming a shard already taken is refused, so
/// a retried pod is never counted twice). Each agent prepares (opens its connections, reads its
/// files, maps its capture), measures its clock against the barrier's (the smallest of 8
/// timestamped round trips) and says ready; once every one is, the barrier gives one start
/// instant, 100 ms plus twice the largest round trip ahead, and says on stderr
/// `tcpkit barrier: all N agents ready, start at <RFC 3339>`. During the run each side beats
/// every 250 ms from the join on; an agent is lost at once when its connection closes or
/// resets, or after --lost-after silent (10 s by default). An agent not ready by --ready-timeout, one that says it cannot get ready, or one
/// lost before its run ended fails the fleet run: the others are told to stop, and the barrier
/// exits 1 naming it (`shard K/N on HOST`) and why. Exit 0 once every agent has ended its run
/// (each one's own verdict is in its report, and in this one's agents[].failure).
///
/// Every connection is bounded: at most N agents plus 8 handshakes at once (more are closed),
/// 3 s to prove the key, frames of at most 559 bytes; a wrong key is closed without a word and
/// counted (auth_failures).
#[derive(Debug, Parser)]
pub struct Args {
    /// Where agents reach the barrier, e.g. 0.0.0.0:7300.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,

    /// How many agents make the fleet run (1 to 10000).
    #[arg(long, value_name = "N")]
    pub agents: u32,

    /// The pre-shared key every agent gives as --barrier-key: a regular file readable by its
    /// owner alone, at least 16 bytes (`openssl rand -base64 32 > FILE; chmod 600 FILE`).
    #[arg(long, value_name = "FILE")]
    pub key_file: PathBuf,

    /// From the barrier's start to every agent ready (joined, prepared, clock measured).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration_arg)]
    pub ready_timeout: Duration,

    /// An agent not heard for this long is lost, and an agent that has not heard the barrier
    /// for this long stops (the barrier gives this bound to every agent when it joins, so both
    /// ends use one). A closed or reset connection is lost at once, whatever this says. The
    /// default holds through a heavy preparation on a loaded host (tens of thousands of
    /// connects, which have silenced a healthy connection for over 2 s); lower it to find a
    /// host whose path went quiet sooner. 1s to 10m.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_arg)]
    pub lost_after: Duration,

    #[command(flatten)]
    pub out: OutputFlags,
}

/// Most agents one barrier takes.
const MAX_AGENTS: u32 = 10_000;

pub fn resolve(a: &Args) -> Result<BarrierConfig, Failure> {
    if !(1..=MAX_AGENTS).contains(&a.agents) {
        return Err(Failure::Usage(format!(
            "--agents {}: must be 1 to {MAX_AGENTS}",
            a.agents
        )));
    }
    if a.ready_timeout.is_zero() {
        return Err(Failure::Usage("--ready-timeout: must be above 0".into()));
    }
    let (min, max) = (tcpkit_fleet::LOST_AFTER_MIN, tcpkit_fleet::LOST_AFTER_MAX);
    if !(min..=max).contains(&a.lost_after) {
        return Err(Failure::Usage(format!(
            "--lost-after {} ms: must be {} s to {} s",
            a.lost_after.as_millis(),
            min.as_secs(),
            max.as_secs()
        )));
    }
    Ok(BarrierConfig {
        listen: a.listen,
        agents: a.agents,
        key: crate::fleet::read_key("--key-file", &a.key_file)?,
        ready_timeout: a.ready_timeout,
        lost_after: a.lost_after,
    })
}

pub fn main(args: Args, interrupt: &'static AtomicBool) -> Result<(), Failure> {
    let cfg = resolve(&args)?;
    let say = |l: &str| eprintln!("tcpkit barrier: {l}");
    let report: BarrierReport = tcpkit_fleet::barrier::run(&cfg, interrupt, &say)
        .map_err(|e| Failure::Runtime(crate::chain(&e)))?;
    common::finish(&report, &args.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<BarrierConfig, String> {
        common::resolved(&[&["barrier"], args].concat(), resolve)
    }

    #[test]
    fn every_flag_parses_and_each_bad_value_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let key = d.path().join("k");
        std::fs::write(&key, "0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = key.to_str().unwrap();
        let base = [
            "--listen",
            "127.0.0.1:7300",
            "--agents",
            "3",
            "--key-file",
            k,
        ];
        let c = parse(&base).unwrap();
        assert_eq!(c.agents, 3);
        assert_eq!(c.ready_timeout, Duration::from_secs(60));
        assert_eq!(c.listen, "127.0.0.1:7300".parse().unwrap());
        let c = parse(&[&base[..], &["--ready-timeout", "500ms"]].concat()).unwrap();
        assert_eq!(c.ready_timeout, Duration::from_millis(500));
        let e = parse(&[
            "--listen",
            "127.0.0.1:7300",
            "--agents",
            "0",
            "--key-file",
            k,
        ]);
        assert!(e.unwrap_err().starts_with("--agents 0: must be 1 to"));
        assert_eq!(c.lost_after, tcpkit_fleet::LOST_AFTER);
        let c = parse(&[&base[..], &["--lost-after", "3s"]].concat()).unwrap();
        assert_eq!(c.lost_after, Duration::from_secs(3));
        for bad in ["500ms", "11m"] {
            let e = parse(&[&base[..], &["--lost-after", bad]].concat()).unwrap_err();
            assert!(
                e.starts_with("--lost-after ") && e.contains("must be 1 s to 600 s"),
                "{e}"
            );
        }
        let e = parse(&[&base[..], &["--ready-timeout", "0s"]].concat()).unwrap_err();
        assert!(e.starts_with("--ready-timeout"), "{e}");
        let e = parse(&[&base[..], &["--ready-timeout", "soon"]].concat()).unwrap_err();
        assert!(e.contains("--ready-timeout"), "{e}");
        let e = parse(&["--listen", "nowhere", "--agents", "3", "--key-file", k]).unwrap_err();
        assert!(e.contains("--listen"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = parse(&base).unwrap_err();
        assert!(
            e.starts_with("--key-file ") && e.contains("chmod 600"),
            "{e}"
        );
        let e = parse(&[
            "--listen",
            "127.0.0.1:1",
            "--agents",
            "1",
            "--key-file",
            "/nonexistent",
        ]);
        assert!(e.unwrap_err().starts_with("--key-file /nonexistent: "));
    }
}
