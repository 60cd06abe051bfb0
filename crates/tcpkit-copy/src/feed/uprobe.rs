//! `--tls-uprobe-calls`' input: the probes' records (tcpkit-tlsprobe: the plaintext a TLS server's
//! library read and wrote, per SSL object, tied to its socket) turned into the reassembler's
//! [`Event`]s, so every copy mode takes plaintext as it takes reassembled TCP (issue 27's
//! contract): Open (`syn_seen` false for a connection joined mid-stream, open before the
//! probes), Data with `offset` in plaintext bytes of the direction and `seq` its low 32 bits,
//! Gap for answer bytes the probes lost, Close when the library frees the connection or its
//! process is gone (a lost request byte ends the session as `LostData`, as a capture's does).
//!
//! Which side is the server: the copy rules' ports. A record whose socket's own port is a
//! rule's port comes from the server (its reads are the requests); any other (the same file
//! mapped by a client, a port no rule copies) is counted unmatched and left.

use std::collections::HashSet;
use std::net::SocketAddr;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use tcpkit_tlsprobe::{Kind, Record, RecordError};

use crate::reasm::{CloseKind, Dir, Event, SessionId};

/// Connections followed at once; over it a new one is not copied (counted).
const MAX_SESSIONS: usize = 1 << 16;
/// Processes remembered for the report's count (a bound, not a limit on what is copied).
const MAX_PIDS: usize = 1 << 16;
/// How often the processes of open sessions are checked for having exited.
const PID_CHECK_NS: u64 = 1_000_000_000;

#[derive(Debug)]
struct Sess {
    id: SessionId,
    client: SocketAddr,
    server: SocketAddr,
    /// The next offset expected in each direction (index: `Dir`).
    next: [u64; 2],
    last: Option<Dir>,
    from_start: bool,
    requests: u64,
    copied_any: bool,
    /// Ended early (a request byte lost): its records are passed over until it is freed.
    dead: bool,
}

/// What the report says of the probes' records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub records: u64,
    /// Records not of a connection the rules copy (or, with --only-full, joined mid-stream),
    /// or that did not parse.
    pub unmatched: u64,
    /// Connections whose plaintext was copied.
    pub copied: u64,
    /// Connections not followed: the table was full.
    pub not_tracked: u64,
    pub pids: u64,
}

/// The records of the probes, as the reassembler's events.
#[derive(Debug)]
pub struct Sessions {
    server_ports: Vec<u16>,
    only_full: bool,
    mono_to_real: i128,
    table: FxHashMap<(u32, u64), Sess>,
    next_id: u64,
    pids: HashSet<u32>,
    last_pid_check: u64,
    pub tally: Tally,
}

fn idx(d: Dir) -> usize {
    match d {
        Dir::ClientToServer => 0,
        Dir::ServerToClient => 1,
    }
}

impl Sessions {
    /// `server_ports`: the rules' ports; `mono_to_real`: CLOCK_REALTIME less CLOCK_MONOTONIC.
    pub fn new(server_ports: Vec<u16>, only_full: bool, mono_to_real: i128) -> Sessions {
        Sessions {
            server_ports,
            only_full,
            mono_to_real,
            table: FxHashMap::default(),
            next_id: 0,
            pids: HashSet::new(),
            last_pid_check: 0,
            tally: Tally::default(),
        }
    }

    /// Sessions open now.
    pub fn open(&self) -> usize {
        self.table.len()
    }

    fn close(s: &Sess, how: CloseKind, ts_ns: u64, evs: &mut Vec<Event>) {
        if !s.dead {
            evs.push(Event::Close {
                id: s.id,
                how,
                requests_seen: s.requests,
                ts_ns,
            });
        }
    }

    /// One item of the probes' ring: a record, or bytes that did not parse (counted
    /// unmatched).
    pub fn take(&mut self, r: Result<Record<'_>, RecordError>, evs: &mut Vec<Event>) {
        match r {
            Ok(r) => self.push(&r, evs),
            Err(_) => {
                self.tally.records += 1;
                self.tally.unmatched += 1;
            }
        }
    }

