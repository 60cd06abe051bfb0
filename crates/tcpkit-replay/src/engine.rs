//! The worker loop: one composition of (inputs × loops) → frame → schedule × stop conditions →
//! batched sink. Every mode (capture timing, rates, top speed, dry run, sharded threads) is this
//! one loop with different parts plugged in, never a copy of it.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::report::{
    DeviceStats, FlowStats, IfDelta, MtuTrunc, ReplayReport, ReplayShard, SendPath, TimingError,
    REPLAY_SCHEMA_VERSION,
};
use tcpkit_pace::{now_ns, Pacer, Rate, Schedule};
use tcpkit_pcap::{CaptureFile, PcapError, PcapWriter, PrepCache, PrepDir};
use tcpkit_send::{
    AfPacketOpts, AfPacketSink, Frame, PcapFileSink, SendCounters, SendError, Sink, XdpMode,
    XdpOpts, XdpSink,
};
use tcpkit_stats::plot::{Sample, Timeline};
use tcpkit_stats::{chain, Histogram, LiveCounters};
use tcpkit_wire::{
    flow_shard, shard_hash, to_ethernet, unique_ip, unique_ports, LinkType, MacAddr,
    RewriteOutcome, Rewriter, Uncut,
};
use tcpkit_workers::Shard;

use crate::config::{Config, Output};
use crate::flows::LoopFlows;
use crate::prep::SplitCounts;

/// Ethernet's link type, the one every frame we emit has.
pub(crate) const DLT_EN10MB: u32 = 1;
/// Frames handed to the sink per call, listed on the stack (see `Worker::flush`).
const SEND_CHUNK: usize = 64;
/// Longer waits are cut into pieces this long so an interrupt or the end of `--duration` is
/// seen promptly even inside a long capture gap.
const WAIT_SLICE_NS: u64 = 50_000_000;

/// A run that started: its report, and the error that ended it early, if any (the report still
/// counts what was sent before it).
#[derive(Debug)]
pub struct Outcome {
    pub report: ReplayReport,
    pub error: Option<ReplayError>,
    /// How late paced frames left (ns), over the whole run: what the report's percentiles
    /// and `--plot`'s spectrum come from. Empty at top speed and for `-w`.
    pub late: Histogram,
    /// With [`Config::timeline`]: the timing error per interval (the first sender's; paced
    /// runs have one).
    pub timeline: Vec<Sample>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Input(#[from] PcapError),
    /// An input named on the command line cannot be opened or is not a capture (found before
    /// anything is sent: a usage error, exit 2).
    #[error(transparent)]
    InputFile(PcapError),
    /// A pcap input whose file header names a link type replay cannot send (a usage error:
    /// nothing is sent). pcapng names link types per interface, found as packets come.
    #[error("{path}: {source}")]
    InputLink {
        path: String,
        #[source]
        source: tcpkit_wire::WireError,
    },
    /// `--cachefile FILE` cannot be read or is not a tcpprep cache (a usage error: nothing is
    /// sent).
    #[error("--cachefile {0}")]
    CacheFile(String),
    /// `-w FILE` cannot be created (found before anything is written: a usage error).
    #[error("-w: {0}")]
    OutputFile(#[source] SendError),
    /// A packet the capture holds but we cannot send as it is; `offset` is the record's byte
    /// offset in the file, `what` says what is wrong inside the packet.
    #[error("{path}: packet {number} at byte offset {offset}: {what}")]
    Packet {
        path: String,
        number: u64,
        offset: u64,
        what: String,
    },
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("{0}")]
    Setup(String),
    /// The kernel said the interface is down (ENETDOWN); the text says how to bring it up.
    #[error("{0}")]
    Down(String),
    /// Writing to the `-v` decoder failed (it exited, or its pipe broke).
    #[error("-v: writing packets to the decoder")]
    Tap(#[source] std::io::Error),
}

/// A copy of every frame handed to the sink, as a pcap stream (ns timestamps: the time each
/// frame was due to leave in capture time, as the capture has it): what `-v` pipes to tcpdump,
/// as tcpreplay -v does.
pub struct Tap {
    out: Mutex<PcapWriter<Box<dyn Write + Send>>>,
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tap")
    }
}

impl Tap {
    /// Writes the pcap file header to `out` at once, so a reader that cannot start is seen
    /// before the first packet leaves.
    pub fn new(out: Box<dyn Write + Send>) -> std::io::Result<Tap> {
        let mut w = PcapWriter::new(out, DLT_EN10MB, 262_144, true)?;
        w.flush()?;
        Ok(Tap { out: Mutex::new(w) })
    }

