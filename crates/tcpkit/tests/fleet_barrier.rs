//! `tcpkit barrier` with real agents: a star of lab hosts, the barrier and `tcpkit echo --dns`
//! in host "s", one `tcpkit load --barrier` agent in each of the others (a1, a2, a3, each on
//! its own link to s). Checked by the reports of every side, their exit statuses and last
//! lines, and echo's own count.

use crate::common;
use common::peer::{listening, stop_echo, u};
use common::schema;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::tcpkit;
use serde_json::Value;
use tcpkit_fleet::wire::{Msg, VERSION};
use tcpkit_lab::{Host, Lab, LinkOpts, Proc};

const ECHO_PORT: u16 = 5353;
const BARRIER_PORT: u16 = 7300;
/// How far apart the agents' first queries may go out, on the barrier's clock. Measured here
/// (3 agents on one 2-core VM shared with other builds): 0.08 to 0.28 ms over 10 runs, once 1.5 ms; the
/// bound leaves room for a loaded machine's scheduling.
const START_SPREAD_MAX_NS: u64 = 10_000_000;

/// A process whose stdout and stderr go to files of their own (the JSON report apart from
/// the lines), killed on drop.
struct Run {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Run {
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                t0.elapsed() < limit,
                "ran past {limit:?}: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn last_line(&self) -> String {
        self.stderr().lines().last().unwrap_or_default().to_string()
    }

    fn json(&self) -> Value {
        let text = std::fs::read_to_string(&self.out).unwrap();
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {text} stderr {}", self.stderr()))
    }