    /// One record of the probes; its events go to `evs`.
    pub fn push(&mut self, r: &Record<'_>, evs: &mut Vec<Event>) {
        self.tally.records += 1;
        if self.pids.len() < MAX_PIDS && self.pids.insert(r.tgid) {
            self.tally.pids += 1;
        }
        let ts = u64::try_from(i128::from(r.ts_mono_ns) + self.mono_to_real).unwrap_or(0);
        let key = (r.tgid, r.ssl);
        if r.kind == Kind::Free {
            if let Some(s) = self.table.remove(&key) {
                Self::close(&s, CloseKind::Fin, ts, evs);
            }
            return;
        }
        if !self.server_ports.contains(&r.local.port()) {
            self.tally.unmatched += 1;
            return;
        }
        let (client, server) = (r.remote, r.local);
        // The same SSL object on another socket (SSL_clear and a new descriptor): the old
        // connection is over.
        if let Some(s) = self
            .table
            .get(&key)
            .filter(|s| (s.client, s.server) != (client, server))
        {
            Self::close(s, CloseKind::Fin, ts, evs);
            self.table.remove(&key);
        }
        if !self.table.contains_key(&key) {
            if self.only_full && !r.from_start {
                self.tally.unmatched += 1;
                return;
            }
            if self.table.len() >= MAX_SESSIONS {
                self.tally.not_tracked += 1;
                return;
            }
            let id = SessionId(self.next_id);
            self.next_id += 1;
            evs.push(Event::Open {
                id,
                client,
                server,
                syn_seen: r.from_start,
                ts_ns: ts,
            });
            self.table.insert(
                key,
                Sess {
                    id,
                    client,
                    server,
                    next: [0, 0],
                    last: None,
                    from_start: r.from_start,
                    requests: 0,
                    copied_any: false,
                    dead: false,
                },
            );
        }
        let Some(s) = self.table.get_mut(&key) else {
            return;
        };
        if s.dead {
            return;
        }
        let dir = match r.kind {
            Kind::Read => Dir::ClientToServer,
            _ => Dir::ServerToClient,
        };
        let next = s.next[idx(dir)];
        let mut bytes = r.bytes;
        if r.offset > next {
            let len = r.offset - next;
            if dir == Dir::ClientToServer {
                // A request byte the probes lost: what follows cannot be copied exactly.
                evs.push(Event::Close {
                    id: s.id,
                    how: CloseKind::LostData {
                        dir,
                        at_seq: next as u32,
                    },
                    requests_seen: s.requests + 1,
                    ts_ns: ts,
                });
                s.dead = true;
                return;
            }
            evs.push(Event::Gap {
                id: s.id,
                dir,
                seq: next as u32,
                offset: next,
                len,
                ts_ns: ts,
            });
        } else if r.offset < next {
            // Bytes already handed over (never written by the programs; kept exact anyway).
            let skip = usize::try_from(next - r.offset).unwrap_or(usize::MAX);
            bytes = bytes.get(skip..).unwrap_or_default();
        }
        if bytes.is_empty() {
            return;
        }
        let at = r.offset.max(next);
        if dir == Dir::ClientToServer
            && (s.last == Some(Dir::ServerToClient) || (s.last.is_none() && s.from_start))
        {
            s.requests += 1;
        }
        s.last = Some(dir);
        s.next[idx(dir)] = at + bytes.len() as u64;
        if !s.copied_any {
            s.copied_any = true;
            self.tally.copied += 1;
        }
        evs.push(Event::Data {
            id: s.id,
            dir,
            seq: at as u32,
            offset: at,
            bytes: Bytes::copy_from_slice(bytes),
            ts_ns: ts,
        });
    }

    /// At most once a second: the sessions of processes that are gone (killed, restarted:
    /// their library never freed them) end. `alive` says whether a process still exists.
    pub fn tick(
        &mut self,
        now_ns: u64,
        real_ns: u64,
        alive: impl Fn(u32) -> bool,
        evs: &mut Vec<Event>,
    ) {
        if now_ns < self.last_pid_check + PID_CHECK_NS {
            return;
        }
        self.last_pid_check = now_ns;
        let mut gone: Vec<u32> = self.table.keys().map(|k| k.0).collect();
        gone.sort_unstable();
        gone.dedup();
        gone.retain(|&p| !alive(p));
        if gone.is_empty() {
            return;
        }
        self.table.retain(|k, s| {
            let keep = !gone.contains(&k.0);
            if !keep {
                Self::close(s, CloseKind::Rst, real_ns, evs);
            }
            keep
        });
    }

    /// The end of the run: every session still open ends.
    pub fn finish(&mut self, real_ns: u64, evs: &mut Vec<Event>) {
        for (_, s) in self.table.drain() {
            Self::close(&s, CloseKind::Idle, real_ns, evs);
        }
    }
}

