//! The AF_XDP sink on a veth pair: every frame arrives byte-identical and in order, the rings
//! wrap, lengths the kernel would refuse are counted, and each reason AF_XDP cannot be used is
//! one line.

use super::*;
use crate::testnet::{
    frame, ip_in, lengths_at_the_edges, receive_the_edges, receiver, recv, topspeed, TestNet,
};

/// Sends `frames` in parts of `part`, receiving as it goes so the receiver never overflows.
fn send_and_receive(sink: &mut XdpSink, rx: &OwnedFd, frames: &[Vec<u8>], part: usize) {
    let refs: Vec<Frame<'_>> = frames.iter().map(|d| Frame { data: d, ts_ns: 0 }).collect();
    let mut buf = vec![0u8; 16384];
    let mut next = 0;
    for p in refs.chunks(part) {
        sink.send_batch(p).expect("send");
        for f in &frames[next..next + p.len()] {
            let n = recv(rx, &mut buf).unwrap_or_else(|| panic!("frame {next} never arrived"));
            assert_eq!(&buf[..n], &f[..], "frame {next} differs or is out of order");
            next += 1;
        }
    }
    sink.flush().expect("flush");
}

#[test]
fn frames_arrive_byte_identical_and_in_order_in_copy_mode() {
    let net = TestNet::new();
    let (a, b) = (net.a.clone(), net.b.clone());
    net.run_in(move || {
        let rx = receiver(&b);
        let opts = XdpOpts {
            queue: 0,
            batch: 16,
        };
        let mut sink = XdpSink::open(&a, opts).expect("open");
        // veth has no AF_XDP zero-copy: the kernel falls back to copy mode by itself.
        assert_eq!(sink.mode(), XdpMode::Copy);
        let src = sink.info().mac.expect("veth mac");
        let dst = if_info(&b).expect("peer").mac.expect("peer mac");
        let before = crate::if_counters(&a).expect("counters");
        // Up to a full 1514-byte frame, and past the ring's 2048 slots several times, in
        // parts that do not divide it.
        let frames: Vec<Vec<u8>> = (0..5000u32)
            .map(|i| frame(dst, src, i, 60 + (i as usize * 37) % 1455))
            .collect();
        send_and_receive(&mut sink, &rx, &frames, 333);
        let c = sink.counters();
        assert_eq!((c.successful, c.failed, c.truncated), (5000, 0, 0));
        let total: u64 = frames.iter().map(|f| f.len() as u64).sum();
        assert_eq!(c.bytes, total);
        assert_eq!(sink.invalid_descriptors(), Some(0));
        let after = crate::if_counters(&a).expect("counters");
        let sent = after.tx_packets - before.tx_packets;
        assert!(
            (5000..=5004).contains(&sent),
            "interface sent {sent} for our 5000"
        );
    });
}

