//! `tcpkit mpcat` when a path misbehaves or a limit is set: a link that goes dead mid-transfer
//! (the others keep carrying while its chunks are re-sent on them) and `--rate-limit`'s
//! accuracy whatever the chunk size.

use crate::common;
use common::mpcat::{json_of, shaped, succeeds, Transfer};
use common::tcpkit;

use std::time::{Duration, Instant};

use tcpkit_lab::Lab;

fn len(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// Issue 24 item 2: one of 3 links (200 Mbit/s each) goes dead once 4 MiB of a 48 MiB
/// transfer arrived, and stays dead. The stream keeps arriving in order over the two live links at most of
/// their capacity during the next second (before: nothing at all arrived for --path-timeout +
/// 3.5 s, as the receiver waited for the dead link's chunks and its window filled), and the
/// whole stream arrives verified with the dead path named.
#[test]
fn mpcat_keeps_carrying_through_a_dead_link() {
    const SIZE: u64 = 48 << 20;
    const LIVE_BYTES_S: f64 = 2.0 * 200e6 / 8.0;
    let _turn = common::timing_turn();
    let mut t = Transfer::with_input("mppdead", 3, Some(shaped(200)), SIZE);
    let rx = t.listen(&["--quiet"]);
    let tx = t.send(&["--json"]);
    let out = t.output.clone();
    let started = Instant::now();
    while len(&out) < 4 << 20 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "nothing arrived:\n{}",
            tx.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let l = &t.links[1];
    // Both ways, as a cable pulled: nftables drops what arrives on either end.
    for (h, ifname) in [(&t.b, &l.b.name), (&t.a, &l.a.name)] {
        h.drop_arriving(ifname).unwrap_or_else(|e| panic!("{e}"));
    }
    let (at, dead) = (len(&out), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let (moved, secs) = (len(&out) - at, dead.elapsed().as_secs_f64());
    let share = moved as f64 / (LIVE_BYTES_S * secs);
    eprintln!(
        "{} dead at {at} bytes: {moved} bytes arrived in the next {secs:.2} s, {:.0} % of the live links' capacity",
        l.a.name,
        share * 100.0
    );
    t.arrives(&tx, 20, &rx, 5);
    let j = json_of(&tx);
    let failed: Vec<_> = j["path_failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["stream"].as_u64())
        .collect();
    assert!(!failed.is_empty(), "no path failure named: {j}");
    assert!(
        share >= 0.5,
        "the live links carried {:.0} % of their capacity while {} was dead ({moved} bytes in {secs:.2} s):\n{}",
        share * 100.0,
        l.a.name,
        tx.log()
    );
}

/// `tcpkit mpcat --rate-limit RATE ARGS...` from a sparse file of `size` bytes to a listener
/// on loopback, in a host of its own; the sender's rate in MiB/s (its report's bytes over its
/// seconds).
fn paced_rate(tag: &str, rate: &str, args: &[&str], size: u64) -> f64 {
    let mut lab = Lab::new(tag).unwrap_or_else(|e| panic!("{e}"));
    let h = lab.host("a").unwrap_or_else(|e| panic!("{e}"));
    let dir = lab.dir().to_path_buf();
    let input = dir.join("in.bin");
    std::fs::File::create(&input)
        .and_then(|f| f.set_len(size))
        .unwrap();
    let port = common::mpcat::port().to_string();
    let rx = h
        .spawn(
            &mut lab,
            "rx",
            &[
                tcpkit(),
                "mpcat",
                "-l",
                "-p",
                &port,
                "-o",
                "/dev/null",
                "--quiet",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    common::mpcat::wait_listening(&h, common::mpcat::port());
    let inp = input.to_str().unwrap();
    let argv = [
        &[tcpkit(), "mpcat", "-i", inp, "--json", "--rate-limit", rate][..],
        args,
        &["127.0.0.1", &port],
    ]
    .concat();
    let tx = h
        .spawn(&mut lab, "tx", &argv)
        .unwrap_or_else(|e| panic!("{e}"));
    succeeds(&tx, 20);
    succeeds(&rx, 5);
    let j = json_of(&tx);
    assert_eq!(j["bytes"], size, "{j}");
    j["bytes_per_second"].as_f64().unwrap() / 1048576.0
}

/// Asserts that `got` MiB/s is within 2 % of `want`.
fn within_2_percent(got: f64, want: f64, what: &str) {
    let off = (got / want - 1.0) * 100.0;
    eprintln!("--rate-limit {want}M {what}: {got:.2} MiB/s ({off:+.2} %)");
    assert!(
        off.abs() <= 2.0,
        "--rate-limit {want}M {what}: {got:.2} MiB/s, {off:+.2} %"
    );
}

/// Issue 24 item 3: `--rate-limit 60M` with the default (adaptive) chunk sizes holds within
/// 2 % over 2 s on loopback (before: 43 MiB/s, the bucket's burst smaller than the poll's
/// millisecond wait, so each wait lost what it would have refilled).
#[test]
fn mpcat_rate_limit_holds_within_2_percent_with_default_chunks() {
    let _turn = common::timing_turn();
    let got = paced_rate("mppratea", "60M", &[], 120 << 20);
    within_2_percent(got, 60.0, "default chunks");
}

/// Issue 24 item 3: the same with `--chunk 1M` (one chunk is 17 ms of the rate).
#[test]
fn mpcat_rate_limit_holds_within_2_percent_with_1m_chunks() {
    let _turn = common::timing_turn();
    let got = paced_rate("mppratec", "60M", &["--chunk", "1M"], 120 << 20);
    within_2_percent(got, 60.0, "--chunk 1M");
}
