//! `tcpkit copy` in relay mode, in the copy lab (clients → online → target) with real nginx and
//! redis-server on both servers and real clients (`tcpkit load`, redis-benchmark). What copy
//! does whatever its transport (HTTP loss and the clients' link, -n, sampling, joining open
//! sessions, redis, --diff, faults of the target) is in copy_modes.rs, run in both modes from
//! one body.

use crate::copy_common;

use copy_common::*;

fn count_200(log: &[String]) -> usize {
    log.iter().filter(|l| l.contains(" 200 ")).count()
}

#[test]
fn two_rules_in_one_copy_send_http_and_redis_each_to_its_own_target_server() {
    let mut l = CopyLab::new("cp2rules");
    let (on_log, tg_log) = l.nginx_pair();
    let _ron = l.redis(true);
    let _rtg = l.redis(false);
    let rules = format!("8080-{TARGET}:8080,6379-{TARGET}:6379");
    let c = l.copy_rule(&rules, &["--duration", "3.5", "--json"]);
    // Both kinds of traffic at once: HTTP over 2 keep-alive connections and a new connection
    // per request, and a redis SET workload over 5.
    std::thread::scope(|s| {
        s.spawn(|| l.http_get("2", "200", "2", None));
        s.spawn(|| l.http_get("1", "50", "2", Some("1")));
        s.spawn(|| l.redis_sets("1000", "3000"));
    });
    let r = copy_report(c);
    assert_eq!(
        r["rules"],
        serde_json::json!([format!("8080-{TARGET}:8080"), format!("6379-{TARGET}:6379")]),
        "{r:#}"
    );
    // HTTP reached the target's nginx, all of it and nothing else (redis bytes sent to nginx
    // would be logged as 400s).
    let online = lines(&on_log);
    let target = lines(&tg_log);
    assert!(online.len() > 400, "{} requests online", online.len());
    assert_eq!(
        target.len(),
        online.len(),
        "target's nginx log vs the online's: {r:#}"
    );
    assert_eq!(count_200(&target), target.len(), "{target:?}");
    // The SETs reached the target's redis, all of them.
    let on = redis_keys(&l.online, ONLINE);
    let tg = redis_keys(&l.target, TARGET);
    assert!(on.len() > 900, "{} keys online", on.len());
    assert_eq!(on, tg, "redis keys online vs on the target: {r:#}");
    // The report counts both rules' sessions and requests: the HTTP connections (2
    // keep-alive, ~100 of one request each) and the benchmark's 5, all completed; the 3,000
    // SETs and the HTTP requests, all answered.
    assert!(u(&r, "sessions.copies") >= 2 + 50 + 5, "{r:#}");
    assert_eq!(
        u(&r, "sessions.completed"),
        u(&r, "sessions.copies"),
        "{r:#}"
    );
    assert!(
        u(&r, "requests.copied") * 100 >= (3000 + online.len() as u64) * 95,
        "3000 SETs + {} GETs: {r:#}",
        online.len()
    );
    assert_all_answered(&r);
}

