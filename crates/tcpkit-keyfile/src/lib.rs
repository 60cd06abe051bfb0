//! tcpkit-keyfile: the rules every pre-shared key file follows (intercept and copy's
//! `--auth-key-file`, mpcat's `--psk-file`), written once so both read a key the same way:
//! a regular file, readable by its owner alone (as ssh asks of a private key, since whoever
//! reads it reads the data it guards), at most [`MAX_KEY_LEN`] bytes, and at least
//! [`MIN_KEY_LEN`] once trailing whitespace (a final newline) is left out, so a key written
//! by `openssl rand -base64 32 > FILE` or an editor reads the same on both hosts. What the key
//! then becomes (a Noise psk) is the job's business, except the HMAC challenge-response two
//! parts prove it with (copy and intercept's control channel, the fleet barrier): [`proof`].
#![warn(missing_docs)]

pub mod proof;

use std::io::{self, Read};
use std::path::Path;

/// The shortest key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;
/// The longest key file read, in bytes.
pub const MAX_KEY_LEN: usize = 4096;

/// Why a key file was not taken. The caller names its flag and the file.
#[derive(Debug)]
pub enum KeyFileError {
    /// The file could not be opened or read.
    Read(io::Error),
    /// The file breaks a rule: why, with what to do.
    Bad(String),
}

/// The key in `bytes`: trailing whitespace left out, at least [`MIN_KEY_LEN`] bytes.
pub fn key_bytes(bytes: &[u8]) -> Result<&[u8], String> {
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let k = &bytes[..end];
    if k.len() < MIN_KEY_LEN {
        return Err(format!(
            "the key is {} bytes, at least {MIN_KEY_LEN} are needed (make one with 'openssl rand -base64 32 > FILE; chmod 600 FILE')",
            k.len()
        ));
    }
    Ok(k)
}

/// Reads the key file at `path` under the rules above; returns the key's bytes.
pub fn read(path: &Path) -> Result<Vec<u8>, KeyFileError> {
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::File::open(path).map_err(KeyFileError::Read)?;
    let meta = f.metadata().map_err(KeyFileError::Read)?;
    if !meta.is_file() {
        return Err(KeyFileError::Bad("not a regular file".into()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Bad(format!(
            "readable by others than its owner (mode {mode:04o}): chmod 600 it"
        )));
    }
    let mut bytes = Vec::new();
    f.take(MAX_KEY_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(KeyFileError::Read)?;
    if bytes.len() > MAX_KEY_LEN {
        return Err(KeyFileError::Bad(format!(
            "longer than {MAX_KEY_LEN} bytes: not a key file"
        )));
    }
    key_bytes(&bytes)
        .map(<[u8]>::to_vec)
        .map_err(KeyFileError::Bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(dir: &Path, name: &str, body: &[u8], mode: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn each_rule_says_why() {
        let d = tempfile_dir();
        let ok = file(&d, "ok", b"0123456789abcdef\n\n", 0o600);
        assert_eq!(read(&ok).unwrap(), b"0123456789abcdef");
        let open = file(&d, "open", b"0123456789abcdef", 0o644);
        let short = file(&d, "short", b"0123456789abcde \n", 0o600);
        let long = file(&d, "long", &[b'k'; MAX_KEY_LEN + 1], 0o600);
        for (p, want) in [
            (&open, "mode 0644): chmod 600 it"),
            (&short, "the key is 15 bytes, at least 16"),
            (&long, "longer than 4096 bytes"),
        ] {
            match read(p) {
                Err(KeyFileError::Bad(why)) => assert!(why.contains(want), "{why}"),
                other => panic!("{}: {other:?}", p.display()),
            }
        }
        assert!(matches!(read(&d), Err(KeyFileError::Bad(w)) if w == "not a regular file"));
        assert!(matches!(read(&d.join("none")), Err(KeyFileError::Read(_))));
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tcpkit-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
