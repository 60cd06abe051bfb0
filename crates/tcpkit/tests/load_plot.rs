//! Issue 10, "pictures": `load --plot FILE.svg` draws the latency spectrum (corrected and
//! uncorrected), latency over time and the rate achieved, from a real run against
//! `tcpkit echo` across a veth.

use crate::common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{stderr, tcpkit};
use tcpkit_lab::Lab;

const PORT: &str = "4251";
const TARGET: &str = "198.18.0.2:4251";

fn start_echo(tag: &str) -> (Lab, tcpkit_lab::Host, tcpkit_lab::Proc) {
    let (mut lab, cli, srv, _link) = Lab::pair(tag).unwrap_or_else(|e| panic!("{e}"));
    let echo = srv
        .spawn(
            &mut lab,
            "echo",
            &[tcpkit(), "echo", "--port", PORT, "--threads", "1"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let o = cli
            .command(&["bash", "-c", &format!("exec 3<>/dev/tcp/198.18.0.2/{PORT}")])
            .output()
            .unwrap();
        if o.status.success() {
            break;
        }
        assert!(
            Instant::now() < until,
            "echo never listened: {}",
            echo.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (lab, cli, echo)
}

fn load(cli: &tcpkit_lab::Host, args: &[&str]) -> Output {
    let mut argv = vec![
        tcpkit(),
        "load",
        TARGET,
        "--echo-bytes",
        "32",
        "-c",
        "4",
        "-r",
        "400",
    ];
    argv.extend_from_slice(args);
    cli.command(&argv).output().unwrap()
}

fn elements(text: &str) -> Vec<String> {
    roxmltree::Document::parse(text)
        .unwrap_or_else(|e| panic!("the SVG is not well-formed XML: {e}"))
        .descendants()
        .filter(|n| n.is_element())
        .map(|n| n.tag_name().name().to_string())
        .collect()
}

#[test]
fn issue10_load_plot_draws_spectrum_latency_and_rate() {
    let (_lab, cli, _echo) = start_echo("ldplot");
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("load.svg");
    let o = load(
        &cli,
        &["-t", "3", "--json", "--plot", svg.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // stdout is still the report alone.
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    assert!(r["queries"]["answered"].as_u64().unwrap() >= 1000, "{r:#}");
    let text = std::fs::read_to_string(&svg).expect("the SVG was written");
    if let Some(keep) = std::env::var_os("TCPKIT_PLOT_KEEP") {
        std::fs::copy(&svg, keep).unwrap();
    }
    let el = elements(&text);
    assert_eq!(el[0], "svg");
    // Five curves: corrected, uncorrected, p50, p99, rate (plus their legend marks).
    assert!(
        el.iter()
            .filter(|e| *e == "polyline" || *e == "path")
            .count()
            >= 5
    );
    for s in [
        // Issue 24, item 18: which run this is: the target, the asked rate, the connections.
        "tcpkit load: 198.18.0.2:4251 (198.18.0.2:4251), 400 q/s asked over 4 connections",
        "Latency by percentile",
        "corrected (from the intended send time)",
        "uncorrected (from the actual send time)",
        "Latency over time",
        "p50",
        "p99",
        "Rate achieved",
        "answers per second",
        "time since start (s)",
        "99%",
        "percentile (log scale of 1/(1-p))",
    ] {
        assert!(text.contains(s), "{s:?} not in the SVG");
    }
    // The rate curve (green) has a point per second of the 3 s run.
    let rate_points = text
        .split("<polyline")
        .filter(|p| p.to_ascii_uppercase().contains("#2CA02C"))
        .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
        .map(|pts| pts.split_whitespace().count())
        .max()
        .unwrap_or(0);
    assert!((3..=4).contains(&rate_points), "{rate_points} rate points");
    // The interval log it drew from was its own: not left behind.
    assert!(!dir.path().join("load.svg.hlog").exists());
    // A picture that cannot be written: one line, before any connection; a file named on
    // the command line that cannot be used is a usage error (exit 2, issue 24).
    let o = load(&cli, &["-t", "1", "--plot", "/nonexistent/dir/l.svg"]);
    assert_eq!(o.status.code(), Some(2));
    let se = stderr(&o);
    assert_eq!(se.lines().count(), 1, "{se}");
    assert!(
        se.starts_with("tcpkit load: --plot /nonexistent/dir/l.svg: cannot create: No such file"),
        "{se}"
    );
    assert!(o.stdout.is_empty());
}