    /// Flushes and hands back the stream (closing it tells the reader the capture ended).
    pub fn finish(self) -> std::io::Result<Box<dyn Write + Send>> {
        let w = self
            .out
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        w.finish()
    }
}

/// Runs a replay. `Err` means nothing was sent (setup failed); a failure after sending began
/// comes back inside the [`Outcome`] with the counts so far.
pub fn run(
    cfg: &Config,
    interrupt: &AtomicBool,
    live: &LiveCounters,
) -> Result<Outcome, ReplayError> {
    run_with_tap(cfg, interrupt, live, None)
}

/// [`run`], with every frame also written to `tap` just before it is sent.
pub fn run_with_tap(
    cfg: &Config,
    interrupt: &AtomicBool,
    live: &LiveCounters,
    tap: Option<&Tap>,
) -> Result<Outcome, ReplayError> {
    if cfg.inputs.is_empty() {
        return Err(ReplayError::Setup("no input file given".into()));
    }
    if cfg.threads > 1 && !matches!(cfg.rate, Rate::Topspeed) {
        return Err(ReplayError::Setup(
            "--threads above 1 needs --topspeed".into(),
        ));
    }
    let files = cfg
        .inputs
        .iter()
        .map(|p| {
            if cfg.preload {
                CaptureFile::read_into_memory(p)
            } else {
                CaptureFile::open(p)
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(ReplayError::InputFile)?;
    for f in &files {
        if let tcpkit_pcap::Format::Pcap { linktype, .. } = f.format() {
            LinkType::from_dlt(linktype).map_err(|source| ReplayError::InputLink {
                path: f.path().display().to_string(),
                source,
            })?;
        }
    }

    if cfg.intf2.is_some() {
        if cfg.threads > 1 {
            return Err(ReplayError::Setup(
                "--intf2 sends from one thread, which keeps the capture's order across the two interfaces: leave out --threads".into(),
            ));
        }
        if !matches!(cfg.output, Output::Interface { .. }) {
            return Err(ReplayError::Setup("--intf2 needs -i/--intf1".into()));
        }
    }
    let splits = match &cfg.intf2 {
        Some(i) => Some(crate::prep::splits(&i.split, &files)?),
        None => None,
    };
    let (if_mac, if_mtu, if_before, dry_run, out_name) = match &cfg.output {
        Output::Interface { name, .. } => {
            let info = tcpkit_send::if_info(name)?;
            if !info.is_ethernet {
                return Err(ReplayError::Setup(format!(
                    "{name}: not an Ethernet interface; replay sends Ethernet frames"
                )));
            }
            let before = tcpkit_send::if_counters(name).ok();
            (
                info.mac.map(MacAddr),
                Some(info.mtu),
                before,
                false,
                name.clone(),
            )
        }
        Output::File(p) => (None, None, None, true, p.display().to_string()),
    };
    let l2_src = cfg.l2_src.or(if_mac).unwrap_or(MacAddr([0; 6]));
    let l2_dst = cfg.l2_dst.unwrap_or(MacAddr::BROADCAST);

    let rewriter = Rewriter::new(cfg.rewrite.clone());
    // Marks hold when every frame leaves as captured and a flow is new only once: no
    // rewriting, no --unique-*, no expiry, every packet sent (no split, no other hosts).
    let marks = (cfg.preload
        && rewriter.is_identity()
        && !cfg.unique_ip
        && !cfg.unique_ports
        && cfg.flow_expiry.is_none()
        && splits.is_none()
        && cfg.shard.is_none_or(|s| s.count <= 1))
    .then(|| crate::flows::premark(&files))
    .flatten();
    let shared = Shared {
        cfg,
        files: &files,
        rewriter,
        l2_src,
        l2_dst,
        interrupt,
        live,
        reserved: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        start_ns: AtomicU64::new(0),
        tap,
        splits,
        marks,
    };

    let threads = cfg.threads.max(1);
    live.senders.store(threads as u64, Ordering::Relaxed);
    let (mut sinks, send) = open_sinks(cfg, &files, threads)?;

    let mut sink2: Option<Box<dyn Sink + Send>> = None;
    let mut if2_before = None;
    if let (Some(i2), Output::Interface { qdisc_bypass, .. }) = (&cfg.intf2, &cfg.output) {
        let info = tcpkit_send::if_info(&i2.name)?;
        if !info.is_ethernet {
            return Err(ReplayError::Setup(format!(
                "--intf2 {}: not an Ethernet interface; replay sends Ethernet frames",
                i2.name
            )));
        }
        if2_before = tcpkit_send::if_counters(&i2.name).ok();
        let out2 = Output::Interface {
            name: i2.name.clone(),
            qdisc_bypass: *qdisc_bypass,
        };
        sink2 = Some(Box::new(
            AfPacketSink::open(
                &i2.name,
                AfPacketOpts {
                    qdisc_bypass: *qdisc_bypass,
                    batch: cfg.batch,
                    ..AfPacketOpts::default()
                },
            )
            .map_err(|e| down_hint(e.into(), &out2))?,
        ));
    }

    // A fleet agent is prepared here (captures mapped and their link types checked, every
    // sink open): ready, then the barrier's instant on this host's clock, waited for with the
    // hybrid sleep then spin. Stopped before it (another agent failed, the barrier lost), the
    // senders see the stop flag and send nothing.
    if let Some(agent) = &cfg.fleet {
        agent.ready();
        if let Some(at) = agent.wait_start(interrupt) {
            tcpkit_fleet::clock::wait_until_wall(at);
        }
    }
    let results: Vec<WorkerResult> = if threads == 1 {
        let sink = sinks.pop().expect("one sink");
        let mut w = Worker::new(&shared, 0, 1, sink);
        w.sink2 = sink2;
        vec![w.run()]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = sinks
                .into_iter()
                .enumerate()
                .map(|(i, sink)| {
                    let shared = &shared;
                    s.spawn(move || Worker::new(shared, i, threads, sink).run())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| WorkerResult::panicked()))
                .collect()
        })
    };
    let end_ns = now_ns();
    if shared.start_ns.load(Ordering::SeqCst) == 0 {
        shared.start_ns.store(end_ns, Ordering::SeqCst);
    }

    let mut counts = SplitCounts::default();
    for r in &results {
        counts.add(&r.split);
    }
    let mut out = report(
        cfg, &shared, results, end_ns, dry_run, out_name, if_before, if_mac, if_mtu,
    );
    out.report.split = crate::prep::split_report(cfg, &counts, if2_before);
    out.report.send = send;
    Ok(out)
}

/// A sending thread's sink.
type Sender = Box<dyn Sink + Send>;

/// One sink per sending thread, and how they send (for the report; None for `-w`). With
/// `--xdp`, thread i sends through an AF_XDP socket on transmit queue `first + i`; any reason
/// one cannot be opened ends the run before anything is sent, with the AF_PACKET path named
/// as the way out (never a silent fallback: the user asked for this path).
fn open_sinks(
    cfg: &Config,
    files: &[CaptureFile],
    threads: usize,
) -> Result<(Vec<Sender>, Option<SendPath>), ReplayError> {
    let mut sinks: Vec<Sender> = Vec::with_capacity(threads);
    let (name, qdisc_bypass) = match &cfg.output {
        Output::Interface { name, qdisc_bypass } => (name, *qdisc_bypass),
        Output::File(p) => {
            for _ in 0..threads {
                sinks.push(Box::new(
                    PcapFileSink::create(p, DLT_EN10MB, out_snaplen(files))
                        .map_err(ReplayError::OutputFile)?,
                ));
            }
            return Ok((sinks, None));
        }
    };
    let Some(first) = cfg.xdp_queue else {
        for _ in 0..threads {
            let opts = AfPacketOpts {
                qdisc_bypass,
                batch: cfg.batch,
                ..AfPacketOpts::default()
            };
            let sink =
                AfPacketSink::open(name, opts).map_err(|e| down_hint(e.into(), &cfg.output))?;
            sinks.push(Box::new(sink));
        }
        return Ok((sinks, Some(SendPath::af_packet())));
    };
    let mut queues = Vec::with_capacity(threads);
    let mut mode = None;
    for i in 0..threads {
        let queue = first.saturating_add(i as u32);
        let opts = XdpOpts {
            queue,
            batch: cfg.batch,
        };
        let sink = XdpSink::open(name, opts).map_err(|e| {
            let more = if threads > 1 {
                format!(
                    " (--threads {threads} takes queues {first}-{})",
                    first as usize + threads - 1
                )
            } else {
                String::new()
            };
            match down_hint(e.into(), &cfg.output) {
                down @ ReplayError::Down(_) => down,
                e => ReplayError::Setup(format!(
                    "--xdp{more}: {}; or leave out --xdp to send through AF_PACKET",
                    chain(&e)
                )),
            }
        })?;
        queues.push(queue);
        mode = Some(sink.mode());
        sinks.push(Box::new(sink));
    }
    Ok((
        sinks,
        Some(SendPath::af_xdp(mode.map(XdpMode::as_str), queues)),
    ))
}

#[expect(
    clippy::too_many_arguments,
    reason = "facts of the run its one caller gathered at different moments (interface counters, MAC, MTU); a struct for one call would only rename them"
)]
fn report(
    cfg: &Config,
    shared: &Shared<'_>,
    results: Vec<WorkerResult>,
    end_ns: u64,
    dry_run: bool,
    out_name: String,
    if_before: Option<tcpkit_send::IfCounters>,
    if_mac: Option<MacAddr>,
    if_mtu: Option<u32>,
) -> Outcome {
    let mut dev = SendCounters::default();
    let mut hist = Histogram::new();
    let (mut flows, mut flow_packets, mut non_flow, mut conns) = (0, 0, 0, 0);
    let (mut invalid, mut mtu, mut to_others) = (0, MtuCounts::default(), 0);
    let mut last_send = 0u64;
    let (mut eth_added, mut loops, mut virt_ns) = (0, u64::MAX, 0);
    let mut error = None;
    let mut stopped_by = None;
    let mut timeline = Vec::new();
    for mut r in results {
        if timeline.is_empty() {
            timeline = std::mem::take(&mut r.timeline);
        }
        dev = crate::prep::sum_counters(&dev, &r.counters);
        hist.merge(&r.late);
        flows += r.flows.flows();
        flow_packets += r.flows.flow_packets();
        non_flow += r.flows.non_flow_packets();
        conns += r.flows.connections();
        invalid += r.flows.invalid;
        to_others += r.to_others;
        mtu.add(&r.mtu);
        last_send = last_send.max(r.last_send_ns);
        eth_added += r.eth_added;
        loops = loops.min(r.loops_completed);
        virt_ns = virt_ns.max(r.last_offset_ns);
        if error.is_none() {
            error = r.error;
        }
        if stopped_by.is_none() {
            stopped_by = r.stopped_by;
        }
    }
    // A dry run takes no time of its own: its duration is the span of the timestamps it wrote.
    let seconds = if dry_run {
        virt_ns as f64 / 1e9
    } else {
        // Up to the last frame handed to the kernel, as tcpreplay measures.
        let end = if last_send > 0 { last_send } else { end_ns };
        end.saturating_sub(shared.start_ns.load(Ordering::SeqCst)) as f64 / 1e9
    };
    let (bps, mbps, pps) = tcpkit_stats::rates(dev.successful, dev.bytes, seconds);
    let per_sec = |n: u64| {
        if seconds > 0.0 {
            n as f64 / seconds
        } else {
            0.0
        }
    };
    let interface = match (&cfg.output, if_before) {
        (Output::Interface { name, .. }, Some(b)) => {
            tcpkit_send::if_counters(name).ok().map(|a| IfDelta {
                tx_packets: a.tx_packets.saturating_sub(b.tx_packets),
                tx_bytes: a.tx_bytes.saturating_sub(b.tx_bytes),
                tx_dropped: a.tx_dropped.saturating_sub(b.tx_dropped),
                tx_errors: a.tx_errors.saturating_sub(b.tx_errors),
            })
        }
        _ => None,
    };
    if let Some(e) = &error {
        stopped_by = Some(chain(e));
    }
    let paced = !matches!(cfg.rate, Rate::Topspeed) && !dry_run;
    let failure = failure(
        &dev,
        dry_run,
        &out_name,
        if_mtu,
        cfg.rewrite.mtu_trunc,
        &mtu,
    );
    let report = ReplayReport {
        schema_version: REPLAY_SCHEMA_VERSION,
        output: out_name,
        dry_run,
        packets: dev.successful,
        bytes: dev.bytes,
        seconds,
        rate_bps: bps,
        rate_mbps: mbps,
        rate_pps: pps,
        loops_completed: if loops == u64::MAX { 0 } else { loops },
        flows: FlowStats {
            flows,
            flows_per_sec: per_sec(flows),
            flow_packets,
            non_flow_packets: non_flow,
            invalid_packets: invalid,
            connections: conns,
            connections_per_sec: per_sec(conns),
        },
        timing: paced.then(|| TimingError::from_percentiles(&hist.percentiles())),
        device: DeviceStats {
            successful: dev.successful,
            failed: dev.failed,
            failed_too_big: dev.failed_too_big,
            failed_malformed: dev.failed_malformed,
            failed_stuck: dev.failed_stuck,
            truncated: dev.truncated,
            retried_enobufs: dev.retried_enobufs,
            retried_eagain: dev.retried_eagain,
        },
        interface,
        mtu_trunc: cfg.rewrite.mtu_trunc.map(|m| MtuTrunc {
            mtu: m,
            truncated: mtu.cut,
            too_long_not_ip: mtu.not_ip,
            too_long_headers: mtu.long_headers,
        }),
        ethernet_added: eth_added,
        ethernet_src: (eth_added > 0).then(|| {
            let who = match (cfg.l2_src, if_mac) {
                (Some(_), _) => "--src-mac",
                (None, Some(_)) => "the interface's address",
                (None, None) => "no interface: zero",
            };
            format!("{} ({who})", shared.l2_src)
        }),
        ethernet_dst: (eth_added > 0).then(|| shared.l2_dst.to_string()),
        shard: cfg.shard.map(|s| ReplayShard {
            index: s.index,
            count: s.count,
            frames_to_others: to_others,
            flows_kept: conns,
        }),
        stopped_by,
        failure,
        fleet: None,
        split: None,
        send: None,
    };
    let mut report = report;
    if let Some(agent) = &cfg.fleet {
        // The first frame's time zero, on the wall clock through two readings taken together.
        let first = shared.start_ns.load(Ordering::SeqCst);
        let actual = if report.packets > 0 && !dry_run {
            let (w, m) = (tcpkit_fleet::clock::wall_ns(), now_ns());
            w.saturating_sub(m.saturating_sub(first))
        } else {
            0
        };
        if let Some(why) = agent.failure() {
            report.stopped_by = Some(why);
        }
        report.fleet = Some(agent.report(actual));
    }
    Outcome {
        report,
        error,
        late: hist,
        timeline,
    }
}

