//! Where a copy's frames come from, for every copy mode: a live capture (its ring's fd in the
//! mode's event loop) or a capture file played at its own pace (`--speed`, `--max-idle`,
//! `--loop`). Either way the frames go through the reassembler ([`Tracker`]) and its events
//! to the mode (`Consumer`), which between batches serves its own I/O. Relay and transparent
//! mode differ in how a copy reaches the target, not in how the input is read, so the loops
//! live here once. With `--tls-uprobe-calls` the input is the plaintext the probes read at
//! the server's TLS library ([`uprobe`]), handed over as the same events; with `--tls-keylog`
//! or `--tls-uprobe` (the secrets probes) the TLS layer stands between the capture and the
//! mode.

pub mod uprobe;

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::report::{CopyReport, TlsSessionStats, TlsStats, UprobeStats};
use bytes::Bytes;
use mio::unix::SourceFd;
use mio::{Events, Interest, Registry, Token};
use tcpkit_capture::{Capture, CaptureError, CaptureOpts};
use tcpkit_pace::{now_ns, CaptureClock, Speed};
use tcpkit_pcap::{CaptureFile, PcapError};
use tcpkit_wire::{as_ethernet, LinkType};

use crate::config::{CopyConfig, CopyCounters};
use crate::reasm::{CloseKind, Dir, Event, SessionId, Tracker, TrackerConfig};
use crate::transfer::{self, Rule};

/// The capture's token in a mode's event loop.
pub(crate) const CAPTURE: Token = Token(usize::MAX);
/// How far behind the wall clock the live capture's reassembler is ticked (see its use).
const TICK_LAG_NS: u64 = 250_000_000;
/// Capture handled per turn of the live loop before the copies are served.
const CAPTURE_SLICE_NS: u64 = 2_000_000;

/// Whether a live capture's interface is up, looked at with the capture's counters: an
/// interface that goes down stops the capture without an error (the kernel hooks the packet
/// socket back in when it comes up), so the gap would pass unseen. Each change is said at
/// once and the gap counted in the report (`capture.interface_downs`,
/// `capture.interface_down_seconds`).
#[derive(Debug, Default)]
struct LinkWatch {
    /// When the interface was found down (0: up).
    down_since: u64,
    /// The interface cannot be asked about (`any`, or the ioctl failed): not watched.
    off: bool,
}

impl LinkWatch {
    fn check<C: Consumer>(
        &mut self,
        c: &mut C,
        say: &dyn Fn(&str),
        ifname: &str,
        fd: i32,
        now: u64,
    ) {
        if self.off {
            return;
        }
        let Some(up) = link_up(ifname, fd) else {
            self.off = true;
            return;
        };
        match (up, self.down_since) {
            (false, 0) => {
                self.down_since = now;
                c.report().capture.interface_downs += 1;
                say(&format!(
                    "capture: {ifname} went down: nothing is captured (nor copied) until it \
                     comes back up; copying goes on then"
                ));
            }
            (true, 1..) => {
                let secs = self.close(c, now);
                say(&format!(
                    "capture: {ifname} is up again (down {:.1} s, not captured meanwhile)",
                    secs
                ));
            }
            _ => {}
        }
    }

    /// Adds the gap so far to the report; the seconds it lasted.
    fn close<C: Consumer>(&mut self, c: &mut C, now: u64) -> f64 {
        let secs = now.saturating_sub(self.down_since) as f64 / 1e9;
        c.report().capture.interface_down_seconds += secs;
        self.down_since = 0;
        secs
    }

    /// The run ends: a gap still open counts up to now.
    fn end<C: Consumer>(&mut self, c: &mut C, now: u64) {
        if self.down_since != 0 {
            self.close(c, now);
        }
    }
}

/// Whether `ifname` is up with a carrier (IFF_UP and IFF_RUNNING), asked on the capture's
/// own socket (it is in the capture's network namespace); None for `any` or when the kernel
/// cannot say.
fn link_up(ifname: &str, fd: i32) -> Option<bool> {
    if ifname == "any" || ifname.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: ifreq is plain old data; all zeroes is a valid (empty) request.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(ifname.as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads and writes one ifreq, which we own.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) } < 0 {
        return None;
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
    Some(flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0)
}

