//! The agent's side (`load` and `replay` with `--barrier`): reach the barrier (retrying while
//! it is not up yet, for [`AgentConfig::patience`]), check its proof of the key and prove ours
//! with our claim (shard, host), then a thread of its own keeps the connection: a beat every
//! [`crate::BEAT`], the clock samples and Ready when the job is prepared, the start instant
//! converted to this host's clock, and a Stop (or a barrier lost: closed, or silent for the
//! bound its welcome gave, its `--lost-after`) turned into the job's stop flag with the reason
//! kept for its report.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tcpkit_keyfile::proof::Key;

use crate::clock::{self, wall_ns, Sample};
use crate::wire::{Msg, Shard, HDR, MAX_BODY, RUN_ID_LEN, VERSION};
use crate::{auth, hex, FleetReport, BEAT, LOST_AFTER_MAX, LOST_AFTER_MIN};

/// How an agent reaches its barrier.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `--barrier HOST:PORT`, as given.
    pub barrier: String,
    /// `--barrier-key`'s key.
    pub key: Key,
    /// The shard this agent claims (`--shard`).
    pub shard: Option<Shard>,
    /// This host's name, as the barrier reports it.
    pub host: String,
    /// How long to keep trying to reach a barrier that is not listening yet (agents and
    /// barrier are started together, in no order).
    pub patience: Duration,
}

/// Why an agent could not join its barrier.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The barrier could not be reached within the patience.
    #[error("--barrier {barrier}: cannot reach it within {secs} s")]
    Reach {
        /// `--barrier` as given.
        barrier: String,
        /// The patience, in seconds.
        secs: u64,
        /// The last error.
        #[source]
        source: io::Error,
    },
    /// The barrier refused this agent, or proved another key, or spoke out of turn.
    #[error("--barrier {barrier}: {why}")]
    Refused {
        /// `--barrier` as given.
        barrier: String,
        /// Why.
        why: String,
    },
}

enum Cmd {
    Ready,
    NotReady(String),
    Done {
        actual_start: u64,
        failure: Option<String>,
    },
}

#[derive(Debug, Default)]
struct State {
    offset: Option<(i64, u64)>,
    /// The start instant on this host's wall clock.
    start: Option<u64>,
    stopped_by: Option<String>,
    ended: bool,
}

/// A joined agent. Its thread keeps the barrier's connection until [`Agent::done`].
#[derive(Debug)]
pub struct Agent {
    barrier: String,
    host: String,
    run_id: [u8; RUN_ID_LEN],
    tx: Mutex<Sender<Cmd>>,
    state: Arc<(Mutex<State>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cmd")
    }
}

/// A blocking reader of whole frames.
struct Frames {
    sock: TcpStream,
    buf: Vec<u8>,
}