/// Why not every frame offered was sent whole, with the errno, how many, and what to do, as
/// one line (tcpreplay names the errno per packet; one line with the counts reads better and
/// ends the run's output). None when nothing failed.
fn failure(
    dev: &SendCounters,
    dry_run: bool,
    out: &str,
    mtu: Option<u32>,
    mtu_trunc: Option<u16>,
    cut: &MtuCounts,
) -> Option<String> {
    let bad = dev.failed + dev.truncated;
    if bad == 0 {
        return None;
    }
    let offered = dev.successful + bad;
    let mut why = Vec::new();
    if dev.failed_too_big > 0 {
        why.push(too_big(dev.failed_too_big, out, mtu, mtu_trunc, cut));
    }
    if dev.failed_malformed > 0 {
        why.push(format!(
            "{} refused with Invalid argument (EINVAL): shorter than an Ethernet header (14 bytes)",
            dev.failed_malformed
        ));
    }
    if dev.failed_stuck > 0 {
        why.push(format!(
            "{} given up after the device queue stayed full for over a second (ENOBUFS/EAGAIN): lower the rate, or lengthen the queue (ip link set {out} txqueuelen N)",
            dev.failed_stuck
        ));
    }
    let other = dev
        .failed
        .saturating_sub(dev.failed_too_big + dev.failed_malformed + dev.failed_stuck);
    if other > 0 {
        why.push(if dry_run {
            format!("{other} could not be stored in {out} (a timestamp after 2106, or over 4 GiB)")
        } else {
            format!("{other} not sent after the send error below")
        });
    }
    if dev.truncated > 0 {
        why.push(format!("{} truncated by the kernel", dev.truncated));
    }
    let verb = if dry_run { "written" } else { "sent" };
    Some(format!(
        "{bad} of {offered} packets not {verb}: {}",
        why.join("; ")
    ))
}