    /// Waits until stderr has a line containing `what`.
    fn wait_line(&self, what: &str, limit: Duration) {
        let t0 = Instant::now();
        while !self.stderr().contains(what) {
            assert!(t0.elapsed() < limit, "no '{what}' in: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Fleet {
    lab: Lab,
    srv: Host,
    agents: Vec<Host>,
    /// Agent i's interface toward s (for replay), and s's toward agent i.
    ifaces: Vec<String>,
    srv_ifaces: Vec<String>,
    dir: tempfile::TempDir,
    key: PathBuf,
    runs: usize,
}

impl Fleet {
    /// Host s and `n` agent hosts, agent i (from 1) linked to s over 198.18.i.0/24.
    fn new(tag: &str, n: usize) -> Fleet {
        let mut lab = Lab::new(tag).unwrap_or_else(|e| panic!("{e}"));
        let srv = lab.host("s").unwrap();
        let (mut agents, mut ifaces, mut srv_ifaces) = (Vec::new(), Vec::new(), Vec::new());
        for i in 1..=n {
            let a = lab.host(&format!("a{i}")).unwrap();
            let opts = LinkOpts::addrs(format!("198.18.{i}.1/24"), format!("198.18.{i}.2/24"));
            let link = lab.link(&a, &srv, &opts).unwrap();
            ifaces.push(link.a.name);
            srv_ifaces.push(link.b.name);
            agents.push(a);
        }
        let dir = tempfile::tempdir().unwrap();
        let key = common::mpcat::key_file(dir.path(), "key", "fleet-test-key-0123456789\n");
        Fleet {
            lab,
            srv,
            agents,
            ifaces,
            srv_ifaces,
            dir,
            key,
            runs: 0,
        }
    }

    fn spawn(&mut self, host: &Host, argv: &[&str]) -> Run {
        self.runs += 1;
        let out = self.dir.path().join(format!("{}.out", self.runs));
        let err = self.dir.path().join(format!("{}.err", self.runs));
        let mut cmd: Command = host.command(argv);
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap());
        Run {
            child: cmd.spawn().unwrap(),
            out,
            err,
        }
    }

    fn echo(&mut self) -> Proc {
        let port = ECHO_PORT.to_string();
        let argv = [
            tcpkit(),
            "echo",
            "--dns",
            "--port",
            &port,
            "--threads",
            "1",
            "--json",
        ];
        let p = self.srv.spawn(&mut self.lab, "echo", &argv).unwrap();
        let at = SocketAddr::from(([198, 18, 1, 2], ECHO_PORT));
        assert!(listening(&self.agents[0], at), "echo: {}", p.log());
        p
    }

    fn barrier(&mut self, n: usize, args: &[&str]) -> Run {
        let (listen, n) = (format!("0.0.0.0:{BARRIER_PORT}"), n.to_string());
        let key = self.key.to_str().unwrap().to_string();
        let mut argv = vec![
            tcpkit(),
            "barrier",
            "--listen",
            &listen,
            "--agents",
            &n,
            "--key-file",
            &key,
            "--json",
        ];
        argv.extend_from_slice(args);
        let srv = self.srv.clone();
        self.spawn(&srv, &argv)
    }

    /// `tcpkit load` in agent host `i` (from 1) as shard `shard`, against echo over its own
    /// link, with `args` after the fleet's.
    fn agent(&mut self, i: usize, shard: &str, args: &[&str]) -> Run {
        let target = format!("198.18.{i}.2:{ECHO_PORT}");
        let barrier = format!("198.18.{i}.2:{BARRIER_PORT}");
        let key = self.key.to_str().unwrap().to_string();
        let mut argv = vec![
            tcpkit(),
            "load",
            &target,
            "--barrier",
            &barrier,
            "--barrier-key",
            &key,
            "--shard",
            shard,
            "--json",
        ];
        argv.extend_from_slice(args);
        let host = self.agents[i - 1].clone();
        self.spawn(&host, &argv)
    }
}

/// A short load at a constant rate, shared over the shards: shard K's first query is due
/// (K-1)/R after the start (at most 0.33 ms here), so the starts' spread is the barrier's.
const LOAD: [&str; 6] = ["-c", "6", "-r", "6000", "--arrivals", "constant"];

fn load_args(secs: &str) -> Vec<&str> {
    let mut a = LOAD.to_vec();
    a.extend_from_slice(&["-t", secs]);
    a
}

#[test]
fn every_agent_starts_at_the_one_instant_and_echo_counts_what_they_answered() {
    let _turn = common::timing_turn();
    let t0 = Instant::now();
    let mut f = Fleet::new("fbok", 3);
    let echo = f.echo();
    let mut b = f.barrier(3, &["--ready-timeout", "20s"]);
    let args = load_args("1");
    // Agent 3 runs two worker processes, as a host past one process's descriptor limit
    // does: its parent talks to the barrier and releases its workers at the start.
    let procs = [&args[..], &["--procs", "2"]].concat();
    let mut agents: Vec<Run> = (1..=3)
        .map(|i| f.agent(i, &format!("{i}/3"), if i == 3 { &procs } else { &args }))
        .collect();
    for a in &mut agents {
        assert!(a.wait(Duration::from_secs(20)).success(), "{}", a.stderr());
    }
    assert!(b.wait(Duration::from_secs(10)).success(), "{}", b.stderr());
    assert!(
        b.stderr()
            .contains("tcpkit barrier: all 3 agents ready, start at 20"),
        "{}",
        b.stderr()
    );
    let br = b.json();
    schema::check(&schema::load("barrier"), &br, "barrier");
    let mut answered = 0;
    let mut starts = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let r = a.json();
        schema::check(&schema::load("load"), &r, "load");
        let fl = &r["fleet"];
        assert_eq!(fl["run_id"], br["run_id"], "{r:#}");
        assert!(fl["stopped_by"].is_null());
        let (intended, actual) = (
            u(fl, "intended_start_unix_ns"),
            u(fl, "actual_start_unix_ns"),
        );
        assert!(
            actual >= intended && actual - intended < 50_000_000,
            "{fl:#}"
        );
        let offset = fl["clock_offset_ns"].as_i64().unwrap();
        // One kernel's clock on every host here: the offset is within its own error bound
        // (half its round trip) of the truth, 0, with 50 µs for the reading itself.
        assert!(
            offset.unsigned_abs() <= u(fl, "offset_rtt_ns") / 2 + 50_000,
            "{fl:#}"
        );
        starts.push(i128::from(actual) - i128::from(offset));
        answered += u(&r, "queries.answered");
        assert_eq!(u(&r, "processes"), if i == 2 { 2 } else { 1 });
        let e = &br["agents"][i];
        assert_eq!(e["outcome"], "done", "{br:#}");
        assert_eq!(e["shard"]["index"], i as u64 + 1);
        assert_eq!(e["actual_start_unix_ns"].as_u64(), Some(actual));
    }
    let spread = (starts.iter().max().unwrap() - starts.iter().min().unwrap()) as u64;
    assert_eq!(u(&br, "start_spread_ns"), spread, "{br:#}");
    assert!(spread < START_SPREAD_MAX_NS, "start spread {spread} ns");
    // -r is the fleet's rate, shared over the shards: about 6000 answers in the second.
    assert!(answered > 4500, "{answered}");
    let er = stop_echo(&echo);
    assert_eq!(u(&er, "answered"), answered, "echo {er:#}");
    let late: Vec<String> = br["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let l = u(a, "actual_start_unix_ns") - u(a, "intended_start_unix_ns");
            format!("{:.3}", l as f64 / 1e6)
        })
        .collect();
    eprintln!(
        "fleet: start spread {:.3} ms, lead {:.1} ms (last ready to start), offset bound {:.3} ms, first query after the instant {} ms, {:?}",
        spread as f64 / 1e6,
        (u(&br, "start_unix_ns") - u(&br, "all_ready_unix_ns")) as f64 / 1e6,
        u(&br, "offset_error_bound_ns") as f64 / 1e6,
        late.join("/"),
        t0.elapsed()
    );
}

