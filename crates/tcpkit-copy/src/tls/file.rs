//! The key log file, read as it grows: a client still running appends a session's secrets
//! while copy runs. Each poll reads what was appended since the last; a file truncated or
//! replaced (a new client run) is read again from its start, the secrets already read kept.
//! A file that does not exist yet (live capture started before the client) is read once it
//! appears.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use tcpkit_tls::decrypt::KeyLog;

/// Read per poll at most, so a huge file cannot stall the copy's loop for long.
const READ_PER_POLL: usize = 4 << 20;

#[derive(Debug)]
pub(crate) struct KeyLogFile {
    path: PathBuf,
    file: Option<(File, u64)>,
    pos: u64,
    buf: Vec<u8>,
    pub log: KeyLog,
}

impl KeyLogFile {
    pub(crate) fn new(path: &Path) -> KeyLogFile {
        KeyLogFile {
            path: path.to_path_buf(),
            file: None,
            pos: 0,
            buf: vec![0; 64 << 10],
            log: KeyLog::new(),
        }
    }

    /// Reads what was appended; whether any secret came with it.
    pub(crate) fn poll(&mut self) -> bool {
        let before = self.log.secrets;
        // A poll that fails (the file gone for a moment) is tried again at the next.
        let _ = self.read();
        self.log.secrets > before
    }

    fn read(&mut self) -> io::Result<()> {
        let meta = std::fs::metadata(&self.path)?;
        let replaced = match &self.file {
            Some((_, ino)) => *ino != meta.ino() || meta.len() < self.pos,
            None => true,
        };
        if replaced {
            self.file = Some((File::open(&self.path)?, meta.ino()));
            self.pos = 0;
            // A line cut by the old file's end is not finished by the new file's start.
            self.log.feed(&[], true);
        }
        let Some((f, _)) = self.file.as_mut() else {
            return Ok(());
        };
        let mut read = 0;
        while read < READ_PER_POLL {
            let n = f.read(&mut self.buf)?;
            if n == 0 {
                break;
            }
            self.log.feed(&self.buf[..n], false);
            self.pos += n as u64;
            read += n;
        }
        Ok(())
    }
}
