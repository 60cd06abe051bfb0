//! `tcpkit load`: many TCP connections to one server, queries at an asked rate on an
//! open-loop schedule, each answer's latency from its intended and from its actual send time.
//!
//! The parts: [`Config`] (resolved flags) → [`plan`] (what the host allows: ports × source
//! addresses, file descriptors → processes and threads) → one event loop per thread
//! (`engine`), or several worker processes that each run a share and report back as JSON
//! (`procs`) → one [`LoadReport`], judged: a run that could not do what was asked (no
//! connection, fewer connections than asked, rate not met by more than 1 %, no answers,
//! more timeouts and wrong-ID answers than answers, malformed answers) carries the reason in `failure`.

mod config;
mod engine;
mod interval;
mod outfiles;
mod perquery;
mod procs;
mod profile;
mod proto;
mod sock;
mod tls;
mod wake;

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::report::{
    ConnStats, Histograms, LagStats, LoadReport, PerQueryStats, QueryStats, Rates,
    LOAD_SCHEMA_VERSION,
};
use serde::{Deserialize, Serialize};
use tcpkit_stats::Histogram;

pub use config::{
    check_target, parse_duration, parse_ramp, parse_sources, parse_steps, resolve_target,
    shard_names, ArrivalKind, Config, Payload, Procs, RateProfile, ResponseEnd, MAX_SOURCES,
};
pub use outfiles::hdr_logs;
pub use perquery::HEADER as PER_QUERY_HEADER;
pub use tcpkit_wire::dns::{qtype_from_str, Name as DnsName};
pub use tls::TlsClient;

use tcpkit_workers::{share, share_offset};

/// Why a load run could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("resolve {target}")]
    Resolve {
        target: String,
        #[source]
        source: io::Error,
    },
    /// `-c` above what the host can reach: a usage error, found before any connection.
    #[error("-c {asked}: at most {max} connections can reach {target} from here ({sources} source address{plural} x {ports} local ports in net.ipv4.ip_local_port_range {lo}-{hi}); add addresses with --source or widen the port range (tcpkit tune --role client)")]
    Unreachable {
        asked: u64,
        max: u64,
        target: String,
        sources: u64,
        plural: &'static str,
        ports: u64,
        lo: u16,
        hi: u16,
    },
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// An output file named on the command line cannot be created: a usage error, found
    /// before any connection is opened.
    #[error("{flag} {path}: cannot create")]
    OutFile {
        flag: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}")]
    File {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("worker process {k}: {why}")]
    Worker { k: u32, why: String },
}

impl LoadError {
    /// True for errors about what was asked (exit status 2), not about the run.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            LoadError::Unreachable { .. } | LoadError::OutFile { .. }
        )
    }
}

/// Live counters: one slot per event-loop thread (or per worker process in the parent),
/// written with relaxed stores by their owner and summed by the live line.
#[derive(Debug)]
pub struct LoadCounters {
    slots: Box<[LiveSlot]>,
    /// The limit hints given so far in this process (bits of `sock::hint_bit`): each is said
    /// once, when its limit is first hit.
    hints: AtomicU32,
}

#[derive(Debug, Default)]
pub struct LiveSlot {
    pub open: AtomicU64,
    pub sent: AtomicU64,
    pub answered: AtomicU64,
    pub errors: AtomicU64,
    pub timeouts: AtomicU64,
    pub lag_ns: AtomicU64,
}

/// A sum of the live slots (lag: the largest).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveTotals {
    pub open: u64,
    pub sent: u64,
    pub answered: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub lag_ns: u64,
    /// The limit hints given (a worker's, sent to its parent with its live line).
    #[serde(default)]
    pub hints: u32,
}

/// Slots for threads of one process or worker processes of one run.
const LIVE_SLOTS: usize = 256;

impl Default for LoadCounters {
    fn default() -> Self {
        LoadCounters::new()
    }
}

