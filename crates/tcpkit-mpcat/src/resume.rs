//! `--resume`: a file-to-file transfer broken off (either side killed, every path down) is
//! started again and sends only what the receiver does not already hold.
//!
//! What the receiver keeps is its output (the bytes written in order before the break) and a
//! small state file beside it, `OUTPUT.mpcat-resume`: the input file's length and
//! modification time as the sender named them when the transfer began. Both are untrusted on
//! the way back in: the state file is read only up to [`MAX_STATE`] bytes and taken only when
//! it is exactly one record with its own check ([`State::parse`], fuzzed as `mpcat_resume`);
//! the output is believed for no more than the input's length, and only chunk by chunk
//! against the sender's own file.
//!
//! The check, when a `--resume` session begins ([`crate::frame::Frame::Resume`] and
//! [`crate::frame::Frame::Held`]): the sender names its input (length, modification time);
//! the receiver refuses if its state file names another (the input changed since the break),
//! records this one, and answers how much it holds with a BLAKE3 hash of each [`CHUNK`] of
//! it; the sender hashes the same chunks of its own file and aborts at the first that
//! differs, naming it. Then the stream goes on from the held length as if it had been sent
//! in this session: both sides' stream hash (XXH3-128) covers the whole file, each side
//! hashing the held part from its own copy, so the end frame checks the whole file end to
//! end. A verified transfer removes the state file.
//!
//! BLAKE3 for the chunks, not the stream's XXH3: what it compares is data at rest that
//! anyone who could write the output could have changed, and a cryptographic hash makes a
//! matching chunk the same bytes; BLAKE3 is the official crate of its authors, already in the
//! tree, and hashes at several GB/s, so the check costs about one read of the held part on
//! each side.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::{Error, StreamHasher};

/// The bytes each chunk hash covers (the last one less).
pub const CHUNK: u64 = 1 << 20;

/// The state file's name is the output's with this after it.
pub const STATE_SUFFIX: &str = ".mpcat-resume";

/// The most of a state file that is read: a valid one is [`STATE_LEN`] bytes.
pub const MAX_STATE: u64 = 4096;

const MAGIC: [u8; 8] = *b"TKMPRSM1";
/// Magic, length, modification time, and 16 bytes of BLAKE3 over the three.
pub const STATE_LEN: usize = 8 + 8 + 8 + 16;

/// The input file as the sender names it: a changed length or modification time is a
/// changed input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub size: u64,
    /// Nanoseconds since the epoch.
    pub mtime_ns: u64,
}

impl Source {
    /// The identity of the file `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> Source {
        use std::os::unix::fs::MetadataExt;
        let ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        Source {
            size: meta.len(),
            mtime_ns: u64::try_from(ns).unwrap_or(0),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} bytes, modified at {}.{:09} s after the epoch",
            self.size,
            self.mtime_ns / 1_000_000_000,
            self.mtime_ns % 1_000_000_000
        )
    }
}

/// Why a state file is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("{len} bytes, a resume state is {STATE_LEN}")]
    Length { len: usize },
    #[error("not an mpcat resume state (magic {found:02x?})")]
    Magic { found: [u8; 8] },
    #[error("its check does not match its contents (damaged)")]
    Check,
}

/// What the receiver keeps beside its output between a break and a `--resume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub source: Source,
}

impl State {
    /// The state in `b`, which must be exactly one record whose check matches.
    pub fn parse(b: &[u8]) -> Result<State, StateError> {
        let b: &[u8; STATE_LEN] = b
            .try_into()
            .map_err(|_| StateError::Length { len: b.len() })?;
        let (head, check) = b.split_at(STATE_LEN - 16);
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&head[..8]);
        if magic != MAGIC {
            return Err(StateError::Magic { found: magic });
        }
        if blake3::hash(head).as_bytes()[..16] != *check {
            return Err(StateError::Check);
        }
        let u = |at: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&head[at..at + 8]);
            u64::from_be_bytes(x)
        };
        Ok(State {
            source: Source {
                size: u(8),
                mtime_ns: u(16),
            },
        })
    }

    pub fn emit(&self) -> [u8; STATE_LEN] {
        let mut b = [0u8; STATE_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..16].copy_from_slice(&self.source.size.to_be_bytes());
        b[16..24].copy_from_slice(&self.source.mtime_ns.to_be_bytes());
        let check = blake3::hash(&b[..24]);
        b[24..].copy_from_slice(&check.as_bytes()[..16]);
        b
    }
}

/// The state file of `output`.
pub fn state_path(output: &Path) -> PathBuf {
    let mut s = output.as_os_str().to_owned();
    s.push(STATE_SUFFIX);
    PathBuf::from(s)
}

/// The state kept at `path`: None when there is none; an error naming the file when it is
/// there and not a state (never more than [`MAX_STATE`] bytes of it read).
pub fn read_state(path: &Path) -> Result<Option<State>, Error> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    let mut b = Vec::new();
    f.take(MAX_STATE + 1)
        .read_to_end(&mut b)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    State::parse(&b).map(Some).map_err(|e| {
        Error::msg(format!(
            "{}: {e}; remove it to send the whole input again",
            path.display()
        ))
    })
}

/// Writes `state` to `path` whole or not at all (a temporary file, synced, renamed over it).
pub fn write_state(path: &Path, state: &State) -> Result<(), Error> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let w = || -> io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&state.emit())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    w().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("write {}", path.display()), e)
    })
}

