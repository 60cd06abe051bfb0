//! Where each OpenSSL version keeps the secrets in its SSL object: a small table of layouts
//! by version range, each with its source, and the library's version read from its own
//! "OpenSSL X.Y.Z" string. The secrets mode reads the library's memory at these offsets, so a
//! library whose version is not in the table is refused (the per-call probes,
//! `--tls-uprobe-calls`, need no layout); a layout that is wrong all the same is caught at run
//! time: the client random read must be the one the captured ClientHello carried.

use std::path::{Path, PathBuf};

use crate::record::RawLayout;

/// An OpenSSL release: (major, minor, patch).
pub type Release = (u32, u32, u32);

/// One row of the table: the releases it covers, its offsets, where they come from.
struct Row {
    from: Release,
    to: Release,
    layout: RawLayout,
    source: &'static str,
}

/// OpenSSL 3.0.0-3.0.11, 3.0.13 on, and 3.1: ssl_st and ssl_session_st as ssl/ssl_local.h
/// lays them out on x86_64 and arm64 (LP64).
const OPENSSL_30: RawLayout = RawLayout {
    version: 0x0,
    rbio: 0x10,
    session: 0x918,
    client_random: 0x160,
    handshake_secret: 0x584,
    handshake_traffic_hash: 0x704,
    client_app_secret: 0x744,
    server_app_secret: 0x784,
    master_key_length: 0x8,
    master_key: 0x50,
    cipher: 0x2f8,
    cipher_id: 0x18,
    bio_num: 0x38,
    pad: 0,
};

const SOURCE_30: &str = "ecapture kern/openssl_3_0_0_kern.c (offsetof over OpenSSL 3.0/3.1's \
     ssl/ssl_local.h); checked against Debian 12's libssl3 3.0.19 by the lab tests";

const TABLE: [Row; 3] = [
    Row {
        from: (3, 0, 0),
        to: (3, 0, 11),
        layout: OPENSSL_30,
        source: SOURCE_30,
    },
    // 3.0.12 alone had ssl_st's session 32 bytes further (a field added, then taken out).
    Row {
        from: (3, 0, 12),
        to: (3, 0, 12),
        layout: RawLayout {
            session: 0x938,
            ..OPENSSL_30
        },
        source: "ecapture kern/openssl_3_0_12_kern.c",
    },
    Row {
        from: (3, 0, 13),
        to: (3, 1, 99),
        layout: OPENSSL_30,
        source: SOURCE_30,
    },
];

/// The layout of `release`, and where its offsets come from.
pub(crate) fn lookup(release: Release) -> Option<(RawLayout, &'static str)> {
    TABLE
        .iter()
        .find(|r| r.from <= release && release <= r.to)
        .map(|r| (r.layout, r.source))
}

/// The first "OpenSSL X.Y.Z" in `bytes` (a library's version text, e.g. "OpenSSL 3.0.19 27
/// Jan 2026"), as a release.
pub fn find_release(bytes: &[u8]) -> Option<Release> {
    const TAG: &[u8] = b"OpenSSL ";
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(TAG.len()).position(|w| w == TAG) {
        let start = at + i + TAG.len();
        let text: Vec<u8> = bytes[start..]
            .iter()
            .take(16)
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .copied()
            .collect();
        let parts: Vec<u32> = std::str::from_utf8(&text)
            .unwrap_or("")
            .split('.')
            .map_while(|p| p.parse().ok())
            .collect();
        if let [a, b, c, ..] = parts[..] {
            return Some((a, b, c));
        }
        at = start;
    }
    None
}

/// Where a library's version text is: the file itself (a binary with OpenSSL linked in), else
/// the libcrypto beside a libssl (libssl.so.3 keeps none of its own; OpenSSL_version is
/// libcrypto's).
fn candidates(path: &Path) -> Vec<PathBuf> {
    let mut v = vec![path.to_path_buf()];
    if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
        if let Some(rest) = name.strip_prefix("libssl") {
            v.push(path.with_file_name(format!("libcrypto{rest}")));
        }
    }
    v
}

/// The OpenSSL release `path` is (or links), read from its version text.
pub fn release_of(path: &Path) -> Result<Release, String> {
    for c in candidates(path) {
        let Ok(bytes) = std::fs::read(&c) else {
            continue;
        };
        if let Some(r) = find_release(&bytes) {
            return Ok(r);
        }
    }
    Err("no \"OpenSSL X.Y.Z\" version text in it (nor in the libcrypto beside it)".into())
}

/// The layout for `path`'s library, or why there is none (a sentence naming the version).
pub(crate) fn for_library(path: &Path) -> Result<(Release, RawLayout, &'static str), String> {
    const CALLS: &str = "--tls-uprobe-calls probes every SSL_read/SSL_write instead, needing none";
    let r = release_of(path).map_err(|e| format!("{e}; {CALLS}"))?;
    match lookup(r) {
        Some((l, src)) => Ok((r, l, src)),
        None => Err(format!(
            "OpenSSL {}.{}.{}: no known layout of its SSL object (known: 3.0.x, 3.1.x); {CALLS}",
            r.0, r.1, r.2
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_text_is_found_and_the_table_covers_openssl_3_0_and_3_1() {
        assert_eq!(
            find_release(b"\0\0OpenSSL 1\0xx OpenSSL 3.0.19 27 Jan 2026\0"),
            Some((3, 0, 19))
        );
        assert_eq!(find_release(b"OpenSSL 3.x"), None);
        assert_eq!(lookup((3, 0, 19)).map(|l| l.0.session), Some(0x918));
        assert_eq!(lookup((3, 0, 12)).map(|l| l.0.session), Some(0x938));
        assert_eq!(lookup((3, 1, 4)).map(|l| l.0.session), Some(0x918));
        assert!(lookup((3, 2, 0)).is_none());
        assert!(lookup((1, 1, 1)).is_none());
    }

    #[test]
    fn debians_libssl3_is_read_through_its_libcrypto() {
        // scripts/setup.sh installs it (nginx's).
        let lib = Path::new("/usr/lib/x86_64-linux-gnu/libssl.so.3");
        let (r, l, _) = for_library(lib).unwrap();
        assert_eq!(r.0, 3);
        assert_eq!(l.client_random, 0x160);
    }
}