impl LoadCounters {
    pub fn new() -> LoadCounters {
        LoadCounters {
            slots: (0..LIVE_SLOTS).map(|_| LiveSlot::default()).collect(),
            hints: AtomicU32::new(0),
        }
    }

    pub(crate) fn slot(&self, i: usize) -> &LiveSlot {
        &self.slots[i % LIVE_SLOTS]
    }

    pub fn totals(&self) -> LiveTotals {
        let mut t = LiveTotals::default();
        for s in self.slots.iter() {
            t.open += s.open.load(Ordering::Relaxed);
            t.sent += s.sent.load(Ordering::Relaxed);
            t.answered += s.answered.load(Ordering::Relaxed);
            t.errors += s.errors.load(Ordering::Relaxed);
            t.timeouts += s.timeouts.load(Ordering::Relaxed);
            t.lag_ns = t.lag_ns.max(s.lag_ns.load(Ordering::Relaxed));
        }
        t.hints = self.hints.load(Ordering::Relaxed);
        t
    }

    /// Marks the hints of `bits` as given and passes those not given before to `say`.
    pub(crate) fn give_hints(&self, bits: u32, say: &(dyn Fn(&str) + Sync)) {
        // A load first: errors can come by the thousand, the hint once.
        if self.hints.load(Ordering::Relaxed) & bits == bits {
            return;
        }
        let new = bits & !self.hints.fetch_or(bits, Ordering::Relaxed);
        for h in sock::hints_of(new) {
            say(h);
        }
    }

    pub(crate) fn set(&self, i: usize, t: &LiveTotals) {
        let s = self.slot(i);
        s.open.store(t.open, Ordering::Relaxed);
        s.sent.store(t.sent, Ordering::Relaxed);
        s.answered.store(t.answered, Ordering::Relaxed);
        s.errors.store(t.errors, Ordering::Relaxed);
        s.timeouts.store(t.timeouts, Ordering::Relaxed);
        s.lag_ns.store(t.lag_ns, Ordering::Relaxed);
    }
}

/// What the host allows and how the run is spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Source addresses × local ports.
    pub reachable_max: u64,
    /// Soft `RLIMIT_NOFILE` after raising it to the hard limit.
    pub nofile: u64,
    pub procs: u32,
    /// Event-loop threads per process.
    pub threads: usize,
}

/// Most worker processes.
pub const MAX_PROCS: u32 = 256;

/// Checks `-c` against the reachable maximum, raises `RLIMIT_NOFILE`, and chooses processes
/// (enough that each stays under its descriptor limit, unless `--procs` says) and threads.
pub fn plan(cfg: &Config) -> Result<Plan, LoadError> {
    let (lo, hi) = sock::local_port_range();
    let ports = u64::from(hi - lo) + 1;
    let sources = cfg.sources.len().max(1) as u64;
    let reachable_max = sources * ports;
    if cfg.connections > reachable_max {
        return Err(LoadError::Unreachable {
            asked: cfg.connections,
            max: reachable_max,
            target: cfg.addr.to_string(),
            sources,
            plural: if sources == 1 { "" } else { "es" },
            ports,
            lo,
            hi,
        });
    }
    let nofile = crate::raise_nofile_limit().map_err(|e| LoadError::Io {
        what: "raise RLIMIT_NOFILE",
        source: e,
    })?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let guess_threads = if cfg.threads == 0 { cores } else { cfg.threads };
    let cap = nofile.saturating_sub(sock::fd_margin(guess_threads)).max(1);
    let procs = match (cfg.worker, cfg.procs) {
        (Some(_), _) => 1,
        (None, Procs::Fixed(n)) => n.max(1),
        (None, Procs::Auto) => cfg.connections.div_ceil(cap).clamp(1, u64::from(MAX_PROCS)) as u32,
    };
    let threads = if cfg.threads == 0 {
        (cores / procs as usize).max(1)
    } else {
        cfg.threads
    };
    Ok(Plan {
        reachable_max,
        nofile,
        procs,
        threads,
    })
}