impl Frames {
    /// The next frame, with when its last bytes arrived; `Ok(None)` on a read timeout.
    fn next(&mut self) -> io::Result<Option<(Vec<u8>, u64)>> {
        let mut got = [0u8; 1024];
        loop {
            match Msg::parse(&self.buf) {
                Ok(Some((_, used))) => {
                    let frame: Vec<u8> = self.buf.drain(..used).collect();
                    return Ok(Some((frame, wall_ns())));
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            debug_assert!(self.buf.len() < HDR + MAX_BODY);
            match self.sock.read(&mut got) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "its connection closed",
                    ))
                }
                Ok(n) => self.buf.extend_from_slice(&got[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn send(&mut self, m: &Msg<'_>) -> io::Result<()> {
        let mut b = Vec::with_capacity(m.buffer_len());
        m.emit(&mut b);
        self.sock.write_all(&b)
    }
}

fn connect(cfg: &AgentConfig) -> Result<TcpStream, AgentError> {
    let deadline = Instant::now() + cfg.patience;
    loop {
        let tried = cfg
            .barrier
            .to_socket_addrs()
            .and_then(|mut a| {
                a.next()
                    .ok_or_else(|| io::Error::other("resolves to no address"))
            })
            .and_then(|a: SocketAddr| TcpStream::connect_timeout(&a, Duration::from_secs(2)));
        match tried {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(AgentError::Reach {
                    barrier: cfg.barrier.clone(),
                    secs: cfg.patience.as_secs(),
                    source: e,
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

impl Agent {
    /// Joins the barrier: the key exchange and the claim, then the connection's thread.
    /// `stop` is the job's stop flag: set when the barrier says stop or is lost.
    pub fn join(cfg: &AgentConfig, stop: &'static AtomicBool) -> Result<Agent, AgentError> {
        let refused = |why: String| AgentError::Refused {
            barrier: cfg.barrier.clone(),
            why,
        };
        let sock = connect(cfg)?;
        let _ = sock.set_nodelay(true);
        let io_err = |e: io::Error| refused(format!("during the key exchange: {e}"));
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(io_err)?;
        sock.set_write_timeout(Some(Duration::from_secs(5)))
            .map_err(io_err)?;
        let mut f = Frames {
            sock,
            buf: Vec::new(),
        };
        let nonce = tcpkit_keyfile::proof::nonce().map_err(io_err)?;
        f.send(&Msg::Hello {
            version: VERSION,
            nonce,
        })
        .map_err(io_err)?;
        let expect = |f: &mut Frames| -> Result<Vec<u8>, AgentError> {
            match f.next().map_err(io_err)? {
                Some((b, _)) => Ok(b),
                None => Err(refused("did not answer within 5 s".into())),
            }
        };
        let b = expect(&mut f)?;
        let (bnonce, proof) = match Msg::parse(&b) {
            Ok(Some((Msg::Challenge { nonce, proof }, _))) => (nonce, proof),
            Ok(Some((Msg::Refuse { reason }, _))) => return Err(refused(reason.into())),
            other => return Err(refused(format!("answered {other:?} to its hello"))),
        };
        if !auth::verify_barrier(&cfg.key, &nonce, &bnonce, &proof) {
            return Err(refused(
                "holds another key than --barrier-key: give the barrier's --key-file and every agent's --barrier-key the same key".into(),
            ));
        }
        let tag = auth::agent_proof(&cfg.key, &nonce, &bnonce, cfg.shard, &cfg.host);
        f.send(&Msg::Join {
            proof: tag,
            shard: cfg.shard,
            host: &cfg.host,
        })
        .map_err(io_err)?;
        let b = expect(&mut f)?;
        let (run_id, lost_after) = match Msg::parse(&b) {
            Ok(Some((
                Msg::Welcome {
                    run_id,
                    lost_after_ms,
                    ..
                },
                _,
            ))) => {
                let d = Duration::from_millis(u64::from(lost_after_ms));
                if !(LOST_AFTER_MIN..=LOST_AFTER_MAX).contains(&d) {
                    return Err(refused(format!(
                        "gave {lost_after_ms} ms as its --lost-after, outside {} to {} ms",
                        LOST_AFTER_MIN.as_millis(),
                        LOST_AFTER_MAX.as_millis()
                    )));
                }
                (run_id, d)
            }
            Ok(Some((Msg::Refuse { reason }, _))) => {
                return Err(refused(format!("refused this agent: {reason}")))
            }
            other => return Err(refused(format!("answered {other:?} to its join"))),
        };
        f.sock.set_write_timeout(Some(lost_after)).map_err(io_err)?;
        // The thread wakes at least this often to beat and to take the job's commands.
        f.sock
            .set_read_timeout(Some(Duration::from_millis(20)))
            .map_err(io_err)?;
        let (tx, rx) = mpsc::channel();
        let state = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let st = Arc::clone(&state);
        let barrier = cfg.barrier.clone();
        let thread = std::thread::Builder::new()
            .name("tcpkit-fleet-agent".into())
            .spawn(move || keep(f, &rx, &st, stop, &barrier, lost_after))
            .map_err(|e| refused(format!("start its thread: {e}")))?;
        Ok(Agent {
            barrier: cfg.barrier.clone(),
            host: cfg.host.clone(),
            run_id,
            tx: Mutex::new(tx),
            state,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn cmd(&self, c: Cmd) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(c);
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prepared: measures the clock offset, then tells the barrier.
    pub fn ready(&self) {
        self.cmd(Cmd::Ready);
    }

    /// Cannot get ready: tells the barrier why (it fails the fleet run, naming this agent).
    pub fn not_ready(&self, why: &str) {
        self.cmd(Cmd::NotReady(why.to_string()));
    }

    /// The start instant on this host's wall clock, once the barrier gave it.
    pub fn start(&self) -> Option<u64> {
        self.state().start
    }

    /// Waits for the start instant (this host's wall clock); None when there will be none:
    /// the barrier stopped this agent or was lost ([`Agent::stopped_by`] says why), or `stop`
    /// was set (a signal).
    pub fn wait_start(&self, stop: &AtomicBool) -> Option<u64> {
        let (m, cv) = &*self.state;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if s.stopped_by.is_some() || stop.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(at) = s.start {
                return Some(at);
            }
            s = cv
                .wait_timeout(s, Duration::from_millis(10))
                .map_or_else(|e| e.into_inner().0, |r| r.0);
        }
    }

    /// The job's failure line when the barrier stopped it early: whom the barrier named, or
    /// that the barrier was lost.
    pub fn failure(&self) -> Option<String> {
        self.state().stopped_by.as_ref().map(|w| {
            if w.starts_with("lost the barrier") {
                w.clone()
            } else {
                format!("stopped by the barrier: {w}")
            }
        })
    }

    /// Why the barrier stopped this agent early (naming the agent that failed), or why the
    /// barrier is lost.
    pub fn stopped_by(&self) -> Option<String> {
        self.state().stopped_by.clone()
    }

    /// The report's `fleet` object, with when the first query or frame went out.
    pub fn report(&self, actual_start_unix_ns: u64) -> FleetReport {
        let s = self.state();
        let (offset, rtt) = s.offset.unwrap_or((0, 0));
        FleetReport {
            run_id: hex(&self.run_id),
            controller: self.barrier.clone(),
            host: self.host.clone(),
            clock_offset_ns: offset,
            offset_rtt_ns: rtt,
            intended_start_unix_ns: s.start.unwrap_or(0),
            actual_start_unix_ns,
            stopped_by: s.stopped_by.clone(),
        }
    }

    /// The run ended: tells the barrier (with when it started and its failure) and closes.
    pub fn done(&self, actual_start: u64, failure: Option<&str>) {
        self.cmd(Cmd::Done {
            actual_start,
            failure: failure.map(str::to_string),
        });
        let t = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// The connection's thread: runs until the job's Done, or the barrier is lost.
fn keep(
    mut f: Frames,
    rx: &Receiver<Cmd>,
    st: &(Mutex<State>, Condvar),
    stop: &AtomicBool,
    barrier: &str,
    lost_after: Duration,
) {
    let set = |g: &dyn Fn(&mut State)| {
        let mut s = st.0.lock().unwrap_or_else(|e| e.into_inner());
        g(&mut s);
        st.1.notify_all();
    };
    let lost = |why: String| {
        set(&|s: &mut State| {
            if s.stopped_by.is_none() && !s.ended {
                s.stopped_by = Some(format!("lost the barrier {barrier}: {why}"));
                stop.store(true, Ordering::SeqCst);
            }
        });
    };
    let mut heard = Instant::now();
    let mut next_beat = Instant::now() + BEAT;
    let mut samples: Option<Vec<Sample>> = None;
    loop {
        while let Ok(c) = rx.try_recv() {
            let sent = match c {
                Cmd::Ready => {
                    samples = Some(Vec::with_capacity(clock::SAMPLES));
                    f.send(&Msg::TimeReq { t1: wall_ns() })
                }
                Cmd::NotReady(why) => {
                    // The barrier closing on this agent now is its answer, not a loss: the
                    // job's own reason stays its failure.
                    set(&|s: &mut State| s.ended = true);
                    f.send(&Msg::NotReady { why: &why })
                }
                Cmd::Done {
                    actual_start,
                    failure,
                } => {
                    set(&|s: &mut State| s.ended = true);
                    let _ = f.send(&Msg::Done {
                        actual_start_ns: actual_start,
                        failure: failure.as_deref(),
                    });
                    let _ = f.sock.shutdown(Shutdown::Write);
                    return;
                }
            };
            if let Err(e) = sent {
                return lost(format!("write: {e}"));
            }
        }
        let got = match f.next() {
            Ok(g) => g,
            Err(e) => return lost(e.to_string()),
        };
        let now = Instant::now();
        if let Some((b, t4)) = got {
            heard = now;
            let reply = match Msg::parse(&b) {
                Ok(Some((Msg::TimeResp { t1, t2, t3 }, _))) => match &mut samples {
                    Some(v) => {
                        v.push(Sample { t1, t2, t3, t4 });
                        if v.len() < clock::SAMPLES {
                            f.send(&Msg::TimeReq { t1: wall_ns() })
                        } else {
                            let (offset_ns, rtt_ns) = clock::best(v).unwrap_or((0, 0));
                            samples = None;
                            set(&|s: &mut State| s.offset = Some((offset_ns, rtt_ns)));
                            f.send(&Msg::Ready { offset_ns, rtt_ns })
                        }
                    }
                    None => Ok(()),
                },
                Ok(Some((Msg::Start { at_unix_ns }, _))) => {
                    set(&|s: &mut State| {
                        let off = s.offset.map_or(0, |o| o.0);
                        s.start = Some(clock::to_agent(at_unix_ns, off));
                    });
                    Ok(())
                }
                Ok(Some((Msg::Stop { reason }, _))) => {
                    set(&|s: &mut State| {
                        if s.stopped_by.is_none() {
                            s.stopped_by = Some(reason.to_string());
                        }
                        stop.store(true, Ordering::SeqCst);
                    });
                    Ok(())
                }
                Ok(Some((Msg::Beat, _))) => Ok(()),
                other => return lost(format!("it sent {other:?}")),
            };
            if let Err(e) = reply {
                return lost(format!("write: {e}"));
            }
        }
        if now.duration_since(heard) > lost_after {
            return lost(format!("silent for {} ms", lost_after.as_millis()));
        }
        if now >= next_beat {
            next_beat = now + BEAT;
            if let Err(e) = f.send(&Msg::Beat) {
                return lost(format!("write: {e}"));
            }
        }
    }
}
