//! The layer over RFC 8448's TLS 1.3 trace (the `tls_decrypt` fuzz corpus holds it with its
//! key log): what the front gets as the key log is complete, late, or never has the secrets,
//! and for sessions that cannot be followed.

use std::net::SocketAddr;

use super::*;

/// The RFC trace's key log and its records by sender, out of the fuzz seed's layout.
fn rfc8448() -> (Vec<u8>, Vec<(Dir, Vec<u8>)>) {
    let seed = tcpkit_lab::corpus::seeds("tls_decrypt")
        .into_iter()
        .find(|s| s.name == "rfc8448")
        .expect("the rfc8448 seed");
    let b = seed.bytes;
    let k = u16::from_be_bytes([b[0], b[1]]) as usize;
    let log = b[2..2 + k].to_vec();
    let mut flow: Vec<(Dir, Vec<u8>)> = Vec::new();
    let mut rest = &b[2 + k..];
    while let [side, len, tail @ ..] = rest {
        let dir = if side & 1 == 0 {
            Dir::ClientToServer
        } else {
            Dir::ServerToClient
        };
        let n = *len as usize;
        match flow.last_mut() {
            Some((d, v)) if *d == dir => v.extend_from_slice(&tail[..n]),
            _ => flow.push((dir, tail[..n].to_vec())),
        }
        rest = &tail[n..];
    }
    (log, flow)
}

const ID: SessionId = SessionId(7);

fn events(flow: &[(Dir, Vec<u8>)], syn_seen: bool) -> Vec<Event> {
    let a: SocketAddr = "198.18.1.1:40000".parse().unwrap();
    let b: SocketAddr = "198.18.1.2:443".parse().unwrap();
    let mut evs = vec![Event::Open {
        id: ID,
        client: a,
        server: b,
        syn_seen,
        ts_ns: 1,
    }];
    let mut off = [0u64; 2];
    for (i, (dir, bytes)) in flow.iter().enumerate() {
        let o = &mut off[d_index(*dir)];
        evs.push(Event::Data {
            id: ID,
            dir: *dir,
            seq: *o as u32,
            offset: *o,
            bytes: Bytes::from(bytes.clone()),
            ts_ns: 10 + i as u64,
        });
        *o += bytes.len() as u64;
    }
    evs.push(Event::Close {
        id: ID,
        how: CloseKind::Fin,
        requests_seen: 3,
        ts_ns: 100,
    });
    evs
}

/// What the front gets, summed up: (opened, client plaintext, server plaintext, requests at
/// the close).
fn front(evs: &[Event]) -> (bool, Vec<u8>, Vec<u8>, Option<u64>) {
    let (mut open, mut c, mut s, mut close) = (false, Vec::new(), Vec::new(), None);
    for e in evs {
        match e {
            Event::Open { .. } => open = true,
            Event::Data {
                dir, bytes, offset, ..
            } => {
                let v = if *dir == Dir::ClientToServer {
                    &mut c
                } else {
                    &mut s
                };
                assert_eq!(*offset, v.len() as u64, "plaintext offsets");
                v.extend_from_slice(bytes);
            }
            Event::Gap { .. } => panic!("no gap here"),
            Event::Close { requests_seen, .. } => close = Some(*requests_seen),
        }
    }
    (open, c, s, close)
}

/// A layer whose key log file holds the trace's secrets from the start (the folder goes with
/// the first value).
fn with_whole_key_log() -> (tempfile::TempDir, Vec<(Dir, Vec<u8>)>, State) {
    let (log, flow) = rfc8448();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, &log).unwrap();
    let st = State::new(Keys::file(&path), 1 << 20);
    (dir, flow, st)
}

#[test]
fn a_session_is_opened_with_its_plaintext_once_it_decrypts() {
    let (_dir, flow, mut st) = with_whole_key_log();
    let mut evs = events(&flow, true);
    st.process(&mut evs, 1);
    let payload: Vec<u8> = (0..50).collect();
    assert_eq!(front(&evs), (true, payload.clone(), payload, Some(1)));
    assert_eq!(st.stats.sessions.decrypted, 1);
    assert_eq!(st.stats.versions["TLSv1.3"], 1);
    assert_eq!(st.stats.ciphers["TLS_AES_128_GCM_SHA256"], 1);
    assert!(st.sessions.is_empty());
}

#[test]
fn a_session_waits_for_its_secret_and_then_counts_no_secret() {
    let (log, flow) = rfc8448();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    // Not there yet: the session is held, nothing reaches the front.
    let mut st = State::new(Keys::file(&path), 1 << 20);
    let mut evs = events(&flow, true);
    st.process(&mut evs, 1);
    assert!(evs.is_empty());
    // Held from the server's first encrypted record on: the records after its flight.
    assert_eq!(st.held_bytes, 58 + 227 + 72 + 72 + 24 + 24);
    // The key log appears: the held events come out whole, in order.
    std::fs::write(&path, &log).unwrap();
    st.process(&mut evs, 1 + POLL_NS);
    let payload: Vec<u8> = (0..50).collect();
    assert_eq!(front(&evs), (true, payload.clone(), payload, Some(1)));
    assert_eq!(st.held_bytes, 0);
    // Never there: no_secret past the wait, nothing out, nothing held.
    let mut st = State::new(Keys::file(&dir.path().join("other")), 1 << 20);
    let mut evs = events(&flow, true);
    st.process(&mut evs, 1);
    st.process(&mut evs, 1 + KEY_WAIT_NS / 2);
    assert!(evs.is_empty());
    assert_eq!(st.stats.sessions.no_secret, 0);
    st.process(&mut evs, 2 + KEY_WAIT_NS);
    assert!(evs.is_empty());
    assert_eq!(st.stats.sessions.no_secret, 1);
    assert_eq!(st.held_bytes, 0);
    assert!(st.sessions.is_empty());
}

