//! The names of the files a run writes (`--hdr-log`, `-R`/`--per-query`): FILE itself from one
//! process, FILE.K from worker process K of several; and finding them again after the run,
//! for whoever reads them (`--plot`).

use std::path::{Path, PathBuf};

/// The path process `k` of `n` writes for output path `p`: `p` itself when it runs alone,
/// `p.K` when there are several processes.
pub(crate) fn per_proc_path(p: &Path, k: u32, n: u32) -> PathBuf {
    if n <= 1 {
        return p.to_path_buf();
    }
    suffixed(p, k)
}

fn suffixed(p: &Path, k: u32) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(format!(".{k}"));
    s.into()
}

/// The HDR interval logs a run wrote for `--hdr-log base`: the file itself, or one per process
/// (`base.0`, `base.1`, … up to the first missing one), in process order.
pub fn hdr_logs(base: &Path) -> Vec<PathBuf> {
    if base.exists() {
        return vec![base.to_path_buf()];
    }
    (0..)
        .map(|k| suffixed(base, k))
        .take_while(|p| p.exists())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_writes_the_file_itself() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("run.hlog");
        assert_eq!(per_proc_path(&base, 0, 1), base);
        assert!(hdr_logs(&base).is_empty(), "nothing written yet");
        std::fs::write(per_proc_path(&base, 0, 1), "").unwrap();
        assert_eq!(hdr_logs(&base), vec![base]);
    }

    #[test]
    fn several_processes_write_one_file_each_found_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("run.hlog");
        let written: Vec<PathBuf> = (0..3).map(|k| per_proc_path(&base, k, 3)).collect();
        assert_eq!(written[2], dir.path().join("run.hlog.2"));
        // Written out of order, as worker processes finish.
        for p in written.iter().rev() {
            std::fs::write(p, "").unwrap();
        }
        assert_eq!(hdr_logs(&base), written);
        // A missing process's file ends the list: what follows is not of this run.
        std::fs::remove_file(&written[1]).unwrap();
        assert_eq!(hdr_logs(&base), written[..1]);
    }
}