/// An agent that cannot get ready fails the fleet run before any query is sent: each way of
/// not being ready (a file it cannot read; a target refusing its connections).
#[test]
fn an_agent_that_cannot_get_ready_fails_the_run_before_any_query() {
    let mut f = Fleet::new("fbnr", 2);
    let echo = f.echo();
    let args = load_args("1");
    let refused = format!("198.18.2.2:{}", ECHO_PORT + 1);
    let cases: [(Vec<&str>, &str); 2] = [
        (
            [&["--qname-file", "/nonexistent/names"], &args[..]].concat(),
            "--qname-file /nonexistent/names",
        ),
        (
            args.clone(),
            "only 0 of 3 connections could be opened to 198.18.2.2:5354 (198.18.2.2:5354) while preparing (first failure: ECONNREFUSED",
        ),
    ];
    for (k, (bad, why)) in cases.iter().enumerate() {
        let mut b = f.barrier(2, &["--ready-timeout", "20s"]);
        let mut ok = f.agent(1, "1/2", &args);
        // Joined first: an agent that comes after the fleet run failed finds no barrier.
        b.wait_line("shard 1/2 on ", Duration::from_secs(10));
        let mut bad_agent = if k == 0 {
            f.agent(2, "2/2", bad)
        } else {
            // Its own target: a port nothing listens on.
            let key = f.key.to_str().unwrap().to_string();
            let barrier = format!("198.18.2.2:{BARRIER_PORT}");
            let mut argv = vec![
                tcpkit(),
                "load",
                &refused,
                "--barrier",
                &barrier,
                "--barrier-key",
                &key,
                "--shard",
                "2/2",
                "--json",
                "--connect-retries",
                "0",
            ];
            argv.extend_from_slice(bad);
            let h = f.agents[1].clone();
            f.spawn(&h, &argv)
        };
        assert!(!bad_agent.wait(Duration::from_secs(15)).success());
        assert_eq!(
            b.wait(Duration::from_secs(10)).code(),
            Some(1),
            "{}",
            b.stderr()
        );
        let last = b.last_line();
        assert!(
            last.starts_with("tcpkit barrier: shard 2/2 on ") && last.contains(why),
            "{last}"
        );
        assert!(last.contains("cannot get ready"), "{last}");
        assert_eq!(ok.wait(Duration::from_secs(10)).code(), Some(1));
        let r = ok.json();
        assert_eq!(u(&r, "queries.sent"), 0, "{r:#}");
        let stopped = r["fleet"]["stopped_by"].as_str().unwrap_or_default();
        assert!(stopped.starts_with("shard 2/2 on "), "{r:#}");
        assert!(ok.last_line().contains("stopped by the barrier: shard 2/2"));
        let br = b.json();
        assert_eq!(br["agents"][1]["outcome"], "not_ready", "{br:#}");
        assert!(br["start_unix_ns"].is_null());
    }
    assert_eq!(u(&stop_echo(&echo), "answered"), 0);
}