/// Where frames come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Live capture on an interface ("any" for all).
    Live { ifname: String },
    /// A pcap or pcapng file, at its own pace divided by `speed`, gaps capped at
    /// `max_idle_ns`, `loops` times.
    File {
        path: PathBuf,
        speed: f64,
        max_idle_ns: Option<u64>,
        loops: u32,
    },
    /// `--tls-uprobe-calls`: the plaintext of the server's TLS connections, read by BPF uprobes at
    /// SSL_read/SSL_write of each library or binary in `targets`, in every process mapping
    /// it or only in `pid`.
    Uprobe {
        targets: Vec<PathBuf>,
        pid: Option<u32>,
    },
}

impl Input {
    /// A capture file's first check, before the run starts: opened (a regular file's header
    /// read too), so a file missing, unreadable or not a pcap/pcapng is said before anything
    /// runs. A pipe or device is only opened: reading it here would consume what the run
    /// must read. A live input is checked when its capture opens.
    pub fn file_usable(&self) -> Result<(), PcapError> {
        let Input::File { path, .. } = self else {
            return Ok(());
        };
        if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            return CaptureFile::open(path).map(drop);
        }
        std::fs::File::open(path)
            .map(drop)
            .map_err(|source| PcapError::Io {
                path: path.clone(),
                what: "cannot open",
                source,
            })
    }
}

