//! `tcpkit replay`: what the user typed (clap, tcpreplay's and tcprewrite's option names), then
//! the resolved `tcpkit_replay::Config` where every cross-flag check happens.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};
use tcpkit_replay::{Config, MacAddr, Output, Rate};
use tcpkit_stats::{LiveCounters, Monitor, MonitorOptions};

use crate::common::{self, duration_arg, OutputFlags, RunFlags};
use crate::Failure;

#[derive(Debug, Parser)]
#[command(group(ArgGroup::new("out").args(["intf1", "write"])))]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
#[command(group(ArgGroup::new("timing").args(["multiplier", "pps", "mbps", "topspeed"])))]
pub struct Args {
    /// `tcpkit replay prep`: write a tcpprep cache (tcpprep's flags).
    #[command(subcommand)]
    pub cmd: Option<crate::replay_prep::ReplayCmd>,

    /// Capture files (pcap or pcapng), sent one after the other.
    #[arg(required_unless_present = "listnics", value_name = "PCAP")]
    pub files: Vec<PathBuf>,

    /// Interface to send out of (AF_PACKET; needs root or CAP_NET_RAW).
    #[arg(short = 'i', long = "intf1", value_name = "IFACE")]
    pub intf1: Option<String>,

    /// Send the server side of the capture out of this second interface, the client side out
    /// of --intf1, as tcpreplay -I does: the side of each packet comes from --cachefile, or
    /// without one from tcpprep --auto=client computed from each capture (a host is a server
    /// when it sends at least twice as many SYN-ACKs, DNS answers and ICMP port-unreachables as
    /// SYNs and DNS queries; unknown hosts are clients). One sender hands the frames to the two
    /// interfaces in the capture's order. Example: tcpkit replay -i eth1 -I eth2 -c in.cache
    /// -t in.pcap
    #[arg(short = 'I', long = "intf2", value_name = "IFACE", requires = "intf1")]
    pub intf2: Option<String>,