#[test]
fn an_agent_killed_mid_run_is_named_and_the_others_stop() {
    let mut f = Fleet::new("fbkill", 3);
    let _echo = f.echo();
    let mut b = f.barrier(3, &["--ready-timeout", "20s"]);
    let args = load_args("10");
    let mut agents: Vec<Run> = (1..=3)
        .map(|i| f.agent(i, &format!("{i}/3"), &args))
        .collect();
    b.wait_line("start at", Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    agents[1].child.kill().unwrap();
    b.wait_line("other agents told to stop", Duration::from_secs(5));
    let noticed = killed.elapsed();
    assert_eq!(b.wait(Duration::from_secs(5)).code(), Some(1));
    let last = b.last_line();
    assert!(
        last.starts_with("tcpkit barrier: shard 2/3 on ") && last.contains("lost"),
        "{last}"
    );
    assert!(last.contains("mid-run"), "{last}");
    assert!(b.stderr().contains("; 2 other agents told to stop"));
    for k in [0, 2] {
        let a = &mut agents[k];
        assert_eq!(
            a.wait(Duration::from_secs(5)).code(),
            Some(1),
            "{}",
            a.stderr()
        );
        let r = a.json();
        let stopped = r["fleet"]["stopped_by"].as_str().unwrap_or_default();
        assert!(stopped.starts_with("shard 2/3 on "), "{r:#}");
        assert!(a.last_line().contains("stopped by the barrier: shard 2/3"));
        // Stopped well before its 10 s.
        assert!(r["seconds"].as_f64().unwrap() < 5.0, "{r:#}");
    }
    // Lost at once on the close, not at the next beat's write (250 ms) nor after 2 s silent
    // (that bound is for a host cut off).
    assert!(noticed < Duration::from_millis(250), "{noticed:?}");
    let br = b.json();
    assert_eq!(br["agents"][1]["outcome"], "lost");
    eprintln!("fleet: kill noticed by the barrier in {noticed:?}");
}

/// Speaks the barrier's protocol from a host with `key`'s bytes as the key; what came back
/// after its Join (the barrier sends nothing to a wrong key but the close).
fn join_with_key(host: &Host, key: &[u8]) -> Vec<u8> {
    let key = tcpkit_keyfile::proof::Key::from_bytes(key).unwrap();
    host.enter(|| {
        let mut s = TcpStream::connect(("198.18.1.2", BARRIER_PORT)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let nonce = [7u8; 16];
        let mut b = Vec::new();
        Msg::Hello {
            version: VERSION,
            nonce,
        }
        .emit(&mut b);
        s.write_all(&b).unwrap();
        let mut buf = vec![0u8; 64];
        s.read_exact(&mut buf[..51]).unwrap();
        let Ok(Some((Msg::Challenge { nonce: bn, .. }, _))) = Msg::parse(&buf[..51]) else {
            panic!("{buf:?}")
        };
        let proof = tcpkit_fleet::auth::agent_proof(&key, &nonce, &bn, None, "intruder");
        b.clear();
        Msg::Join {
            proof,
            shard: None,
            host: "intruder",
        }
        .emit(&mut b);
        s.write_all(&b).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    })
}

#[test]
fn a_taken_shard_is_refused_and_a_wrong_key_gets_nothing() {
    let mut f = Fleet::new("fbdup", 2);
    let echo = f.echo();
    let mut b = f.barrier(2, &["--ready-timeout", "20s"]);
    let args = load_args("0.5");
    let mut first = f.agent(1, "1/2", &args);
    b.wait_line("shard 1/2 on ", Duration::from_secs(10));
    // A retried agent claiming the same shard: refused, by name.
    let mut again = f.agent(2, "1/2", &args);
    assert_eq!(again.wait(Duration::from_secs(10)).code(), Some(1));
    let last = again.last_line();
    assert!(
        last.contains("refused this agent: shard 1/2 is taken by"),
        "{last}"
    );
    // A peer without the key: nothing back but the close.
    let got = join_with_key(&f.agents[0], b"not-the-fleet-key-at-all");
    assert!(got.is_empty(), "{got:?}");
    // And `tcpkit load` with another key file finds it out from the barrier's proof.
    let other = common::mpcat::key_file(f.dir.path(), "other", "another-key-0123456789\n");
    let barrier = format!("198.18.2.2:{BARRIER_PORT}");
    let argv = [
        tcpkit(),
        "load",
        "198.18.2.2:5353",
        "--barrier",
        &barrier,
        "--barrier-key",
        other.to_str().unwrap(),
        "-r",
        "10",
    ];
    let h = f.agents[1].clone();
    let mut wrong = f.spawn(&h, &argv);
    assert_eq!(wrong.wait(Duration::from_secs(10)).code(), Some(1));
    assert!(wrong
        .last_line()
        .contains("holds another key than --barrier-key"));
    let mut second = f.agent(2, "2/2", &args);
    assert!(
        first.wait(Duration::from_secs(15)).success(),
        "{}",
        first.stderr()
    );
    assert!(second.wait(Duration::from_secs(15)).success());
    assert!(b.wait(Duration::from_secs(10)).success(), "{}", b.stderr());
    let br = b.json();
    assert_eq!(u(&br, "auth_failures"), 1, "{br:#}");
    assert_eq!(br["refused"].as_array().unwrap().len(), 1, "{br:#}");
    assert_eq!(br["refused"][0]["shard"]["index"], 1);
    let answered = u(&first.json(), "queries.answered") + u(&second.json(), "queries.answered");
    assert_eq!(u(&stop_echo(&echo), "answered"), answered);
}

/// `replay` is an agent too: its capture mapped and its interface open, it sends its first
/// frame at the instant the load agent sends its first query.
#[test]
fn a_replay_agent_starts_with_a_load_agent() {
    let _turn = common::timing_turn();
    let mut f = Fleet::new("fbrep", 2);
    let echo = f.echo();
    let mut b = f.barrier(2, &["--ready-timeout", "20s"]);
    let args = load_args("0.5");
    let mut load = f.agent(1, "1/2", &args);
    let (key, barrier) = (
        f.key.to_str().unwrap().to_string(),
        format!("198.18.2.2:{BARRIER_PORT}"),
    );
    let pcap = common::testdata("tcpreplay-test.pcap");
    let iface = f.ifaces[1].clone();
    let argv = [
        tcpkit(),
        "replay",
        "-i",
        &iface,
        "--topspeed",
        "--barrier",
        &barrier,
        "--barrier-key",
        &key,
        "--shard",
        "2/2",
        "--json",
        pcap.to_str().unwrap(),
    ];
    let h = f.agents[1].clone();
    let mut replay = f.spawn(&h, &argv);
    assert!(
        replay.wait(Duration::from_secs(15)).success(),
        "{}",
        replay.stderr()
    );
    assert!(
        load.wait(Duration::from_secs(15)).success(),
        "{}",
        load.stderr()
    );
    assert!(b.wait(Duration::from_secs(10)).success(), "{}", b.stderr());
    let (br, rr) = (b.json(), replay.json());
    schema::check(&schema::load("replay"), &rr, "replay");
    assert!(u(&rr, "packets") > 0, "{rr:#}");
    assert_eq!(rr["fleet"]["run_id"], br["run_id"]);
    let fl = &rr["fleet"];
    let late = u(fl, "actual_start_unix_ns") - u(fl, "intended_start_unix_ns");
    assert!(late < 5_000_000, "replay started {late} ns late: {fl:#}");
    assert!(u(&br, "start_spread_ns") < START_SPREAD_MAX_NS, "{br:#}");
    assert_eq!(br["agents"][1]["outcome"], "done");
    assert_eq!(
        u(&stop_echo(&echo), "answered"),
        u(&load.json(), "queries.answered")
    );
}

/// An agent cut off mid-run (its link carries nothing either way, no close seen by anyone) is
/// lost after 2 s of silence on both sides: the barrier names it and stops the other; the
/// agent itself finds the barrier gone and stops too.
#[test]
fn an_agent_cut_off_mid_run_is_lost_after_two_silent_seconds() {
    let mut f = Fleet::new("fbcut", 2);
    let _echo = f.echo();
    let mut b = f.barrier(2, &["--ready-timeout", "20s", "--lost-after", "2s"]);
    let args = load_args("10");
    let mut one = f.agent(1, "1/2", &args);
    let mut cut = f.agent(2, "2/2", &args);
    b.wait_line("start at", Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(200));
    // From the barrier's side going deaf: nft can take a while on a loaded machine.
    let t = Instant::now();
    f.srv.drop_arriving(&f.srv_ifaces[1]).unwrap();
    f.agents[1].drop_arriving(&f.ifaces[1]).unwrap();
    assert_eq!(b.wait(Duration::from_secs(6)).code(), Some(1));
    let noticed = t.elapsed();
    let last = b.last_line();
    assert!(
        last.starts_with("tcpkit barrier: shard 2/2 on ")
            && last.contains("silent for 2000 ms mid-run"),
        "{last}"
    );
    // 2 s from the last beat heard, which came up to 250 ms before the cut (more when the
    // machine is loaded and the agent's beat late): the silence path, never an instant one.
    assert!(
        (Duration::from_millis(1000)..Duration::from_millis(3000)).contains(&noticed),
        "{noticed:?}"
    );
    assert_eq!(one.wait(Duration::from_secs(5)).code(), Some(1));
    let r = one.json();
    assert!(r["fleet"]["stopped_by"]
        .as_str()
        .unwrap()
        .starts_with("shard 2/2 on "));
    assert_eq!(cut.wait(Duration::from_secs(5)).code(), Some(1));
    assert!(
        cut.last_line().contains("lost the barrier"),
        "{}",
        cut.stderr()
    );
    assert!(cut.json()["seconds"].as_f64().unwrap() < 5.0);
    eprintln!("fleet: cut-off agent lost after {noticed:?}");
}

/// An agent whose connects fail while it prepares (out of local ports: EADDRNOTAVAIL, as when
/// an earlier run's ports are still in TIME_WAIT) reaches the barrier as not ready with why,
/// through its worker processes and their parent, never as silent; its own last line is
/// that reason, not the barrier's close that answers it.
#[test]
fn an_agent_out_of_ports_while_preparing_is_not_ready_with_why() {
    let mut f = Fleet::new("fbport", 1);
    let echo = f.echo();
    let a = f.agents[0].clone();
    // 8 ports, 5 of them held by bound sockets: the plan (8 ports for 6 connections) passes,
    // and the connects find 3.
    a.run(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=41000 41007"])
        .unwrap();
    let held: Vec<std::net::TcpListener> = a.enter(|| {
        (41000..41005)
            .map(|p| std::net::TcpListener::bind(("0.0.0.0", p)).unwrap())
            .collect()
    });
    let mut b = f.barrier(1, &["--ready-timeout", "20s"]);
    let args = [
        &LOAD[..],
        &["-t", "1", "--procs", "2", "--connect-retries", "0"],
    ]
    .concat();
    let mut agent = f.agent(1, "1/1", &args);
    assert_eq!(agent.wait(Duration::from_secs(15)).code(), Some(1));
    assert_eq!(
        b.wait(Duration::from_secs(10)).code(),
        Some(1),
        "{}",
        b.stderr()
    );
    drop(held);
    let last = b.last_line();
    assert!(
        last.contains("cannot get ready: worker process")
            && last.contains("connections could be opened to")
            && last.contains("(first failure: EADDRNOTAVAIL"),
        "{last}"
    );
    let br = b.json();
    assert_eq!(br["agents"][0]["outcome"], "not_ready", "{br:#}");
    let own = agent.last_line();
    assert!(own.contains("(first failure: EADDRNOTAVAIL"), "{own}");
    assert_eq!(u(&agent.json(), "queries.sent"), 0);
    assert_eq!(u(&stop_echo(&echo), "answered"), 0);
}