/// Extra facts the verdict quotes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Details {
    pub connect_error: Option<String>,
    pub bad_answer: Option<String>,
    /// When the first query went out (wall clock, Unix ns), for a fleet report.
    #[serde(default)]
    pub first_sent_unix_ns: Option<u64>,
    /// Why this host could not get ready for a fleet run (told to the barrier).
    #[serde(default)]
    pub not_ready: Option<String>,
    /// `--tls`: the address handshakes were tried with, for the line naming their failure.
    #[serde(default)]
    pub tls_peer: Option<String>,
}

/// Runs the load. In a worker (`cfg.worker`), runs its share and prints JSON lines for the
/// parent; with several processes, starts the workers and merges their reports.
///
/// `hint` receives the one-line hint of each limit hit (out of descriptors, out of ports,
/// connects timing out) once, when it is first hit (the binary prints it as `tcpkit load:
/// <hint>`); the report's `hints` has them too. A worker passes its hints to the parent with
/// its live line, and the parent says them (once for all workers).
pub fn run(
    cfg: &Config,
    interrupt: &AtomicBool,
    live: &LoadCounters,
    hint: &(dyn Fn(&str) + Sync),
) -> Result<LoadReport, LoadError> {
    let plan = plan(cfg)?;
    if let Some((k, n)) = cfg.worker {
        let stop = AtomicBool::new(false);
        let result = std::thread::scope(|s| {
            s.spawn(|| procs::live_loop(live, &stop));
            let r = run_share(cfg, &plan, k, n, interrupt, live, &|_| {});
            stop.store(true, Ordering::Relaxed);
            r
        });
        let (report, details) = result?;
        procs::print_final(&report, &details);
        return Ok(report);
    }
    let (mut report, mut details) = if plan.procs > 1 {
        procs::run_parent(cfg, &plan, interrupt, live, hint)?
    } else {
        run_share(cfg, &plan, 0, 1, interrupt, live, hint)?
    };
    // The hints of the whole run's evidence (a worker judged only its own connects).
    let c = &report.connections;
    report.hints = sock::hints_for(
        report.errors.keys().map(String::as_str),
        c.established > 0,
        c.slow,
    )
    .map(str::to_string)
    .collect();
    report.hints.extend(protocol_hint(&report, &cfg.payload));
    report.run_id = crate::run_id::new_run_id();
    // The processes' reports merged into one carry no shard of their own.
    report.shard = cfg.shard;
    if cfg.tls.is_some() {
        details.tls_peer = Some(cfg.addr.to_string());
    }
    judge(&mut report, &details);
    if let Some(agent) = &cfg.fleet {
        let fleet = agent.report(details.first_sent_unix_ns.unwrap_or(0));
        // This host's own not-ready first (the barrier's stop that follows is its echo), then
        // the barrier's word: the agent that failed is the cause of this one's end.
        if let Some(why) = details.not_ready.or_else(|| agent.failure()) {
            report.failure = Some(why);
        }
        report.fleet = Some(fleet);
    }
    Ok(report)
}

/// Why this process is not ready for a fleet run, once its threads have settled: fewer
/// connections open than asked, with why the first connect failed (EADDRNOTAVAIL: out of
/// ports) so the barrier names the cause, not only the count.
pub(crate) fn not_ready_why(
    open: u64,
    asked: u64,
    target: &str,
    failure: &Mutex<Option<String>>,
) -> Option<String> {
    (open < asked).then(|| {
        let why = failure.lock().ok().and_then(|f| f.clone());
        let first = why.map_or_else(String::new, |w| format!(" (first failure: {w})"));
        format!(
            "only {open} of {asked} connections could be opened to {target} while preparing{first}"
        )
    })
}