/// What stops a worker at a packet it cannot send as it is (`what` says why).
fn packet_failed(path: &str, number: u64, offset: u64, what: &dyn std::fmt::Display) -> Stop {
    Stop::Failed(ReplayError::Packet {
        path: path.to_string(),
        number,
        offset,
        what: what.to_string(),
    })
}

/// A send refused with ENETDOWN says what to do: the interface is down, `ip link set DEV up`
/// brings it up (tcpreplay says only "Network is down").
fn down_hint(e: ReplayError, out: &Output) -> ReplayError {
    let (ReplayError::Send(se), Output::Interface { name, .. }) = (&e, out) else {
        return e;
    };
    let down = se.raw_os_error().map(std::io::Error::from_raw_os_error);
    if down.is_some_and(|d| d.kind() == std::io::ErrorKind::NetworkDown) {
        return ReplayError::Down(format!(
            "{}; {name} is down: bring it up with `ip link set {name} up`",
            chain(&e)
        ));
    }
    e
}

/// The EMSGSIZE part of the failure line. Without --mtu-trunc it is the way out; with it, the
/// line says why it did not help: --mtu above the interface's MTU, frames that are not IP (no
/// datagram length to shorten), or link headers (tags, labels) that the MTU counts too.
fn too_big(n: u64, out: &str, mtu: Option<u32>, mtu_trunc: Option<u16>, cut: &MtuCounts) -> String {
    let mtu_s = mtu.map_or_else(|| "?".to_string(), |m| m.to_string());
    let head = format!("{n} refused with Message too long (EMSGSIZE): the MTU of {out} is {mtu_s}");
    let raise = format!("raise the MTU (ip link set {out} mtu N)");
    let Some(m) = mtu_trunc else {
        return format!("{head}; truncate them with --mtu-trunc --mtu {mtu_s}, or {raise}");
    };
    let mut why = Vec::new();
    if mtu.is_some_and(|i| u32::from(m) > i) {
        why.push(format!("--mtu {m} is above it: use --mtu {mtu_s}"));
    }
    let causes = [
        (
            cut.not_ip,
            "frames longer than --mtu are not IPv4/IPv6 (ARP, MPLS over something else, 802.3), so --mtu-trunc has no datagram length to shorten and leaves them whole".to_string(),
        ),
        (
            cut.long_headers,
            format!("IP frames were cut to --mtu {m} bytes from their IP header, but their link headers (VLAN tags, MPLS labels) are longer than Ethernet's 14 bytes and the MTU counts them: lower --mtu by that much"),
        ),
    ];
    why.extend(
        causes
            .into_iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("{n} {what}")),
    );
    if why.is_empty() {
        why.push("--mtu-trunc did not make them short enough".into());
    }
    format!("{head}; {}; or {raise}", why.join("; "))
}

/// Whether `frame` (Ethernet, before `--unique-ip` and rewriting, so a flow goes to one
/// shard in every loop) belongs to another shard's flow than `host`'s.
fn for_others(host: Option<Shard>, frame: &[u8]) -> bool {
    host.is_some_and(|h| flow_shard(frame, h.count) != h.index)
}

/// What `--mtu-trunc` did, per worker and summed.
#[derive(Debug, Clone, Copy, Default)]
struct MtuCounts {
    /// Frames cut.
    cut: u64,
    /// Frames left longer than an Ethernet header plus --mtu because they are not IP.
    not_ip: u64,
    /// IP frames cut, still too long for their long link headers.
    long_headers: u64,
}

impl MtuCounts {
    fn count(&mut self, o: RewriteOutcome) {
        self.cut += u64::from(o.truncated);
        match o.uncut {
            Some(Uncut::NotIp) => self.not_ip += 1,
            Some(Uncut::LongHeaders) => self.long_headers += 1,
            None => {}
        }
    }

    fn add(&mut self, o: &MtuCounts) {
        self.cut += o.cut;
        self.not_ip += o.not_ip;
        self.long_headers += o.long_headers;
    }
}

