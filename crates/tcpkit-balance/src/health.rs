//! Active health checks: one prober thread per backend probes it every interval (from
//! balance's own cgroup, outside the balanced one, so probes are never translated). A probe
//! is a TCP connect, or an application exchange (send bytes, expect the reply to start with a
//! prefix) over TCP or UDP, or for a UDP backend without one, a datagram that ICMP port
//! unreachable may answer (see [`Probe`]). A backend goes down after `fall` failed probes in
//! a row and comes back after `rise` successes; each change swaps its service's backend set
//! in the kernel at once (atomically: see `Balancer::set_live`), so a dead backend leaves the
//! selection within one interval of its `fall`-th failed probe, and is said on stderr in one
//! line with the time and the reason ([`transition`]).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{ConfigError, Service};
use crate::drain::DrainKill;
use crate::loader::Balancer;

/// How backends are probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthOptions {
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    pub probe: Probe,
}

/// Shortest interval between two probes of one backend: each probe is a socket, a connect
/// and a thread's wake-up (at 1 ns, one core did nothing else).
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Longest payload a probe sends, and longest prefix it expects: the reply is read into a
/// buffer of the prefix's size, never more.
pub const MAX_SEND: usize = 4096;
pub const MAX_EXPECT: usize = 1024;

/// What one probe does; every one ends within the timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A TCP connect is accepted.
    Connect,
    /// TCP: connect, send `send` (may be empty: a server that speaks first), and the reply
    /// starts with `expect` (empty: any byte at all).
    Tcp { send: Vec<u8>, expect: Vec<u8> },
    /// UDP: a datagram `send` from a connected socket, and a reply that starts with `expect`
    /// (empty: any reply).
    Udp { send: Vec<u8>, expect: Vec<u8> },
    /// UDP without an application probe: an empty datagram; the backend is down when its host
    /// answers ICMP port unreachable (ECONNREFUSED on the connected socket), up when it answers
    /// or stays silent. This only tells a closed port from an open one; the backend host
    /// rate-limits those ICMP messages (net.ipv4.icmp_ratelimit: one a second per peer after a
    /// burst of 6), so probe at most once a second.
    UdpUnreachable,
}

impl Probe {
    /// The probe's kind as `status` shows it.
    pub fn kind(&self) -> &'static str {
        match self {
            Probe::Connect => "tcp-connect",
            Probe::Tcp { .. } => "tcp-send-expect",
            Probe::Udp { .. } => "udp-send-expect",
            Probe::UdpUnreachable => "udp-port-unreachable",
        }
    }

    /// The probe for a backend spoken to over `udp` (or TCP) with these payloads (None: not
    /// given). A UDP probe without `send` has nothing to expect a reply to.
    pub fn new(
        udp: bool,
        send: Option<Vec<u8>>,
        expect: Option<Vec<u8>>,
    ) -> Result<Probe, ConfigError> {
        if send.as_ref().is_some_and(|s| s.len() > MAX_SEND) {
            return Err(ConfigError::HealthPayload("send", MAX_SEND));
        }
        if expect.as_ref().is_some_and(|s| s.len() > MAX_EXPECT) {
            return Err(ConfigError::HealthPayload("expect", MAX_EXPECT));
        }
        Ok(match (udp, send, expect) {
            (false, None, None) => Probe::Connect,
            (false, send, expect) => Probe::Tcp {
                send: send.unwrap_or_default(),
                expect: expect.unwrap_or_default(),
            },
            (true, None, None) => Probe::UdpUnreachable,
            (true, None, Some(_)) => return Err(ConfigError::UdpExpectWithoutSend),
            (true, Some(send), expect) => Probe::Udp {
                send,
                expect: expect.unwrap_or_default(),
            },
        })
    }
}

/// Bytes as a reason shows them: printable ASCII as is, the rest escaped, at most 40.
fn shown(b: &[u8]) -> String {
    let mut s: String = b
        .iter()
        .take(40)
        .flat_map(|c| c.escape_ascii())
        .map(char::from)
        .collect();
    if b.len() > 40 {
        s.push_str("...");
    }
    s
}

/// Whether `reply` (what came back, at most `expect.len()` bytes or one) matches.
fn check_reply(reply: &[u8], expect: &[u8], ended: bool) -> Result<(), String> {
    if reply.starts_with(expect) && !reply.is_empty() {
        return Ok(());
    }
    if expect.starts_with(reply) && ended {
        return Err(if reply.is_empty() {
            "closed without a reply".into()
        } else {
            format!(
                "reply \"{}\" ended before \"{}\"",
                shown(reply),
                shown(expect)
            )
        });
    }
    Err(format!(
        "reply \"{}\" does not start with \"{}\"",
        shown(reply),
        shown(expect)
    ))
}