    /// With --intf2: the tcpprep cache (tcpprep -o, or tcpkit replay prep -o) that says which
    /// interface each packet leaves by: primary (client to server) --intf1, secondary --intf2,
    /// and packets marked not to send are skipped, as are packets past the cache's end. The
    /// cache numbers packets from 1 in each capture, as tcpreplay applies it.
    #[arg(
        short = 'c',
        long = "cachefile",
        value_name = "FILE",
        requires = "intf2"
    )]
    pub cachefile: Option<PathBuf>,

    /// Write what would be sent (after rewriting) to this pcap file, with the timestamps it
    /// would have had, instead of sending. Nothing waits: a dry run takes no wall-clock time.
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    pub write: Option<PathBuf>,

    /// Replay at the capture's own timing multiplied by F (2.0 = twice as fast).
    #[arg(short = 'x', long, value_name = "F")]
    pub multiplier: Option<f64>,

    /// Replay at N packets per second (fractions allowed).
    #[arg(short = 'p', long, value_name = "N")]
    pub pps: Option<f64>,

    /// Replay at M megabits per second (frame bytes, as tcpreplay counts).
    #[arg(short = 'M', long, value_name = "M")]
    pub mbps: Option<f64>,

    /// Replay as fast as possible.
    #[arg(short = 't', long)]
    pub topspeed: bool,

    /// With --pps: send packets in bursts of K, each burst at its due time.
    #[arg(long, value_name = "K", requires = "pps")]
    pub pps_multi: Option<u32>,

    /// Cap every gap of the capture's timing at MS milliseconds.
    #[arg(long, value_name = "MS")]
    pub maxsleep: Option<f64>,

    /// Send the inputs N times (0 = forever).
    #[arg(short = 'l', long = "loop", value_name = "N", default_value_t = 1)]
    pub loops: u64,

    /// Pause MS milliseconds between loops.
    #[arg(long = "loopdelay-ms", value_name = "MS", default_value_t = 0)]
    pub loopdelay_ms: u64,

    /// Stop after N packets in all.
    #[arg(short = 'L', long, value_name = "N")]
    pub limit: Option<u64>,

    /// Load the whole input into memory before sending (memory ≈ the files' size).
    #[arg(short = 'K', long, visible_alias = "preload-pcap")]
    pub preload: bool,

    /// Make every loop's flows new flows: IPv4/IPv6 addresses are shifted per loop
    /// (checksums kept valid).
    #[arg(long)]
    pub unique_ip: bool,

    /// Make every loop's TCP and UDP flows new flows by their client port, addresses and
    /// service ports kept: in loop i (from 0) the higher port of each packet (both when equal)
    /// becomes 1024 + (port - 1024 + i * 3979) mod 64512, the same in both directions, the
    /// TCP/UDP checksum updated. With --unique-ip too, both change.
    #[arg(long)]
    pub unique_ports: bool,

    /// Sender threads (top speed only); flows are sharded by their 5-tuple so order within a
    /// connection holds.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub threads: usize,

    /// Frames handed to the kernel per call (one sendmmsg or TX ring send; with --xdp, one
    /// wakeup of the AF_XDP socket).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub batch: usize,

    /// Bypass the interface's qdisc (PACKET_QDISC_BYPASS): faster, but tc shaping is skipped.
    #[arg(long)]
    pub qdisc_bypass: bool,

    /// Send through AF_XDP sockets instead of AF_PACKET: frames copied into a UMEM shared with
    /// the kernel, past the qdisc and the socket layer; zero-copy where the driver supports it,
    /// copy mode elsewhere (veth). One socket per sending thread, on transmit queues Q..Q+N-1
    /// (--xdp-queue Q, --threads N). Every timing option works with it. Where AF_XDP cannot be
    /// used (no privilege, interface down, queue missing) the run stops before sending, saying
    /// why. Example: tcpkit replay -i eth0 --xdp --topspeed --threads 2 in.pcap
    #[arg(long)]
    pub xdp: bool,

    /// With --xdp: the first transmit queue to bind (thread i takes queue Q + i).
    #[arg(long, value_name = "Q", default_value_t = 0, requires = "xdp")]
    pub xdp_queue: u32,

    /// A flow idle for DURATION (capture time: 30, 30s, 500ms) counts as a new flow when it
    /// comes back.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub flow_expiry: Option<Duration>,

    /// Source MAC of every frame; also the source of the Ethernet header given to frames whose
    /// link type has none (default: the interface's own address).
    #[arg(long, visible_alias = "enet-smac", value_name = "MAC")]
    pub src_mac: Option<MacAddr>,

    /// Destination MAC of every frame; also the destination of the Ethernet header given to
    /// frames whose link type has none (default: broadcast).
    #[arg(long, visible_alias = "enet-dmac", value_name = "MAC")]
    pub dst_mac: Option<MacAddr>,

    /// Rewrite source IPs: CIDR:CIDR[,CIDR:CIDR...] (tcprewrite's syntax; IPv6 in brackets).
    #[arg(long, value_name = "MAP")]
    pub srcipmap: Option<String>,

    /// Rewrite destination IPs: CIDR:CIDR[,CIDR:CIDR...].
    #[arg(long, value_name = "MAP")]
    pub dstipmap: Option<String>,

    /// Rewrite TCP/UDP ports: FROM:TO[,FROM:TO...] (FROM may be a range LO-HI).
    #[arg(long, value_name = "MAP")]
    pub portmap: Option<String>,

    /// Truncate frames longer than --mtu (IP lengths and checksums fixed).
    #[arg(long)]
    pub mtu_trunc: bool,

    /// The MTU for --mtu-trunc.
    #[arg(long, value_name = "N", default_value_t = 1500, requires = "mtu_trunc")]
    pub mtu: u16,

    /// Recompute IP/TCP/UDP/ICMP checksums of every packet.
    #[arg(long)]
    pub fixcsum: bool,

    /// Add or remove an 802.1Q VLAN tag.
    #[arg(long, value_name = "MODE")]
    pub enet_vlan: Option<VlanMode>,

    /// VLAN id for --enet-vlan add.
    #[arg(long, value_name = "VID")]
    pub enet_vlan_tag: Option<u16>,

    /// VLAN priority (PCP, 0-7) for --enet-vlan add.
    #[arg(long, value_name = "PCP", default_value_t = 0)]
    pub enet_vlan_pri: u8,

    /// VLAN CFI/DEI bit (0 or 1) for --enet-vlan add.
    #[arg(long, value_name = "CFI", default_value_t = 0)]
    pub enet_vlan_cfi: u8,

    /// Set the IPv4 TTL / IPv6 hop limit: N sets it, +N raises it, -N lowers it.
    #[arg(long, value_name = "[+-]N", allow_hyphen_values = true)]
    pub ttl: Option<String>,

    /// --duration: stop after this long; --stats: the running totals (with the loop and the
    /// percent done) on stderr.
    #[command(flatten)]
    pub run: RunFlags,

    #[command(flatten)]
    pub out: OutputFlags,

    /// --barrier, --barrier-key, --shard: one agent of a fleet run (`tcpkit barrier`).
    #[command(flatten)]
    pub fleet: crate::fleet::AgentFlags,
    /// Decode every packet as it is sent, one line each, as tcpreplay -v does: the frames
    /// (after rewriting) are piped to `tcpdump -n -l -r -`, so tcpdump must be installed. The
    /// lines go to stdout, or to stderr with --json.
    #[arg(short = 'v', long)]
    pub verbose: bool,

    /// List the interfaces replay can send on (Ethernet interfaces of this network namespace,
    /// with their MTU and address) and exit.
    #[arg(long, exclusive = true)]
    pub listnics: bool,

    /// Draw how late packets left their intended send time into FILE (SVG): the timing error
    /// by percentile (HdrHistogram's spectrum: 90%, 99%, 99.9%... evenly spaced) and its p50,
    /// p99 and max per second. Paced runs only (not --topspeed, not -w).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum VlanMode {
    Add,
    Del,
}

