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
