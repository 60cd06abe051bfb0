//! The id of one run (`run_id` in load's report): made by `load` for each run and by `merge`
//! for each merged report, so that `merge` can refuse one run given twice. Below both, so
//! that neither imports the other for it.

/// A fresh run id: 128 random bits in hex, from getrandom(2). Two runs, on one host or on
/// several, do not share one, which is what lets `merge` refuse one run given twice.
pub(crate) fn new_run_id() -> String {
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writes at most the rest of `b` into `b`.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n > 0 {
            got += n as usize;
        } else if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // No getrandom (a very old kernel): the time and pid, still unique per run.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let v = t ^ (u128::from(std::process::id()) << 96);
            return format!("{v:032x}");
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_128_bits_in_hex_and_differ() {
        let a = new_run_id();
        let b = new_run_id();
        for id in [&a, &b] {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.bytes()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{id}"
            );
        }
        assert_ne!(a, b);
    }
}