fn left(deadline: Instant) -> Option<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    (!d.is_zero()).then_some(d)
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// One probe of `addr`: Ok, or why it failed (what status shows for a down backend).
pub fn probe(addr: SocketAddr, p: &Probe, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let late = || format!("no reply within {timeout:?}");
    match p {
        Probe::Connect => TcpStream::connect_timeout(&addr, timeout)
            .map(|_| ())
            .map_err(|e| format!("connect: {e}")),
        Probe::Tcp { send, expect } => {
            let mut s =
                TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
            if !send.is_empty() {
                s.set_write_timeout(Some(left(deadline).ok_or_else(late)?))
                    .map_err(|e| format!("send: {e}"))?;
                s.write_all(send).map_err(|e| format!("send: {e}"))?;
            }
            let mut buf = vec![0u8; expect.len().max(1)];
            let mut got = 0;
            let mut ended = false;
            while got < buf.len() {
                let Some(t) = left(deadline) else {
                    return Err(if got == 0 {
                        late()
                    } else {
                        format!(
                            "reply \"{}\" incomplete after {timeout:?}",
                            shown(&buf[..got])
                        )
                    });
                };
                s.set_read_timeout(Some(t))
                    .map_err(|e| format!("recv: {e}"))?;
                match s.read(&mut buf[got..]) {
                    Ok(0) => {
                        ended = true;
                        break;
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if timed_out(&e) => {}
                    Err(e) => return Err(format!("recv: {e}")),
                }
                if !expect.starts_with(&buf[..got]) {
                    break;
                }
            }
            check_reply(&buf[..got], expect, ended)
        }
        Probe::Udp { send, expect } => {
            let s = udp_to(addr)?;
            s.send(send).map_err(|e| format!("send: {e}"))?;
            let mut buf = vec![0u8; expect.len().max(1)];
            loop {
                let t = left(deadline).ok_or_else(late)?;
                s.set_read_timeout(Some(t))
                    .map_err(|e| format!("recv: {e}"))?;
                match s.recv(&mut buf) {
                    Ok(n) => return check_reply(&buf[..n.min(buf.len())], expect, true),
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        return Err("ICMP port unreachable (ECONNREFUSED)".into())
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted || timed_out(&e) => {}
                    Err(e) => return Err(format!("recv: {e}")),
                }
            }
        }
        Probe::UdpUnreachable => {
            let s = udp_to(addr)?;
            s.send(&[]).map_err(|e| format!("send: {e}"))?;
            let mut buf = [0u8; 1];
            loop {
                // Silence until the deadline is an open port (or a host that sends no ICMP).
                let Some(t) = left(deadline) else {
                    return Ok(());
                };
                s.set_read_timeout(Some(t))
                    .map_err(|e| format!("recv: {e}"))?;
                match s.recv(&mut buf) {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        return Err("ICMP port unreachable (ECONNREFUSED)".into())
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted || timed_out(&e) => {}
                    Err(e) => return Err(format!("recv: {e}")),
                }
            }
        }
    }
}

/// A UDP socket connected to `addr` (so ICMP errors come back to it, and only `addr`'s
/// datagrams are received).
fn udp_to(addr: SocketAddr) -> Result<UdpSocket, String> {
    let any: SocketAddr = if addr.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any).map_err(|e| format!("socket: {e}"))?;
    s.connect(addr).map_err(|e| format!("connect: {e}"))?;
    Ok(s)
}

impl HealthOptions {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
    pub const DEFAULT_RISE: u32 = 2;
    pub const DEFAULT_FALL: u32 = 3;

    /// Checked options (the same checks for `run`'s flags and `up`'s file).
    pub fn new(
        interval: Duration,
        timeout: Duration,
        rise: u32,
        fall: u32,
        probe: Probe,
    ) -> Result<HealthOptions, ConfigError> {
        if interval < MIN_INTERVAL {
            return Err(ConfigError::HealthInterval(interval));
        }
        if timeout.is_zero() {
            return Err(ConfigError::HealthTimeout);
        }
        if rise == 0 || fall == 0 {
            return Err(ConfigError::RiseFall);
        }
        Ok(HealthOptions {
            interval,
            timeout,
            rise,
            fall,
            probe,
        })
    }
}