/// tcpcopy's `-F` (issue 10): a tcpdump expression the live capture must also match. Two
/// clients ask the online nginx; `-F 'host 198.18.1.3'` copies the second one's session and
/// nothing of the first's.
#[test]
fn a_capture_filter_copies_what_it_matches_and_nothing_else() {
    let mut l = CopyLab::new("cpfilt");
    let (on_log, tg_log) = l.nginx_pair();
    let cif = l.cli_link.a.name.clone();
    l.clients
        .run(&["ip", "addr", "add", "198.18.1.3/24", "dev", &cif])
        .expect("a second client address");
    let c = l.copy_rule(
        &rule_8080(),
        &["-F", "host 198.18.1.3", "--duration", "2", "--json"],
    );
    // Each curl: one keep-alive session of 10 GETs, from its own address.
    for (from, tag) in [(CLIENT, "one"), ("198.18.1.3", "three"), (CLIENT, "one")] {
        let url = format!("http://{ONLINE}:8080/hello.txt?{tag}=[1-10]");
        let o = l.client(&["curl", "-sS", "--interface", from, &url]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let r = copy_report(c);
    assert_all_completed(&r);
    assert_eq!(lines(&on_log).len(), 30);
    let copied = lines(&tg_log);
    assert_eq!(copied.len(), 10, "{copied:#?}");
    assert!(copied.iter().all(|l| l.contains("?three=")), "{copied:#?}");
    assert_eq!(u(&r, "sessions.seen"), 1, "{r:#}");
    assert_eq!(u(&r, "requests.answered"), 10, "{r:#}");
    let filter = r["filter"].as_str().unwrap();
    assert!(filter.ends_with(" and (host 198.18.1.3)"), "{filter}");
}

/// A SYN lost on the way to a target that is accepting other connections is TCP's to
/// retransmit, not the target's silence. The target's input drops the first two SYNs (an nft
/// quota); a third session's connection is accepted at once. When the two lost SYNs had gone
/// 900 ms unanswered, the first used to mark the target silent and the second then stood
/// back: it dropped its socket and connected again from another port after the back-off
/// (at 20k new connections a second, queues full, that put thousands of copies to a target
/// that was answering into the gate, past a stopped run's drain). Now both keep their
/// connection, which the kernel's retransmission completes: the target sees three ports.
#[test]
fn a_syn_lost_while_the_target_accepts_others_is_retransmitted_not_stood_back() {
    let mut l = CopyLab::new("cplostsyn");
    let (_tg, tg_log) = l.nginx(false, Log::Peer);
    serve(&l, "target", &[("same.txt", SAME)]);
    let answer = fetch(&l, "/same.txt");
    let before = lines(&tg_log).len();
    let chain = nft::Chain::new(&l.target, "lostsyn", "input");
    // Linux's SYN here is 60 bytes (MSS, SACK, timestamps, window scale): a 121-byte quota
    // matches the first two.
    drop_first_syns(&chain, &["ip", "saddr", ONLINE_T], "121");
    let (target, tif) = (l.target.clone(), l.tgt_link.b.name.clone());
    let dump = l
        .lab
        .tcpdump(&target, &tif, "tcp dst port 8080")
        .expect("tcpdump");
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("three.pcap");
    // Three sessions 1 ms apart.
    diff_capture(&pcap, 3, 45000, &[("/same.txt", answer)]);
    let o = l.copy_to_end(
        &[
            "-x",
            &rule_8080(),
            "--input",
            pcap.to_str().unwrap(),
            "--timeout",
            "5",
            "--json",
        ],
        std::time::Duration::from_secs(30),
    );
    let frames = dump.stop().expect("tcpdump").path;
    let (dropped, rules) = chain.packets();
    assert_eq!(dropped, 2, "not the first two SYNs dropped: {rules}");
    let ports: std::collections::BTreeSet<u16> = {
        use tcpkit_wire::tcp::{Flags, Segment};
        let f = tcpkit_pcap::CaptureFile::open(&frames).unwrap();
        f.packets()
            .filter_map(|p| Segment::parse(p.unwrap().data).ok())
            .filter(|s| s.flags.has(Flags::SYN) && !s.flags.has(Flags::ACK))
            .map(|s| s.src.port())
            .collect()
    };
    let r = json(&o);
    assert_eq!(ports.len(), 3, "SYNs from ports {ports:?}: {r:#}");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(u(&r, "sessions.completed"), 3, "{r:#}");
    assert_all_answered(&r);
    assert_eq!(lines(&tg_log).len(), before + 3, "{r:#}");
}

/// A client that pipelines HTTP/1 requests (sends the next before the answer to the one
/// before, as a keep-alive load on its schedule does whenever the server is slower than its
/// interval) puts them in one request turn, which `at_source` counts once: the soak's copy
/// role found at_source 10 % under the online nginx's log with nothing lost. They are counted
/// apart in `requests.pipelined`, so that at_source + pipelined is the server's log. One
/// connection: 3 GETs in one write, their 3 answers, then a 4th GET (with its close).
#[test]
fn pipelined_http_requests_are_counted_apart_from_their_turn() {
    let mut l = CopyLab::new("cppipe");
    let (on_log, tg_log) = l.nginx_pair();
    let c = l.copy_rule(&rule_8080(), &["--duration", "1.5", "--json"]);
    let client = format!(
        "import socket,time\n\
         g=b'GET /hello.txt HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n'\n\
         s=socket.create_connection(('{ONLINE}',8080))\n\
         s.sendall(g*3)\n\
         got=b''\n\
         while got.count(b'hello from the lab')<3:\n    got+=s.recv(65536)\n\
         time.sleep(0.1)\n\
         s.sendall(b'GET /hello.txt HTTP/1.1\\r\\nHost: a\\r\\nConnection: close\\r\\n\\r\\n')\n\
         while s.recv(65536): pass\n"
    );
    let o = l.client(&["python3", "-c", &client]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = copy_report(c);
    assert_eq!(lines(&on_log).len(), 4);
    // Two turns (the three pipelined GETs, then the fourth), and the two GETs sent inside the
    // first one before the answer to the one before them.
    assert_eq!(u(&r, "requests.at_source"), 2, "{r:#}");
    assert_eq!(u(&r, "requests.pipelined"), 2, "{r:#}");
    // The copy sends the turn as it came: the target sees all four.
    assert_eq!(lines(&tg_log).len(), 4, "{r:#}");
    assert_all_completed(&r);
    check_schema(&r);
}
