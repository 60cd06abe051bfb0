//! `balance up`: the services of a configuration file balanced for every process of one
//! cgroup (the hierarchy's root unless --cgroup names one) until SIGINT/SIGTERM. The links
//! are this process's descriptors, so they go when it ends, however it ends. SIGHUP or
//! `balance reload` re-reads the file and swaps each service's set atomically (a bad file is
//! refused and the running one stays); `balance status` asks over the control socket.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cgroup::{self, CgroupError, PrivateMount};
use crate::control::{self, Control, ControlError, Handler};
use crate::drain::DrainKill;
use crate::features::{self, Feature};
use crate::file::{self, FileError, ServiceConfig};
use crate::health::{lock, BackendHealth, Health, State};
use crate::loader::{Balancer, LoadError};
use crate::status::{BackendStatus, ServiceStatus, StatusReport};
use crate::trace::Tracer;

#[derive(Debug, Clone)]
pub struct UpOptions {
    pub config: PathBuf,
    /// The cgroup to attach to, as given (see `cgroup::resolve`); None: the root.
    pub cgroup: Option<String>,
    pub socket: PathBuf,
    pub trace: bool,
    /// Serve Prometheus metrics here (`--metrics ADDR`).
    pub metrics: Option<std::net::SocketAddr>,
    /// End the sockets still on a backend that goes down or leaves (`--drain-kill`).
    pub drain: Option<DrainKill>,
    /// Pin the links and maps here (`--pin DIR`): the balancing outlives this process.
    pub pin: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("health checks: {0}")]
    Health(String),
    #[error("--metrics {0}: {1}")]
    Metrics(std::net::SocketAddr, #[source] std::io::Error),
    #[error(transparent)]
    Pin(#[from] crate::pin::PinError),
    /// Another balancer's programs on the cgroup serve a VIP of this file: (cgroup, VIP, who).
    #[error("cgroup {0}: {1} is balanced there already, by {2}")]
    Serving(String, std::net::SocketAddr, String),
    /// (cgroup, what was being done, why).
    #[error("cgroup {0}: {1}: {2}")]
    Query(String, &'static str, #[source] std::io::Error),
}

/// What reload and status share with the main loop.
struct Daemon {
    path: PathBuf,
    balancer: Arc<Mutex<Balancer>>,
    configs: Vec<ServiceConfig>,
    state: State,
    health: Option<Health>,
    reloads: u64,
    reloads_refused: u64,
    drain: Option<DrainKill>,
    /// Sockets ended because their backend left the configuration (reload).
    drained_removed: u64,
}

fn start_health(
    configs: &[ServiceConfig],
    balancer: &Arc<Mutex<Balancer>>,
    state: &State,
    drain: Option<DrainKill>,
) -> Option<Health> {
    let opts: Vec<_> = configs.iter().map(|c| c.health.clone()).collect();
    if opts.iter().all(Option::is_none) {
        return None;
    }
    let services: Vec<_> = configs.iter().map(|c| c.service.clone()).collect();
    Some(Health::start(
        &services,
        &opts,
        Arc::clone(balancer),
        Arc::clone(state),
        drain,
    ))
}

impl Daemon {
    /// Puts the file as re-read (by [`reread`], without the lock that `status` needs) in
    /// force; on any error the running configuration stays.
    fn reload(&mut self, read: Result<Vec<ServiceConfig>, FileError>) -> Result<usize, String> {
        let new = match read {
            Ok(n) => n,
            Err(e) => {
                self.reloads_refused += 1;
                return Err(e.to_string());
            }
        };
        // Probers first, so none writes a set while the services change under it.
        if let Some(h) = self.health.take() {
            let _ = h.stop();
        }
        let old = lock(&self.state).clone();
        let same = |a: &ServiceConfig, b: &ServiceConfig| {
            a.service.vip == b.service.vip && a.service.protocol == b.service.protocol
        };
        // A backend kept by the new file keeps its health (a down one stays down until it
        // rises); one checked no more is up, as is every new one.
        let states: Vec<Vec<BackendHealth>> = new
            .iter()
            .map(|n| {
                let before = self
                    .configs
                    .iter()
                    .position(|o| same(o, n))
                    .map(|i| (&self.configs[i], &old[i]));
                n.service
                    .backends
                    .iter()
                    .map(|b| {
                        let kept = before.and_then(|(o, st)| {
                            o.service
                                .backends
                                .iter()
                                .position(|ob| ob.addr == b.addr)
                                .map(|j| st[j].clone())
                        });
                        match (kept, n.health.is_some()) {
                            (Some(h), true) if h.checked => h,
                            (Some(h), false) if !h.checked => h,
                            // New and checked: out until a probe passes.
                            (None, true) => BackendHealth::added(),
                            (_, checked) => BackendHealth::new(checked),
                        }
                    })
                    .collect()
            })
            .collect();
        let live: Vec<Vec<bool>> = states
            .iter()
            .map(|s| s.iter().map(|h| h.up).collect())
            .collect();
        let services: Vec<_> = new.iter().map(|c| c.service.clone()).collect();
        let swapped = lock(&self.balancer).replace(&services, &live);
        if let Err(e) = swapped {
            // The maps may hold part of the new configuration: say so; probes resume on the
            // old one's view.
            self.reloads_refused += 1;
            self.health = start_health(&self.configs, &self.balancer, &self.state, self.drain);
            return Err(format!(
                "writing the new sets into the kernel: {}",
                tcpkit_stats::chain(&e)
            ));
        }
        *lock(&self.state) = states;
        // Backends the new file no longer has (or whose service it dropped): out of every
        // set now, so their sockets can be ended.
        let gone: Vec<std::net::SocketAddr> = self
            .configs
            .iter()
            .flat_map(|o| {
                let kept = new.iter().find(|n| same(o, n));
                o.service
                    .backends
                    .iter()
                    .filter(move |b| {
                        kept.is_none_or(|n| n.service.backends.iter().all(|nb| nb.addr != b.addr))
                    })
                    .map(|b| b.addr)
            })
            .collect();
        self.configs = new;
        if let Some(which) = self.drain {
            for addr in gone {
                match crate::health::drain_backend(&self.balancer, addr, which) {
                    Ok(n) => self.drained_removed += n,
                    Err(e) => eprintln!("tcpkit balance: --drain-kill {addr}: {e}"),
                }
            }
        }
        self.health = start_health(&self.configs, &self.balancer, &self.state, self.drain);
        self.reloads += 1;
        Ok(self.configs.len())
    }
}

/// The configuration file of `daemon` read again, outside its lock: a slow file holds no
/// `status` or scrape.
fn reread(daemon: &Mutex<Daemon>) -> Result<Vec<ServiceConfig>, FileError> {
    let path = lock(daemon).path.clone();
    file::load(&path)
}

/// Everything a status answer needs that does not change.
struct Fixed {
    pid: u32,
    config: String,
    cgroup: String,
    started: Instant,
    features: Vec<Feature>,
    control: Arc<control::Counts>,
    pin: Option<String>,
}

fn status(d: &Daemon, f: &Fixed, mode: &str, interrupted: bool) -> Result<StatusReport, LoadError> {
    let (counters, hooks) = {
        let b = lock(&d.balancer);
        (b.counters()?, b.hooks()?)
    };
    let states = lock(&d.state).clone();
    let now = Instant::now();
    let services = d
        .configs
        .iter()
        .zip(&counters.picks)
        .zip(&counters.active)
        .zip(&states)
        .map(|(((c, picks), active), st)| ServiceStatus {
            name: c.name.clone(),
            vip: c.service.vip.to_string(),
            protocol: c.service.protocol.name().into(),
            algorithm: c.service.algorithm.name().into(),
            hash_key: c.service.algorithm.hash_key().map(Into::into),
            persistence_s: c.service.persistence.map(|p| p.as_secs_f64()),
            probe: c.health.as_ref().map(|h| h.probe.kind().into()),
            backends: c
                .service
                .backends
                .iter()
                .zip(picks)
                .zip(active)
                .zip(st)
                .map(|(((b, n), open), h)| BackendStatus {
                    addr: b.addr.to_string(),
                    weight: b.weight,
                    health: match (h.checked, h.up) {
                        (false, _) => "unchecked",
                        (true, true) => "up",
                        (true, false) => "down",
                    }
                    .into(),
                    changed_s: now.duration_since(h.since).as_secs_f64(),
                    connections: *n,
                    active: *open,
                    probes: h.probes,
                    probes_failed: h.failed,
                    downs: h.downs,
                    drained: h.drained,
                    down_reason: if h.checked && !h.up {
                        h.last_failure.clone()
                    } else {
                        None
                    },
                })
                .collect(),
        })
        .collect();
    Ok(StatusReport {
        schema_version: 1,
        mode: mode.into(),
        pid: f.pid,
        config: f.config.clone(),
        cgroup: f.cgroup.clone(),
        uptime_s: f.started.elapsed().as_secs_f64(),
        reloads: d.reloads,
        reloads_refused: d.reloads_refused,
        services,
        translated: counters.translated,
        refused: counters.refused,
        getpeername_vip: counters.revnat,
        stale: counters.stale,
        trace_lost: counters.trace_lost,
        drain_kill: d.drain.map(|w| w.name().into()),
        pin: f.pin.clone(),
        drained: d.drained_removed + states.iter().flatten().map(|h| h.drained).sum::<u64>(),
        hooks,
        features: f.features.clone(),
        control: f.control.stats(),
        interrupted,
    })
}

fn answer_json<T: serde::Serialize>(v: &T) -> String {
    tcpkit_stats::to_json(v) + "\n"
}

/// Balances until `interrupted`; `hangup` (SIGHUP) asks for a reload. Live lines (reloads,
/// health changes are in status) go to stderr. Must be called before this process starts any
/// thread (a private cgroup2 mount needs its own mount namespace).
pub fn up(
    opts: &UpOptions,
    interrupted: &AtomicBool,
    hangup: &AtomicBool,
) -> Result<StatusReport, UpError> {
    let configs = file::load(&opts.config)?;
    let (mount, private) = match cgroup::find_mount()? {
        Some(m) => (m, None),
        None => {
            let p = PrivateMount::new()?;
            (p.dir.clone(), Some(p))
        }
    };
    let cg = cgroup::resolve(opts.cgroup.as_deref(), &mount, private.is_some())?;
    let shown_cg = display_cgroup(&cg, &mount, private.is_some());
    let services: Vec<_> = configs.iter().map(|c| c.service.clone()).collect();
    // Before anything is loaded: a second `up` on the same socket or pins, or for the same
    // VIP, attaches nothing (and what it made for them goes).
    let listener = control::bind(&opts.socket)?;
    let pins = opts.pin.as_deref().map(crate::pin::prepare).transpose()?;
    // The pins of an `up` that has ended: taken over, not refused (an upgrade).
    let adopting = opts
        .pin
        .as_deref()
        .filter(|_| pins.as_ref().is_some_and(|p| p.adopt));
    let cg_lock = lock_cgroup(&cg, &shown_cg)?;
    let theirs = adopting
        .map(crate::loader::pinned_prog_ids)
        .unwrap_or_default();
    refuse_served(&cg_lock, &shown_cg, &services, &theirs)?;
    let features = features::probe();
    let (mut balancer, adopted) = match adopting {
        None => (Balancer::load(&services, opts.trace)?, None),
        Some(dir) => {
            let (b, a) = Balancer::load_adopting(dir, opts.trace)?;
            (b, Some(a))
        }
    };
    let tracer = if opts.trace {
        Some(Tracer::start(balancer.take_trace()?))
    } else {
        None
    };
    let states = first_states(&configs, adopted.as_ref());
    match adopting {
        None => balancer.attach(&cg)?,
        Some(dir) => {
            // The links first (the programs swapped, the pinned sets still in force), then
            // the file's services, each set swapped atomically as a reload does.
            balancer.adopt_links(&cg, dir)?;
            let live: Vec<Vec<bool>> = states
                .iter()
                .map(|s| s.iter().map(|h| h.up).collect())
                .collect();
            balancer.replace(&services, &live)?;
            let (n, up) = adopted
                .as_ref()
                .map_or((0, 0), crate::loader::Adopted::counts);
            eprintln!(
                "tcpkit balance: adopted the balancer pinned in {} ({n} services, {up} backends live as pinned)",
                dir.display()
            );
        }
    }
    drop(cg_lock);
    let balancer = Arc::new(Mutex::new(balancer));
    let state: State = Arc::new(Mutex::new(states));
    let health = start_health(&configs, &balancer, &state, opts.drain);
    let daemon = Arc::new(Mutex::new(Daemon {
        path: opts.config.clone(),
        balancer: Arc::clone(&balancer),
        configs,
        state,
        health,
        reloads: 0,
        reloads_refused: 0,
        drain: opts.drain,
        drained_removed: 0,
    }));
    let fixed = Arc::new(Fixed {
        pid: std::process::id(),
        config: opts.config.display().to_string(),
        cgroup: shown_cg,
        started: Instant::now(),
        features,
        control: Arc::default(),
        pin: opts.pin.as_ref().map(|p| p.display().to_string()),
    });
    let handler: Arc<Handler> = {
        let (d, f) = (Arc::clone(&daemon), Arc::clone(&fixed));
        Arc::new(move |word: &str| match word {
            "status" => Some(match status(&lock(&d), &f, "status", false) {
                Ok(r) => answer_json(&r),
                Err(e) => control::error_answer(&tcpkit_stats::chain(&e)),
            }),
            "reload" => {
                let read = reread(&d);
                let r = lock(&d).reload(read);
                Some(match r {
                    Ok(n) => {
                        eprintln!("tcpkit balance: reloaded {} ({n} services)", f.config);
                        answer_json(&serde_json::json!({ "reloaded": true, "services": n }))
                    }
                    Err(e) => {
                        eprintln!(
                            "tcpkit balance: reload refused, the running configuration stays: {e}"
                        );
                        control::error_answer(&e)
                    }
                })
            }
            _ => None,
        })
    };
    let ctl = Control::start(
        listener,
        handler,
        control::FIRST_MESSAGE,
        Arc::clone(&fixed.control),
    )?;
    let metrics = match opts.metrics {
        None => None,
        Some(addr) => {
            let (d, f) = (Arc::clone(&daemon), Arc::clone(&fixed));
            let body = move || match status(&lock(&d), &f, "status", false) {
                Ok(r) => exposition(&r),
                // A scrape that cannot read the maps says so in a comment, and nothing else.
                Err(e) => format!("# tcpkit balance: {}\n", tcpkit_stats::chain(&e)),
            };
            let m = tcpkit_metrics::start(addr, Arc::new(body))
                .map_err(|e| UpError::Metrics(addr, e))?;
            eprintln!("tcpkit balance: metrics on http://{}/metrics", m.addr());
            Some(m)
        }
    };
    // Pinned last, once nothing else can fail: a refused `up` leaves no balancing behind.
    // (Adopted pins are in place already, and stay whatever happens.)
    if let Some(dir) = opts.pin.as_ref().filter(|_| adopting.is_none()) {
        let pinned = lock(&balancer).pin(dir);
        if let Err(e) = pinned {
            // Half a set of pins would keep half a balancer: none stays (the directory goes
            // with `pins`).
            let _ = crate::pin::remove(dir);
            return Err(e.into());
        }
    }
    eprintln!(
        "tcpkit balance: up: {} services from {} on cgroup {}; status: tcpkit balance status --socket {}",
        lock(&daemon).configs.len(),
        fixed.config,
        fixed.cgroup,
        opts.socket.display()
    );
    while !interrupted.load(Ordering::Relaxed) {
        if hangup.swap(false, Ordering::SeqCst) {
            let read = reread(&daemon);
            match lock(&daemon).reload(read) {
                Ok(n) => eprintln!(
                    "tcpkit balance: SIGHUP: reloaded {} ({n} services)",
                    fixed.config
                ),
                Err(e) => eprintln!(
                    "tcpkit balance: SIGHUP: reload refused, the running configuration stays: {e}"
                ),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Stop answering first, then probing, then read the counters; the links go last.
    drop(metrics);
    ctl.stop();
    if let Some(t) = tracer {
        t.stop();
    }
    let mut d = lock(&daemon);
    let health_error = d.health.take().and_then(|h| h.stop().1);
    let report = status(&d, &fixed, "up", true)?;
    drop(d);
    drop(daemon);
    drop(balancer);
    drop(private);
    // The lock last: until here a `down` on the pins is refused.
    drop(pins);
    if let Some(e) = health_error {
        return Err(UpError::Health(e));
    }
    Ok(report)
}

/// Each backend's health when `up` starts: up (a fresh balancer balances at once); adopting
/// pins, as the pinned set had it: a checked backend out of it (and not drained) stays down
/// until `rise` probes pass, one new to it is out until its first probe passes.
fn first_states(
    configs: &[ServiceConfig],
    adopted: Option<&crate::loader::Adopted>,
) -> Vec<Vec<BackendHealth>> {
    configs
        .iter()
        .map(|c| {
            let checked = c.health.is_some();
            c.service
                .backends
                .iter()
                .map(|b| match adopted.map(|a| a.was_live(&c.service, b.addr)) {
                    Some(Some(false)) if checked && b.weight > 0 => BackendHealth::adopted_down(),
                    Some(None) if checked => BackendHealth::added(),
                    _ => BackendHealth::new(checked),
                })
                .collect()
        })
        .collect()
}

/// Refuses a cgroup where a balancer (another `up`, or the pins of one that ended) already
/// serves a VIP of `services`: two sets of programs would both run on every connect.
fn refuse_served(
    cg: &std::fs::File,
    shown: &str,
    services: &[crate::Service],
    adopting: &std::collections::HashSet<u32>,
) -> Result<(), UpError> {
    use std::os::fd::AsFd;
    let query = |e| UpError::Query(shown.to_string(), "asking the kernel what is attached", e);
    let Some(s) = crate::attached::serving(cg.as_fd(), services, adopting).map_err(query)? else {
        return Ok(());
    };
    let who = match crate::holder::prog_holder(s.prog_id) {
        Some(pid) => format!("a running balance up ({})", crate::holder::describe(pid)),
        None => "the pinned programs of a balance up that has ended (tcpkit balance down --pin DIR removes them)".into(),
    };
    Err(UpError::Serving(shown.to_string(), s.vip, who))
}

/// The cgroup's directory, locked (flock, exclusive) until dropped: held from the check of
/// what serves there to the attach, so two `up`s started together cannot both pass the check.
/// Only `up` takes it, for a moment (at most another's load and attach), and it goes with the
/// process however it ends.
fn lock_cgroup(cg: &Path, shown: &str) -> Result<std::fs::File, UpError> {
    use std::os::fd::AsRawFd;
    let fail = |e| UpError::Query(shown.to_string(), "locking it for the attach", e);
    let f = std::fs::File::open(cg).map_err(fail)?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    Ok(f)
}

/// The cgroup as the user knows it: under a private mount (ip netns exec), its path in the
/// hierarchy, since the private directory means nothing outside this process.
fn display_cgroup(cg: &Path, mount: &Path, private: bool) -> String {
    if private {
        match cg.strip_prefix(mount) {
            Ok(rel) => format!("/{}", rel.display()),
            Err(_) => cg.display().to_string(),
        }
    } else {
        cg.display().to_string()
    }
}

/// The Prometheus text exposition of a status: per backend its connections, health and
/// probes; reloads, refusals and trace drops.
pub fn exposition(r: &StatusReport) -> String {
    use tcpkit_metrics::{family, sample};
    let mut s = String::with_capacity(4096);
    let each = |s: &mut String, name: &str, value: &dyn Fn(&BackendStatus) -> String| {
        for svc in &r.services {
            for b in &svc.backends {
                let labels = [
                    ("service", svc.name.as_str()),
                    ("vip", svc.vip.as_str()),
                    ("protocol", svc.protocol.as_str()),
                    ("backend", b.addr.as_str()),
                ];
                sample(s, name, &labels, value(b));
            }
        }
    };
    let n = "tcpkit_balance_backend_connections_total";
    family(
        &mut s,
        n,
        "counter",
        "Connects (and unconnected UDP sockets) sent to the backend.",
    );
    each(&mut s, n, &|b| b.connections.to_string());
    let n = "tcpkit_balance_backend_active_connections";
    family(
        &mut s,
        n,
        "gauge",
        "Sockets open now on the backend (sent there and not yet closed; ipvsadm's ActiveConn).",
    );
    each(&mut s, n, &|b| b.active.to_string());
    let n = "tcpkit_balance_backend_up";
    family(
        &mut s,
        n,
        "gauge",
        "1 when the backend is in the selection (up, or not health-checked), 0 when down.",
    );
    each(&mut s, n, &|b| u8::from(b.health != "down").to_string());
    let n = "tcpkit_balance_backend_probes_total";
    family(
        &mut s,
        n,
        "counter",
        "Health probes sent to the backend, by result.",
    );
    for svc in &r.services {
        for b in &svc.backends {
            for (result, v) in [
                ("ok", b.probes - b.probes_failed.min(b.probes)),
                ("failed", b.probes_failed),
            ] {
                let labels = [
                    ("service", svc.name.as_str()),
                    ("vip", svc.vip.as_str()),
                    ("protocol", svc.protocol.as_str()),
                    ("backend", b.addr.as_str()),
                    ("result", result),
                ];
                sample(&mut s, n, &labels, v);
            }
        }
    }
    let n = "tcpkit_balance_backend_downs_total";
    family(&mut s, n, "counter", "Times the backend was marked down.");
    each(&mut s, n, &|b| b.downs.to_string());
    for (name, kind, help, v) in [
        (
            "tcpkit_balance_translated_total",
            "counter",
            "Connects to a VIP sent to a backend.",
            r.translated,
        ),
        (
            "tcpkit_balance_refused_total",
            "counter",
            "Connects to a VIP refused with ECONNREFUSED (no backend up).",
            r.refused,
        ),
        (
            "tcpkit_balance_reloads_total",
            "counter",
            "Configurations put in force by SIGHUP or balance reload.",
            r.reloads,
        ),
        (
            "tcpkit_balance_reloads_refused_total",
            "counter",
            "Reloads refused (bad file; the running configuration stayed).",
            r.reloads_refused,
        ),
        (
            "tcpkit_balance_drained_total",
            "counter",
            "Sockets --drain-kill ended (their backend went down or left the configuration).",
            r.drained,
        ),
        (
            "tcpkit_balance_trace_lost_total",
            "counter",
            "--trace events lost (ring buffer full).",
            r.trace_lost,
        ),
    ] {
        family(&mut s, name, kind, help);
        sample(&mut s, name, &[], v);
    }
    let n = "tcpkit_balance_uptime_seconds";
    family(&mut s, n, "gauge", "Seconds since balance up started.");
    sample(&mut s, n, &[], format!("{:.3}", r.uptime_s));
    s
}