/// Why the input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("capture")]
    Capture {
        ifname: String,
        #[source]
        source: CaptureError,
    },
    #[error("input")]
    File(#[source] PcapError),
    #[error("--tls-uprobe")]
    Uprobe(#[source] tcpkit_tlsprobe::ProbeError),
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// A copy mode, as the input loops drive it: the capture side (sessions opening, their
/// bytes, their end) is the same for every mode; how a copy reaches the target is the mode's.
pub(crate) trait Consumer {
    type Error: From<FeedError>;
    /// How long one turn of the live loop waits for the mode's I/O at most.
    const LIVE_WAIT: Duration;
    fn cfg(&self) -> &CopyConfig;
    fn rules(&self) -> &[Rule] {
        &self.cfg().rules
    }
    /// The reassembler as the copy's settings want it: the rules' ports, `--only-full`, and
    /// a share of `--max-memory` for what it buffers.
    fn tracker_config(&self) -> TrackerConfig {
        let c = self.cfg();
        TrackerConfig {
            server_ports: transfer::server_ports(&c.rules),
            only_full: c.only_full,
            max_buffered_total: (c.max_memory / 4).max(1 << 16),
            max_buffered_per_dir: (c.max_memory / 16).clamp(1 << 14, 4 << 20),
            // The client's stream is what is copied: a hole in an answer must not end it.
            skip_server_holes: true,
            ..TrackerConfig::default()
        }
    }
    fn registry(&self) -> &Registry;
    fn report(&mut self) -> &mut CopyReport;
    /// Every frame (Ethernet), before the reassembler sees it.
    fn frame(&mut self, _frame: &[u8]) {}
    /// The reassembler's events; `tracker_mem` is what it holds.
    fn on_events(&mut self, evs: &mut Vec<Event>, tracker_mem: u64) {
        let now = now_ns();
        for ev in evs.drain(..) {
            match ev {
                Event::Open {
                    id,
                    client,
                    server,
                    syn_seen,
                    ..
                } => self.open_session(id, client, server, syn_seen, now),
                Event::Data {
                    id,
                    dir,
                    bytes,
                    ts_ns,
                    ..
                } => self.session_data(id, dir, &bytes, ts_ns, now, tracker_mem),
                Event::Gap {
                    id,
                    dir,
                    len,
                    ts_ns,
                    ..
                } => self.session_gap(id, dir, len, ts_ns),
                Event::Close {
                    id,
                    how,
                    requests_seen,
                    ..
                } => self.close_session(id, how, requests_seen, now),
            }
        }
    }
    /// A session of the capture starts: copy it (rules, sampling) or not.
    fn open_session(
        &mut self,
        id: SessionId,
        client: SocketAddr,
        server: SocketAddr,
        syn_seen: bool,
        now: u64,
    );
    /// Bytes of a session, in order, in direction `dir`, captured at `ts`.
    fn session_data(
        &mut self,
        id: SessionId,
        dir: Dir,
        bytes: &Bytes,
        ts: u64,
        now: u64,
        tracker_mem: u64,
    );
    /// `len` bytes of a session's server direction the capture lost, passed over at `ts`:
    /// the server's turn goes on (its timing and `--diff` are what it affects).
    fn session_gap(&mut self, id: SessionId, dir: Dir, len: u64, ts: u64);
    /// The session ended in the capture (`requests_seen` request turns in all).
    fn close_session(&mut self, id: SessionId, how: CloseKind, requests_seen: u64, now: u64);
    /// Timers, then one wait for I/O of at most `max_wait`, then the I/O.
    fn step(&mut self, events: &mut Events, max_wait: Duration) -> Result<(), Self::Error>;
    fn publish(&mut self, live: &CopyCounters);
}

pub(crate) fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn tracker_stats(r: &mut CopyReport, t: &Tracker) {
    let s = t.stats();
    let c = &mut r.capture;
    c.not_tcp += s.not_tcp_frames;
    c.retransmitted_bytes += s.retransmitted_bytes;
    c.out_of_order_segments += s.out_of_order_segments;
    c.sessions_with_lost_data += s.closed_lost_data;
    c.sessions_not_tracked += s.table_full;
    c.server_bytes_lost += s.skipped_bytes;
}

pub(crate) use tcpkit_stats::chain;

/// How long the copies still running may take to finish after SIGINT/SIGTERM or
/// `--duration`: the user bounded the run, and a silent target would otherwise hold it for its
/// `--timeout` (a Ctrl-C once took 9.2 s). After the end of an input file each copy gets its
/// `--timeout` instead: the file's sessions are the whole job.
pub const STOP_DRAIN: Duration = Duration::from_secs(1);

/// When the drain after the input stopped ends: `STOP_DRAIN` from now when the run was
/// stopped (`stopped`), else `--timeout` and the closing copies' linger.
pub(crate) fn drain_deadline(cfg: &CopyConfig, stopped: bool, linger_ns: u64) -> u64 {
    let now = now_ns();
    if stopped {
        now + STOP_DRAIN.as_nanos() as u64
    } else {
        now + cfg.timeout_ns + 2 * linger_ns
    }
}

/// Whether the run was stopped (a signal, or `--duration` passed) rather than its input
/// ending.
pub(crate) fn stopped(stop: &AtomicBool, end_at: Option<u64>) -> bool {
    stop.load(Ordering::Relaxed) || end_at.is_some_and(|e| now_ns() >= e)
}

/// Think times of the input: (the speed they are divided by, capped at), the pace the file
/// is played at.
pub(crate) fn pace(input: &Input) -> (Speed, u64) {
    match input {
        Input::File {
            speed, max_idle_ns, ..
        } => (Speed::new(*speed), max_idle_ns.unwrap_or(u64::MAX)),
        Input::Live { .. } | Input::Uprobe { .. } => (Speed::new(1.0), u64::MAX),
    }
}

/// Feeds `input` to `c` until it ends (a file), `stop` is set, or `end_at` passes. A capture
/// file that turns out truncated ends the input early with the reason in the report's
/// `failure`. With `--tls-keylog` or `--tls-uprobe` the TLS layer stands between the
/// reassembler and `c`, its secrets from the file or from the probes (attached here, before
/// the capture opens).
pub(crate) fn run<C: Consumer>(
    c: &mut C,
    input: &Input,
    end_at: Option<u64>,
    stop: &AtomicBool,
    live: &CopyCounters,
    events: &mut Events,
    say: &dyn Fn(&str),
) -> Result<(), C::Error> {
    let keys = match (&c.cfg().tls_keylog, &c.cfg().tls_secrets) {
        (Some(path), _) => crate::tls::Keys::file(path),
        (None, Some(p)) => crate::tls::Keys::probes(
            tcpkit_tlsprobe::SecretProbes::attach(&p.targets, p.pid).map_err(FeedError::Uprobe)?,
        ),
        (None, None) => return run_input(c, input, end_at, stop, live, events, say),
    };
    let mut layer = crate::tls::Layer::new(c, keys);
    let r = run_input(&mut layer, input, end_at, stop, live, events, say);
    layer.finish();
    r
}

fn run_input<C: Consumer>(
    c: &mut C,
    input: &Input,
    end_at: Option<u64>,
    stop: &AtomicBool,
    live: &CopyCounters,
    events: &mut Events,
    say: &dyn Fn(&str),
) -> Result<(), C::Error> {
    let past_end = |now: u64| stop.load(Ordering::Relaxed) || end_at.is_some_and(|e| now >= e);
    let mut evs: Vec<Event> = Vec::new();
    let mut eth: Vec<u8> = Vec::new();
    match input {
        Input::Live { ifname } => {
            let filter = transfer::capture_filter(c.rules(), c.cfg().filter.as_deref());
            let cap_err = |source| FeedError::Capture {
                ifname: ifname.clone(),
                source,
            };
            let mut cap = Capture::open(
                ifname,
                &CaptureOpts {
                    filter: Some(filter.clone()),
                    ..CaptureOpts::default()
                },
            )
            .map_err(cap_err)?;
            c.report().source = format!("live {ifname}");
            c.report().filter = filter;
            let link = LinkType::from_dlt(cap.linktype()).unwrap_or(LinkType::Ethernet);
            let fd = cap.as_fd().as_raw_fd();
            c.registry()
                .register(&mut SourceFd(&fd), CAPTURE, Interest::READABLE)
                .map_err(|source| FeedError::Io {
                    what: "watch the capture socket (epoll_ctl)",
                    source,
                })?;
            let mut tracker = Tracker::new(c.tracker_config());
            let mut last_stats = 0u64;
            let mut packets = 0u64;
            let mut watch = LinkWatch::default();
            while !past_end(now_ns()) {
                // Retired blocks for at most CAPTURE_SLICE_NS (at least one), then the copies:
                // a block can hold hundreds of new sessions, each a connect(), and copies left
                // unserved keep their requests unsent (at 20k new connections/s the relay held
                // 15k target connections open, the target closed them as idle).
                let slice_end = now_ns() + CAPTURE_SLICE_NS;
                for _ in 0..64 {
                    let n = cap
                        .next_block(Duration::ZERO, |p| {
                            packets += 1;
                            let Some(frame) = as_ethernet(link, p.data, &mut eth) else {
                                return;
                            };
                            c.frame(frame);
                            tracker.push(p.ts_ns, frame, &mut evs);
                        })
                        .map_err(cap_err)?;
                    let mem = tracker.stats().memory_bytes;
                    c.on_events(&mut evs, mem);
                    if n == 0 || now_ns() >= slice_end {
                        break;
                    }
                }
                // The tracker stamps events with the latest time it knows: ticking it to the
                // wall clock would stamp frames still in the ring (a block retires up to its
                // timeout late) with a later time, and the original latencies would shrink.
                tracker.tick(realtime_ns().saturating_sub(TICK_LAG_NS), &mut evs);
                let mem = tracker.stats().memory_bytes;
                c.on_events(&mut evs, mem);
                c.step(events, C::LIVE_WAIT)?;
                let now = now_ns();
                if now >= last_stats + 250_000_000 {
                    last_stats = now;
                    if let Ok(st) = cap.stats() {
                        c.report().capture.kernel_drops = st.drops;
                    }
                    watch.check(c, say, ifname, cap.as_fd().as_raw_fd(), now);
                }
                c.publish(live);
            }
            watch.end(c, now_ns());
            tracker.finish(&mut evs);
            c.on_events(&mut evs, 0);
            if let Ok(st) = cap.stats() {
                c.report().capture.kernel_drops = st.drops;
            }
            c.report().capture.packets = packets;
            tracker_stats(c.report(), &tracker);
        }
        Input::Uprobe { targets, pid } => run_uprobe(c, targets, *pid, &past_end, live, events)?,
        Input::File {
            path,
            speed,
            max_idle_ns,
            loops,
        } => {
            c.report().source = format!("file {}", path.display());
            let file = CaptureFile::open(path).map_err(FeedError::File)?;
            let wall0 = now_ns();
            // Capture time mapped onto the wall clock: gaps capped, divided by the speed.
            let mut clock = CaptureClock::new(Speed::new(*speed), *max_idle_ns);
            let mut packets = 0u64;
            'loops: for _ in 0..*loops {
                let mut tracker = Tracker::new(c.tracker_config());
                let mut it = file.packets().peekable();
                clock.restart();
                loop {
                    let now = now_ns();
                    if past_end(now) {
                        tracker.finish(&mut evs);
                        c.on_events(&mut evs, 0);
                        tracker_stats(c.report(), &tracker);
                        break 'loops;
                    }
                    // Feed every frame that is due.
                    let mut ended = false;
                    let mut wait = Duration::from_millis(50);
                    let mut next_ts = None;
                    loop {
                        let p = match it.peek() {
                            None => {
                                ended = true;
                                break;
                            }
                            Some(Err(_)) => {
                                if let Some(Err(e)) = it.next() {
                                    c.report().failure = Some(chain(&e));
                                }
                                ended = true;
                                break;
                            }
                            Some(Ok(p)) => *p,
                        };
                        let due = wall0.saturating_add(clock.due(p.ts_ns));
                        if due > now {
                            wait = Duration::from_nanos(due - now);
                            next_ts = Some(p.ts_ns);
                            break;
                        }
                        it.next();
                        clock.take(p.ts_ns);
                        packets += 1;
                        let frame = match LinkType::from_dlt(p.linktype)
                            .ok()
                            .and_then(|l| as_ethernet(l, p.data, &mut eth))
                        {
                            Some(f) => f,
                            None => {
                                c.report().capture.not_tcp += 1;
                                continue;
                            }
                        };
                        c.frame(frame);
                        tracker.push(p.ts_ns, frame, &mut evs);
                        let mem = tracker.stats().memory_bytes;
                        c.on_events(&mut evs, mem);
                    }
                    if ended {
                        tracker.finish(&mut evs);
                        c.on_events(&mut evs, 0);
                        tracker_stats(c.report(), &tracker);
                        if c.report().failure.is_some() {
                            break 'loops;
                        }
                        break;
                    }
                    // The capture's clock runs on while we wait for the next frame, so holes
                    // and idle sessions time out as they would have; never up to that frame's
                    // own time, though, which may be due already (the frames above took long
                    // to feed, or the process was held up: a loaded host, --speed N
                    // multiplying every delay): ticking past it would time out a hole before
                    // frames the capture has before the timeout, and a file's sessions would
                    // end by the host's load, not by the capture.
                    if let Some(t) = clock.capture_now(now_ns().saturating_sub(wall0)) {
                        let t = next_ts.map_or(t, |n: u64| t.min(n.saturating_sub(1)));
                        tracker.tick(t, &mut evs);
                        c.on_events(&mut evs, tracker.stats().memory_bytes);
                    }
                    c.step(events, wait.min(Duration::from_millis(50)))?;
                    c.publish(live);
                }
            }
            c.report().capture.packets = packets;
        }
    }
    Ok(())
}

/// Records taken from the probes' ring per turn before the copies are served.
const UPROBE_SLICE: usize = 4096;

/// `--tls-uprobe-calls`: the probes attached for the run (detached when it returns, or by the
/// kernel if this process dies), their records turned into events until the run ends.
fn run_uprobe<C: Consumer>(
    c: &mut C,
    targets: &[PathBuf],
    pid: Option<u32>,
    past_end: &dyn Fn(u64) -> bool,
    live: &CopyCounters,
    events: &mut Events,
) -> Result<(), C::Error> {
    let mut probes = tcpkit_tlsprobe::Probes::attach(targets, pid).map_err(FeedError::Uprobe)?;
    let names: Vec<String> = targets.iter().map(|t| t.display().to_string()).collect();
    c.report().source = match pid {
        Some(p) => format!("uprobe {} pid {p}", names.join(",")),
        None => format!("uprobe {}", names.join(",")),
    };
    let fd = probes.as_raw_fd();
    c.registry()
        .register(&mut SourceFd(&fd), CAPTURE, Interest::READABLE)
        .map_err(|source| FeedError::Io {
            what: "watch the probes' ring buffer (epoll_ctl)",
            source,
        })?;
    let ports = transfer::server_ports(c.rules());
    let mut s = uprobe::Sessions::new(
        ports,
        c.cfg().only_full,
        tcpkit_tlsprobe::mono_to_realtime_ns(),
    );
    let mut evs: Vec<Event> = Vec::new();
    while !past_end(now_ns()) {
        for _ in 0..16 {
            let n = probes.drain(UPROBE_SLICE, |r| s.take(r, &mut evs));
            c.on_events(&mut evs, 0);
            if n < UPROBE_SLICE {
                break;
            }
        }
        s.tick(now_ns(), realtime_ns(), uprobe::alive, &mut evs);
        c.on_events(&mut evs, 0);
        c.step(events, C::LIVE_WAIT)?;
        c.publish(live);
    }
    probes.drain(usize::MAX, |r| s.take(r, &mut evs));
    s.finish(realtime_ns(), &mut evs);
    c.on_events(&mut evs, 0);
    let k = probes.counters();
    let t = &s.tally;
    // Sessions not followed (the table full) are named with the rest that were not copied.
    let mut unsupported = std::collections::BTreeMap::new();
    if t.not_tracked > 0 {
        unsupported.insert("table full".to_string(), t.not_tracked);
    }
    c.report().tls = Some(TlsStats {
        source: "uprobe".into(),
        sessions: TlsSessionStats {
            decrypted: t.copied,
            unsupported,
            ..TlsSessionStats::default()
        },
        uprobe: Some(UprobeStats {
            targets: names,
            pids: t.pids,
            records: t.records,
            lost_records: k.lost_records,
            unmatched: t.unmatched + k.unmatched_calls,
            mode: "calls".into(),
            library: None,
        }),
        ..TlsStats::default()
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_times_follow_the_files_pace_and_live_input_is_real_time() {
        let file = Input::File {
            path: PathBuf::from("x.pcap"),
            speed: 4.0,
            max_idle_ns: Some(2_000_000_000),
            loops: 1,
        };
        let (speed, cap) = pace(&file);
        assert_eq!(speed.wall(400_000_000), 100_000_000);
        assert_eq!(cap, 2_000_000_000);
        let uncapped = Input::File {
            path: PathBuf::from("x.pcap"),
            speed: 0.5,
            max_idle_ns: None,
            loops: 1,
        };
        let (speed, cap) = pace(&uncapped);
        assert_eq!(speed.wall(1), 2);
        assert_eq!(cap, u64::MAX);
        let live = Input::Live {
            ifname: "any".into(),
        };
        let (speed, cap) = pace(&live);
        assert_eq!(speed.wall(123_456_789), 123_456_789);
        assert_eq!(cap, u64::MAX);
    }

    #[test]
    fn stopped_by_the_flag_or_the_end_time() {
        let stop = AtomicBool::new(false);
        assert!(!stopped(&stop, None));
        assert!(!stopped(&stop, Some(u64::MAX)));
        assert!(stopped(&stop, Some(0)));
        stop.store(true, Ordering::Relaxed);
        assert!(stopped(&stop, None));
    }
}
