//! `copy --check`'s return-path probe: one SYN as a copy sends it, its answer through
//! intercept.

use super::*;

/// What [`probe_return_path`] saw come back through intercept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeAnswer {
    /// The TCP flags of the target's answer (SYN-ACK when it listens, RST when not).
    pub flags: u8,
    /// From the SYN leaving to intercept's report of the answer arriving here.
    pub rtt: Duration,
}

/// Sends one SYN from `client` to `target` through a raw socket, as a copy's first packet
/// leaves, and waits up to `wait` for intercept at `intercept` to report the target's answer:
/// the path transparent mode depends on (the target routes the clients' addresses via the
/// assistant, its reverse-path filter lets the copy's packets in, intercept captures where
/// the answers arrive). None when nothing came back in time. A SYN-ACK is reset at once, so
/// the target keeps no half-open connection from the probe.
pub fn probe_return_path(
    intercept: SocketAddr,
    key: Option<&Key>,
    target: SocketAddr,
    client: SocketAddr,
    wait: Duration,
) -> Result<Option<ProbeAnswer>, TransparentError> {
    let mut s = handshake(intercept, wait, 0, key)?;
    let raw = RawIpSink::open(target.is_ipv6()).map_err(io_err("open a raw IP socket (socket)"))?;
    let isn = (now_ns() as u32).wrapping_mul(2_654_435_761);
    let send = |flags: Flags, seq: u32| -> Result<(), TransparentError> {
        let seg = Segment {
            src: client,
            dst: target,
            seq,
            ack: 0,
            flags,
            window: WINDOW,
            options: Options {
                mss: flags.has(Flags::SYN).then_some(1460),
                ..Options::default()
            },
            payload: 0..0,
            payload_len: 0,
        };
        let mut pkt = Vec::new();
        seg.emit_ip(&[], &mut pkt).map_err(|e| {
            io_err("build the probe SYN")(io::Error::new(io::ErrorKind::InvalidInput, e))
        })?;
        raw.send(target.ip(), &pkt)
            .map_err(io_err("send the probe through the raw socket (sendto)"))?;
        Ok(())
    };
    let sent = Instant::now();
    send(Flags::SYN, isn)?;
    let deadline = sent + wait;
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        loop {
            match Msg::parse(&buf) {
                Ok((Msg::Packet { hdr, .. }, used)) => {
                    buf.drain(..used);
                    if hdr.src == target && hdr.dst == client {
                        let syn_ack = Flags::SYN.0 | Flags::ACK.0;
                        if hdr.flags & syn_ack == syn_ack {
                            send(Flags::RST, isn.wrapping_add(1))?;
                        }
                        return Ok(Some(ProbeAnswer {
                            flags: hdr.flags,
                            rtt: sent.elapsed(),
                        }));
                    }
                }
                Ok((_, used)) => {
                    buf.drain(..used);
                }
                Err(ControlError::Truncated { .. }) => break,
                Err(e) => {
                    return Err(TransparentError::NotIntercept {
                        addr: intercept,
                        why: e.to_string(),
                    })
                }
            }
        }
        match s.read(&mut chunk) {
            Ok(0) => {
                return Err(TransparentError::NotIntercept {
                    addr: intercept,
                    why: "closed the control connection during the probe".into(),
                })
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                return Err(TransparentError::Unreachable {
                    addr: intercept,
                    source: e,
                })
            }
        }
    }
    Ok(None)
}
