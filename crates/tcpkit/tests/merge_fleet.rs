//! Issue 25, items 4 and 5: many runs merged by time and judged as one. Real `tcpkit load`
//! runs side by side against one `tcpkit echo --dns` (lab host a to host b) merged: the
//! merged answered count is their sum and echo's own, the per-second series adds up to it,
//! limits broken and kept give exit 1 and 0; the same reports as shards of one fleet run
//! (`shard` and `fleet` written into them as the agents of `--shard`/`--barrier` write them):
//! a shard given twice is refused, a missing one named, an agent the barrier stopped named,
//! a clock offset taken off. Two real `tcpkit copy` runs into one nginx merged: the loss
//! equals what nginx counted.

use crate::common;
use crate::copy_common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::peer::{json, merge_as, pair, run_limited, stop_echo, target, u};
use common::{schema, stderr, stdout};
use serde_json::{json, Value};

/// `tcpkit load TARGET --dns -c 2 -r RATE -t SECS --json EXTRA` from host a, each given
/// (rate, extra) at the same time; each report written to `dir/<k>.json`.
fn loads_at_once(
    p: &common::peer::Pair,
    port: u16,
    secs: &str,
    runs: &[(&str, &[&str])],
    dir: &Path,
) -> Vec<PathBuf> {
    let t = target(port);
    let cmds: Vec<_> = runs
        .iter()
        .map(|(rate, extra)| {
            let args = [
                &[
                    common::tcpkit(),
                    "load",
                    t.as_str(),
                    "--dns",
                    "-c",
                    "2",
                    "--threads",
                    "1",
                    "-r",
                    rate,
                    "-t",
                    secs,
                    "--json",
                ][..],
                extra,
            ]
            .concat();
            p.cli.command(&args)
        })
        .collect();
    let outs = all_at_once(cmds);
    outs.iter()
        .enumerate()
        .map(|(k, o)| {
            assert!(o.status.success(), "load {k}: {}", stderr(o));
            let path = dir.join(format!("{k}.json"));
            std::fs::write(&path, &o.stdout).unwrap();
            path
        })
        .collect()
}