/// The snap length `-w` writes in its header: the inputs' largest (a pcapng's are per
/// interface: taken as 65535), never below 65535, which tcprewrite writes and which holds a
/// jumbo frame with the tags and headers replay may add.
fn out_snaplen(files: &[CaptureFile]) -> u32 {
    files
        .iter()
        .filter_map(|f| match f.format() {
            tcpkit_pcap::Format::Pcap { snaplen, .. } => Some(snaplen),
            tcpkit_pcap::Format::PcapNg => None,
        })
        .fold(65_535, u32::max)
}

/// What every worker reads.
struct Shared<'a> {
    cfg: &'a Config,
    files: &'a [CaptureFile],
    rewriter: Rewriter,
    l2_src: MacAddr,
    l2_dst: MacAddr,
    interrupt: &'a AtomicBool,
    live: &'a LiveCounters,
    /// Packets claimed against `--limit` by all workers.
    reserved: AtomicU64,
    /// Set by a worker that failed, so the others stop too.
    abort: AtomicBool,
    /// The run's time zero: when the first packet was ready to leave (0 until then). Taken
    /// then, not at setup, so opening sockets never makes the first packets late.
    start_ns: AtomicU64,
    /// `-v`: every frame is copied here before it is sent.
    tap: Option<&'a Tap>,
    /// `--intf2`: each input's tcpprep cache (one for all with `--cachefile`).
    splits: Option<Vec<PrepCache>>,
    /// Per packet of each input, its flow marks (see `flows::premark`).
    marks: Option<Vec<Vec<u8>>>,
}

impl Shared<'_> {
    fn start(&self) -> u64 {
        let s = self.start_ns.load(Ordering::Acquire);
        if s != 0 {
            return s;
        }
        let now = now_ns();
        match self
            .start_ns
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => now,
            Err(earlier) => earlier,
        }
    }
}

struct WorkerResult {
    counters: SendCounters,
    late: Histogram,
    flows: LoopFlows,
    /// `--shard`: frames of the other shards' flows, not sent here.
    to_others: u64,
    mtu: MtuCounts,
    eth_added: u64,
    loops_completed: u64,
    last_offset_ns: u64,
    /// When the last frame was handed to the kernel (0 if none): the run's end, so closing
    /// sockets and joining threads is not counted as sending time.
    last_send_ns: u64,
    error: Option<ReplayError>,
    stopped_by: Option<String>,
    timeline: Vec<Sample>,
    split: SplitCounts,
}

impl WorkerResult {
    fn panicked() -> WorkerResult {
        WorkerResult {
            counters: SendCounters::default(),
            late: Histogram::new(),
            flows: LoopFlows::new(None, false),
            to_others: 0,
            mtu: MtuCounts::default(),
            eth_added: 0,
            loops_completed: 0,
            last_offset_ns: 0,
            last_send_ns: 0,
            error: Some(ReplayError::Setup("a sender thread panicked".into())),
            stopped_by: None,
            timeline: Vec::new(),
            split: SplitCounts::default(),
        }
    }
}

/// Why a worker stops before its inputs and loops are done.
enum Stop {
    Limit,
    Duration,
    Interrupted,
    Aborted,
    Failed(ReplayError),
}

struct Worker<'a> {
    sh: &'a Shared<'a>,
    shard: usize,
    shards: usize,
    sink: Box<dyn Sink + Send + 'a>,
    /// `--intf2`'s sink: frames whose slot in `second` is true go here.
    sink2: Option<Box<dyn Sink + Send + 'a>>,
    /// Per slot of the batch: the frame leaves by `--intf2`.
    second: Vec<bool>,
    /// Packets the `--intf2` split does not send.
    not_sent: u64,
    schedule: Schedule,
    pacer: Pacer,
    /// The run's time zero as this worker knows it (0 until its first packet).
    t0: u64,
    end_ns: Option<u64>,
    bufs: Vec<Vec<u8>>,
    /// Per slot of the batch: the frame itself when it goes out exactly as captured (no copy
    /// into `bufs`), else None and the frame is in `bufs`.
    direct: Vec<Option<&'a [u8]>>,
    /// Per slot of the batch: when the frame was due (absolute ns), if paced.
    due: Vec<Option<u64>>,
    ts: Vec<u64>,
    n: usize,
    late: Histogram,
    /// `--plot`: the same values per interval, started with the run's time zero.
    timeline: Option<Timeline>,
    flows: LoopFlows,
    /// `--shard` (of more than one): this host's shard; the frames of the others' flows are
    /// skipped, each still taking its place in the whole replay's schedule and `--limit`.
    host: Option<Shard>,
    /// Frames of the whole replay seen so far, this host's and the others' (for `--limit`).
    whole_pos: u64,
    to_others: u64,
    mtu: MtuCounts,
    /// Frames offered in this pass over the inputs so far (sent, failed or still batched):
    /// after the first pass, the exact size of one loop for the live percentage.
    offered_this_loop: u64,
    eth_added: u64,
    last_send_ns: u64,
    /// Dry run: the capture time the first packet had, so written timestamps read like the input.
    base_ts: Option<u64>,
    last_offset_ns: u64,
}

impl<'a> Worker<'a> {
    fn new(
        sh: &'a Shared<'a>,
        shard: usize,
        shards: usize,
        sink: Box<dyn Sink + Send + 'a>,
    ) -> Self {
        let cfg = sh.cfg;
        let batch = cfg.batch.max(1);
        let expiry = cfg.flow_expiry.map(|d| d.as_nanos() as u64);
        Worker {
            sh,
            shard,
            shards,
            sink,
            sink2: None,
            second: vec![false; batch],
            not_sent: 0,
            schedule: Schedule::new(cfg.rate, cfg.max_sleep.map(|d| d.as_nanos() as u64)),
            pacer: Pacer::default(),
            t0: 0,
            end_ns: None,
            // Frames up to a jumbo frame fit without reallocating; larger ones grow a slot once.
            bufs: (0..batch).map(|_| Vec::with_capacity(9216 + 64)).collect(),
            direct: vec![None; batch],
            due: vec![None; batch],
            ts: vec![0; batch],
            n: 0,
            late: Histogram::new(),
            timeline: None,
            // Only --unique-ip and --unique-ports make a loop's frames differ from the first's.
            flows: LoopFlows::new(expiry, !cfg.unique_ip && !cfg.unique_ports),
            host: cfg.shard.filter(|s| s.count > 1),
            whole_pos: 0,
            to_others: 0,
            mtu: MtuCounts::default(),
            offered_this_loop: 0,
            eth_added: 0,
            last_send_ns: 0,
            base_ts: None,
            last_offset_ns: 0,
        }
    }

