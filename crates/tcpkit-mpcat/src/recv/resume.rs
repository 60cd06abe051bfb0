//! The receiver's side of `--resume` ([`crate::resume`]): the sender's request taken from
//! stream 0, checked against the state file kept beside the output, and answered with the
//! held length and a hash of each held chunk; then the session goes on from there, the output
//! cut to the held length and the stream hash carrying on from the held part's.

use std::io::{Seek, SeekFrom};

use crate::frame::{Frame, HELD_HASH, HELD_PER_FRAME};
use crate::resume::{self as rs, Source, State, CHUNK};
use crate::{Error, Output, ResumeReport, StreamHasher};

use super::{flush, Receiver, Sink};

/// Where a session's resumption stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// No --resume on this receiver.
    Off,
    /// --resume: the sender's request must come before any data.
    Wanted,
    /// Asked on stream `stream` for this input; answered by the loop.
    Asked { stream: u16, source: Source },
    /// Answered: the session goes on from `held`.
    Done { held: u64 },
}

impl Step {
    /// A data frame arrived: only after the request was answered on a --resume receiver.
    pub(super) fn data_may_come(&self) -> Result<(), Error> {
        match self {
            Step::Off | Step::Done { .. } => Ok(()),
            Step::Wanted => Err(Error::msg(
                "--resume: the sender did not ask to resume (give it --resume too): this receiver keeps its output to resume into",
            )),
            Step::Asked { .. } => Err(Error::msg(
                "--resume: data came before the resume request was answered",
            )),
        }
    }

    /// The sender's request, from stream `stream` (`begun`: bytes of the stream arrived
    /// already). One per session, before anything else.
    pub(super) fn ask(&mut self, stream: u16, source: Source, begun: bool) -> Result<(), Error> {
        match self {
            Step::Wanted | Step::Off if !begun => {
                *self = Step::Asked { stream, source };
                Ok(())
            }
            _ => Err(Error::msg(format!(
                "stream {stream}: a resume request after the stream began"
            ))),
        }
    }

    /// The report's part: what was held (skipped) and what came in this session.
    pub(super) fn report(&self, written: u64) -> Option<ResumeReport> {
        match *self {
            Step::Done { held } => Some(ResumeReport {
                held,
                sent: written.saturating_sub(held),
            }),
            _ => None,
        }
    }
}

impl Receiver<'_> {
    /// Answers the sender's --resume request once it came: refuses an input that changed
    /// since the break (the state file names another), records this one, hashes the held
    /// chunks into Held frames on the asking stream, and sets the session to go on from the
    /// held length.
    pub(super) fn answer_resume(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let cfg = self.cfg;
        let Some(s) = self.session.as_mut() else {
            return Ok(());
        };
        let Step::Asked { stream, source } = s.resume else {
            return Ok(());
        };
        let (true, Output::File(out)) = (cfg.resume, &cfg.output) else {
            return Err(Error::msg(
                "the sender asked to --resume: this receiver was not started with --resume (give it --resume and -o FILE)",
            ));
        };
        let state = rs::state_path(out);
        if let Some(kept) = rs::read_state(&state)? {
            if kept.source != source {
                return Err(Error::msg(rs::changed(out, &kept.source, &source)));
            }
        }
        rs::write_state(&state, &State { source })?;
        let meta = sink
            .w
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", sink.name), e))?;
        if !meta.is_file() {
            // A device or a pipe has no length to tell what it holds.
            return Err(Error::msg(format!(
                "--resume: {} is not a regular file: what it holds cannot be told",
                sink.name
            )));
        }
        let len = meta.len();
        // The output is believed for no more than the input's length, and only chunk by
        // chunk, by the sender.
        let held = len.min(source.size);
        let t = s
            .joined
            .get(usize::from(stream))
            .copied()
            .flatten()
            .ok_or_else(|| Error::msg(format!("stream {stream} left before its answer")))?;
        let mut hasher = StreamHasher::new();
        let mut buf = Vec::new();
        let chunks = held.div_ceil(CHUNK);
        let mut k = 0;
        loop {
            let n = (chunks - k).min(HELD_PER_FRAME as u64) as usize;
            let mut hashes = [0u8; HELD_PER_FRAME * HELD_HASH];
            for (j, h) in hashes.chunks_mut(HELD_HASH).take(n).enumerate() {
                let got = rs::chunk_hash(&sink.w, k + j as u64, held, &mut buf, &mut hasher)
                    .map_err(|e| Error::io(format!("read {} to check it", sink.name), e))?;
                h.copy_from_slice(&got);
            }
            let Some(c) = self.conns.get_mut(&t) else {
                return Err(Error::msg(format!(
                    "stream {stream} left before its answer"
                )));
            };
            c.put(&Frame::Held {
                held,
                first: k,
                hashes: &hashes[..n * HELD_HASH],
            });
            flush(c)?;
            k += n as u64;
            if k >= chunks {
                break;
            }
        }
        // What lies past the held part (more than the input's length) goes; the stream
        // goes on at the held length.
        sink.w
            .set_len(held)
            .and_then(|()| sink.w.seek(SeekFrom::Start(held)).map(|_| ()))
            .map_err(|e| Error::io(format!("cut {} to the {held} bytes held", sink.name), e))?;
        let Some(s) = self.session.as_mut() else {
            return Ok(());
        };
        s.reorder.skip(held);
        s.last_ack = held;
        s.seed = Some(hasher);
        s.resume = Step::Done { held };
        self.say(&format!(
            "--resume: {held} bytes of {} held and hashed; the rest follows",
            source.size
        ));
        Ok(())
    }
}
