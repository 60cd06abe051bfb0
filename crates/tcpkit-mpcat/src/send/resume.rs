//! The sender's side of `--resume` ([`crate::resume`]), on stream 0 before any other stream
//! opens: the input named (length, modification time), the receiver's held chunks checked one
//! by one against the same chunks of the input, and the offset the stream goes on from, with
//! the stream hash over everything before it.

use std::fs::File;
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use crate::frame::{self, Frame, HELD_HASH};
use crate::resume::{self as rs, Source, CHUNK};
use crate::secure::{Channel, REC_HDR, TAG};
use crate::{Error, StreamHasher};

use super::handshake::{read_exact, read_frame};

/// Where the stream goes on from, and the stream hash of the input before it.
pub(crate) struct Resumed {
    pub(crate) held: u64,
    pub(crate) hasher: StreamHasher,
}

/// Frames of the largest a receiver sends here (a refusal's reason), sealed or not.
const BUF: usize = 64 + frame::MAX_REASON;

/// Writes `f` on `s` (sealed under `chan` with --psk-file).
fn put(s: &mut TcpStream, chan: Option<&mut Channel>, f: &Frame<'_>) -> Result<(), Error> {
    let mut plain = Vec::with_capacity(f.buffer_len());
    f.emit_vec(&mut plain);
    let bytes = match chan {
        Some(ch) => {
            let mut sealed = Vec::with_capacity(plain.len() + REC_HDR + TAG);
            ch.seal(&plain, &mut sealed);
            sealed
        }
        None => plain,
    };
    s.write_all(&bytes)
        .map_err(|e| Error::io("stream 0: send the --resume request", e))
}

/// Reads one frame from `s` into `buf` (opened from its record under `chan`); its length.
fn get(
    s: &mut TcpStream,
    chan: Option<&mut Channel>,
    buf: &mut [u8; BUF],
    timeout: Duration,
) -> Result<usize, Error> {
    let what = |w: &str| format!("stream 0: {w} the receiver (--resume)");
    let Some(ch) = chan else {
        return read_frame(s, buf, timeout, &what);
    };
    let mut raw = [0u8; REC_HDR + TAG + BUF];
    read_exact(s, &mut raw[..REC_HDR], timeout, &what)?;
    let len = usize::from(u16::from_be_bytes([raw[0], raw[1]]));
    if !(TAG..=raw.len() - REC_HDR).contains(&len) {
        return Err(Error::msg(format!(
            "{}: a {len}-byte record where the held chunks belong",
            what("handshake with")
        )));
    }
    read_exact(s, &mut raw[REC_HDR..REC_HDR + len], timeout, &what)?;
    let mut have = 0;
    ch.open(&raw[..REC_HDR + len], buf, &mut have)
        .map_err(|e| Error::msg(format!("{}: {e}", what("handshake with"))))?;
    Ok(have)
}

/// Asks the receiver what it holds of `file` (named by `source`) and checks each held chunk
/// against the file's own; at the first that differs the receiver is told why (an abort) and
/// the session fails. `timeout`: the most to wait for each answer (the receiver hashes a few
/// of its chunks between answers).
pub(crate) fn exchange(
    s: &mut TcpStream,
    mut chan: Option<&mut Channel>,
    file: &File,
    source: Source,
    timeout: Duration,
) -> Result<Resumed, Error> {
    put(
        s,
        chan.as_deref_mut(),
        &Frame::Resume {
            size: source.size,
            mtime_ns: source.mtime_ns,
        },
    )?;
    let mut hasher = StreamHasher::new();
    let mut scratch = Vec::new();
    let mut buf = [0u8; BUF];
    let mut next = 0u64;
    let mut held = None;
    loop {
        let n = get(s, chan.as_deref_mut(), &mut buf, timeout)?;
        let bad = |why: String| Error::msg(format!("stream 0: --resume: {why}"));
        let (h, first, hashes) = match Frame::parse(&buf[..n]) {
            Ok((
                Frame::Held {
                    held,
                    first,
                    hashes,
                },
                _,
            )) => (held, first, hashes),
            Ok((Frame::Abort { reason }, _)) => {
                return Err(Error::msg(format!(
                    "the receiver aborted the session: {reason}"
                )))
            }
            Ok((Frame::Refuse { reason }, _)) => {
                return Err(Error::msg(format!("stream 0: refused: {reason}")))
            }
            other => return Err(bad(format!("expected the held chunks, got {other:?}"))),
        };
        if h > source.size || held.is_some_and(|x| x != h) || first != next {
            return Err(bad(format!(
                "the receiver's answer does not hold together (held {h} of {} bytes, chunk {first} where {next} was due)",
                source.size
            )));
        }
        held = Some(h);
        let mut why = None;
        for theirs in hashes.chunks(HELD_HASH) {
            let mine = rs::chunk_hash(file, next, h, &mut scratch, &mut hasher)
                .map_err(|e| Error::io("read the input to check the receiver's chunks", e))?;
            if mine[..] != *theirs {
                let at = next * CHUNK;
                why = Some(format!(
                    "--resume: the receiver's output differs from the input in chunk {next} (bytes {at}..{}): the input changed since the transfer broke off, or the output is another file; remove the output and its {} file to send the whole input",
                    (at + CHUNK).min(h),
                    rs::STATE_SUFFIX
                ));
                break;
            }
            next += 1;
        }
        if let Some(why) = why {
            // Told to the receiver too, so both sides fail with the same line.
            let _ = put(s, chan.as_deref_mut(), &Frame::Abort { reason: &why });
            return Err(Error::msg(why));
        }
        if next >= h.div_ceil(CHUNK) {
            return Ok(Resumed { held: h, hasher });
        }
    }
}