    fn run(mut self) -> WorkerResult {
        let (loops_completed, stop) = self.run_loops();
        let flushed = self.flush();
        let mut error = None;
        let mut stopped_by = None;
        match stop {
            Some(Stop::Failed(e)) => {
                self.sh.abort.store(true, Ordering::SeqCst);
                error = Some(e);
            }
            Some(Stop::Interrupted) => stopped_by = Some("interrupted".to_string()),
            _ => {}
        }
        if let Err(e) = flushed.and_then(|()| self.sink.flush().map_err(ReplayError::from)) {
            error.get_or_insert(e);
        }
        if let Some(Err(e)) = self.sink2.as_mut().map(|s| s.flush()) {
            error.get_or_insert(e.into());
        }
        let one = self.sink.counters();
        let two = self.sink2.as_ref().map(|s| s.counters());
        let split = SplitCounts {
            intf1: (one.successful, one.bytes),
            intf2: two.map_or((0, 0), |c| (c.successful, c.bytes)),
            not_sent: self.not_sent,
        };
        let error = error.map(|e| down_hint(e, &self.sh.cfg.output));
        let timeline = self
            .timeline
            .take()
            .map(|t| t.finish(self.last_send_ns.max(self.t0)))
            .unwrap_or_default();
        WorkerResult {
            timeline,
            counters: match two {
                Some(t) => crate::prep::sum_counters(&one, &t),
                None => one,
            },
            split,
            late: self.late,
            flows: self.flows,
            to_others: self.to_others,
            mtu: self.mtu,
            eth_added: self.eth_added,
            loops_completed,
            last_offset_ns: self.last_offset_ns,
            last_send_ns: self.last_send_ns,
            error,
            stopped_by,
        }
    }

    fn run_loops(&mut self) -> (u64, Option<Stop>) {
        let cfg = self.sh.cfg;
        let mut loop_no: u64 = 0;
        loop {
            self.sh
                .live
                .loop_started(loop_no, std::mem::take(&mut self.offered_this_loop));
            for (fi, file) in self.sh.files.iter().enumerate() {
                if loop_no > 0 || fi > 0 {
                    // A new file follows the last one at once; a new loop after --loopdelay-ms.
                    let gap = if fi == 0 {
                        cfg.loop_delay.as_nanos() as u64
                    } else {
                        0
                    };
                    self.schedule.restart_timeline(gap);
                    // At top speed there is no schedule to carry the pause: wait it out here.
                    let live = matches!(cfg.output, Output::Interface { .. });
                    if gap > 0 && live && matches!(cfg.rate, Rate::Topspeed) {
                        if let Some(stop) = self.wait(now_ns() + gap) {
                            return (loop_no, Some(stop));
                        }
                    }
                }
                if let Some(stop) = self.send_file(fi, file, loop_no) {
                    return (loop_no, Some(stop));
                }
            }
            loop_no += 1;
            self.flows.loop_done();
            if cfg.loops != 0 && loop_no >= cfg.loops {
                return (loop_no, None);
            }
        }
    }

