//! Names the commit a binary was built from, for `tcpkit --version`:
//! `tcpkit 0.1.0 (abc1234[-dirty] 2026-11-28)`, the commit's short hash, `-dirty` when tracked
//! files differed from it, and the commit's date (not the build's, so two builds of one
//! commit say the same). Read from git when this crate sits in the git work tree of its own
//! workspace; otherwise (a source tarball, or a tarball unpacked inside some other
//! repository) from TCPKIT_COMMIT and TCPKIT_COMMIT_DATE, which also override git when set,
//! as a distribution's build would; with neither, `unknown`. Never fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TCPKIT_COMMIT");
    println!("cargo:rerun-if-env-changed=TCPKIT_COMMIT_DATE");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let from_env = std::env::var("TCPKIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            let date = std::env::var("TCPKIT_COMMIT_DATE").unwrap_or_default();
            (c.trim().to_string(), date.trim().to_string())
        });
    let commit = from_env.or_else(|| from_git(&manifest));
    let text = match commit {
        Some((c, d)) if d.is_empty() => c,
        Some((c, d)) => format!("{c} {d}"),
        None => "unknown".to_string(),
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=TCPKIT_LONG_VERSION={version} ({text})");
}

/// `git` in `dir`, its trimmed stdout when it succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        // `git status` must not refresh the index: a write there would trigger this script
        // again on the next build.
        .arg("--no-optional-locks")
        .args(args)
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The commit of the work tree this crate is in, with `-dirty`, and its date; None when this
/// crate is not in a git work tree whose top is the workspace's root.
fn from_git(manifest: &Path) -> Option<(String, String)> {
    let root = manifest.parent()?.parent()?.canonicalize().ok()?;
    let top = git(manifest, &["rev-parse", "--show-toplevel"])?;
    if Path::new(&top).canonicalize().ok()? != root {
        return None;
    }
    // Run again when HEAD moves (a checkout, a commit on the branch HEAD names) or the index
    // changes (git add, a commit); paths from git, since a worktree keeps HEAD and the index
    // apart from the refs.
    let mut watch = vec!["HEAD".to_string(), "index".to_string()];
    if let Some(r) = git(manifest, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(r);
    }
    watch.push("packed-refs".into());
    for w in watch {
        if let Some(p) = git(manifest, &["rev-parse", "--git-path", &w]) {
            let p = if Path::new(&p).is_absolute() {
                PathBuf::from(p)
            } else {
                manifest.join(p)
            };
            // A path that does not exist would make cargo run this script on every build.
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    let hash = git(manifest, &["rev-parse", "--short=7", "HEAD"])?;
    let date = git(manifest, &["show", "-s", "--format=%cs", "HEAD"]).unwrap_or_default();
    let dirty = git(manifest, &["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|s| !s.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    Some((format!("{hash}{suffix}"), date))
}