/// One backend's health as the probes found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendHealth {
    pub up: bool,
    /// Whether it is probed at all (a service without health checks: always up).
    pub checked: bool,
    /// When it last went up or down (or was first seen).
    pub since: Instant,
    pub probes: u64,
    pub failed: u64,
    /// Times it went down.
    pub downs: u64,
    /// Why the last failed probe failed (kept until a probe succeeds).
    pub last_failure: Option<String>,
    /// Sockets `--drain-kill` ended when it went down.
    pub drained: u64,
    ok_run: u32,
    fail_run: u32,
    /// Added by a reload and not yet seen healthy: out of the set until its first probe
    /// passes (one, not `rise`: it never failed, it is only unproven).
    unproven: bool,
}

impl BackendHealth {
    /// Up until proven otherwise: a run starts balancing at once.
    pub fn new(checked: bool) -> BackendHealth {
        BackendHealth {
            up: true,
            checked,
            since: Instant::now(),
            probes: 0,
            failed: 0,
            downs: 0,
            last_failure: None,
            drained: 0,
            ok_run: 0,
            fail_run: 0,
            unproven: false,
        }
    }

    /// A backend a reload adds to a health-checked service: down, not counted as a down,
    /// until its first probe passes, so no connect goes to a server never seen answering.
    pub fn added() -> BackendHealth {
        BackendHealth {
            up: false,
            unproven: true,
            last_failure: Some("added by reload: no probe has passed yet".into()),
            ..BackendHealth::new(true)
        }
    }

    /// A backend out of the live set of the pins an `up` adopts: down (not counted as a
    /// down: this process saw none) until `rise` probes pass.
    pub fn adopted_down() -> BackendHealth {
        BackendHealth {
            up: false,
            last_failure: Some("out of the pinned set when its pins were adopted".into()),
            ..BackendHealth::new(true)
        }
    }

    /// The line said when it has just changed state (see [`BackendHealth::probe`]): when, which
    /// backend of which VIP, up or down, and why.
    pub fn transition(&self, addr: SocketAddr, vip: SocketAddr, o: &HealthOptions) -> String {
        let when = humantime::format_rfc3339_millis(std::time::SystemTime::now());
        if self.up {
            format!(
                "{when} tcpkit balance: backend {addr} (VIP {vip}) up: {}",
                // A backend a reload added comes in on its first pass, before `rise`.
                if self.ok_run < o.rise {
                    "its first probe passed (added by reload)".to_string()
                } else {
                    format!(
                        "{} probe{} passed in a row",
                        o.rise,
                        if o.rise == 1 { "" } else { "s" }
                    )
                }
            )
        } else {
            format!(
                "{when} tcpkit balance: backend {addr} (VIP {vip}) down: {} ({} probe{} failed in a row)",
                self.last_failure.as_deref().unwrap_or("probe failed"),
                o.fall,
                if o.fall == 1 { "" } else { "s" }
            )
        }
    }

    /// Counts one probe; true when the backend changed state.
    fn probe(&mut self, result: Result<(), String>, o: &HealthOptions) -> bool {
        self.probes += 1;
        let ok = result.is_ok();
        if let Err(why) = result {
            self.last_failure = Some(why);
        }
        if ok {
            self.last_failure = None;
            self.fail_run = 0;
            self.ok_run = self.ok_run.saturating_add(1);
            if !self.up && (self.ok_run >= o.rise || self.unproven) {
                self.up = true;
                self.unproven = false;
                self.since = Instant::now();
                return true;
            }
        } else {
            self.failed += 1;
            self.ok_run = 0;
            self.fail_run = self.fail_run.saturating_add(1);
            if self.up && self.fail_run >= o.fall {
                self.up = false;
                self.downs += 1;
                self.since = Instant::now();
                return true;
            }
        }
        false
    }
}

/// Every backend's health, by service and backend index; shared with `status`.
pub type State = Arc<Mutex<Vec<Vec<BackendHealth>>>>;

/// Ends the sockets the balancer sent to `addr` (see [`crate::drain`]); the number ended.
pub fn drain_backend(
    balancer: &Mutex<Balancer>,
    addr: SocketAddr,
    which: DrainKill,
) -> Result<u64, String> {
    let cookies = lock(balancer)
        .cookies_toward(addr)
        .map_err(|e| tcpkit_stats::chain(&e))?;
    let mut free = Vec::new();
    let d = crate::drain::drain(addr, &cookies, which, &mut free)
        .map_err(|e| format!("sock_diag: {e}"))?;
    if !free.is_empty() {
        lock(balancer)
            .forget(&free)
            .map_err(|e| tcpkit_stats::chain(&e))?;
    }
    Ok(d.ended)
}