/// A single-process fleet agent: once every thread has settled, tells the barrier ready (or
/// why not), then sets the query phase's start at the barrier's instant, converted to this
/// host's clocks. Returns why this host could not get ready, if it could not.
fn fleet_gate(
    agent: &tcpkit_fleet::Agent,
    sh: &engine::Shared<'_>,
    ready: &AtomicBool,
) -> Option<String> {
    while !ready.load(Ordering::SeqCst) {
        if sh.interrupt.load(Ordering::Relaxed) {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    let target = format!("{} ({})", sh.cfg.target, sh.cfg.addr);
    if let Some(why) = not_ready_why(
        sh.open.load(Ordering::SeqCst),
        sh.conns,
        &target,
        &sh.connect_failure,
    ) {
        agent.not_ready(&why);
        sh.interrupt.store(true, Ordering::SeqCst);
        return Some(why);
    }
    agent.ready();
    if let Some(at) = agent.wait_start(sh.interrupt) {
        sh.wall_start.store(at, Ordering::SeqCst);
        sh.start
            .store(tcpkit_fleet::clock::mono_of(at).max(1), Ordering::SeqCst);
    }
    None
}

/// When the answers say the server speaks another protocol than the payload: DNS queries
/// all sent back as they were (a byte echo, such as `tcpkit echo` without --dns), or a
/// payload other than DNS that no connection the server accepted ever answered (a DNS
/// server, such as `tcpkit echo --dns`, waits for the rest of what it takes for a length
/// prefix, or closes the connection).
fn protocol_hint(r: &LoadReport, payload: &Payload) -> Option<String> {
    let q = &r.queries;
    let dns = matches!(payload, Payload::Dns { .. });
    if dns && q.answered > 0 && q.echoed == q.answered {
        return Some(format!(
            "every answer was the query sent back ({} of {}): the server echoes bytes (as tcpkit echo without --dns does) instead of answering DNS; a byte echo is loaded with --echo-bytes N, a DNS server answers --dns",
            q.echoed, q.answered
        ));
    }
    if !dns && q.sent > 0 && q.answered == 0 && r.connections.established > 0 {
        return Some(format!(
            "the server accepted {} connections but answered none of {} queries ({}): it may speak another protocol; a DNS server (tcpkit echo --dns, unbound) is loaded with --dns, a byte echo (tcpkit echo) with --echo-bytes N",
            r.connections.established, q.sent, r.payload
        ));
    }
    None
}

/// Runs worker `k` of `n`'s share of the connections, rate and queries in this process.
fn run_share(
    cfg: &Config,
    plan: &Plan,
    k: u32,
    n: u32,
    interrupt: &AtomicBool,
    live: &LoadCounters,
    hint: &(dyn Fn(&str) + Sync),
) -> Result<(LoadReport, Details), LoadError> {
    // `--duration` bounds the whole run, from here: opening the connections included (for a
    // fleet agent, from the barrier's start: `begin` bounds the query phase).
    let began = tcpkit_pace::now_ns();
    let deadline = match cfg.duration {
        Some(d) if !cfg.gated => began.saturating_add(d.as_nanos() as u64),
        _ => u64::MAX,
    };
    let open = Arc::new(AtomicU64::new(0));
    let connect_failure = Arc::new(Mutex::new(None));
    let gate = cfg.fleet.as_deref().filter(|_| n == 1);
    let (kk, nn) = (u64::from(k), u64::from(n));
    let conns = share(cfg.connections, nn, kk);
    let threads = plan
        .threads
        .clamp(1, (conns.max(1)) as usize)
        .min(LIVE_SLOTS);
    let wall_start = Arc::new(AtomicU64::new(0));
    let start = Arc::new(AtomicU64::new(0));
    // One of several processes: the parent releases all of them into the query phase at once.
    let ready = if n > 1 {
        let ready = Arc::new(AtomicBool::new(false));
        procs::await_release(
            Arc::clone(&ready),
            Arc::clone(&start),
            Arc::clone(&wall_start),
            (
                Arc::clone(&open),
                conns,
                format!("{} ({})", cfg.target, cfg.addr),
                Arc::clone(&connect_failure),
            ),
        );
        Some(ready)
    } else {
        // A lone fleet agent: its gate sets the start, not the last thread to settle.
        gate.map(|_| Arc::new(AtomicBool::new(false)))
    };
    let per_query = match &cfg.per_query {
        Some(p) => {
            let path = outfiles::per_proc_path(p, k, n);
            Some(
                perquery::PerQuery::start(&path, Arc::clone(&wall_start)).map_err(|e| {
                    LoadError::OutFile {
                        flag: "-R/--per-query",
                        path: path.display().to_string(),
                        source: e,
                    }
                })?,
            )
        }
        None => None,
    };
    let hdr_log = match &cfg.hdr_log {
        Some(p) => {
            let path = outfiles::per_proc_path(p, k, n);
            Some(Mutex::new(
                tcpkit_stats::HdrLog::create(&path, std::time::SystemTime::now()).map_err(|e| {
                    LoadError::OutFile {
                        flag: "--hdr-log",
                        path: path.display().to_string(),
                        source: e,
                    }
                })?,
            ))
        }
        None => None,
    };
    let shared = engine::Shared {
        cfg,
        proto: proto::Proto::new(&cfg.payload, cfg.udp),
        interrupt,
        live,
        hint,
        threads,
        conns,
        conn_offset: share_offset(cfg.connections, nn, kk),
        thread_offset: kk * LIVE_SLOTS as u64,
        rate_share: if cfg.connections == 0 {
            0.0
        } else {
            conns as f64 / cfg.connections as f64
        },
        connected: AtomicUsize::new(0),
        start: Arc::clone(&start),
        deadline,
        wall_start: Arc::clone(&wall_start),
        ready: ready.clone(),
        open,
        peak_open: AtomicU64::new(0),
        hdr_log,
        first_sent: AtomicU64::new(u64::MAX),
        connect_failure,
    };
    let mut not_ready = None;
    let outs: Vec<Result<engine::ThreadOut, LoadError>> = std::thread::scope(|s| {
        let gate = match (gate, &ready) {
            (Some(agent), Some(r)) => {
                let sh = &shared;
                Some(s.spawn(move || fleet_gate(agent, sh, r)))
            }
            _ => None,
        };
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let sink = per_query.as_ref().and_then(perquery::PerQuery::sink);
                let sh = &shared;
                std::thread::Builder::new()
                    .name(format!("tcpkit-load-{t}"))
                    .spawn_scoped(s, move || engine::run_thread(sh, t, sink))
            })
            .collect();
        let outs = handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(LoadError::Io {
                        what: "event-loop thread",
                        source: io::Error::other("panicked"),
                    })
                }),
                Err(e) => Err(LoadError::Io {
                    what: "spawn event-loop thread",
                    source: e,
                }),
            })
            .collect::<Vec<_>>();
        if let Some(g) = gate {
            not_ready = g.join().ok().flatten();
        }
        outs
    });
    let mut threads_out = Vec::with_capacity(outs.len());
    for o in outs {
        threads_out.push(o?);
    }
    if let Some(log) = &shared.hdr_log {
        if let Ok(mut l) = log.lock() {
            let _ = l.flush();
        }
    }
    let per_query = match per_query {
        Some(pq) => {
            let path = pq.path().display().to_string();
            let (lines, dropped) = pq.finish().map_err(|e| LoadError::File {
                path: path.clone(),
                source: e,
            })?;
            Some(PerQueryStats {
                path,
                lines,
                dropped,
            })
        }
        None => None,
    };
    let (report, mut details) = assemble(cfg, plan, &shared, threads_out, began, per_query);
    details.not_ready = not_ready;
    Ok((report, details))
}

