//! The README demo: a two-host lab in network namespaces, `tcpkit replay` on one host sending a
//! bundled capture, tcpdump on the other recording it, and both sides' counts side by side.
//!
//! Run by scripts/demo.sh. Arguments go to `tcpkit replay`; TCPKIT_DEMO_PCAP picks the capture.

use std::path::PathBuf;
use std::process::ExitCode;

use tcpkit_lab::{Lab, LinkOpts};

fn tcpkit_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TCPKIT_BIN") {
        return p.into();
    }
    // target/<profile>/examples/demo -> target/<profile>/tcpkit
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("tcpkit"))
        .expect("target dir")
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let pcap: PathBuf = match std::env::var_os("TCPKIT_DEMO_PCAP") {
        Some(p) => p.into(),
        None => {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tcpreplay-test.pcap")
        }
    };
    let pcap = pcap
        .canonicalize()
        .map_err(|e| format!("{}: {e}", pcap.display()))?;
    let bin = tcpkit_bin();
    if !bin.exists() {
        return Err(format!(
            "{} not built (cargo build --release -p tcpkit)",
            bin.display()
        )
        .into());
    }

    let mut lab = Lab::new("demo")?;
    let sender = lab.host("sender")?;
    let recorder = lab.host("recorder")?;
    // Jumbo MTU so captures taken with offloads on fit; no addresses and IPv6 off, so the
    // recorder sees only what tcpkit sends.
    let link = lab.link(
        &sender,
        &recorder,
        &LinkOpts {
            mtu: Some(9000),
            ..LinkOpts::default()
        },
    )?;
    for (h, i) in [(&sender, &link.a.name), (&recorder, &link.b.name)] {
        h.run(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{i}.disable_ipv6=1"),
        ])?;
    }
    println!(
        "lab: host {} ({}) --veth-- host {} ({})",
        sender.name(),
        link.a.name,
        recorder.name(),
        link.b.name
    );
    println!("recorder: tcpdump -i {}", link.b.name);
    let dump = lab.tcpdump(&recorder, &link.b.name, "")?;
    let rx_before = recorder.ifstats(&link.b.name)?;

    let user_args: Vec<String> = std::env::args().skip(1).collect();
    let mut argv: Vec<String> = vec![
        bin.display().to_string(),
        "replay".into(),
        "-i".into(),
        link.a.name.clone(),
    ];
    argv.extend(user_args.iter().cloned());
    argv.push(pcap.display().to_string());
    let shown: Vec<String> = user_args
        .iter()
        .cloned()
        .chain([pcap.display().to_string()])
        .collect();
    println!(
        "sender:   tcpkit replay -i {} {}\n",
        link.a.name,
        shown.join(" ")
    );
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = sender.command(&argv_ref).output()?;
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    print!("{summary}");
    // "Actual: N packets (B bytes) sent in S seconds"
    let actual = summary
        .lines()
        .find(|l| l.starts_with("Actual: "))
        .ok_or("tcpkit replay printed no summary")?;
    let nums: Vec<u64> = actual
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(2)
        .map(|s| s.parse().unwrap_or(0))
        .collect();
    let (sent_pkts, sent_bytes) = (nums[0], nums[1]);

    std::thread::sleep(std::time::Duration::from_millis(200));
    let cap = dump.stop()?;
    let rx_after = recorder.ifstats(&link.b.name)?;
    let file = tcpkit_pcap::CaptureFile::open(&cap.path)?;
    let (mut rec_pkts, mut rec_bytes) = (0u64, 0u64);
    for p in file.packets() {
        let p = p?;
        rec_pkts += 1;
        rec_bytes += u64::from(p.orig_len);
    }

    println!("\n{:<34} {:>10} {:>12}", "", "packets", "bytes");
    println!(
        "{:<34} {:>10} {:>12}",
        "sender: tcpkit replay (Actual)", sent_pkts, sent_bytes
    );
    println!(
        "{:<34} {:>10} {:>12}",
        "recorder: tcpdump capture", rec_pkts, rec_bytes
    );
    println!(
        "{:<34} {:>10} {:>12}",
        "recorder: interface rx counters",
        rx_after.rx_packets - rx_before.rx_packets,
        rx_after.rx_bytes - rx_before.rx_bytes
    );
    println!(
        "tcpdump: {} captured, {} dropped by the kernel",
        cap.captured, cap.dropped_by_kernel
    );
    let equal = sent_pkts == rec_pkts && sent_bytes == rec_bytes && out.status.success();
    println!(
        "{}",
        if equal {
            "both sides counted the same"
        } else {
            "THE COUNTS DIFFER"
        }
    );
    Ok(equal)
}
