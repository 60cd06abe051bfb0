//! Issue 25, item 3: `--shard K/N`, one command line shared by N agents. load: shard K takes
//! its share of connections and queries, and the N shards' constant arrivals together are one
//! evenly spaced schedule (against `tcpkit echo`, read back from their `-R` files). replay:
//! N shards send the whole capture between them, byte for byte, no flow split over two, each
//! frame at its time in the whole replay. Bad K/N: exit 2, one line naming --shard.

use crate::common;
use common::peer::{json, pair, stop_echo, target, u};
use common::{read_frames, schema, stderr, usage_line, Frame, ReplayLab};

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// Intended send times (ns after the start) of the `query` lines of per-query files.
fn intended(files: &[&Path]) -> Vec<u64> {
    let mut t = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        t.extend(
            text.lines()
                .filter(|l| l.starts_with("query,"))
                .map(|l| l.split(',').nth(4).unwrap().parse::<u64>().unwrap()),
        );
    }
    t.sort_unstable();
    t
}

/// Three load shards of `-c 10 -r 600 --arrivals constant -n 60` against one echo, the first
/// over two processes: 4/3/3 connections, 20 queries each, all answered; their intended send
/// times together are the whole run's schedule, g/600 s for g = 0..59, to the ns (evenly
/// spaced at 1/R, not three shards firing at once); and a --hold shard holds its share.
#[test]
fn load_shards_share_one_command_line_and_one_even_schedule() {
    let _turn = common::timing_turn();
    let mut p = pair("shld");
    let echo = p.echo(4290, &["--json"]);
    let dir = tempfile::tempdir().unwrap();
    let t = target(4290);
    let load_schema = schema::load("load");
    let mut files = Vec::new();
    for (k, conns, procs) in [(1, 4, "2"), (2, 3, "1"), (3, 3, "1")] {
        let shard = format!("{k}/3");
        let pq = dir.path().join(format!("pq{k}.csv"));
        let pq_s = pq.to_str().unwrap();
        let args = [
            t.as_str(),
            "--echo-bytes",
            "16",
            "-c",
            "10",
            "-r",
            "600",
            "--arrivals",
            "constant",
            "-n",
            "60",
            "--shard",
            &shard,
            "--procs",
            procs,
            "-R",
            pq_s,
            "--json",
        ];
        let o = p.load(&args, Duration::from_secs(20));
        assert!(o.status.success(), "shard {shard}: {}", stderr(&o));
        let r = json(&o);
        schema::check(&load_schema, &r, "report");
        assert_eq!(r["shard"], serde_json::json!({"index": k, "count": 3}));
        assert_eq!(u(&r, "connections.asked"), conns, "shard {shard}");
        assert_eq!(u(&r, "connections.peak_open"), conns, "shard {shard}");
        assert_eq!(u(&r, "queries.sent"), 20, "shard {shard}");
        assert_eq!(u(&r, "queries.answered"), 20, "shard {shard}");
        assert_eq!(u(&r, "processes"), procs.parse::<u64>().unwrap());
        let asked = r["rates"]["asked_qps"].as_f64().unwrap();
        assert!((asked - 200.0).abs() < 1e-6, "shard {shard}: asked {asked}");
        if procs == "2" {
            files.extend([0, 1].map(|w| dir.path().join(format!("pq{k}.csv.{w}"))));
        } else {
            files.push(pq);
        }
    }
    let paths: Vec<&Path> = files.iter().map(|f| f.as_path()).collect();
    let all = intended(&paths);
    let whole: Vec<u64> = (0..60u64).map(|g| g * 1_000_000_000 / 600).collect();
    assert_eq!(all, whole, "the shards' queries together, to the ns");
    // A shard of --hold opens its share and sends nothing.
    let o = p.load(
        &[
            t.as_str(),
            "-c",
            "10",
            "--hold",
            "-t",
            "0.3",
            "--shard",
            "2/3",
            "--json",
        ],
        Duration::from_secs(10),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(u(&r, "connections.peak_open"), 3, "{r:#}");
    assert_eq!(u(&r, "queries.sent"), 0);
    // What the server saw: the shards' connections (and the probe that saw it listen), and
    // every query.
    let e = stop_echo(&echo);
    assert_eq!(u(&e, "accepted"), 1 + 10 + 3);
    assert_eq!(u(&e, "bytes_in"), 60 * 16);
}

/// The IP connection of a frame, the same both ways; None for frames that are not IP.
fn connection(f: &[u8]) -> Option<tcpkit_wire::ConnKey> {
    tcpkit_wire::flow_key(f).map(|k| k.connection())
}

fn multiset(frames: &[Frame]) -> BTreeMap<&[u8], usize> {
    let mut m = BTreeMap::new();
    for f in frames {
        *m.entry(f.data.as_slice()).or_insert(0) += 1;
    }
    m
}

/// A bundled capture (HTTP, DNS, ICMP, IPv6, MPLS, ARP) replayed twice over with --unique-ip
/// into a recording host, whole and then as three shards one after the other: the shards'
/// frames together are the whole replay's, byte for byte (as a multiset); every connection's
/// frames came from one shard, and frames that are not IP from shard 1; each report counts
/// what it left to the others.
#[test]
fn replay_shards_send_the_whole_capture_between_them() {
    let _turn = common::timing_turn();
    let mut lab = ReplayLab::new("shrp");
    let pcap = common::testdata("tcpreplay-test.pcap");
    let pcap = pcap.to_str().unwrap();
    let replay_schema = schema::load("replay");
    let (reports, frames) = lab.capture(|l| {
        let mut reports: Vec<Value> = Vec::new();
        for shard in [None, Some("1/3"), Some("2/3"), Some("3/3")] {
            let mut args = vec!["-p", "4000", "--loop", "2", "--unique-ip", "--json"];
            if let Some(s) = shard {
                args.extend(["--shard", s]);
            }
            args.push(pcap);
            let o = l.replay(&args);
            assert!(o.status.success(), "{shard:?}: {}", stderr(&o));
            let r = json(&o);
            schema::check(&replay_schema, &r, "report");
            reports.push(r);
            // The next run's frames must not overtake this one's at the receiver.
            std::thread::sleep(Duration::from_millis(100));
        }
        reports
    });
    let whole_count = u(&reports[0], "packets") as usize;
    assert_eq!(whole_count, 2 * 179);
    assert!(reports[0]["shard"].is_null());
    let mut at = whole_count;
    let mut runs: Vec<&[Frame]> = vec![&frames[..whole_count]];
    for (k, r) in reports[1..].iter().enumerate() {
        let n = u(r, "packets") as usize;
        assert!(n > 0, "shard {} sent nothing", k + 1);
        assert_eq!(u(r, "shard.index"), k as u64 + 1);
        assert_eq!(u(r, "shard.count"), 3);
        assert_eq!(u(r, "shard.frames_to_others") as usize + n, whole_count);
        assert_eq!(u(r, "shard.flows_kept"), u(r, "flows.connections"));
        runs.push(&frames[at..at + n]);
        at += n;
    }
    assert_eq!(frames.len(), at, "the receiver got more than was sent");
    let union: Vec<Frame> = runs[1..].iter().flat_map(|r| r.iter().cloned()).collect();
    assert!(
        multiset(&union) == multiset(runs[0]),
        "the shards' frames differ from the whole replay's"
    );
    let mut shards_of: BTreeMap<tcpkit_wire::ConnKey, BTreeSet<usize>> = BTreeMap::new();
    for (k, run) in runs[1..].iter().enumerate() {
        for f in *run {
            match connection(&f.data) {
                Some(c) => {
                    shards_of.entry(c).or_default().insert(k + 1);
                }
                None => assert_eq!(k + 1, 1, "a frame that is not IP from shard {}", k + 1),
            }
        }
    }
    let split: Vec<_> = shards_of.iter().filter(|(_, s)| s.len() > 1).collect();
    assert!(split.is_empty(), "connections split over shards: {split:?}");
    let used: BTreeSet<usize> = shards_of.values().flatten().copied().collect();
    assert_eq!(used.len(), 3, "every shard had connections of its own");
}

/// Dry runs (-w) write each frame with the time it is due: the three shards' files together
/// are the whole replay's, frame and timestamp, under capture timing, --pps and --mbps (where
/// the others' frames still take their bits' time), looped, with --unique-ip and rewriting
/// that resizes frames (a VLAN tag added).
#[test]
fn replay_shards_keep_their_times_in_the_whole_replay() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = common::testdata("tcpreplay-test.pcap");
    let pcap = pcap.to_str().unwrap();
    for rate in [&["-x", "3"][..], &["-p", "500"], &["-M", "2"]] {
        let run = |shard: Option<&str>, name: &str| {
            let out = dir.path().join(name);
            let mut args = vec!["replay", "-w", out.to_str().unwrap(), "--loop", "2"];
            args.extend(["--unique-ip", "--enet-vlan", "add", "--enet-vlan-tag", "7"]);
            args.extend(rate);
            if let Some(s) = shard {
                args.extend(["--shard", s]);
            }
            args.extend(["-L", "300", pcap]);
            let o = common::run(&args);
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
            read_frames(&out)
        };
        let whole = run(None, "whole.pcap");
        assert_eq!(whole.len(), 300, "{rate:?}");
        let mut union: Vec<Frame> = (1..=3)
            .flat_map(|k| run(Some(&format!("{k}/3")), &format!("s{k}.pcap")))
            .collect();
        let key = |f: &Frame| (f.ts_ns, f.data.clone());
        let mut whole = whole;
        whole.sort_by_key(key);
        union.sort_by_key(key);
        assert!(
            union == whole,
            "{rate:?}: the shards' frames or times differ"
        );
    }
}