fn assemble(
    cfg: &Config,
    plan: &Plan,
    sh: &engine::Shared<'_>,
    outs: Vec<engine::ThreadOut>,
    began: u64,
    per_query: Option<PerQueryStats>,
) -> (LoadReport, Details) {
    let start = sh.start.load(Ordering::SeqCst);
    let mut hi = Histogram::new();
    let mut hs = Histogram::new();
    let mut codes = vec![0u64; outs.first().map_or(0, |o| o.codes.len())];
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut c = engine::Counters::default();
    let mut details = Details::default();
    let mut connected_at = began;
    let mut stopped_at = start;
    let mut tls: Option<crate::tls_report::TlsTally> = None;
    for o in &outs {
        if let Some(t) = &o.tls {
            tls.get_or_insert_with(Default::default).absorb(t);
        }
        hi.merge(&o.hist_intended);
        hs.merge(&o.hist_sent);
        for (a, b) in codes.iter_mut().zip(&o.codes) {
            *a += b;
        }
        for (k, v) in &o.errors {
            *errors.entry((*k).to_string()).or_insert(0) += v;
        }
        if details.connect_error.is_none() {
            details.connect_error.clone_from(&o.first_connect_error);
        }
        if details.bad_answer.is_none() {
            details.bad_answer.clone_from(&o.first_bad);
        }
        let t = &o.c;
        c.attempts += t.attempts;
        c.established += t.established;
        c.failed += t.failed;
        c.connect_timeouts += t.connect_timeouts;
        c.retries += t.retries;
        c.closed_by_server += t.closed_by_server;
        c.reconnects += t.reconnects;
        c.slow += t.slow;
        c.scheduled += t.scheduled;
        c.sent += t.sent;
        c.answered += t.answered;
        c.echoed += t.echoed;
        c.timeouts += t.timeouts;
        c.lost += t.lost;
        c.unanswered_at_end += t.unanswered_at_end;
        c.malformed += t.malformed;
        c.unmatched += t.unmatched;
        c.bytes_sent += t.bytes_sent;
        c.bytes_received += t.bytes_received;
        c.behind += t.behind;
        c.lag_max = c.lag_max.max(t.lag_max);
        c.lag_end = c.lag_end.max(t.lag_end);
        c.open_at_end += t.open_at_end;
        connected_at = connected_at.max(o.connected_at);
        stopped_at = stopped_at.max(t.stopped_at);
    }
    let seconds = if start == 0 {
        0.0
    } else {
        stopped_at.saturating_sub(start) as f64 / 1e9
    };
    let per_sec = |n: u64| {
        if seconds > 0.0 {
            n as f64 / seconds
        } else {
            0.0
        }
    };
    let proto = &sh.proto;
    let codes: BTreeMap<String, u64> = codes
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(i, &n)| (proto.code_name(i as u16), n))
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            *m.entry(k).or_insert(0) += v;
            m
        });
    let hints: Vec<String> =
        sock::hints_for(errors.keys().map(String::as_str), c.established > 0, c.slow)
            .map(str::to_string)
            .collect();
    let wall_start = sh.wall_start.load(Ordering::SeqCst);
    let intervals = thread_intervals(&outs, wall_start);
    let first = sh.first_sent.load(Ordering::SeqCst);
    if first != u64::MAX && start != 0 {
        // On the wall clock through the start's two readings (a step of the wall clock
        // mid-run does not move it).
        details.first_sent_unix_ns =
            Some(wall_start.saturating_add_signed(first.wrapping_sub(start) as i64));
    }
    let report = LoadReport {
        schema_version: LOAD_SCHEMA_VERSION,
        // Given by `run` to the whole run (a worker's share is not a run of its own).
        run_id: String::new(),
        merged_run_ids: Vec::new(),
        target: format!("{} ({})", cfg.target, cfg.addr),
        payload: if cfg.udp {
            format!("{} over UDP", cfg.payload.describe())
        } else {
            cfg.payload.describe()
        },
        runs: 1,
        processes: 1,
        threads: sh.threads as u32,
        shard: cfg.shard,
        start_unix_ns: wall_start,
        end_unix_ns: wall_start + (seconds * 1e9) as u64,
        seconds,
        connect_seconds: connected_at.saturating_sub(began) as f64 / 1e9,
        connections: ConnStats {
            asked: sh.conns,
            peak_open: sh.peak_open.load(Ordering::Relaxed),
            open_at_end: c.open_at_end,
            attempts: c.attempts,
            established: c.established,
            failed: c.failed,
            timeouts: c.connect_timeouts,
            retries: c.retries,
            closed_by_server: c.closed_by_server,
            reconnects: c.reconnects,
            reachable_max: plan.reachable_max,
            slow: c.slow,
        },
        queries: QueryStats {
            scheduled: c.scheduled,
            sent: c.sent,
            answered: c.answered,
            echoed: c.echoed,
            timeouts: c.timeouts,
            lost: c.lost,
            unanswered_at_end: c.unanswered_at_end,
            malformed: c.malformed,
            unmatched: c.unmatched,
            bytes_sent: c.bytes_sent,
            bytes_received: c.bytes_received,
        },
        rates: Rates {
            asked_qps: cfg.rate.as_ref().map(|r| {
                if seconds > 0.0 {
                    r.expected(seconds) / seconds * sh.rate_share
                } else {
                    0.0
                }
            }),
            sent_qps: per_sec(c.sent),
            answered_qps: per_sec(c.answered),
        },
        lag: LagStats {
            behind: c.behind,
            max_ns: c.lag_max,
            end_ns: c.lag_end,
        },
        codes,
        errors,
        hints,
        latency: hi.percentiles(),
        latency_sent: hs.percentiles(),
        histograms: Histograms {
            intended: hi.to_base64(),
            sent: hs.to_base64(),
        },
        per_query,
        failure: None,
        intervals,
        fleet: None,
        // Handshakes per second of the whole run: without reopening, most of them are made
        // while the connections open.
        tls: tls.map(|t| t.stats(seconds + connected_at.saturating_sub(began) as f64 / 1e9)),
        ..LoadReport::default()
    };
    (report, details)
}