/// Whether process `pid` still exists.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRV: &str = "198.18.0.2:443";
    const CLI: &str = "198.18.0.1:40000";

    fn rec(kind: Kind, offset: u64, bytes: &[u8], from_start: bool) -> Record<'_> {
        Record {
            ssl: 0x1000,
            tgid: 7,
            ts_mono_ns: 1_000,
            offset,
            local: SRV.parse().unwrap(),
            remote: CLI.parse().unwrap(),
            kind,
            from_start,
            bytes,
        }
    }

    fn feed(s: &mut Sessions, rs: &[Record<'_>]) -> Vec<Event> {
        let mut evs = Vec::new();
        for r in rs {
            s.push(r, &mut evs);
        }
        evs
    }

    #[test]
    fn a_connection_opens_carries_both_directions_in_order_and_closes_on_free() {
        let mut s = Sessions::new(vec![443], false, 5);
        let evs = feed(
            &mut s,
            &[
                rec(Kind::Read, 0, b"GET / HTTP/1.1\r\n\r\n", true),
                rec(Kind::Write, 0, b"HTTP/1.1 200 OK\r\n\r\n", true),
                rec(Kind::Read, 18, b"GET /b", true),
                rec(Kind::Free, 24, b"", true),
            ],
        );
        let id = SessionId(0);
        assert_eq!(
            evs[0],
            Event::Open {
                id,
                client: CLI.parse().unwrap(),
                server: SRV.parse().unwrap(),
                syn_seen: true,
                ts_ns: 1_005
            }
        );
        assert!(
            matches!(&evs[1], Event::Data { dir: Dir::ClientToServer, offset: 0, bytes, .. } if &bytes[..] == b"GET / HTTP/1.1\r\n\r\n")
        );
        assert!(matches!(
            &evs[2],
            Event::Data {
                dir: Dir::ServerToClient,
                offset: 0,
                ..
            }
        ));
        assert!(matches!(
            &evs[3],
            Event::Data {
                dir: Dir::ClientToServer,
                offset: 18,
                seq: 18,
                ..
            }
        ));
        assert_eq!(
            evs[4],
            Event::Close {
                id,
                how: CloseKind::Fin,
                requests_seen: 2,
                ts_ns: 1_005
            }
        );
        assert_eq!(s.open(), 0);
        assert_eq!((s.tally.records, s.tally.copied, s.tally.pids), (4, 1, 1));
    }

    #[test]
    fn lost_answer_bytes_are_a_gap_and_a_lost_request_byte_ends_the_session() {
        let mut s = Sessions::new(vec![443], false, 0);
        let evs = feed(
            &mut s,
            &[
                rec(Kind::Read, 0, b"abc", false),
                rec(Kind::Write, 10, b"xyz", false),
            ],
        );
        assert!(matches!(
            evs[0],
            Event::Open {
                syn_seen: false,
                ..
            }
        ));
        assert!(matches!(
            evs[2],
            Event::Gap {
                dir: Dir::ServerToClient,
                offset: 0,
                len: 10,
                ..
            }
        ));
        assert!(matches!(evs[3], Event::Data { offset: 10, .. }));
        let evs = feed(
            &mut s,
            &[
                rec(Kind::Read, 5, b"late", false),
                rec(Kind::Read, 9, b"more", false),
            ],
        );
        assert!(matches!(
            evs[..],
            [Event::Close {
                how: CloseKind::LostData {
                    dir: Dir::ClientToServer,
                    at_seq: 3
                },
                ..
            }]
        ));
        // Freed later: no second Close.
        assert!(feed(&mut s, &[rec(Kind::Free, 0, b"", false)]).is_empty());
    }

    #[test]
    fn a_client_side_record_or_another_port_is_unmatched_and_only_full_skips_joined() {
        let mut s = Sessions::new(vec![8443], false, 0);
        assert!(feed(&mut s, &[rec(Kind::Read, 0, b"x", true)]).is_empty());
        assert_eq!(s.tally.unmatched, 1);
        let mut s = Sessions::new(vec![443], true, 0);
        assert!(feed(&mut s, &[rec(Kind::Read, 0, b"x", false)]).is_empty());
        assert_eq!(s.tally.unmatched, 1);
    }

    #[test]
    fn sessions_of_a_process_that_is_gone_end_and_the_rest_stay() {
        let mut s = Sessions::new(vec![443], false, 0);
        let mut other = rec(Kind::Read, 0, b"y", true);
        other.tgid = 8;
        feed(&mut s, &[rec(Kind::Read, 0, b"x", true), other]);
        let mut evs = Vec::new();
        s.tick(2_000_000_000, 9, |p| p == 8, &mut evs);
        assert!(matches!(
            evs[..],
            [Event::Close {
                id: SessionId(0),
                how: CloseKind::Rst,
                ..
            }]
        ));
        assert_eq!(s.open(), 1);
        evs.clear();
        s.finish(10, &mut evs);
        assert!(matches!(
            evs[..],
            [Event::Close {
                id: SessionId(1),
                how: CloseKind::Idle,
                ..
            }]
        ));
    }
}