/// --shard's usage errors: exit 2, one line naming --shard (or the flag that cannot be shared
/// out), nothing run.
#[test]
fn shard_usage_errors_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let names = dir.path().join("names");
    std::fs::write(&names, "a.test\nb.test\n").unwrap();
    let names = names.to_str().unwrap();
    // Bounded: a command line wrongly taken runs 0.3 s and fails, it does not hang the test.
    let load = |extra: &[&str]| {
        let mut a = vec!["load", "127.0.0.1:9", "-r", "100", "-t", "0.3"];
        a.extend_from_slice(extra);
        common::run(&a)
    };
    for bad in ["0/3", "4/3", "1/0", "x", "", "1/3/1", "-1/3"] {
        let arg = format!("--shard={bad}");
        usage_line(&load(&["-c", "10", &arg]), &["--shard", bad]);
        let o = common::run(&["replay", "-w", "/dev/null", &arg, "f.pcap"]);
        usage_line(&o, &["--shard", bad]);
    }
    let line = usage_line(
        &load(&["--shard", "1/3", "-c", "2"]),
        &["--shard 1/3", "-c 2"],
    );
    assert!(
        line.contains("fewer connections than the 3 shards"),
        "{line}"
    );
    usage_line(
        &load(&["-c", "10", "--shard", "3/3", "-n", "2"]),
        &["--shard 3/3", "-n 2"],
    );
    let line = usage_line(
        &load(&["-c", "10", "--shard", "2/3", "--qname-file", names]),
        &["--qname-file", "2 names for 3 shards"],
    );
    assert!(line.contains("--qname"), "{line}");
}
