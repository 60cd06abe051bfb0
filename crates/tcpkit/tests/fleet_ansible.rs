//! deploy/ansible's fleet.yml as a user runs it: ansible-playbook (ansible-core from
//! scripts/setup.sh's venv) in a controller namespace, over SSH (Debian's sshd in each host,
//! keys made by the lab) to 3 agent namespaces and 1 server namespace running `tcpkit echo`,
//! all on one LAN (tcpkit_lab::Fleet). The hosts share this machine's filesystem, so the play
//! installs nothing (tcpkit_install: false) and runs the binary under test. Each scenario is a
//! lab of its own, run side by side with the others.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tcpkit_lab::Fleet;

use crate::common;
use common::peer::u;

/// echo's port in the server host.
const ECHO_PORT: u16 = 4242;

/// The longest a playbook may run here before the test calls it a hang.
const PLAY_LIMIT: Duration = Duration::from_secs(60);

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/ansible")
}

/// One scenario: its fleet, the directories the play writes, and its variables.
struct Scenario {
    fleet: Fleet,
    dir: tempfile::TempDir,
    vars: Value,
    host_vars: Vec<(&'static str, Value)>,
    groups: Vec<(&'static str, &'static [&'static str])>,
}

/// What a playbook run left: its output and exit status, how long it took, and where its
/// files are.
struct Played {
    out: Output,
    took: Duration,
    run_dir: PathBuf,
    results: PathBuf,
}

impl Played {
    fn text(&self) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }

    fn json(&self, rel: &str) -> Value {
        let p = self.results.join(rel);
        let s = std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", p.display(), self.text()));
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}: {s}", p.display()))
    }

    /// The barrier's stderr on the controller.
    fn barrier_err(&self) -> String {
        std::fs::read_to_string(self.run_dir.join("controller/barrier.err")).unwrap_or_default()
    }
}

impl Scenario {
    /// A fleet of 3 agents and 1 server, and fleet.yml's variables for a short run against
    /// the server's echo: `rate` queries per second over 6 connections for `duration`.
    fn new(tag: &str, rate: u32, duration: &str) -> Scenario {
        let fleet = Fleet::new(tag, 3, 1).unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().expect("tempdir");
        let vars = json!({
            "tcpkit_install": false,
            "tcpkit_bin": common::tcpkit(),
            "tcpkit_echo": true,
            "tcpkit_echo_port": ECHO_PORT,
            "tcpkit_echo_args": "--threads 1",
            "tcpkit_target": format!("{}:{ECHO_PORT}", fleet.servers[0].addr),
            "tcpkit_rate": rate,
            "tcpkit_connections": 6,
            "tcpkit_duration": duration,
            "tcpkit_load_args": "--threads 1",
            "tcpkit_barrier_host": fleet.controller.addr.to_string(),
            "tcpkit_ready_timeout": "5s",
            "tcpkit_run_dir": dir.path().join("run"),
            "tcpkit_results_dir": dir.path().join("results"),
        });
        Scenario {
            fleet,
            dir,
            vars,
            host_vars: Vec::new(),
            groups: Vec::new(),
        }
    }

