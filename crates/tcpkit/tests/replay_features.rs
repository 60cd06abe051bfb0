//! Loops, unique IPs, limits, threads, preload, reports: each option does what it says, seen
//! from the receiver and from the report.

use crate::common;
use common::schema;

use std::collections::HashMap;

use common::{stderr, stdout, testdata, udp_frame, write_pcap, Frame, ReplayLab};
use serde_json::Value;

/// `flows` connections of `per_flow` frames each, interleaved; the payload carries the frame's
/// sequence number within its flow.
fn multiflow(flows: u32, per_flow: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("flows.pcap");
    let mut frames = Vec::new();
    for seq in 0..per_flow {
        for f in 0..flows {
            let mut fr = udp_frame(seq, 80, [198, 18, 1, f as u8], [198, 18, 2, 1]);
            fr[34..36].copy_from_slice(&(10_000 + f as u16).to_be_bytes());
            frames.push((u64::from(seq * flows + f) * 1_000, fr));
        }
    }
    write_pcap(&p, 1, &frames);
    (dir, p)
}

fn src_port(f: &Frame) -> u16 {
    u16::from_be_bytes([f.data[34], f.data[35]])
}

fn seq(f: &Frame) -> u32 {
    u32::from_be_bytes(f.data[42..46].try_into().unwrap())
}

fn json(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("--json output is not JSON ({e}): {}", stdout(o)))
}

#[test]
fn unique_ip_makes_every_loop_new_flows() {
    let (_d, p) = multiflow(4, 5);
    let mut lab = ReplayLab::new("uniq");
    let (out, got) = lab.capture(|l| {
        l.replay(&[
            "-t",
            "--loop",
            "3",
            "--unique-ip",
            "--json",
            p.to_str().unwrap(),
        ])
    });
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(got.len(), 60);
    let j = json(&out);
    assert_eq!(j["packets"], 60);
    assert_eq!(j["loops_completed"], 3);
    assert_eq!(j["flows"]["flows"], 12, "4 flows a loop, new every loop");
    // Loop k's addresses differ from loop 0's, and stay consistent within the loop.
    let srcs: Vec<[u8; 4]> = got
        .iter()
        .map(|f| f.data[26..30].try_into().unwrap())
        .collect();
    assert_ne!(srcs[0], srcs[20]);
    assert_ne!(srcs[20], srcs[40]);
    assert_eq!(srcs[0], [198, 18, 1, 0]);
    // IPv4 header checksums still verify.
    for f in &got {
        let mut sum: u32 = f.data[14..34]
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "bad IPv4 checksum after --unique-ip");
    }
    // Without --unique-ip, loops repeat the same flows.
    let out = lab.replay(&["-t", "--loop", "3", "--json", p.to_str().unwrap()]);
    assert_eq!(json(&out)["flows"]["flows"], 4);
}