/// The running probers; [`Health::stop`] ends them and gives the final states.
#[derive(Debug)]
pub struct Health {
    state: State,
    stop: Arc<Stop>,
    threads: Vec<JoinHandle<()>>,
    /// The first error met swapping a set in the kernel, if any.
    error: Arc<Mutex<Option<String>>>,
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The probers' stop signal. They sleep on it between probes rather than in short naps, so
/// an idle balancer does not wake 50 times a second per backend (its CPU shows in the
/// machine's busy time beside every application it balances), and still stops at once.
#[derive(Debug, Default)]
struct Stop {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl Stop {
    fn is_set(&self) -> bool {
        *lock(&self.stopped)
    }

    fn set(&self) {
        *lock(&self.stopped) = true;
        self.cv.notify_all();
    }

    /// Sleeps until `until` or the stop, whichever comes first.
    fn sleep_until(&self, until: Instant) {
        let mut stopped = lock(&self.stopped);
        while !*stopped {
            let now = Instant::now();
            if now >= until {
                return;
            }
            stopped = self
                .cv
                .wait_timeout(stopped, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Health {
    /// Probes every backend of every service that has options in `health` (same order as
    /// `services`), from the states in `state` (one per backend; see [`BackendHealth::new`]).
    /// With `drain`, the sockets still on a backend that goes down are ended
    /// ([`crate::drain`]).
    pub fn start(
        services: &[Service],
        health: &[Option<HealthOptions>],
        balancer: Arc<Mutex<Balancer>>,
        state: State,
        drain: Option<DrainKill>,
    ) -> Health {
        let stop = Arc::new(Stop::default());
        let error = Arc::new(Mutex::new(None));
        let mut threads = Vec::new();
        for (si, s) in services.iter().enumerate() {
            let Some(o) = health.get(si).cloned().flatten() else {
                continue;
            };
            for (bi, b) in s.backends.iter().enumerate() {
                let o = o.clone();
                let (state, stop, error, balancer) = (
                    Arc::clone(&state),
                    Arc::clone(&stop),
                    Arc::clone(&error),
                    Arc::clone(&balancer),
                );
                let (addr, vip) = (b.addr, s.vip);
                let t = std::thread::Builder::new()
                    .name(format!("tcpkit-health-{addr}"))
                    .spawn(move || {
                        let start = Instant::now();
                        let mut k: u32 = 0;
                        while !stop.is_set() {
                            let result = probe(addr, &o.probe, o.timeout);
                            let mut st = lock(&state);
                            let mut went_down = false;
                            if st[si][bi].probe(result, &o) {
                                crate::trace::write_line(
                                    &mut std::io::stderr().lock(),
                                    st[si][bi].transition(addr, vip, &o),
                                );
                                let live: Vec<bool> = st[si].iter().map(|h| h.up).collect();
                                went_down = !live[bi];
                                // Under the state lock: swaps happen in the order of changes.
                                if let Err(e) = lock(&balancer).set_live(si, &live) {
                                    lock(&error).get_or_insert_with(|| tcpkit_stats::chain(&e));
                                }
                            }
                            drop(st);
                            // Out of the selection first, so no new socket lands there while
                            // the old ones are ended.
                            if let (true, Some(which)) = (went_down, drain) {
                                match drain_backend(&balancer, addr, which) {
                                    Ok(n) => lock(&state)[si][bi].drained += n,
                                    Err(e) => {
                                        crate::trace::write_line(
                                            &mut std::io::stderr().lock(),
                                            format!("tcpkit balance: --drain-kill {addr}: {e}"),
                                        );
                                        lock(&error)
                                            .get_or_insert(format!("--drain-kill {addr}: {e}"));
                                    }
                                }
                            }
                            // Absolute schedule: start + k * interval, skipping the slots a
                            // slow probe (up to its timeout) overran rather than probing
                            // back to back until caught up.
                            let due = start.elapsed().as_nanos() / o.interval.as_nanos();
                            k = (k + 1).max(u32::try_from(due + 1).unwrap_or(u32::MAX));
                            stop.sleep_until(start + o.interval * k);
                        }
                    });
                if let Ok(t) = t {
                    threads.push(t);
                }
            }
        }
        Health {
            state,
            stop,
            threads,
            error,
        }
    }

    /// Stops the probers (each ends within its probe timeout) and returns the states.
    pub fn stop(self) -> (Vec<Vec<BackendHealth>>, Option<String>) {
        self.stop.set();
        for t in self.threads {
            let _ = t.join();
        }
        let st = lock(&self.state).clone();
        let e = lock(&self.error).clone();
        (st, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prober_sleeps_until_its_next_probe_or_the_stop_whichever_is_first() {
        let stop = Arc::new(Stop::default());
        let t = Instant::now();
        stop.sleep_until(t + Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(30));
        // Stopped from another thread an hour before the next probe: wakes at once.
        let s = Arc::clone(&stop);
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            s.set();
        });
        let t = Instant::now();
        stop.sleep_until(t + Duration::from_secs(3600));
        assert!(stop.is_set());
        assert!(t.elapsed() < Duration::from_secs(3000));
        waker.join().unwrap();
        // And a stopped signal never sleeps again.
        stop.sleep_until(Instant::now() + Duration::from_secs(3600));
    }

    #[test]
    fn falls_after_fall_failures_and_rises_after_rise_successes() {
        let o = HealthOptions {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
            probe: Probe::Connect,
        };
        let bad = || Err("refused".to_string());
        let mut h = BackendHealth::new(true);
        assert!(!h.probe(bad(), &o) && !h.probe(bad(), &o) && h.up);
        assert!(!h.probe(Ok(()), &o), "a success resets the failure run");
        assert!(h.last_failure.is_none());
        assert!(!h.probe(bad(), &o) && !h.probe(bad(), &o));
        assert!(h.probe(bad(), &o) && !h.up && h.downs == 1);
        assert_eq!(h.last_failure.as_deref(), Some("refused"));
        let line = h.transition(
            "198.18.0.2:80".parse().unwrap(),
            "198.19.0.1:80".parse().unwrap(),
            &o,
        );
        assert!(
            line.ends_with(
                "Z tcpkit balance: backend 198.18.0.2:80 (VIP 198.19.0.1:80) down: refused (3 probes failed in a row)"
            ),
            "{line}"
        );
        assert!(!h.probe(Ok(()), &o) && !h.up);
        assert!(h.probe(Ok(()), &o) && h.up);
        assert_eq!((h.probes, h.failed), (8, 5));
    }

    #[test]
    fn an_added_backend_is_out_until_its_first_probe_passes() {
        let o = HealthOptions {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            rise: 3,
            fall: 2,
            probe: Probe::Connect,
        };
        let mut h = BackendHealth::added();
        assert!(!h.up && h.checked);
        assert!(!h.probe(Err("refused".into()), &o) && !h.up && h.downs == 0);
        assert!(h.probe(Ok(()), &o) && h.up, "one pass, not rise");
        // From then on an ordinary backend: down after fall, up after rise.
        assert!(!h.probe(Err("x".into()), &o) && h.probe(Err("x".into()), &o) && !h.up);
        assert!(!h.probe(Ok(()), &o) && !h.probe(Ok(()), &o) && h.probe(Ok(()), &o));
    }

    #[test]
    fn probes_are_chosen_by_protocol_and_payload() {
        assert_eq!(Probe::new(false, None, None), Ok(Probe::Connect));
        assert_eq!(Probe::new(true, None, None), Ok(Probe::UdpUnreachable));
        assert_eq!(
            Probe::new(true, None, Some(b"x".to_vec())),
            Err(ConfigError::UdpExpectWithoutSend)
        );
        assert_eq!(
            Probe::new(false, None, Some(b"220".to_vec()))
                .unwrap()
                .kind(),
            "tcp-send-expect"
        );
        assert!(Probe::new(false, Some(vec![0; MAX_SEND + 1]), None).is_err());
        assert!(Probe::new(true, Some(vec![1]), Some(vec![0; MAX_EXPECT + 1])).is_err());
    }

    #[test]
    fn replies_are_judged_by_their_prefix() {
        assert!(check_reply(b"+PONG", b"+PONG", false).is_ok());
        assert!(check_reply(b"x", b"", true).is_ok());
        assert_eq!(
            check_reply(b"-ERR", b"+PONG", false).unwrap_err(),
            "reply \"-ERR\" does not start with \"+PONG\""
        );
        assert_eq!(
            check_reply(b"", b"+PONG", true).unwrap_err(),
            "closed without a reply"
        );
        assert!(check_reply(b"+PO", b"+PONG", true)
            .unwrap_err()
            .contains("ended before"));
        assert!(check_reply(b"\x01", b"+", true)
            .unwrap_err()
            .contains("\\x01"));
    }
}