/// Why the receiver cannot resume from what it keeps: the input named now is not the one
/// the state file recorded.
pub fn changed(output: &Path, was: &Source, now: &Source) -> String {
    format!(
        "--resume: the input changed since the transfer broke off (then {}; now {}): remove {} to send it whole",
        was.describe(),
        now.describe(),
        state_path(output).display()
    )
}

/// The hash of chunk `k` of `file`'s first `held` bytes, the stream hash taking its bytes
/// too (`buf`: a scratch buffer). A file shorter than `held` is an UnexpectedEof error.
pub fn chunk_hash(
    file: &File,
    k: u64,
    held: u64,
    buf: &mut Vec<u8>,
    stream: &mut StreamHasher,
) -> io::Result<[u8; 32]> {
    let at = k * CHUNK;
    let len = held.saturating_sub(at).min(CHUNK) as usize;
    buf.resize(len, 0);
    file.read_exact_at(buf, at)?;
    stream.update(buf);
    Ok(*blake3::hash(buf).as_bytes())
}

/// The `mpcat_resume` fuzz target's body: a state file of any bytes is refused or taken, and
/// one taken emits back to the same bytes; a held-bytes answer of any bytes parses or is
/// refused within its bounds.
pub fn fuzz_state(data: &[u8]) {
    if let Ok(s) = State::parse(data) {
        assert_eq!(&s.emit()[..], data, "a state taken emits back to its bytes");
    }
    let mut b = data.to_vec();
    if b.len() >= STATE_LEN {
        // Given the magic and a good check, the fields are taken whatever they say.
        b[..8].copy_from_slice(&MAGIC);
        b.truncate(STATE_LEN);
        let check = blake3::hash(&b[..24]);
        b[24..].copy_from_slice(&check.as_bytes()[..16]);
        let s = State::parse(&b).expect("a record with its check");
        assert_eq!(s.emit(), b[..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        State {
            source: Source {
                size: 123_456_789,
                mtime_ns: 1_764_000_000_987_654_321,
            },
        }
    }

    #[test]
    fn a_state_round_trips_and_every_damage_is_refused() {
        let b = sample().emit();
        assert_eq!(State::parse(&b), Ok(sample()));
        for cut in 0..STATE_LEN {
            assert_eq!(
                State::parse(&b[..cut]),
                Err(StateError::Length { len: cut })
            );
        }
        let mut long = b.to_vec();
        long.push(0);
        assert!(State::parse(&long).is_err());
        for i in 0..STATE_LEN {
            let mut bad = b;
            bad[i] ^= 0x40;
            assert!(State::parse(&bad).is_err(), "byte {i} flipped");
        }
        let mut other = b;
        other[..8].copy_from_slice(b"GARBAGE!");
        assert!(matches!(
            State::parse(&other),
            Err(StateError::Magic { .. })
        ));
    }

    #[test]
    fn a_state_file_is_read_bounded_and_written_whole() {
        let dir = std::env::temp_dir().join(format!("mpcat-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out.bin");
        let p = state_path(&out);
        assert_eq!(p, dir.join("out.bin.mpcat-resume"));
        assert!(read_state(&p).unwrap().is_none());
        write_state(&p, &sample()).unwrap();
        assert_eq!(read_state(&p).unwrap(), Some(sample()));
        // A huge file is read no further than the bound, and refused.
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        let e = read_state(&p).unwrap_err().line();
        assert!(e.contains(&format!("{} bytes", MAX_STATE + 1)), "{e}");
        assert!(e.contains("remove it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn chunk_hashes_cover_the_held_bytes_and_feed_the_stream_hash() {
        let dir = std::env::temp_dir().join(format!("mpcat-resume-h-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let bytes: Vec<u8> = (0..(CHUNK as usize * 2 + 10)).map(|i| i as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        let f = File::open(&p).unwrap();
        let held = CHUNK * 2 + 5;
        let (mut buf, mut h) = (Vec::new(), StreamHasher::new());
        let hs: Vec<[u8; 32]> = (0..held.div_ceil(CHUNK))
            .map(|k| chunk_hash(&f, k, held, &mut buf, &mut h).unwrap())
            .collect();
        assert_eq!(hs.len(), 3);
        assert_eq!(
            hs[2],
            *blake3::hash(&bytes[2 * CHUNK as usize..held as usize]).as_bytes()
        );
        assert_eq!(h.finish(), crate::stream_hash(&bytes[..held as usize]));
        assert!(chunk_hash(&f, 3, CHUNK * 4, &mut buf, &mut h).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_fuzz_body_runs_over_the_seed_corpus_and_random_bytes() {
        let seeds = tcpkit_lab::corpus::seeds("mpcat_resume");
        assert!(seeds.len() >= 3, "{} seeds", seeds.len());
        for s in &seeds {
            fuzz_state(&s.bytes);
        }
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for len in 0..200 {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            fuzz_state(&data);
        }
    }

    /// Writes the seed corpus (run by hand: `cargo test -p tcpkit-mpcat write_resume_corpus
    /// -- --ignored`).
    #[test]
    #[ignore = "writes fuzz/corpus/mpcat_resume"]
    fn write_resume_corpus() {
        let put = |name: &str, b: &[u8]| tcpkit_lab::corpus::write("mpcat_resume", name, b);
        let b = sample().emit();
        put("state", &b);
        put("state-cut", &b[..20]);
        let mut bad = b;
        bad[30] ^= 1;
        put("state-bad-check", &bad);
        put("empty", &[]);
    }
}