    fn send_file(&mut self, fi: usize, file: &'a CaptureFile, loop_no: u64) -> Option<Stop> {
        let sh = self.sh;
        let cfg = sh.cfg;
        let split = sh.splits.as_ref().map(|v| &v[fi.min(v.len() - 1)]);
        let unique = (cfg.unique_ip || cfg.unique_ports) && loop_no > 0;
        let path = file.path().display().to_string();
        let identity = sh.rewriter.is_identity();
        // One cached conversion per link type change, not one lookup per packet.
        let mut link_cache: Option<(u32, LinkType)> = None;
        for (i, pkt) in file.packets().enumerate() {
            let pkt = match pkt {
                Ok(p) => p,
                Err(e) => return Some(Stop::Failed(e.into())),
            };
            if i % 64 == 0 {
                if sh.interrupt.load(Ordering::Relaxed) {
                    return Some(Stop::Interrupted);
                }
                if sh.abort.load(Ordering::Relaxed) {
                    return Some(Stop::Aborted);
                }
            }
            if self.t0 == 0 {
                self.t0 = sh.start();
                self.end_ns = cfg.duration.map(|d| self.t0 + d.as_nanos() as u64);
                self.timeline = cfg
                    .timeline
                    .map(|every| Timeline::new(self.t0, every.as_nanos() as u64));
            }
            // tcpreplay's cache_mode: by packet number in this input, before anything else;
            // a packet not sent takes no place in the schedule, as in tcpreplay.
            let mut second = false;
            if let Some(c) = split {
                match c.dir(pkt.number) {
                    Some(PrepDir::Primary) => {}
                    Some(PrepDir::Secondary) => second = true,
                    Some(PrepDir::NoSend) | None => {
                        self.not_sent += 1;
                        continue;
                    }
                }
            }
            let link = match link_cache {
                Some((dlt, l)) if dlt == pkt.linktype => l,
                _ => match LinkType::from_dlt(pkt.linktype) {
                    Ok(l) => {
                        link_cache = Some((pkt.linktype, l));
                        l
                    }
                    Err(e) => return Some(packet_failed(&path, pkt.number, pkt.offset, &e)),
                },
            };
            if self.host.is_some() {
                // --limit counts the whole replay's frames: the shards together send what
                // one unsharded run would.
                if cfg.limit.is_some_and(|l| self.whole_pos >= l) {
                    return Some(Stop::Limit);
                }
                self.whole_pos += 1;
            }
            if self.shards > 1
                && link == LinkType::Ethernet
                && shard_hash(pkt.data) % self.shards as u64 != self.shard as u64
            {
                continue;
            }
            // Another shard's flow: its place in the schedule is kept, and it is not sent. Its
            // length counts under --mbps, so a frame the rewriter may resize is rewritten
            // first there.
            let mbps = matches!(cfg.rate, Rate::Mbps(_));
            let mut others = link == LinkType::Ethernet && for_others(self.host, pkt.data);
            let len_known = identity || !mbps;
            if others && len_known {
                self.skip(pkt.ts_ns, pkt.data.len());
                continue;
            }
            let mut slot = self.n;
            // Frames that leave exactly as captured are sent from the capture's own bytes.
            let as_captured = link == LinkType::Ethernet && identity && !unique;
            if as_captured {
                self.direct[slot] = Some(pkt.data);
            } else {
                self.direct[slot] = None;
                let buf = &mut self.bufs[slot];
                if link == LinkType::Ethernet {
                    buf.clear();
                    buf.extend_from_slice(pkt.data);
                } else {
                    if let Err(e) = to_ethernet(link, pkt.data, sh.l2_src, sh.l2_dst, buf) {
                        return Some(packet_failed(&path, pkt.number, pkt.offset, &e));
                    }
                    if self.shards > 1 && shard_hash(buf) % self.shards as u64 != self.shard as u64
                    {
                        continue;
                    }
                    if for_others(self.host, buf) {
                        others = true;
                        if !mbps {
                            let len = buf.len();
                            self.skip(pkt.ts_ns, len);
                            continue;
                        }
                    } else {
                        self.eth_added += 1;
                    }
                }
                if cfg.unique_ip && loop_no > 0 {
                    unique_ip(buf, loop_no as u32);
                }
                if cfg.unique_ports && loop_no > 0 {
                    unique_ports(buf, loop_no as u32);
                }
                match sh.rewriter.apply(buf) {
                    Ok(o) if !others => self.mtu.count(o),
                    Ok(_) => {}
                    Err(e) => return Some(packet_failed(&path, pkt.number, pkt.offset, &e)),
                }
                if others {
                    let len = self.bufs[slot].len();
                    self.skip(pkt.ts_ns, len);
                    continue;
                }
            }
            if let (Some(limit), None) = (cfg.limit, self.host) {
                let claimed = if self.shards > 1 {
                    sh.reserved.fetch_add(1, Ordering::Relaxed)
                } else {
                    let r = sh.reserved.load(Ordering::Relaxed);
                    sh.reserved.store(r + 1, Ordering::Relaxed);
                    r
                };
                if claimed >= limit {
                    return Some(Stop::Limit);
                }
            }
            let wire_len = self.frame(slot).len() as u32;
            let offset = self.schedule.next(pkt.ts_ns, wire_len);
            let base = *self.base_ts.get_or_insert(pkt.ts_ns);
            let mut sent_at = pkt.ts_ns;
            match (offset, &cfg.output) {
                (Some(off), Output::File(_)) => {
                    sent_at = base.saturating_add(off);
                    self.last_offset_ns = off;
                    if let Some(limit_ns) = cfg.duration.map(|d| d.as_nanos() as u64) {
                        if off > limit_ns {
                            return Some(Stop::Duration);
                        }
                    }
                    self.due[slot] = None;
                }
                (None, Output::File(_)) => {
                    self.last_offset_ns = pkt.ts_ns.saturating_sub(base);
                    self.due[slot] = None;
                }
                (Some(off), Output::Interface { .. }) => {
                    let due = self.t0 + off;
                    if let Some(stop) = self.wait(due) {
                        return Some(stop);
                    }
                    // Waiting sent the frames batched before this one; move it to the
                    // first free slot so the batch stays contiguous.
                    if self.n != slot {
                        self.bufs.swap(slot, self.n);
                        self.direct.swap(slot, self.n);
                        slot = self.n;
                    }
                    self.due[slot] = Some(due);
                }
                (None, Output::Interface { .. }) => {
                    self.due[slot] = None;
                    if let Some(end) = self.end_ns {
                        if now_ns() >= end {
                            return Some(Stop::Duration);
                        }
                    }
                }
            }
            // Flows are counted on what leaves, after --unique-ip and rewriting.
            match &sh.marks {
                Some(m) => self.flows.observe_marked(m[fi][i]),
                None => {
                    let frame = match self.direct[slot] {
                        Some(d) => d,
                        None => &self.bufs[slot][..],
                    };
                    self.flows.observe(frame, sent_at);
                }
            }
            self.offered_this_loop += 1;
            self.ts[slot] = sent_at;
            self.second[slot] = second;
            self.n += 1;
            if self.n == self.bufs.len() {
                if let Err(e) = self.flush() {
                    return Some(Stop::Failed(e));
                }
            }
        }
        None
    }

    /// Passes over another shard's frame: the schedule moves on as if it were sent (so this
    /// shard's frames leave at their times in the whole replay), and it is counted.
    fn skip(&mut self, ts_ns: u64, wire_len: usize) {
        let _ = self.schedule.next(ts_ns, wire_len as u32);
        // A dry run writes timestamps from the whole replay's first frame, as it would.
        self.base_ts.get_or_insert(ts_ns);
        self.to_others += 1;
    }

    /// Waits until `due`, sending what is batched first so no frame waits for a later one.
    fn wait(&mut self, due: u64) -> Option<Stop> {
        loop {
            let now = now_ns();
            if due <= now {
                return None;
            }
            if self.n > 0 {
                if let Err(e) = self.flush() {
                    return Some(Stop::Failed(e));
                }
                continue;
            }
            if self.sh.interrupt.load(Ordering::Relaxed) {
                return Some(Stop::Interrupted);
            }
            if self.sh.abort.load(Ordering::Relaxed) {
                return Some(Stop::Aborted);
            }
            let end = self.end_ns.unwrap_or(u64::MAX);
            if now >= end {
                return Some(Stop::Duration);
            }
            let target = due.min(end).min(now + WAIT_SLICE_NS);
            self.pacer.wait_until(target);
            if target == due {
                return None;
            }
        }
    }

    /// The frame in batch slot `i`.
    fn frame(&self, i: usize) -> &[u8] {
        match self.direct[i] {
            Some(d) => d,
            None => &self.bufs[i],
        }
    }