/// The threads' seconds put together on the wall clock: one interval per second of the
/// process (each thread's share added), bounded as one thread's are.
fn thread_intervals(
    outs: &[engine::ThreadOut],
    wall_start: u64,
) -> Vec<crate::series::IntervalRec> {
    let on_wall: Vec<Vec<_>> = outs
        .iter()
        .map(|o| {
            o.intervals
                .iter()
                .map(|r| crate::series::IntervalRec {
                    start_unix_ns: wall_start.saturating_add(r.start_unix_ns),
                    ..r.clone()
                })
                .collect()
        })
        .collect();
    let runs: Vec<(&[_], i64)> = on_wall.iter().map(|l| (l.as_slice(), 0)).collect();
    // The threads' histograms were encoded here: they decode, and their sums fit.
    let mut merged = crate::series::lay_out(&runs)
        .map(|(m, _)| m)
        .unwrap_or_default();
    let _ = crate::series::coarsen(&mut merged, crate::series::MAX_INTERVALS);
    merged
}

/// The verdict: the first way the run fell short of what was asked, or None.
pub(crate) fn judge(r: &mut LoadReport, d: &Details) {
    let c = &r.connections;
    let q = &r.queries;
    let tls_all_failed = r
        .tls
        .as_ref()
        .filter(|t| t.handshakes.full + t.handshakes.resumed == 0 && t.handshakes.failed > 0);
    let why = if let Some(t) = tls_all_failed {
        // Every handshake failed: the one line that says why (the first failure's).
        Some(format!(
            "TLS handshake with {} failed: {}",
            d.tls_peer.as_deref().unwrap_or(&r.target),
            t.first_failure
                .as_deref()
                .unwrap_or("no handshake completed")
        ))
    } else if c.asked > 0 && c.established == 0 {
        Some(format!(
            "could not connect to {}: {} ({} attempts)",
            r.target,
            d.connect_error.as_deref().unwrap_or("no connection opened"),
            c.attempts
        ))
    } else if q.malformed > 0 {
        // The root cause when it happens: each one closed a connection.
        Some(format!(
            "{} malformed answers (first: {})",
            q.malformed,
            d.bad_answer.as_deref().unwrap_or("?")
        ))
    } else if c.peak_open < c.asked {
        let top = r
            .errors
            .iter()
            .max_by_key(|(_, v)| **v)
            .map(|(k, v)| format!("{k} x{v}"))
            .unwrap_or_else(|| "interrupted".into());
        let hint = r
            .hints
            .first()
            .map(|h| format!("; {h}"))
            .unwrap_or_default();
        Some(format!(
            "only {} of {} connections were open at once ({top}){hint}",
            c.peak_open, c.asked
        ))
    } else if q.scheduled > 0 && (q.scheduled - q.sent.min(q.scheduled)) * 100 > q.scheduled {
        Some(format!(
            "asked rate not met: {} of {} scheduled queries sent ({:.1} %), schedule lag up to {:.1} ms",
            q.sent,
            q.scheduled,
            q.sent as f64 * 100.0 / q.scheduled as f64,
            r.lag.max_ns as f64 / 1e6
        ))
    } else if q.sent > 0 && q.answered > 0 && q.timeouts + q.unmatched > q.answered {
        // Answers came, but most queries went wrong: a server answering with the wrong DNS
        // ID (or a path losing most of them) is not a run that did what was asked.
        Some(format!(
            "most queries went wrong: {} answered, {} timed out, {} unmatched answers (wrong ID) of {} sent",
            q.answered, q.timeouts, q.unmatched, q.sent
        ))
    } else if q.sent > 0 && q.answered == 0 {
        // The protocol hint, when there is one, is the likeliest reason: said on this last
        // line too, not only timeouts.
        let why = r
            .hints
            .iter()
            .find(|h| h.starts_with("the server accepted"))
            .map(|h| format!("; {h}"))
            .unwrap_or_default();
        Some(format!(
            "no answers: {} queries sent, {} timed out, {} lost, {} unanswered at end, {} unmatched answers (wrong ID){why}",
            q.sent, q.timeouts, q.lost, q.unanswered_at_end, q.unmatched
        ))
    } else {
        None
    };
    r.failure = why;
}

