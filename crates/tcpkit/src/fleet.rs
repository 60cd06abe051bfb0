//! The agent's flags `load` and `replay` share (`--barrier`, `--barrier-key`, `--shard`),
//! resolved once: the key file read under tcpkit-keyfile's rules, the shard parsed, and the
//! barrier joined (tcpkit-fleet's agent) before the job prepares.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tcpkit_fleet::{Agent, AgentConfig};
use tcpkit_keyfile::proof::Key;

use crate::Failure;

/// How long an agent keeps trying to reach a barrier that is not listening yet.
const PATIENCE: Duration = Duration::from_secs(60);

/// Flattened into `load` and `replay`.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct AgentFlags {
    /// Join the fleet run of the barrier at HOST:PORT (`tcpkit barrier`): prepare (open the
    /// connections, read the files, map the capture), say ready, and start at the one instant
    /// the barrier gives once every agent is ready. A barrier not listening yet is retried for
    /// 60 s. Stopped early, with the agent that failed named in the report's fleet.stopped_by,
    /// when another agent fails or the barrier is lost (closed, or silent for the barrier's
    /// --lost-after, which it gives every agent): exit 1.
    #[arg(long, value_name = "HOST:PORT", requires = "barrier_key")]
    pub barrier: Option<String>,

    /// The barrier's pre-shared key (as its --key-file): a regular file readable by its owner
    /// alone, at least 16 bytes (`openssl rand -base64 32 > FILE; chmod 600 FILE`).
    #[arg(long, value_name = "FILE", requires = "barrier")]
    pub barrier_key: Option<PathBuf>,

    /// This agent's part of a run several hosts share, from one command line for all: shard K
    /// of N (K from 1, as jest's and playwright's --shard 1/3). What a shard takes is the
    /// job's (load: its share of -c, -n and the rates, the --qname-file names numbered K-1
    /// modulo N; replay: the frames of the flows whose key hashes to K, each at its time in the
    /// whole replay). With --barrier, the barrier admits one agent per shard.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<String>,
}

/// Reads a key file named by `flag`; every rule it breaks is a usage error naming both.
pub(crate) fn read_key(flag: &str, path: &Path) -> Result<Key, Failure> {
    Key::from_file(path).map_err(|e| {
        let why = match e {
            tcpkit_keyfile::KeyFileError::Read(e) => e.to_string(),
            tcpkit_keyfile::KeyFileError::Bad(why) => why,
        };
        Failure::Usage(format!("{flag} {}: {why}", path.display()))
    })
}

impl AgentFlags {
    /// Joins the barrier when `--barrier` is given (a failure to reach it, a refusal, another
    /// key: exit 1 with why); None without it.
    pub(crate) fn join(&self, stop: &'static AtomicBool) -> Result<Option<Agent>, Failure> {
        let (Some(barrier), Some(key)) = (&self.barrier, &self.barrier_key) else {
            return Ok(None);
        };
        let key = read_key("--barrier-key", key)?;
        let cfg = AgentConfig {
            barrier: barrier.clone(),
            key,
            shard: crate::common::shard(self.shard.as_deref())?,
            host: tcpkit_fleet::hostname(),
            patience: PATIENCE,
        };
        Agent::join(&cfg, stop)
            .map(Some)
            .map_err(|e| Failure::Runtime(crate::chain(&e)))
    }
}

/// What an agent tells its barrier when the job cannot get ready: the job's own failure line,
/// passed on as it is returned.
pub(crate) fn not_ready(agent: Option<&Agent>, f: Failure) -> Failure {
    if let Some(a) = agent {
        a.not_ready(f.message());
        // The barrier's Stop, if it comes, is not this agent's news: it already knows why.
        a.done(0, Some(f.message()));
    }
    f
}