#[test]
fn limit_and_duration_stop_the_run() {
    let (_d, p) = multiflow(2, 500);
    let mut lab = ReplayLab::new("limit");
    let (out, got) = lab.capture(|l| l.replay(&["-t", "-L", "17", p.to_str().unwrap()]));
    assert!(out.status.success());
    assert_eq!(got.len(), 17);
    assert!(stdout(&out).starts_with("Actual: 17 packets"));
    let t = std::time::Instant::now();
    let (out, got) = lab.capture(|l| {
        l.replay(&[
            "--pps",
            "100",
            "--duration",
            "1",
            "--json",
            p.to_str().unwrap(),
        ])
    });
    let took = t.elapsed().as_secs_f64();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(
        (99..=102).contains(&got.len()),
        "--duration 1 at 100 pps sent {}",
        got.len()
    );
    assert!(took < 3.0, "run took {took} s");
    // Forever, stopped by the duration.
    let out = lab.replay(&[
        "-t",
        "--loop",
        "0",
        "--duration",
        "0.5",
        "--json",
        p.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(json(&out)["loops_completed"].as_u64().unwrap() >= 2);
}

#[test]
fn loopdelay_pauses_between_loops() {
    let (_d, p) = multiflow(1, 5);
    let mut lab = ReplayLab::new("ldelay");
    let (out, got) = lab.capture(|l| {
        l.replay(&[
            "-t",
            "--loop",
            "2",
            "--loopdelay-ms",
            "300",
            p.to_str().unwrap(),
        ])
    });
    assert!(out.status.success());
    assert_eq!(got.len(), 10);
    let gap = got[5].ts_ns - got[4].ts_ns;
    // The delay is slept from the moment loop 1's last batch left, so the gap is 300 ms plus
    // how late the sleeper woke: seen 403 ms while four compilers shared the two cores. The
    // bounds catch what the product can get wrong (no delay: ~0; the delay twice: 600 ms),
    // not how busy the machine is.
    assert!(
        (290_000_000..590_000_000).contains(&gap),
        "gap between loops {gap} ns"
    );
}

#[test]
fn threads_keep_order_within_each_flow() {
    // Small enough for tcpdump's buffer at top speed.
    let (_d, p) = multiflow(64, 20);
    let mut lab = ReplayLab::new("threads");
    let (out, got) =
        lab.capture(|l| l.replay(&["-t", "-K", "--threads", "2", "--json", p.to_str().unwrap()]));
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(got.len(), 64 * 20);
    let j = json(&out);
    assert_eq!(j["packets"], 64 * 20);
    assert_eq!(j["flows"]["flows"], 64);
    let mut next: HashMap<u16, u32> = HashMap::new();
    for f in &got {
        let want = next.entry(src_port(f)).or_insert(0);
        assert_eq!(seq(f), *want, "flow {} out of order", src_port(f));
        *want += 1;
    }
    assert_eq!(next.len(), 64);
}

#[test]
fn preload_sends_the_same_frames() {
    let f = testdata("tcpreplay-test.pcap");
    let mut lab = ReplayLab::new("preload");
    let (_, a) = lab.capture(|l| l.replay(&["-t", f.to_str().unwrap()]));
    let (_, b) = lab.capture(|l| l.replay(&["-t", "-K", f.to_str().unwrap()]));
    assert_eq!(a.len(), 179);
    assert!(a.iter().zip(&b).all(|(x, y)| x.data == y.data) && a.len() == b.len());
}

#[test]
fn human_summary_has_tcpreplays_lines_and_the_interface_counters() {
    let f = testdata("tcpreplay-test.pcap");
    let lab = ReplayLab::new("summary");
    let out = lab.replay(&["-t", f.to_str().unwrap()]);
    assert!(out.status.success());
    let s = stdout(&out);
    let lines: Vec<&str> = s.lines().collect();
    assert!(
        lines[0].starts_with("Actual: 179 packets (69000 bytes) sent in "),
        "{s}"
    );
    assert!(
        lines[1].starts_with("Rated: ")
            && lines[1].contains(" Bps, ")
            && lines[1].ends_with(" pps")
    );
    assert!(
        lines[2].starts_with("Flows: ") && lines[2].contains(" flow packets, "),
        "{s}"
    );
    let dev = format!("Statistics for network device: {}", lab.link.a.name);
    assert!(lines.contains(&dev.as_str()), "{s}");
    assert!(lines.contains(&"\tSuccessful packets:        179"));
    assert!(lines.contains(&"\tFailed packets:            0"));
    // The kernel's own count: at least what we sent (it may add frames of its own).
    let ifl = lines
        .iter()
        .find(|l| l.starts_with("Interface counters over the run: "))
        .expect(&s);
    let n: u64 = ifl
        .split("tx_packets ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(n >= 179, "{ifl}");
}

#[test]
fn stats_lines_appear_during_the_run() {
    let (_d, p) = multiflow(1, 150);
    let lab = ReplayLab::new("stats");
    let out = lab.replay(&["--pps", "100", "--stats", "0.4", p.to_str().unwrap()]);
    assert!(out.status.success());
    // The live lines on stderr, elapsed time first; stdout has the summary's one Actual: line.
    let s = stdout(&out);
    assert_eq!(
        s.lines().filter(|l| l.starts_with("Actual: ")).count(),
        1,
        "{s}"
    );
    let e = stderr(&out);
    let actual = e
        .lines()
        .filter(|l| l.starts_with('[') && l.contains("s] Actual: "))
        .count();
    // ~1.5 s at 0.4 s intervals: 3 interval lines.
    assert!((2..=4).contains(&actual), "{actual} Actual: lines\n{e}");
}

#[test]
fn json_matches_the_committed_schema() {
    let schema = schema::load("replay");
    let f = testdata("zeek-redis-pipelining-dlt-null.pcap");
    let lab = ReplayLab::new("json");
    for args in [vec!["--pps", "1000", "--json"], vec!["-t", "--json"]] {
        let mut a = args.clone();
        a.push(f.to_str().unwrap());
        let out = lab.replay(&a);
        assert!(out.status.success());
        let j = json(&out);
        schema::check(&schema, &j, "report");
        assert_eq!(j["packets"], 12);
        assert_eq!(j["ethernet_added"], 12);
    }
    let dir = tempfile::tempdir().unwrap();
    let out = common::run(&[
        "replay",
        "-w",
        dir.path().join("o.pcap").to_str().unwrap(),
        "--json",
        f.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let j = json(&out);
    schema::check(&schema, &j, "report");
    assert_eq!(j["dry_run"], true);
    assert!(j["interface"].is_null() && j["timing"].is_null());
    // The checker is not vacuous: it rejects an unknown field and a wrong type.
    let mut bad = j.clone();
    bad["surprise"] = Value::from(1);
    assert!(std::panic::catch_unwind(|| schema::check(&schema, &bad, "bad")).is_err());
    let mut bad = j;
    bad["packets"] = Value::from("12");
    assert!(std::panic::catch_unwind(|| schema::check(&schema, &bad, "bad")).is_err());
}

/// A copy of `name` in `dir` with the destination MAC of every IPv6 frame starting with the
/// nibble 6 (0x6X, still unicast): tcpreplay 4.4.3's flow_decode checks the IP version in the
/// first byte of the *frame* instead of the IPv6 header and files every other IPv6 frame as
/// non-flow. Ours does not copy that bug; on this copy both must count alike.
fn ipv6_frames_past_tcpreplays_bug(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let frames: Vec<(u64, Vec<u8>)> = common::read_frames(&testdata(name))
        .into_iter()
        .map(|f| {
            let mut d = f.data;
            if d.get(12..14) == Some(&[0x86, 0xdd]) {
                d[0] = 0x60 | (d[0] & 0x0e);
            }
            (f.ts_ns, d)
        })
        .collect();
    let p = dir.join(name);
    write_pcap(&p, 1, &frames);
    p
}

/// The numbers of a `Flows:` line: flows, flow packets, non-flow packets.
fn flows_line(s: &str) -> (u64, u64, u64) {
    let line = s
        .lines()
        .find(|l| l.starts_with("Flows: "))
        .unwrap_or_else(|| panic!("no Flows line:\n{s}"));
    // "Flows: N flows, R fps, F unique flow packets, M unique non-flow packets"
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        (w.len(), w[2], w[6], w[7], w[11]),
        (13, "flows,", "unique", "flow", "non-flow"),
        "{line}"
    );
    let n = |i: usize| -> u64 { w[i].parse().unwrap_or_else(|e| panic!("{line}: {e}")) };
    (n(1), n(5), n(9))
}

/// tcpreplay 4.4.3 is the oracle for flow counting: the same flows, flow packets and non-flow
/// packets on every Ethernet capture in testdata/ (issue 24: tcpreplay-test.pcap gave 13
/// non-flow packets where tcpreplay says 12: Ethernet over MPLS was not looked into, and an
/// 802.3 frame, which tcpreplay counts in neither, was non-flow). The one exception, made
/// explicit: tcpreplay's IPv6 bug, taken out of the inputs by
/// [`ipv6_frames_past_tcpreplays_bug`].
#[test]
fn flows_are_counted_as_tcpreplay_counts_them() {
    let lab = ReplayLab::new("flows");
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "tcpreplay-test.pcap",
        "trex-http_get.pcap",
        "zeek-dns-tcp-keepalive.pcap",
        "zeek-redis-django-cloud.pcapng",
    ] {
        let f = ipv6_frames_past_tcpreplays_bug(dir.path(), name);
        let f = f.to_str().unwrap();
        let ours = stdout(&lab.replay(&["-t", f]));
        let theirs = lab
            .tx
            .command(&["tcpreplay", "-i", &lab.link.a.name, "-t", f])
            .output()
            .expect("tcpreplay");
        let theirs = stdout(&theirs);
        assert_eq!(
            flows_line(&ours),
            flows_line(&theirs),
            "{name}: (flows, flow packets, non-flow packets)\nours: {ours}\ntheirs: {theirs}"
        );
    }
}

/// Issue 24: with `--unique-ip` over 2000 loops of tcpreplay-test.pcap we counted 86,002 flows
/// where tcpreplay counts 90,000 (45 a loop): our mapping (both addresses + loop) made one
/// loop's flows another loop's. tcpreplay's mapping now; same flows and flow packets. Its
/// non-flow count is not compared, by design: tcpreplay drops every non-IP frame from each
/// loop after the first (they fail its address edit: "Failed write attempts"); we send them.
#[test]
fn unique_ip_flows_are_tcpreplays_over_many_loops() {
    let lab = ReplayLab::new("uflows");
    let dir = tempfile::tempdir().unwrap();
    let f = ipv6_frames_past_tcpreplays_bug(dir.path(), "tcpreplay-test.pcap");
    let f = f.to_str().unwrap();
    let args = ["-t", "--loop", "300", "--unique-ip"];
    let ours = stdout(&lab.replay(&[&args[..], &[f]].concat()));
    let mut argv = vec!["tcpreplay", "-i", &lab.link.a.name];
    argv.extend_from_slice(&args);
    argv.push(f);
    let theirs = stdout(&lab.tx.command(&argv).output().expect("tcpreplay"));
    let (o, t) = (flows_line(&ours), flows_line(&theirs));
    assert_eq!(
        (o.0, o.1),
        (t.0, t.1),
        "(flows, flow packets)\nours: {ours}\ntheirs: {theirs}"
    );
    assert_eq!(o.0, 47 * 300, "every loop's flows are new: {ours}");
    // Ours sends the 2 non-IP frames of every loop.
    assert_eq!(o.2, 2 * 300, "{ours}");
}