    fn flush(&mut self) -> Result<(), ReplayError> {
        if self.n == 0 {
            return Ok(());
        }
        let now = now_ns();
        let mut bytes = 0u64;
        for i in 0..self.n {
            if let Some(due) = self.due[i] {
                self.late.record(now.saturating_sub(due));
                if let Some(t) = &mut self.timeline {
                    t.record(now, now.saturating_sub(due));
                }
            }
            bytes += self.frame(i).len() as u64;
        }
        if let Some(tap) = self.sh.tap {
            let mut w = tap
                .out
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for i in 0..self.n {
                let f = self.frame(i);
                let r = w.write_packet(self.ts[i], f, f.len() as u32);
                if let Err(e) = r {
                    self.n = 0;
                    return Err(ReplayError::Tap(e));
                }
            }
            // Flushed per batch so the decoded lines follow the sending, not a buffer.
            if let Err(e) = w.flush() {
                self.n = 0;
                return Err(ReplayError::Tap(e));
            }
        }
        // The sink takes borrowed frames; they are listed on the stack, SEND_CHUNK at a time,
        // so a paced run (a batch of one per packet) allocates nothing per packet.
        // With --intf2, each run of frames for one side goes in one call, the runs in the
        // capture's order: no frame is handed to the kernel before an earlier one.
        let (direct, bufs, ts, second) = (&self.direct, &self.bufs, &self.ts, &self.second);
        let failed_now = |a: &dyn Sink, b: &Option<Box<dyn Sink + Send + 'a>>| {
            a.counters().failed + b.as_ref().map_or(0, |s| s.counters().failed)
        };
        let before = failed_now(&*self.sink, &self.sink2);
        let mut r = Ok(());
        let mut start = 0;
        while start < self.n {
            let side = second[start];
            let mut len = 1;
            while len < SEND_CHUNK && start + len < self.n && second[start + len] == side {
                len += 1;
            }
            let frames: [Frame<'_>; SEND_CHUNK] = std::array::from_fn(|i| {
                if i < len {
                    Frame {
                        data: direct[start + i].unwrap_or(&bufs[start + i]),
                        ts_ns: ts[start + i],
                    }
                } else {
                    Frame {
                        data: &[],
                        ts_ns: 0,
                    }
                }
            });
            let sink = match (side, self.sink2.as_mut()) {
                (true, Some(s2)) => s2,
                _ => &mut self.sink,
            };
            r = sink.send_batch(&frames[..len]);
            if r.is_err() {
                break;
            }
            start += len;
        }
        self.last_send_ns = now_ns();
        let failed = failed_now(&*self.sink, &self.sink2) - before;
        self.sh
            .live
            .add(self.n as u64 - failed.min(self.n as u64), bytes);
        self.sh.live.failed.fetch_add(failed, Ordering::Relaxed);
        self.n = 0;
        r.map_err(ReplayError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> MtuCounts {
        MtuCounts::default()
    }

    /// Issue 24: at top speed the live line said "loop 1821/2000 100.0%": one loop's size was
    /// read from the sent count when the second loop began, short of the batch not yet
    /// flushed (64 of 100 here), so the whole run looked done early.
    #[test]
    fn one_loop_is_counted_whole_with_a_batch_still_unflushed() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.pcap");
        let mut w = PcapWriter::create(&input, DLT_EN10MB, 65535, false).unwrap();
        for i in 0..100u64 {
            let mut f = vec![0u8; 60];
            f[12..14].copy_from_slice(&[0x08, 0x06]);
            w.write_packet(i * 1000, &f, 60).unwrap();
        }
        w.finish().unwrap();
        let mut cfg = Config::new(vec![input], Output::File(dir.path().join("out.pcap")));
        cfg.rate = Rate::Topspeed;
        cfg.loops = 3;
        let live = LiveCounters::default();
        let out = run(&cfg, &AtomicBool::new(false), &live).unwrap();
        assert_eq!(out.report.packets, 300);
        assert_eq!(live.one_loop(), Some(100));
    }

    #[test]
    fn with_mtu_trunc_the_line_says_why_it_did_not_help() {
        let dev = SendCounters {
            successful: 8,
            failed: 2,
            failed_too_big: 2,
            ..SendCounters::default()
        };
        let cut = MtuCounts {
            cut: 31,
            not_ip: 1,
            long_headers: 1,
        };
        let line = failure(&dev, false, "veth0", Some(1500), Some(1500), &cut).unwrap();
        assert!(!line.contains("truncate them with --mtu-trunc"), "{line}");
        assert!(
            line.contains("1 frames longer than --mtu are not IPv4/IPv6"),
            "{line}"
        );
        assert!(line.contains("1 IP frames were cut to --mtu 1500 bytes from their IP header, but their link headers (VLAN tags, MPLS labels) are longer"), "{line}");
        let line = failure(&dev, false, "veth0", Some(1500), Some(9000), &none()).unwrap();
        assert!(
            line.contains("--mtu 9000 is above it: use --mtu 1500"),
            "{line}"
        );
    }

    fn sent(ok: u64) -> SendCounters {
        SendCounters {
            successful: ok,
            ..SendCounters::default()
        }
    }

    #[test]
    fn no_failure_line_when_every_frame_went_whole() {
        assert_eq!(
            failure(&sent(10), false, "eth0", Some(1500), None, &none()),
            None
        );
        assert_eq!(
            failure(&sent(0), true, "out.pcap", None, None, &none()),
            None
        );
    }

    #[test]
    fn each_cause_is_counted_named_and_given_its_fix() {
        let dev = SendCounters {
            successful: 90,
            failed: 9,
            failed_too_big: 4,
            failed_malformed: 2,
            failed_stuck: 1,
            truncated: 1,
            ..SendCounters::default()
        };
        let line = failure(&dev, false, "veth0", Some(1500), None, &none()).unwrap();
        assert!(line.starts_with("10 of 100 packets not sent: "), "{line}");
        assert!(line.contains("4 refused with Message too long (EMSGSIZE): the MTU of veth0 is 1500; truncate them with --mtu-trunc --mtu 1500"), "{line}");
        assert!(
            line.contains("2 refused with Invalid argument (EINVAL)"),
            "{line}"
        );
        assert!(
            line.contains("1 given up after the device queue stayed full"),
            "{line}"
        );
        // The rest of `failed` (9 - 4 - 2 - 1) is the send error the run ended on.
        assert!(
            line.contains("2 not sent after the send error below"),
            "{line}"
        );
        assert!(line.ends_with("1 truncated by the kernel"), "{line}");
        assert!(!line.contains('\n'), "one line");
    }

    #[test]
    fn a_dry_run_says_written_and_an_unknown_mtu_is_a_question_mark() {
        let dev = SendCounters {
            successful: 1,
            failed: 3,
            failed_too_big: 1,
            ..SendCounters::default()
        };
        let line = failure(&dev, true, "out.pcap", None, None, &none()).unwrap();
        assert!(line.starts_with("3 of 4 packets not written: "), "{line}");
        assert!(line.contains("the MTU of out.pcap is ?"), "{line}");
        assert!(line.contains("2 could not be stored in out.pcap"), "{line}");
        // Sub-counts above the total (a sink's bug) do not underflow.
        let odd = SendCounters {
            failed: 1,
            failed_too_big: 2,
            ..SendCounters::default()
        };
        assert!(failure(&odd, false, "x", Some(9000), None, &none()).is_some());
    }
}