#[test]
fn sessions_that_cannot_be_followed_are_counted_and_never_opened() {
    let (_dir, flow, mut st) = with_whole_key_log();
    let mut evs = events(&flow, false);
    st.process(&mut evs, 1);
    assert!(evs.is_empty());
    assert_eq!(st.stats.sessions.unsupported["joined mid-stream"], 1);
    let http = [(Dir::ClientToServer, b"GET / HTTP/1.1\r\n\r\n".to_vec())];
    let mut evs = events(&http, true);
    st.process(&mut evs, 1);
    assert!(evs.is_empty());
    assert_eq!(st.stats.sessions.not_tls, 1);
    // A byte changed in the client's application record: the copy had begun, and it ends
    // where the plaintext stopped; counted failed.
    let mut bad = flow.clone();
    let last_client = bad
        .iter()
        .rposition(|(d, _)| *d == Dir::ClientToServer)
        .unwrap();
    let rec = &mut bad[last_client - 2].1;
    let at = rec.len() - 3;
    rec[at] ^= 1;
    let mut evs = events(&bad, true);
    st.process(&mut evs, 1);
    let (open, c, _, close) = front(&evs);
    assert!(open && c.is_empty(), "{evs:?}");
    assert_eq!(close, Some(0));
    assert!(matches!(
        evs.last(),
        Some(Event::Close {
            how: CloseKind::LostData { .. },
            ..
        })
    ));
    assert_eq!(st.stats.sessions.failed, 1);
    assert!(st.sessions.is_empty());
}

/// The trace's secrets as the probes would read them from the server's SSL object: its
/// client random and application traffic secrets (from its key log), its handshake secret and
/// ClientHello..ServerHello hash (RFC 8448 section 3), on the session's socket pair.
fn rfc8448_probed(log: &[u8], random: Option<[u8; 32]>) -> tcpkit_tlsprobe::Secrets {
    let text = String::from_utf8_lossy(log);
    let field = |label: &str, i: usize| -> Vec<u8> {
        let l = text.lines().find(|l| l.starts_with(label)).unwrap();
        let h = l.split(' ').nth(i).unwrap();
        (0..h.len() / 2)
            .map(|k| u8::from_str_radix(&h[2 * k..2 * k + 2], 16).unwrap())
            .collect()
    };
    let at64 = |v: &[u8]| {
        let mut a = [0u8; 64];
        a[..v.len()].copy_from_slice(v);
        a
    };
    let unhex = |s: &str| -> Vec<u8> {
        (0..s.len() / 2)
            .map(|k| u8::from_str_radix(&s[2 * k..2 * k + 2], 16).unwrap())
            .collect()
    };
    tcpkit_tlsprobe::Secrets {
        ssl: 1,
        tgid: 2,
        ts_mono_ns: 3,
        version: tcpkit_tlsprobe::TlsVersion::Tls13,
        suite: 0x1301,
        client_random: random
            .unwrap_or_else(|| field("CLIENT_TRAFFIC_SECRET_0", 1).try_into().unwrap()),
        master_key: Vec::new(),
        handshake_secret: at64(&unhex(
            "1dc826e93606aa6fdc0aadc12f741b01046aa6b99f691ed221a9f0ca043fbeac",
        )),
        handshake_hash: at64(&unhex(
            "860c06edc07858ee8e78f0e7428c58edd6b43f2ca3e6e95f02ed063cf0e1cad8",
        )),
        client_app: at64(&field("CLIENT_TRAFFIC_SECRET_0", 2)),
        server_app: at64(&field("SERVER_TRAFFIC_SECRET_0", 2)),
        sockets: Some((
            "198.18.1.2:443".parse().unwrap(),
            "198.18.1.1:40000".parse().unwrap(),
        )),
    }
}

/// `--tls-uprobe`'s keys: the trace's secrets as the probes read them decrypt the trace (the
/// handshake traffic secrets derived as its key log gives them); read with another client
/// random (a layout that is not the library's) on the same connection, the session counts
/// `probe_layout_mismatch` at once, never copied.
#[test]
fn probe_secrets_decrypt_the_trace_and_a_wrong_random_is_a_layout_mismatch() {
    let (log, flow) = rfc8448();
    let mut lines = String::new();
    probe::keylog_lines(&rfc8448_probed(&log, None), &mut lines);
    let text = String::from_utf8_lossy(&log);
    for l in lines.lines() {
        assert!(text.lines().any(|k| k == l), "{l} is not the trace's");
    }
    let mut keys = ProbeKeys::detached();
    keys.take(Ok(rfc8448_probed(&log, None)));
    let mut st = State::new(Keys::Probes(Box::new(keys)), 1 << 20);
    let mut evs = events(&flow, true);
    st.process(&mut evs, 1);
    let payload: Vec<u8> = (0..50).collect();
    assert_eq!(front(&evs), (true, payload.clone(), payload, Some(1)));

    let mut keys = ProbeKeys::detached();
    keys.take(Ok(rfc8448_probed(&log, Some([0x55; 32]))));
    let mut st = State::new(Keys::Probes(Box::new(keys)), 1 << 20);
    let mut evs = events(&flow, true);
    st.process(&mut evs, 1);
    assert!(evs.is_empty(), "{evs:?}");
    assert_eq!(st.stats.sessions.unsupported[LAYOUT_MISMATCH], 1);
    assert_eq!((st.stats.sessions.no_secret, st.held_bytes), (0, 0));
}