    /// Runs `playbook` (in deploy/ansible) to its end; `during` runs beside it, given the
    /// run directory (every host's files, the hosts sharing this filesystem).
    fn play(&self, playbook: &str, during: impl FnOnce(&Path) + Send) -> Played {
        let inv = self.dir.path().join("inventory.json");
        self.fleet
            .inventory(&inv, &self.vars, &self.host_vars, &self.groups)
            .unwrap_or_else(|e| panic!("{e}"));
        let deploy = deploy_dir();
        let inv_s = inv.to_string_lossy();
        let mut cmd = self
            .fleet
            .ansible_playbook(&deploy.join("ansible.cfg"), &["-i", &inv_s, playbook])
            .unwrap_or_else(|e| panic!("{e}"));
        cmd.current_dir(&deploy)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let run_dir = self.dir.path().join("run");
        let t0 = Instant::now();
        let mut child = cmd.spawn().expect("start ansible-playbook");
        let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let out = std::thread::scope(|s| {
            let o = s.spawn(move || {
                let mut b = Vec::new();
                so.read_to_end(&mut b).map(|_| b)
            });
            let e = s.spawn(move || {
                let mut b = Vec::new();
                se.read_to_end(&mut b).map(|_| b)
            });
            s.spawn(|| during(&run_dir));
            let status = loop {
                if let Some(st) = child.try_wait().expect("wait") {
                    break st;
                }
                if t0.elapsed() > PLAY_LIMIT {
                    // SAFETY: kill(2) on the process group Host::command started.
                    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                    panic!("ansible-playbook ran past {PLAY_LIMIT:?} (a hang)");
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            Output {
                status,
                stdout: o.join().unwrap().expect("read stdout"),
                stderr: e.join().unwrap().expect("read stderr"),
            }
        });
        Played {
            out,
            took: t0.elapsed(),
            run_dir,
            results: self.dir.path().join("results"),
        }
    }
}

/// Waits (up to 20 s) until the barrier on the controller has said every agent is ready.
fn wait_ready(run_dir: &Path) {
    let err = run_dir.join("controller/barrier.err");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let s = std::fs::read_to_string(&err).unwrap_or_default();
        if s.contains("tcpkit barrier: all 3 agents ready, start at ") {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the barrier never said all 3 agents were ready");
}

/// An agent's actual start on the controller's clock (the contract's fleet fields).
fn start_on_controller(report: &Value) -> i128 {
    let f = &report["fleet"];
    i128::from(u(f, "actual_start_unix_ns"))
        - i128::from(f["clock_offset_ns"].as_i64().expect("clock_offset_ns"))
}

#[test]
fn a_fleet_run_answers_what_echo_counted_and_starts_together() {
    let _turn = common::timing_turn();
    let s = Scenario::new("fleetok", 300, "1s");
    let p = s.play("fleet.yml", |_| {});
    let text = p.text();
    assert!(p.out.status.success(), "{text}");
    eprintln!("fleet.yml, 3 agents, 1 s of traffic: {:?}", p.took);
    let reports: Vec<Value> = (1..=3)
        .map(|k| p.json(&format!("reports/agent{k}.json")))
        .collect();
    let merged = p.json("merged.json");
    let echo = p.json("echo-server1.json");
    // Every answer the fleet counted is one echo gave, and the other way round.
    let answered = u(&merged, "queries.answered");
    assert!(answered > 0, "{merged:#}");
    assert_eq!(
        answered,
        u(&echo, "answered"),
        "merged {merged:#}\necho {echo:#}"
    );
    // Every agent ran its own shard of one fleet run.
    let run_id = &reports[0]["fleet"]["run_id"];
    for (k, r) in reports.iter().enumerate() {
        assert_eq!(u(&r["shard"], "index"), k as u64 + 1, "{r:#}");
        assert_eq!(u(&r["shard"], "count"), 3, "{r:#}");
        assert_eq!(&r["fleet"]["run_id"], run_id, "{r:#}");
        assert!(r["fleet"]["stopped_by"].is_null(), "{r:#}");
    }
    // The actual starts, on the controller's clock, lie within the bound the barrier states.
    let starts: Vec<i128> = reports.iter().map(start_on_controller).collect();
    let spread = starts.iter().max().unwrap() - starts.iter().min().unwrap();
    assert!(
        spread <= START_BOUND_NS,
        "actual starts {starts:?} spread {spread} ns, over {START_BOUND_NS} ns: {}",
        p.barrier_err()
    );
}

/// The spread of the agents' actual starts the barrier promises (README, `tcpkit barrier
/// --help`).
const START_BOUND_NS: i128 = 10_000_000;

#[test]
fn an_agent_killed_mid_run_fails_the_play_which_names_it() {
    let s = Scenario::new("fleetkill", 300, "4s");
    let p = s.play("fleet.yml", |run| {
        wait_ready(run);
        std::thread::sleep(Duration::from_millis(500));
        let pid = std::fs::read_to_string(run.join("agent2/load.pid")).expect("agent2's pid");
        let pid: i32 = pid.trim().parse().expect("a pid");
        // SAFETY: kill(2) on the load this test's play started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill agent2");
    });
    let text = p.text();
    assert!(!p.out.status.success(), "{text}");
    assert!(text.contains("agent2 (shard 2/3): exit "), "{text}");
    assert!(text.contains("shard 2/3"), "{text}");
    // The others were stopped well before their 4 s were up, each report saying why.
    assert!(p.took < Duration::from_secs(20), "{:?}: {text}", p.took);
    for k in [1, 3] {
        let r = p.json(&format!("reports/agent{k}.json"));
        let why = r["fleet"]["stopped_by"].as_str().unwrap_or_default();
        assert!(why.contains("shard 2/3"), "agent{k}: {r:#}");
    }
    assert!(!p.results.join("reports/agent2.json").exists());
}

#[test]
fn an_agent_that_cannot_get_ready_fails_the_play_before_any_query() {
    let s = Scenario::new("fleetnotready", 300, "2s");
    // The target refuses agent 3 alone: it cannot open its connections.
    let agent3 = s.fleet.agents[2].addr.to_string();
    let server = &s.fleet.servers[0].host;
    let chain = common::nft::Chain::new(server, "refuse3", "input");
    chain.rule(&[
        "ip", "saddr", &agent3, "tcp", "dport", "4242", "reject", "with", "tcp", "reset",
    ]);
    let p = s.play("fleet.yml", |_| {});
    let text = p.text();
    assert!(!p.out.status.success(), "{text}");
    assert!(text.contains("agent3 (shard 3/3): exit "), "{text}");
    assert!(text.contains("shard 3/3"), "{text}");
    assert!(
        !p.barrier_err().contains("agents ready"),
        "{}",
        p.barrier_err()
    );
    let echo = p.json("echo-server1.json");
    assert_eq!(u(&echo, "answered"), 0, "{echo:#}");
}

/// A DNS query for example.com A with `id`, as sent over TCP (length first).
fn dns_query(id: u16) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    m.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01");
    let mut q = (m.len() as u16).to_be_bytes().to_vec();
    q.extend_from_slice(&m);
    q
}

/// Two online hosts copy their captured DNS-over-TCP sessions (copy --input: what a live
/// capture would have seen) into one target, echo --dns, through copy.yml. One capture lost a
/// segment (a hole: the requests past it are counted at the source, never copied), so there
/// is loss to account for: the merged loss is what the target's own count says.
#[test]
fn two_online_hosts_copying_into_one_target_merge_into_the_loss_the_target_counted() {
    use crate::copy_common::{http_session_frames, lose_a_request, write_frames};
    let mut s = Scenario::new("fleetcopy", 1, "1s");
    let server = s.fleet.servers[0].addr;
    let queries: Vec<Vec<u8>> = (1..=4).map(dns_query).collect();
    let answer = b"\x00\x02\xab\xcd".as_slice();
    let turns: Vec<(&[u8], &[u8])> = queries.iter().map(|q| (q.as_slice(), answer)).collect();
    for (k, hole) in [(1, false), (2, true)] {
        // 3 sessions of 4 queries each, 10 ms apart.
        let mut frames = http_session_frames(3, 41000, 10_000_000, &turns);
        if hole {
            // The second query of the first session never made it into the capture.
            lose_a_request(&mut frames, 41000);
        }
        let pcap = s.dir.path().join(format!("online{k}.pcap"));
        write_frames(&pcap, &frames);
        let name: &'static str = ["agent1", "agent2"][k - 1];
        s.host_vars.push((
            name,
            json!({ "tcpkit_copy_args": format!("--input {} --timeout 2s", pcap.display()) }),
        ));
    }
    s.groups.push(("tcpkit_online", &["agent1", "agent2"]));
    s.vars["tcpkit_echo_args"] = json!("--dns --threads 1");
    s.vars["tcpkit_copy_rules"] = json!(format!("8080-{server}:{ECHO_PORT}"));
    s.vars["tcpkit_max_loss"] = json!(50);
    let p = s.play("copy.yml", |_| {});
    let text = p.text();
    assert!(p.out.status.success(), "{text}");
    eprintln!("copy.yml, 2 online hosts: {:?}", p.took);
    let echo = p.json("echo-server1.json");
    let merged = p.json("merged.json");
    let r1 = p.json("reports/agent1.json");
    let r2 = p.json("reports/agent2.json");
    let at_source = u(&r1, "requests.at_source") + u(&r2, "requests.at_source");
    let target = u(&echo, "answered");
    assert!(
        target > 0 && target < at_source,
        "echo {echo:#}\n{r1:#}\n{r2:#}"
    );
    assert_eq!(u(&merged, "requests.at_source"), at_source, "{merged:#}");
    assert_eq!(u(&merged, "requests.answered"), target, "{merged:#}");
    let loss = merged["requests"]["loss_ratio_percent"]
        .as_f64()
        .expect("loss");
    let counted = (at_source - target) as f64 * 100.0 / at_source as f64;
    assert!(
        (loss - counted).abs() < 1e-6,
        "merged loss {loss} vs the target's {counted}: {merged:#}"
    );
}