fn secs(flag: &str, v: f64) -> Result<Duration, Failure> {
    if !v.is_finite() || !(0.0..=1e9).contains(&v) {
        return Err(Failure::Usage(format!(
            "{flag} {v}: must be a number of seconds from 0 to 1e9"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

fn positive(flag: &str, v: f64) -> Result<f64, Failure> {
    if !v.is_finite() || v <= 0.0 {
        return Err(Failure::Usage(format!(
            "{flag} {v}: must be a positive number"
        )));
    }
    Ok(v)
}

/// Every check that involves more than one flag, or a value's meaning, happens here.
pub fn resolve(a: &Args) -> Result<Config, Failure> {
    use tcpkit_replay::{IpMap, PortMap, TtlEdit, VlanEdit};
    let shard = common::shard(a.fleet.shard.as_deref())?;
    let output = match (&a.intf1, &a.write) {
        (Some(i), None) => Output::Interface {
            name: i.clone(),
            qdisc_bypass: a.qdisc_bypass,
        },
        (None, Some(w)) => Output::File(w.clone()),
        _ => {
            return Err(Failure::Usage(
                "give one of -i/--intf1 or -w/--write".into(),
            ))
        }
    };
    if a.qdisc_bypass && a.write.is_some() {
        return Err(Failure::Usage("--qdisc-bypass needs -i/--intf1".into()));
    }
    if a.xdp && a.write.is_some() {
        return Err(Failure::Usage("--xdp needs -i/--intf1".into()));
    }
    if a.xdp && a.intf2.is_some() {
        return Err(Failure::Usage(
            "--xdp with --intf2: the two-interface split sends through AF_PACKET on both; leave out --xdp".into(),
        ));
    }
    if a.xdp && a.qdisc_bypass {
        return Err(Failure::Usage(
            "--qdisc-bypass is AF_PACKET's; --xdp never goes through the qdisc: give one".into(),
        ));
    }
    let rate = if a.topspeed {
        Rate::Topspeed
    } else if let Some(p) = a.pps {
        let burst = a.pps_multi.unwrap_or(1);
        if burst == 0 {
            return Err(Failure::Usage("--pps-multi 0: must be at least 1".into()));
        }
        Rate::Pps {
            pps: positive("--pps", p)?,
            burst,
        }
    } else if let Some(m) = a.mbps {
        Rate::Mbps(positive("--mbps", m)?)
    } else {
        Rate::Capture {
            multiplier: positive("--multiplier", a.multiplier.unwrap_or(1.0))?,
        }
    };
    if a.threads == 0 || a.threads > 64 {
        return Err(Failure::Usage(format!(
            "--threads {}: must be 1 to 64",
            a.threads
        )));
    }
    if a.threads > 1 && !a.topspeed {
        return Err(Failure::Usage(
            "--threads above 1 needs --topspeed (paced replay is one ordered stream)".into(),
        ));
    }
    if a.threads > 1 && a.write.is_some() {
        return Err(Failure::Usage(
            "--threads above 1 needs -i/--intf1 (one output file is one stream)".into(),
        ));
    }
    if a.batch == 0 || a.batch > 1024 {
        return Err(Failure::Usage(format!(
            "--batch {}: must be 1 to 1024",
            a.batch
        )));
    }
    let mut cfg = Config::new(a.files.clone(), output);
    cfg.rate = rate;
    cfg.max_sleep = a
        .maxsleep
        .map(|ms| secs("--maxsleep", ms / 1000.0))
        .transpose()?;
    cfg.loops = a.loops;
    cfg.loop_delay = Duration::from_millis(a.loopdelay_ms);
    cfg.limit = a.limit;
    if a.limit == Some(0) {
        return Err(Failure::Usage("--limit 0: must be at least 1".into()));
    }
    cfg.duration = a.run.duration;
    cfg.preload = a.preload;
    cfg.unique_ip = a.unique_ip;
    cfg.unique_ports = a.unique_ports;
    if let Some(i2) = &a.intf2 {
        if a.intf1.is_none() {
            return Err(Failure::Usage(
                "--intf2 needs -i/--intf1: the client side leaves by --intf1, the server side by --intf2".into(),
            ));
        }
        if a.threads > 1 {
            return Err(Failure::Usage(
                "--intf2 sends from one thread, which keeps the capture's order across the two interfaces: leave out --threads".into(),
            ));
        }
        if a.intf1.as_deref() == Some(i2.as_str()) {
            return Err(Failure::Usage(format!(
                "--intf2 {i2}: the same interface as --intf1"
            )));
        }
        cfg.intf2 = Some(tcpkit_replay::Intf2 {
            name: i2.clone(),
            split: match &a.cachefile {
                Some(c) => tcpkit_replay::Split::Cache(c.clone()),
                None => tcpkit_replay::Split::AutoClient,
            },
        });
    }
    cfg.threads = a.threads;
    cfg.shard = shard;
    cfg.batch = a.batch;
    cfg.xdp_queue = a.xdp.then_some(a.xdp_queue);
    cfg.flow_expiry = a.flow_expiry;
    if let Some(p) = &a.plot {
        tcpkit_stats::plot::check_name(p).map_err(Failure::Usage)?;
        if a.topspeed || a.write.is_some() {
            return Err(Failure::Usage(
                "--plot draws the timing error of paced packets: --topspeed and -w have none"
                    .into(),
            ));
        }
        cfg.timeline = Some(Duration::from_secs(1));
    }
    cfg.l2_src = a.src_mac;
    cfg.l2_dst = a.dst_mac;

    let rw = &mut cfg.rewrite;
    rw.src_mac = a.src_mac;
    rw.dst_mac = a.dst_mac;
    let bad = |flag: &str, v: &str, e: &dyn std::fmt::Display| {
        Failure::Usage(format!("{flag} '{v}': {e}"))
    };
    if let Some(m) = &a.srcipmap {
        rw.srcipmap = IpMap::parse_list(m).map_err(|e| bad("--srcipmap", m, &e))?;
    }
    if let Some(m) = &a.dstipmap {
        rw.dstipmap = IpMap::parse_list(m).map_err(|e| bad("--dstipmap", m, &e))?;
    }
    if let Some(m) = &a.portmap {
        rw.portmap = Some(m.parse::<PortMap>().map_err(|e| bad("--portmap", m, &e))?);
    }
    if a.mtu_trunc {
        if a.mtu < 68 {
            return Err(Failure::Usage(format!(
                "--mtu {}: must be at least 68",
                a.mtu
            )));
        }
        rw.mtu_trunc = Some(a.mtu);
    }
    rw.fixcsum = a.fixcsum;
    rw.vlan = match a.enet_vlan {
        None => {
            if a.enet_vlan_tag.is_some() {
                return Err(Failure::Usage(
                    "--enet-vlan-tag needs --enet-vlan add".into(),
                ));
            }
            None
        }
        Some(VlanMode::Del) => Some(VlanEdit::Remove),
        Some(VlanMode::Add) => {
            let vid = a
                .enet_vlan_tag
                .ok_or_else(|| Failure::Usage("--enet-vlan add needs --enet-vlan-tag".into()))?;
            if vid > 4095 {
                return Err(Failure::Usage(format!(
                    "--enet-vlan-tag {vid}: must be 0 to 4095"
                )));
            }
            if a.enet_vlan_pri > 7 {
                return Err(Failure::Usage(format!(
                    "--enet-vlan-pri {}: must be 0 to 7",
                    a.enet_vlan_pri
                )));
            }
            if a.enet_vlan_cfi > 1 {
                return Err(Failure::Usage(format!(
                    "--enet-vlan-cfi {}: must be 0 or 1",
                    a.enet_vlan_cfi
                )));
            }
            Some(VlanEdit::Add {
                vid,
                pcp: a.enet_vlan_pri,
                cfi: a.enet_vlan_cfi == 1,
            })
        }
    };
    if let Some(t) = &a.ttl {
        rw.ttl = Some(t.parse::<TtlEdit>().map_err(|e| bad("--ttl", t, &e))?);
    }
    Ok(cfg)
}

/// `--listnics`: tcpreplay's header, then one interface a line, its name first.
fn listnics() -> Result<(), Failure> {
    let nics = tcpkit_replay::sendable_interfaces()
        .map_err(|e| Failure::Runtime(format!("--listnics: {}", crate::chain(&e))))?;
    let mut text = String::from("Available network interfaces:\n");
    for i in nics {
        let mac = i.mac.map(|m| tcpkit_replay::MacAddr(m).to_string());
        text.push_str(&format!(
            "{}\tmtu {}, {}\n",
            i.name,
            i.mtu,
            mac.as_deref().unwrap_or("no address")
        ));
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    Ok(())
}

/// `-v`: tcpdump reading a pcap stream on its stdin and printing to our stdout (stderr with
/// --json, so stdout stays one document). Started before the run, so a missing tcpdump stops
/// the run before anything is sent.
fn start_decoder(json: bool) -> Result<(Child, tcpkit_replay::Tap), Failure> {
    let stdout = if json {
        Stdio::from(
            std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| {
                    Failure::Runtime(format!("-v: cannot duplicate stderr for tcpdump: {e}"))
                })?,
        )
    } else {
        Stdio::inherit()
    };
    let mut child = Command::new("tcpdump")
        .args(["-n", "-l", "-r", "-"])
        .stdin(Stdio::piped())
        .stdout(stdout)
        // Its "reading from file -, link-type ..." banner is not a packet.
        .stderr(Stdio::null())
        // Out of our process group: Ctrl-C stops the run (which then closes tcpdump's input so
        // it prints what it has), not tcpdump under it.
        .process_group(0)
        .spawn()
        .map_err(|e| {
            Failure::Runtime(format!(
                "-v: cannot run tcpdump, which decodes the packets as tcpreplay -v does: {e}; install tcpdump or leave out -v"
            ))
        })?;
    let stdin = child.stdin.take().expect("stdin was piped");
    let tap = tcpkit_replay::Tap::new(Box::new(std::io::BufWriter::new(stdin)))
        .map_err(|e| Failure::Runtime(format!("-v: cannot write to tcpdump: {e}")))?;
    Ok((child, tap))
}

/// Closes tcpdump's input and waits until it has printed every packet, so the decoded lines
/// come before the summary.
fn stop_decoder(mut child: Child, tap: tcpkit_replay::Tap) -> Result<(), Failure> {
    drop(tap.finish());
    match child.wait() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(Failure::Runtime(format!(
            "-v: tcpdump could not decode the packets ({s})"
        ))),
        Err(e) => Err(Failure::Runtime(format!("-v: waiting for tcpdump: {e}"))),
    }
}

pub fn main(args: Args, interrupt: &'static AtomicBool) -> Result<(), Failure> {
    if let Some(crate::replay_prep::ReplayCmd::Prep(p)) = &args.cmd {
        return crate::replay_prep::main(p, &crate::replay_prep::raw_args());
    }
    if args.listnics {
        return listnics();
    }
    // A fleet agent joins first, so that whatever keeps it from getting ready (a capture it
    // cannot read, an interface it cannot open) reaches the barrier.
    let agent = args.fleet.join(interrupt)?.map(Arc::new);
    let not_ready = |f: Failure| crate::fleet::not_ready(agent.as_deref(), f);
    let mut cfg = resolve(&args).map_err(not_ready)?;
    cfg.fleet = agent.clone();
    // A picture that cannot be written is found out before the run, not after it.
    if let Some(p) = &args.plot {
        tcpkit_stats::plot::check_path(p).map_err(|e| {
            not_ready(Failure::Usage(format!(
                "--plot {}: cannot create: {e}",
                p.display()
            )))
        })?;
    }
    let decoder = if args.verbose {
        Some(start_decoder(args.out.json)?)
    } else {
        None
    };
    let live = Arc::new(LiveCounters::default());
    let mut monitor = {
        let live = Arc::clone(&live);
        let opts = MonitorOptions {
            stats_every: args.run.stats.filter(|d| !d.is_zero()),
            progress: args.out.progress(),
        };
        // A shard sends part of --limit's frames: the loops say how far it is.
        let limit = cfg.limit.filter(|_| cfg.shard.is_none());
        let (loops, duration) = (cfg.loops, cfg.duration);
        Monitor::start(opts, move |elapsed| {
            let p = live.packets.load(Ordering::Relaxed);
            let b = live.bytes.load(Ordering::Relaxed);
            let s = elapsed.as_secs_f64();
            let (bps, mbps, pps) = tcpkit_stats::rates(p, b, s);
            let progress = progress_line(&live, loops, limit, duration, elapsed);
            format!(
                "Actual: {p} packets ({b} bytes) sent in {s:.6} seconds\nRated: {bps:.1} Bps, {mbps:.2} Mbps, {pps:.2} pps\n{progress}"
            )
        })
    };
    // tcpreplay brackets a --stats run with these two lines; they go with the live lines.
    let bracket = args.run.stats.is_some_and(|s| !s.is_zero());
    if bracket {
        eprintln!("Test start: {} ...", local_time_now());
    }
    let result =
        tcpkit_replay::run_with_tap(&cfg, interrupt, &live, decoder.as_ref().map(|d| &d.1));
    monitor.stop();
    let decoded = match decoder {
        Some((child, tap)) => stop_decoder(child, tap),
        None => Ok(()),
    };
    if bracket {
        eprintln!("Test complete: {}", local_time_now());
    }
    if let (Err(_), Some(p)) = (&result, &args.plot) {
        // Nothing was sent: no picture, not an empty file.
        let _ = std::fs::remove_file(p);
    }
    // A file the command line names that cannot be used is a usage error (exit 2): nothing
    // was sent. Anything found once the run started (a capture cut mid-file) is not.
    let outcome = result.map_err(|e| {
        not_ready(match e {
            tcpkit_replay::ReplayError::InputFile(_)
            | tcpkit_replay::ReplayError::CacheFile(_)
            | tcpkit_replay::ReplayError::InputLink { .. }
            | tcpkit_replay::ReplayError::OutputFile(_) => Failure::Usage(crate::chain(&e)),
            _ => Failure::Runtime(crate::chain(&e)),
        })
    })?;
    decoded?;
    if let Some(p) = &args.plot {
        let title = format!(
            "tcpkit replay: {} packets on {}",
            outcome.report.packets, outcome.report.output
        );
        tcpkit_stats::plot::replay_svg(p, &title, &outcome.late, &outcome.timeline)
            .map_err(|e| Failure::Runtime(format!("--plot {}: cannot write: {e}", p.display())))?;
    }
    let mut report = outcome.report;
    if report.stopped_by.is_none() && interrupt.load(Ordering::Relaxed) {
        report.stopped_by = Some("interrupted".into());
    }
    if let (Some(a), Some(f)) = (&agent, &report.fleet) {
        let failure = report.stopped_by.as_deref().or(report.failure.as_deref());
        a.done(f.actual_start_unix_ns, failure);
    }
    common::finish(&report, &args.out)
}

/// The live block's last line: the loop (k/N, or k/forever) and, where the end is known
/// (`--limit`, `--duration`, or N loops once one loop's size is known), percent done and ETA.
fn progress_line(
    live: &LiveCounters,
    loops: u64,
    limit: Option<u64>,
    duration: Option<Duration>,
    elapsed: Duration,
) -> String {
    let done = live.packets.load(Ordering::Relaxed) + live.failed.load(Ordering::Relaxed);
    let k = live.loop_no.load(Ordering::Relaxed).max(1);
    let mut s = if loops == 0 {
        format!("Progress: loop {k} of forever")
    } else {
        format!("Progress: loop {k}/{loops}")
    };
    // The whole run, every loop included: one loop's exact size (known once every sender
    // has finished its first) times the loops.
    let by_loops = live
        .one_loop()
        .filter(|_| loops > 0)
        .map(|per_loop| per_loop.saturating_mul(loops));
    let by_packets = match (limit, by_loops) {
        (Some(l), Some(t)) => Some(l.min(t)),
        (l, t) => l.or(t),
    };
    let tail = match (by_packets, duration) {
        (Some(total), _) => tcpkit_stats::percent_eta(done, total, elapsed),
        (None, Some(d)) => {
            tcpkit_stats::percent_eta(elapsed.as_millis() as u64, d.as_millis() as u64, elapsed)
        }
        (None, None) => String::new(),
    };
    s.push_str(&tail);
    s
}

/// The wall clock in local time as tcpreplay prints it: `2026-11-24 09:12:55.892051`.
fn local_time_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as libc::time_t;
    // SAFETY: tm is plain old data; localtime_r fills it from a time_t we own.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to locals that outlive the call.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return format!("{}.{:06}", now.as_secs(), now.subsec_micros());
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        now.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_says_the_loop_and_percent_where_the_end_is_known() {
        let live = LiveCounters::default();
        let ten = Duration::from_secs(10);
        live.loop_started(0, 0);
        live.add(100, 0);
        assert_eq!(
            progress_line(&live, 3, None, None, ten),
            "Progress: loop 1/3"
        );
        assert_eq!(
            progress_line(&live, 0, None, None, ten),
            "Progress: loop 1 of forever"
        );
        assert_eq!(
            progress_line(&live, 3, Some(400), None, ten),
            "Progress: loop 1/3  25.0% ETA 30s"
        );
        // One loop's size is known once the second starts: 3 loops of 100.
        live.loop_started(1, 100);
        live.add(50, 0);
        assert_eq!(
            progress_line(&live, 3, None, None, ten),
            "Progress: loop 2/3  50.0% ETA 10s"
        );
        assert_eq!(
            progress_line(&live, 0, None, Some(Duration::from_secs(40)), ten),
            "Progress: loop 2 of forever  25.0% ETA 30s"
        );
    }

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut v = vec!["replay"];
        v.extend_from_slice(args);
        let a = Args::try_parse_from(v).map_err(|e| e.to_string())?;
        resolve(&a).map_err(|f| match f {
            Failure::Usage(m) | Failure::Runtime(m) => m,
        })
    }

    #[test]
    fn every_flag_parses() {
        let c = parse(&[
            "-i",
            "eth7",
            "-t",
            "-K",
            "--loop",
            "50",
            "--unique-ip",
            "--threads",
            "2",
            "--batch",
            "32",
            "--qdisc-bypass",
            "--flow-expiry",
            "30",
            "--src-mac",
            "02:00:00:00:00:01",
            "--dst-mac",
            "02:00:00:00:00:02",
            "--srcipmap",
            "10.0.0.0/8:198.18.0.0/8",
            "--dstipmap",
            "192.168.0.0/16:198.19.0.0/16",
            "--portmap",
            "80:8080",
            "--mtu-trunc",
            "--mtu",
            "1400",
            "--fixcsum",
            "--enet-vlan",
            "add",
            "--enet-vlan-tag",
            "7",
            "--enet-vlan-pri",
            "3",
            "--enet-vlan-cfi",
            "1",
            "--ttl",
            "+1",
            "-L",
            "1000",
            "--duration",
            "2.5",
            "--loopdelay-ms",
            "10",
            "--stats",
            "1",
            "--json",
            "a.pcap",
            "b.pcapng",
        ])
        .unwrap();
        assert!(matches!(c.rate, Rate::Topspeed));
        assert_eq!(
            (c.loops, c.threads, c.batch, c.limit),
            (50, 2, 32, Some(1000))
        );
        assert!(c.preload && c.unique_ip);
        assert_eq!(c.rewrite.mtu_trunc, Some(1400));
        assert_eq!(c.inputs.len(), 2);
        assert_eq!(c.duration, Some(Duration::from_millis(2500)));
        assert!(matches!(
            c.output,
            Output::Interface {
                qdisc_bypass: true,
                ..
            }
        ));
    }

    #[test]
    fn verbose_and_listnics_parse() {
        for v in ["-v", "--verbose"] {
            let a = Args::try_parse_from(["replay", "-i", "x", v, "f"]).unwrap();
            assert!(a.verbose && !a.listnics);
        }
        // --listnics needs neither an interface nor a capture, and takes nothing else.
        let a = Args::try_parse_from(["replay", "--listnics"]).unwrap();
        assert!(a.listnics && a.files.is_empty());
        assert!(Args::try_parse_from(["replay", "--listnics", "f"]).is_err());
        assert!(Args::try_parse_from(["replay", "--listnics", "-v"]).is_err());
        let a = Args::try_parse_from(["replay", "-i", "x", "-p", "10", "--plot", "t.svg", "f"]);
        assert_eq!(a.unwrap().plot, Some(PathBuf::from("t.svg")));
        assert!(parse(&["-i", "x", "-p", "10", "--plot", "t.svg", "f"])
            .unwrap()
            .timeline
            .is_some());
        assert!(parse(&["-i", "x", "-t", "--plot", "t.svg", "f"])
            .unwrap_err()
            .contains("--plot"));
        // The picture is SVG: a .png name would hold SVG, so it is refused (issue 24, item 18).
        assert!(parse(&["-i", "x", "-p", "10", "--plot", "t.png", "f"])
            .unwrap_err()
            .contains("--plot t.png: the picture is SVG, so the file is named .svg: --plot t.svg"));
        // Without it, a capture is still required.
        assert!(Args::try_parse_from(["replay", "-i", "x"]).is_err());
    }

    #[test]
    fn rates_parse() {
        assert!(
            matches!(parse(&["-i", "x", "-p", "100.5", "f"]).unwrap().rate, Rate::Pps { pps, burst: 1 } if pps == 100.5)
        );
        assert!(matches!(
            parse(&["-i", "x", "-p", "10", "--pps-multi", "4", "f"])
                .unwrap()
                .rate,
            Rate::Pps { burst: 4, .. }
        ));
        assert!(
            matches!(parse(&["-i", "x", "-M", "3500", "f"]).unwrap().rate, Rate::Mbps(m) if m == 3500.0)
        );
        assert!(
            matches!(parse(&["-i", "x", "-x", "2.0", "f"]).unwrap().rate, Rate::Capture { multiplier } if multiplier == 2.0)
        );
        assert!(
            matches!(parse(&["-w", "o.pcap", "f"]).unwrap().rate, Rate::Capture { multiplier } if multiplier == 1.0)
        );
        assert_eq!(
            parse(&["-i", "x", "--maxsleep", "5", "f"])
                .unwrap()
                .max_sleep,
            Some(Duration::from_millis(5))
        );
        assert!(parse(&["-i", "x", "--preload-pcap", "f"]).unwrap().preload);
        assert!(parse(&["-i", "x", "--enet-smac", "02:00:00:00:00:09", "f"])
            .unwrap()
            .l2_src
            .is_some());
        assert!(matches!(
            parse(&["-i", "x", "--ttl", "-1", "f"]).unwrap().rewrite.ttl,
            Some(tcpkit_replay::TtlEdit::Decrease(1))
        ));
        assert!(matches!(
            parse(&["-i", "x", "--enet-vlan", "del", "f"])
                .unwrap()
                .rewrite
                .vlan,
            Some(tcpkit_replay::VlanEdit::Remove)
        ));
    }

    /// Issue 28: tcpreplay's -I/--intf2 and -c/--cachefile, and --unique-ports.
    #[test]
    fn intf2_cachefile_and_unique_ports_parse() {
        let c = parse(&["-i", "a", "-I", "b", "-c", "x.cache", "--unique-ports", "f"]).unwrap();
        let i2 = c.intf2.unwrap();
        assert_eq!(i2.name, "b");
        assert!(
            matches!(i2.split, tcpkit_replay::Split::Cache(ref p) if p == std::path::Path::new("x.cache"))
        );
        assert!(c.unique_ports && !c.unique_ip);
        let c = parse(&["-i", "a", "--intf2", "b", "--cachefile=y", "f"]).unwrap();
        assert!(matches!(
            c.intf2.unwrap().split,
            tcpkit_replay::Split::Cache(_)
        ));
        let c = parse(&["-i", "a", "-I", "b", "f"]).unwrap();
        assert!(matches!(
            c.intf2.unwrap().split,
            tcpkit_replay::Split::AutoClient
        ));
        assert!(parse(&["-i", "a", "f"]).unwrap().intf2.is_none());
        // -c needs -I, -I needs -i; one thread; two different interfaces.
        assert!(parse(&["-i", "a", "-c", "x", "f"]).is_err());
        assert!(parse(&["-w", "o", "-I", "b", "f"]).is_err());
        assert!(parse(&["-i", "a", "-I", "b", "-t", "--threads", "2", "f"])
            .unwrap_err()
            .contains("--intf2 sends from one thread"));
        assert!(parse(&["-i", "a", "-I", "a", "f"])
            .unwrap_err()
            .contains("the same interface as --intf1"));
    }

    /// Issue 28: --xdp and --xdp-queue; they need an interface, and --qdisc-bypass is the
    /// other path's.
    #[test]
    fn xdp_flags_parse() {
        let c = parse(&["-i", "x", "--xdp", "-t", "--threads", "2", "f"]).unwrap();
        assert_eq!(c.xdp_queue, Some(0));
        let c = parse(&["-i", "x", "--xdp", "--xdp-queue", "3", "f"]).unwrap();
        assert_eq!(c.xdp_queue, Some(3));
        assert_eq!(parse(&["-i", "x", "f"]).unwrap().xdp_queue, None);
        let e = |args: &[&str]| parse(args).unwrap_err();
        assert_eq!(e(&["-w", "o", "--xdp", "f"]), "--xdp needs -i/--intf1");
        assert!(e(&["-i", "x", "--xdp", "--qdisc-bypass", "f"])
            .starts_with("--qdisc-bypass is AF_PACKET's"));
        assert!(e(&["-i", "x", "--xdp-queue", "1", "f"]).contains("--xdp"));
        assert!(e(&["-i", "x", "-I", "y", "--xdp", "f"]).contains("--intf2"));
    }

    /// Issue 25: --shard K/N; a bad K/N is a usage error naming --shard.
    #[test]
    fn shard_parses() {
        let c = parse(&["-w", "o", "--shard", "2/3", "f"]).unwrap();
        assert_eq!(c.shard.map(|s| (s.index, s.count)), Some((2, 3)));
        assert_eq!(parse(&["-w", "o", "f"]).unwrap().shard, None);
        for bad in ["0/3", "4/3", "3", "1/0"] {
            let e = parse(&["-w", "o", "--shard", bad, "f"]).unwrap_err();
            assert!(e.starts_with(&format!("--shard '{bad}': ")), "{e}");
        }
    }

    #[test]
    fn bad_combinations_say_which_flag() {
        let e = |args: &[&str]| parse(args).unwrap_err();
        assert!(e(&["f"]).contains("--intf1"));
        assert!(e(&["-i", "x", "-w", "o", "f"]).contains("cannot be used"));
        assert!(e(&["-i", "x", "-t", "-p", "5", "f"]).contains("cannot be used"));
        assert!(e(&["-i", "x", "-p", "0", "f"]).contains("--pps 0"));
        assert!(e(&["-i", "x", "-p", "-3", "f"]).contains("-3"));
        assert!(e(&["-i", "x", "-M", "nan", "f"]).contains("--mbps"));
        assert!(e(&["-i", "x", "--threads", "2", "f"]).contains("--topspeed"));
        assert!(e(&["-w", "o", "-t", "--threads", "2", "f"]).contains("-i/--intf1"));
        assert!(
            e(&["-i", "x", "--srcipmap", "10.0.0.0/8", "f"]).starts_with("--srcipmap '10.0.0.0/8'")
        );
        assert!(e(&["-i", "x", "--portmap", "x:1", "f"]).starts_with("--portmap"));
        assert!(e(&["-i", "x", "--src-mac", "zz", "f"]).contains("--src-mac"));
        assert!(e(&["-i", "x", "--enet-vlan", "add", "f"]).contains("--enet-vlan-tag"));
        assert!(e(&[
            "-i",
            "x",
            "--enet-vlan",
            "add",
            "--enet-vlan-tag",
            "5000",
            "f"
        ])
        .contains("4095"));
        assert!(e(&["-i", "x", "--ttl", "abc", "f"]).starts_with("--ttl"));
        assert!(e(&["-i", "x", "--duration", "1e12", "f"]).contains("--duration"));
        assert!(e(&["-i", "x", "--limit", "0", "f"]).contains("--limit 0"));
        assert!(e(&["-i", "x", "--batch", "0", "f"]).contains("--batch"));
        assert!(e(&["-i", "x"]).contains("PCAP"));
        assert!(e(&["-w", "o", "--qdisc-bypass", "f"]).contains("--qdisc-bypass"));
    }
}