/// Runs `cmds` at the same time, each to its end (20 s at most: past it, a hang).
fn all_at_once(cmds: Vec<std::process::Command>) -> Vec<Output> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cmds
            .into_iter()
            .map(|c| s.spawn(move || run_limited(c, Duration::from_secs(20)).0))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn read(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn last_line(o: &Output) -> String {
    stderr(o).lines().last().unwrap_or("").to_string()
}

fn sum(v: &Value, list: &str, field: &str) -> u64 {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list}: {v:#}"))
        .iter()
        .map(|x| x[field].as_u64().unwrap())
        .sum()
}

/// Three loads at once (one of them two worker processes) merged: every count adds up, to
/// echo's count too, and the series has a row per second of the runs.
#[test]
fn three_loads_merge_into_one_series_that_adds_up_to_echos_count() {
    let mut p = pair("mfleet3");
    let echo = p.echo(5410, &["--dns", "--json"]);
    let dir = tempfile::tempdir().unwrap();
    // load takes the same limits for its own run: one broken is its last line.
    let o = p.load(
        &[
            &target(5410),
            "--dns",
            "-r",
            "50",
            "-t",
            "0.2",
            "--max-p99",
            "1ns",
            "--max-errors",
            "0",
            "--json",
        ],
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        last_line(&o).starts_with("tcpkit load: --max-p99 0.0 us broken: p99 "),
        "{}",
        stderr(&o)
    );
    let single = json(&o);
    schema::check(&schema::load("load"), &single, "load --max-p99");
    assert_eq!(single["verdict"]["checks"][1]["flag"], "--max-errors");
    assert_eq!(single["verdict"]["checks"][1]["passed"], true);
    let files = loads_at_once(
        &p,
        5410,
        "1.2",
        &[("300", &[]), ("200", &[]), ("200", &["--procs", "2"])],
        dir.path(),
    );
    let e = stop_echo(&echo);
    let reports: Vec<Value> = files.iter().map(|f| read(f)).collect();
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let o = merge_as(&paths, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = json(&o);
    schema::check(&schema::load("load"), &m, "merged");
    let answered: u64 = reports.iter().map(|r| u(r, "queries.answered")).sum();
    assert!(answered > 0, "{m:#}");
    assert_eq!(u(&m, "queries.answered"), answered, "{m:#}");
    assert_eq!(
        u(&e, "answered"),
        answered + u(&single, "queries.answered"),
        "echo: {e:#}"
    );
    // Each run's seconds add up to its totals (threads and worker processes put together),
    // and the merged intervals and series rows to the merged totals.
    for r in &reports {
        schema::check(&schema::load("load"), r, "report");
        assert_eq!(sum(r, "intervals", "answered"), u(r, "queries.answered"));
        assert_eq!(sum(r, "intervals", "sent"), u(r, "queries.sent"));
        assert_eq!(sum(r, "intervals", "asked"), u(r, "queries.scheduled"));
    }
    for field in ["answered", "sent"] {
        assert_eq!(
            sum(&m, "intervals", field),
            u(&m, &format!("queries.{field}"))
        );
        assert_eq!(
            sum(&m["series"], "rows", field),
            u(&m, &format!("queries.{field}"))
        );
    }
    // Each run's second k lies in the row its middle falls in, counted from the earliest
    // start: runs started together share rows. About 1.2 s of queries: two rows (the second
    // partial), a third for the answers of the last moments or a run started late.
    let starts: Vec<u64> = reports
        .iter()
        .flat_map(|r| r["intervals"].as_array().unwrap().iter())
        .map(|iv| u(iv, "start_unix_ns"))
        .collect();
    let t0 = *starts.iter().min().unwrap();
    let want = starts
        .iter()
        .map(|s| (s - t0 + 500_000_000) / 1_000_000_000)
        .max()
        .unwrap()
        + 1;
    let rows = m["series"]["rows"].as_array().unwrap();
    assert_eq!(rows.len() as u64, want, "{:#}", m["series"]);
    assert!((2..=4).contains(&rows.len()), "{:#}", m["series"]);
    assert_eq!(u(&m, "series.seconds"), 1);
    assert_eq!(u(&m, "series.start_unix_ns"), t0);
    assert!(u(&rows[0], "answered") > 0, "{:#}", m["series"]);
    assert!(u(&rows[0], "p99_ns") > 0, "{:#}", m["series"]);
    // The human summary prints the series as a table, one line per second.
    let o = merge_as(&paths, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("Per 1 s (controller clock, from "), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("0s ")
                && l.contains(&rows[0]["answered"].to_string())),
        "{text}"
    );

    // A limit broken: exit 1, the last line naming it, what was measured and by how much;
    // the JSON carries every limit checked.
    let o = merge_as(&paths, &["--json", "--max-p99", "1ns", "--max-errors", "0"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let last = last_line(&o);
    assert!(
        last.starts_with("tcpkit merge: --max-p99 0.0 us broken: p99 ") && last.contains(" over"),
        "{last}"
    );
    assert!(
        !last.contains("--max-errors"),
        "a kept limit is not a failure: {last}"
    );
    let v = json(&o);
    schema::check(&schema::load("load"), &v, "judged");
    assert_eq!(v["verdict"]["passed"], false);
    assert_eq!(v["verdict"]["checks"][0]["flag"], "--max-p99");
    assert_eq!(v["verdict"]["checks"][0]["passed"], false);
    assert_eq!(v["verdict"]["checks"][1]["passed"], true);
    // Limits kept: exit 0; --plot draws the fleet.
    let svg = dir.path().join("fleet.svg");
    let rate = format!("{}", answered / 4);
    let o = merge_as(
        &paths,
        &[
            "--max-p99",
            "10s",
            "--min-answered-rate",
            &rate,
            "--max-loss",
            "0",
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("Limit --min-answered-rate ")
            && stdout(&o).contains(" kept: answered "),
        "{}",
        stdout(&o)
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.starts_with("<svg") && picture.contains("Rate achieved"),
        "{}",
        &picture[..picture.len().min(200)]
    );
}

/// Rewrites report `path` as shard `k`/`n` of fleet run `f00d`, its clock `offset_ns` ahead
/// of the controller's (every time in it moved by that much), stopped by the barrier if
/// `stopped` says why; written to `dir/name`.
fn as_shard(
    path: &Path,
    dir: &Path,
    name: &str,
    k: u32,
    n: u32,
    offset_ns: i64,
    stopped: Option<&str>,
) -> PathBuf {
    let mut r = read(path);
    let shift = |v: &mut Value| {
        *v = json!((v.as_u64().unwrap() as i64 + offset_ns) as u64);
    };
    shift(&mut r["start_unix_ns"]);
    shift(&mut r["end_unix_ns"]);
    for iv in r["intervals"].as_array_mut().unwrap() {
        shift(&mut iv["start_unix_ns"]);
    }
    let start = r["start_unix_ns"].as_u64().unwrap();
    r["shard"] = json!({"index": k, "count": n});
    r["fleet"] = json!({
        "run_id": "f00d",
        "controller": "198.18.0.9:7000",
        "host": format!("agent-{k}"),
        "clock_offset_ns": offset_ns,
        "offset_rtt_ns": 200_000,
        "intended_start_unix_ns": start,
        "actual_start_unix_ns": start + 50_000,
        "stopped_by": stopped,
    });
    let p = dir.join(name);
    std::fs::write(&p, r.to_string()).unwrap();
    p
}

/// Two real reports as shards of one fleet run: one shard twice is refused naming both files;
/// a shard with no report and an agent the barrier stopped fail the merged run, named on
/// its last line; an agent whose clock is 7 s ahead lands in the same seconds once its
/// offset is taken off.
#[test]
fn shards_of_one_fleet_run_are_merged_once_and_missing_ones_named() {
    let mut p = pair("mfleetsh");
    let echo = p.echo(5412, &["--dns", "--json"]);
    let dir = tempfile::tempdir().unwrap();
    let files = loads_at_once(&p, 5412, "1.2", &[("200", &[]), ("200", &[])], dir.path());
    stop_echo(&echo);
    let d = dir.path();
    let plain = merge_as(&[&files[0], &files[1]], &["--json"]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let plain = json(&plain);

    // Shard 1/2 given twice (a retried pod): refused, both files named, nothing merged.
    let a = as_shard(&files[0], d, "a.json", 1, 2, 0, None);
    let a2 = as_shard(&files[1], d, "a-retry.json", 1, 2, 0, None);
    let o = merge_as(&[&a, &a2], &["--json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains(a.to_str().unwrap())
            && e.contains(a2.to_str().unwrap())
            && e.contains("both shard 1/2 of fleet run f00d"),
        "{e}"
    );

    // Shard 2/3 has no report: the rest is merged, the run fails naming it.
    let c = as_shard(&files[1], d, "c.json", 3, 3, 0, None);
    let a3 = as_shard(&files[0], d, "a3.json", 1, 3, 0, None);
    let o = merge_as(&[&a3, &c], &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(last_line(&o), "tcpkit merge: shard 2/3: no report");
    let m = json(&o);
    schema::check(&schema::load("load"), &m, "fleet");
    assert_eq!(m["merged_fleet"]["missing_shards"], json!([2]));
    assert_eq!(m["merged_fleet"]["run_id"], "f00d");
    assert_eq!(u(&m, "queries.answered"), u(&plain, "queries.answered"));

    // Shard 2/2's clock is 7 s ahead of the controller's (all its times say so) and it was
    // stopped by the barrier: its seconds land in the same rows as shard 1's, and the
    // merged run fails naming it and why.
    let b = as_shard(
        &files[1],
        d,
        "b.json",
        2,
        2,
        7_000_000_000,
        Some("shard 1/2 on agent-1 went silent"),
    );
    let o = merge_as(&[&a, &b], &["--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(
        last_line(&o),
        "tcpkit merge: shard 2/2 on agent-2 was stopped by the barrier: shard 1/2 on agent-1 went silent"
    );
    let m = json(&o);
    assert_eq!(m["series"]["rows"], plain["series"]["rows"], "{m:#}");
    assert_eq!(m["start_unix_ns"], plain["start_unix_ns"]);
    // Started together: well within a second once the 7 s offset is taken off.
    assert!(
        u(&m, "merged_fleet.start_spread_ns") < 1_000_000_000,
        "{m:#}"
    );
    // Without the offset (the same report, no fleet) the seconds would be 7 rows apart.
    let mut skewed = read(&b);
    skewed.as_object_mut().unwrap().remove("fleet");
    let bs = d.join("b-no-fleet.json");
    std::fs::write(&bs, skewed.to_string()).unwrap();
    let o = merge_as(&[&files[0], &bs], &["--json"]);
    let rows = json(&o)["series"]["rows"].as_array().unwrap().len();
    assert!(rows >= 8, "{rows} rows");
}

/// tcpcopy's example: two online hosts copying into one target (here two captures played
/// with --input into one nginx), the request loss over both. The merged answered count is
/// what nginx logged, the loss what it did not; --max-loss judges the sum; load and copy
/// reports are refused together, and a latency limit on copy reports is a usage error.
#[test]
fn two_copies_into_one_target_merge_into_the_loss_the_target_counted() {
    use copy_common::{http_session_frames, lines, rule_8080, write_frames, CopyLab, Log};
    let mut l = CopyLab::new("mfleetcp");
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    let before = lines(&tg_log).len();
    let dir = tempfile::tempdir().unwrap();
    let get = b"GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n".as_slice();
    let answer = b"HTTP/1.1 200 OK\r\n\r\n".as_slice();
    // Host 1: 3 sessions of 4 requests. Host 2: 2 sessions of 5, one client segment of its
    // first session missing from its capture (the requests after it are lost).
    let one = dir.path().join("one.pcap");
    write_frames(
        &one,
        &http_session_frames(3, 41000, 1_000_000, &[(get, answer); 4]),
    );
    let two = dir.path().join("two.pcap");
    let mut frames = http_session_frames(2, 42000, 1_000_000, &[(get, answer); 5]);
    let lost = frames
        .iter()
        .position(|(_, f)| {
            let s = tcpkit_wire::tcp::Segment::parse(f).unwrap();
            s.src.port() == 42000 && !s.payload.is_empty() && s.seq > 1
        })
        .unwrap();
    frames.remove(lost);
    write_frames(&two, &frames);
    let rule = rule_8080();
    // Both at once, as two online hosts would.
    let cmds: Vec<_> = [&one, &two]
        .iter()
        .map(|pcap| {
            l.online.command(&[
                common::tcpkit(),
                "copy",
                "-x",
                &rule,
                "--input",
                pcap.to_str().unwrap(),
                "--max-idle",
                "0.001",
                "--max-loss",
                "100",
                "--json",
            ])
        })
        .collect();
    let outs = all_at_once(cmds);
    let mut files = Vec::new();
    for (k, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "copy {k}: {}", stderr(o));
        let f = dir.path().join(format!("copy{k}.json"));
        std::fs::write(&f, &o.stdout).unwrap();
        files.push(f);
    }
    let counted = (lines(&tg_log).len() - before) as u64;
    let at_source: u64 = files
        .iter()
        .map(|f| u(&read(f), "requests.at_source"))
        .sum();
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let o = merge_as(&paths, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = json(&o);
    schema::check(&schema::load("merge-copy"), &m, "merged copies");
    assert_eq!(u(&m, "requests.answered"), counted, "{m:#}");
    assert_eq!(u(&m, "requests.at_source"), at_source, "{m:#}");
    assert_eq!(u(&m, "requests.lost"), at_source - counted, "{m:#}");
    assert!(
        counted < at_source && counted > 0,
        "{counted} of {at_source}: {m:#}"
    );
    let loss = (at_source - counted) as f64 * 100.0 / at_source as f64;
    assert_eq!(m["requests"]["loss_ratio_percent"].as_f64().unwrap(), loss);
    // --max-loss judged on the sum: broken below the loss, kept at it.
    let below = format!("{}", (loss - 0.5).max(0.0));
    let o = merge_as(&paths, &["--max-loss", &below]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let last = last_line(&o);
    assert!(
        last.starts_with("tcpkit merge: --max-loss ")
            && last.contains(&format!(" broken: loss {loss:.3} %, ")),
        "{last}"
    );
    let at = format!("{loss}");
    let o = merge_as(&paths, &["--max-loss", &at, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(&o)["verdict"]["passed"], true);
    // A latency limit cannot be judged on copy reports; load and copy reports are two kinds.
    let o = merge_as(&paths, &["--max-p99", "1ms"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--max-p99: copy reports"),
        "{}",
        stderr(&o)
    );
    let load = dir.path().join("load.json");
    std::fs::write(
        &load,
        serde_json::to_string(&tcpkit_load::report::LoadReport {
            schema_version: tcpkit_load::report::LOAD_SCHEMA_VERSION,
            run_id: "aa".into(),
            ..Default::default()
        })
        .unwrap(),
    )
    .unwrap();
    let o = merge_as(&[&load, &files[0]], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("merge takes reports of one kind"), "{e}");
}