#[cfg(test)]
mod counter_tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn totals_sum_the_slots_and_take_the_largest_lag() {
        let c = LoadCounters::new();
        for (i, lag) in [(0, 5), (1, 70), (LIVE_SLOTS - 1, 3)] {
            c.set(
                i,
                &LiveTotals {
                    open: 1,
                    sent: 10,
                    answered: 9,
                    errors: 1,
                    timeouts: 2,
                    lag_ns: lag,
                    hints: 0,
                },
            );
        }
        let t = c.totals();
        assert_eq!(
            (t.open, t.sent, t.answered, t.errors, t.timeouts, t.lag_ns),
            (3, 30, 27, 3, 6, 70)
        );
        // More threads or workers than slots share slots, never index past them.
        assert!(std::ptr::eq(c.slot(LIVE_SLOTS + 1), c.slot(1)));
        // `set` replaces a slot (a worker's latest totals), it does not add to it.
        c.set(1, &LiveTotals::default());
        assert_eq!(c.totals().sent, 20);
        assert_eq!(c.totals().lag_ns, 5);
    }

    #[test]
    fn each_hint_is_said_once() {
        let c = LoadCounters::new();
        let said = Mutex::new(Vec::new());
        let say = |h: &str| said.lock().unwrap().push(h.to_string());
        let fds = sock::hint_bit("EMFILE", false);
        let ports = sock::hint_bit("EADDRNOTAVAIL", false);
        assert_ne!(fds, 0);
        assert_ne!(fds, ports);
        c.give_hints(fds, &say);
        c.give_hints(fds, &say);
        c.give_hints(fds | ports, &say);
        c.give_hints(0, &say);
        assert_eq!(said.lock().unwrap().len(), 2);
        assert_eq!(c.totals().hints, fds | ports);
    }
}