#[test]
fn refused_lengths_are_counted_and_the_rest_go_on() {
    let net = TestNet::new();
    let (a, b) = (net.a.clone(), net.b.clone());
    net.run_in(move || {
        let rx = receiver(&b);
        let mut sink = XdpSink::open(&a, XdpOpts::default()).expect("open");
        let src = sink.info().mac.expect("mac");
        let dst = [0xff; 6];
        let mtu = sink.info().mtu as usize;
        let mut tagged = frame(dst, src, 7, mtu + 18);
        tagged[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
        // An 802.1Q tag with our ethertype inside, so the receiver still takes it.
        tagged[16..18].copy_from_slice(&crate::testnet::ETHERTYPE.to_be_bytes());
        let frames = lengths_at_the_edges(src, mtu);
        let refs: Vec<Frame<'_>> = frames.iter().map(|d| Frame { data: d, ts_ns: 0 }).collect();
        sink.send_batch(&refs).expect("send");
        sink.send_batch(&[Frame {
            data: &tagged,
            ts_ns: 0,
        }])
        .expect("send tagged");
        sink.flush().expect("flush");
        let c = sink.counters();
        assert_eq!((c.successful, c.failed), (5, 3));
        assert_eq!((c.failed_too_big, c.failed_malformed), (2, 1));
        receive_the_edges(&rx, &frames);
        let mut buf = vec![0u8; 10000];
        // The receiving veth takes the tagged frame off (no VLAN device on it): only its
        // arrival and its payload's start are ours to check.
        let n = recv(&rx, &mut buf).expect("tagged frame");
        assert_eq!(n, tagged.len() - 4);
        assert_eq!(sink.invalid_descriptors(), Some(0));
    });
}

/// With MTU 9000 a frame spans up to three 4096-byte chunks (multi-buffer): every length
/// around the chunk edges arrives whole, in order.
#[test]
fn jumbo_frames_span_several_chunks() {
    let net = TestNet::new();
    for dev in [&net.a, &net.b] {
        net.ip(&["link", "set", dev, "mtu", "9000"]);
    }
    let (a, b) = (net.a.clone(), net.b.clone());
    net.run_in(move || {
        let rx = receiver(&b);
        let mut sink = XdpSink::open(&a, XdpOpts { queue: 0, batch: 8 }).expect("open");
        let src = sink.info().mac.expect("mac");
        let dst = if_info(&b).expect("peer").mac.expect("peer mac");
        let lens = [60, 4095, 4096, 4097, 8191, 8192, 8193, 9014, 1514];
        // Past the ring's 2048 chunks several times.
        let frames: Vec<Vec<u8>> = (0..1800u32)
            .map(|i| frame(dst, src, i, lens[i as usize % lens.len()]))
            .collect();
        send_and_receive(&mut sink, &rx, &frames, 100);
        let c = sink.counters();
        assert_eq!((c.successful, c.failed), (1800, 0));
        let total: u64 = frames.iter().map(|f| f.len() as u64).sum();
        assert_eq!(c.bytes, total);
        assert_eq!(sink.invalid_descriptors(), Some(0));
    });
}

/// Two sinks on the two queues of a two-queue veth, as `--threads 2 --xdp` opens them.
#[test]
fn one_socket_per_queue() {
    let net = TestNet::with_queues(2);
    let (a, b) = (net.a.clone(), net.b.clone());
    net.run_in(move || {
        let rx = receiver(&b);
        let src = if_info(&a).expect("a").mac.expect("mac");
        let dst = if_info(&b).expect("peer").mac.expect("peer mac");
        for q in 0..2u32 {
            let mut sink = XdpSink::open(&a, XdpOpts { queue: q, batch: 8 }).expect("open");
            assert_eq!(sink.queue(), q);
            let frames: Vec<Vec<u8>> = (0..50).map(|i| frame(dst, src, i, 100)).collect();
            send_and_receive(&mut sink, &rx, &frames, 50);
            assert_eq!(sink.counters().successful, 50);
            sink.close();
        }
        // Queue 2 does not exist: said before anything is sent.
        let e = XdpSink::open(&a, XdpOpts { queue: 2, batch: 8 }).map(|_| ());
        let msg = e.map_err(|e| e.to_string()).unwrap_err();
        assert!(
            msg.starts_with(&format!(
                "{a}: AF_XDP: queue 2 is not one of {a}'s 2 transmit queues (0-1); add queues"
            )),
            "{msg}"
        );
    });
}

#[test]
fn a_queue_taken_a_down_interface_and_a_down_peer_are_one_line_each() {
    let net = TestNet::new();
    let (a, b) = (net.a.clone(), net.b.clone());
    let ns = net.ns.clone();
    net.run_in(move || {
        let first = XdpSink::open(&a, XdpOpts::default()).expect("open");
        let e = XdpSink::open(&a, XdpOpts::default()).map(|_| ());
        assert_eq!(
            e.map_err(|e| (e.to_string(), e.raw_os_error())),
            Err((
                format!("{a}: AF_XDP: bind: queue 0 of {a} already has an AF_XDP socket (another sender, or a program's)"),
                Some(libc::EBUSY)
            ))
        );
        first.close();
        ip_in(&ns, &["link", "set", &b, "down"]);
        let e = XdpSink::open(&a, XdpOpts::default()).map(|_| ());
        let msg = e.map_err(|e| e.to_string()).unwrap_err();
        assert_eq!(msg, format!("{a}: AF_XDP: {a} is up but has no carrier (its link, or a veth's peer, is down): the kernel would drop every frame"));
        ip_in(&ns, &["link", "set", &a, "down"]);
        let e = XdpSink::open(&a, XdpOpts::default()).map(|_| ());
        assert_eq!(e.map_err(|e| e.raw_os_error()), Err(Some(libc::ENETDOWN)));
    });
}

/// The peer goes down mid-run: the kernel drops the frame (EBUSY), the sink says the carrier
/// is gone and counts every frame not sent as failed; it sends nothing after.
#[test]
fn a_peer_going_down_mid_run_stops_the_sink_and_counts_the_rest() {
    let net = TestNet::new();
    let (a, b) = (net.a.clone(), net.b.clone());
    let ns = net.ns.clone();
    net.run_in(move || {
        let mut sink = XdpSink::open(&a, XdpOpts { queue: 0, batch: 4 }).expect("open");
        let src = sink.info().mac.expect("mac");
        let frames: Vec<Vec<u8>> = (0..20).map(|i| frame([0xff; 6], src, i, 100)).collect();
        let refs: Vec<Frame<'_>> = frames.iter().map(|d| Frame { data: d, ts_ns: 0 }).collect();
        sink.send_batch(&refs[..10]).expect("send while up");
        ip_in(&ns, &["link", "set", &b, "down"]);
        let e = sink.send_batch(&refs[10..]).map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err(format!("{a}: AF_XDP: {a} lost its carrier (its link, or a veth's peer, went down): the kernel drops every frame"))
        );
        sink.flush().expect("a dead sink flushes nothing");
        let c = sink.counters();
        assert_eq!((c.successful, c.failed), (10, 10), "{c:?}");
    });
}

/// Top speed with 64-byte frames on a veth pair (nobody listening on the peer), beside the
/// AF_PACKET figures of `topspeed_veth_64_byte_frames`. Run with
/// `cargo test -p tcpkit-send --release -- --ignored --nocapture xdp_topspeed`.
#[test]
#[ignore = "benchmark: prints numbers"]
fn xdp_topspeed_veth_64_byte_frames() {
    let net = TestNet::new();
    let (a, b) = (net.a.clone(), net.b.clone());
    net.run_in(move || {
        let dst = if_info(&b).expect("peer").mac.expect("mac");
        for batch in [16usize, 32, 64, 256] {
            let mut sink = XdpSink::open(&a, XdpOpts { queue: 0, batch }).expect("open");
            let src = sink.info().mac.expect("mac");
            let (pps, cpu) = topspeed(&mut sink, dst, src);
            let c = sink.counters();
            println!(
                "AF_XDP {} batch {batch:3}: {pps:>9.0} pps, {cpu:>5.0} ns CPU/frame (failed {}, eagain retries {})",
                sink.mode().as_str(),
                c.failed,
                c.retried_eagain
            );
            sink.close();
        }
    });
}
