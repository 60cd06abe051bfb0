//! Issue 25 item 1: the Debian package `scripts/package.sh` builds, as a user meets it: the
//! files it holds, units that `systemd-analyze verify` accepts (and a broken one it is made to
//! refuse), installed and removed on this machine with nothing left behind, each conf file's
//! settings parsing as its role's flags, and the echo unit's command run as systemd runs it.
//!
//! The package is made once per test process from the binary these tests already have
//! (`--profile <its profile> --no-build`), under `<target>/<profile>/package-test.<pid>/`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::peer::SRV;
use common::{stderr, stdout, tcpkit};
use tcpkit_lab::{KillOnDrop, Lab};

/// Each unit and the subcommand its ExecStart runs.
const UNITS: [(&str, &str); 4] = [
    ("tcpkit-echo", "echo"),
    ("tcpkit-intercept", "intercept"),
    ("tcpkit-balance", "balance up"),
    ("tcpkit-copy", "copy"),
];
const UNIT_DIR: &str = "usr/lib/systemd/system";

fn unit_path(unit: &str) -> String {
    format!("/{UNIT_DIR}/{unit}.service")
}

fn conf_path(unit: &str) -> String {
    format!("/etc/tcpkit/{}.conf", unit.trim_start_matches("tcpkit-"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let o = run(cmd);
    assert!(o.status.success(), "{cmd:?}: {}: {}", o.status, stderr(&o));
    stdout(&o)
}

/// The package, and the tree it unpacks to (`dpkg-deb -x`).
#[derive(Debug)]
struct Built {
    deb: PathBuf,
    root: PathBuf,
}

/// scripts/package.sh run once for this process on the tests' own binary. It runs in a target
/// directory of its own holding only that binary: cargo-deb deletes the target directory's
/// earlier tcpkit .debs and stages its work in one fixed directory there, which would take a
/// package someone made from under them, or collide with another run.
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let bin = Path::new(tcpkit());
        let profile_dir = bin.parent().expect("the binary's directory");
        let profile = profile_dir.file_name().unwrap().to_str().unwrap();
        // Each process's own (statics are never dropped: the next run sweeps those of
        // processes that have ended).
        for e in std::fs::read_dir(profile_dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("package-test.") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = profile_dir.join(format!("package-test.{}", std::process::id()));
        let target = dir.join("target");
        std::fs::create_dir_all(target.join(profile)).unwrap();
        std::fs::hard_link(bin, target.join(profile).join("tcpkit"))
            .or_else(|_| std::fs::copy(bin, target.join(profile).join("tcpkit")).map(drop))
            .unwrap();
        let t = Instant::now();
        let o = run(Command::new(repo().join("scripts/package.sh"))
            .args(["--profile", profile, "--no-build", "--fast"])
            .env("CARGO_TARGET_DIR", &target));
        assert!(o.status.success(), "package.sh: {}", stderr(&o));
        eprintln!("package.sh --no-build: {:.1} s", t.elapsed().as_secs_f64());
        let debs: Vec<PathBuf> = std::fs::read_dir(target.join("debian"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(debs.len(), 1, "package.sh made {debs:?}");
        let root = dir.join("root");
        ok(Command::new("dpkg-deb").arg("-x").arg(&debs[0]).arg(&root));
        Built {
            deb: debs[0].clone(),
            root,
        }
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `tcpkit --version`'s line from `bin`.
fn version(bin: &Path, flag: &str) -> String {
    ok(Command::new(bin).arg(flag)).trim().to_string()
}

#[test]
fn version_names_the_version_and_the_commit() {
    let v = version(Path::new(tcpkit()), "--version");
    assert_eq!(version(Path::new(tcpkit()), "-V"), v);
    let inner = v
        .strip_prefix(&format!("tcpkit {} (", env!("CARGO_PKG_VERSION")))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{v:?}: not `tcpkit VERSION (COMMIT DATE)`"));
    // The build takes TCPKIT_COMMIT over git (build.rs); the test sees the same environment.
    if let Some(want) = std::env::var("TCPKIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
    {
        assert!(inner.starts_with(want.trim()), "{v:?}: want {want}");
        return;
    }
    // As build.rs: git's answer counts only in this workspace's own work tree.
    let git = |args: &[&str]| {
        Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR")])
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
    };
    let ours = git(&["rev-parse", "--show-toplevel"]).is_some_and(|o| {
        Path::new(stdout(&o).trim()).canonicalize().ok() == repo().canonicalize().ok()
    });
    let Some(git) = git(&["rev-parse", "HEAD"]).filter(|_| ours) else {
        assert_eq!(inner, "unknown", "{v:?}: built outside git");
        return;
    };
    let (commit, date) = inner
        .split_once(' ')
        .unwrap_or_else(|| panic!("{v:?}: no date"));
    let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        hash.len() >= 7 && stdout(&git).starts_with(hash),
        "{v:?}: {hash} is not HEAD ({})",
        stdout(&git).trim()
    );
    let d: Vec<&str> = date.split('-').collect();
    assert!(
        d.len() == 3 && d.iter().all(|p| p.chars().all(|c| c.is_ascii_digit())),
        "{v:?}: {date} is not YYYY-MM-DD"
    );
}

/// The files (not directories) in the package, as absolute paths.
fn files_in(deb: &Path) -> BTreeSet<String> {
    ok(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .filter(|l| !l.starts_with('d'))
        .map(|l| {
            let name = l.split_whitespace().nth(5).expect("a name");
            name.trim_start_matches('.').to_string()
        })
        .collect()
}

#[test]
fn the_deb_holds_the_binary_pages_completions_units_and_confs() {
    let b = built();
    let arch = ok(Command::new("dpkg").arg("--print-architecture"));
    assert_eq!(
        b.deb.file_name().unwrap().to_str().unwrap(),
        format!("tcpkit_{}_{}.deb", env!("CARGO_PKG_VERSION"), arch.trim())
    );
    // Every page `tcpkit man` writes, compressed, and nothing else.
    let pages = tempfile::tempdir().unwrap();
    ok(Command::new(tcpkit()).arg("man").arg(pages.path()));
    let mut want: BTreeSet<String> = std::fs::read_dir(pages.path().join("man1"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name();
            format!("/usr/share/man/man1/{}.gz", name.to_str().unwrap())
        })
        .collect();
    assert!(want.len() > 10, "{want:?}");
    for (unit, _) in UNITS {
        want.insert(unit_path(unit));
        want.insert(conf_path(unit));
    }
    for f in [
        "/usr/bin/tcpkit",
        "/usr/share/bash-completion/completions/tcpkit",
        "/usr/share/zsh/vendor-completions/_tcpkit",
        "/usr/share/fish/vendor_completions.d/tcpkit.fish",
        "/usr/share/doc/tcpkit/README.md",
        "/usr/share/doc/tcpkit/copyright",
    ] {
        want.insert(f.to_string());
    }
    assert_eq!(files_in(&b.deb), want);
    // The confs are conffiles: dpkg keeps an edited one.
    let conffiles: BTreeSet<String> = ok(Command::new("dpkg-deb")
        .arg("-I")
        .arg(&b.deb)
        .arg("conffiles"))
    .lines()
    .map(str::to_string)
    .collect();
    let confs: BTreeSet<String> = UNITS.iter().map(|(u, _)| conf_path(u)).collect();
    assert_eq!(conffiles, confs);
    // What is packaged is this binary, its pages and its completions.
    let packaged = b.root.join("usr/bin/tcpkit");
    assert_eq!(
        version(&packaged, "--version"),
        version(Path::new(tcpkit()), "--version")
    );
    let page = ok(Command::new("zcat").arg(b.root.join("usr/share/man/man1/tcpkit-echo.1.gz")));
    let written = std::fs::read_to_string(pages.path().join("man1/tcpkit-echo.1")).unwrap();
    assert_eq!(page, written);
    let bash = std::fs::read_to_string(b.root.join("usr/share/bash-completion/completions/tcpkit"))
        .unwrap();
    assert_eq!(
        bash,
        ok(Command::new(tcpkit()).args(["completions", "bash"]))
    );
}

/// `systemd-analyze verify` as a check that can fail: it exits 0 on a value it cannot parse
/// or a key it does not know (it warns and ignores them, as systemd would at boot), so any
/// word it prints is a failure too. Units installed on this machine (no `root`) also have the
/// pages their Documentation= names checked with man.
fn verify(root: Option<&Path>, units: &[String]) -> Result<(), String> {
    let mut cmd = Command::new("systemd-analyze");
    cmd.arg("verify");
    match root {
        Some(r) => cmd.arg("--man=no").arg(format!("--root={}", r.display())),
        None => cmd.arg("--man=yes"),
    };
    let o = run(cmd.args(units));
    let said = format!("{}{}", stdout(&o), stderr(&o));
    if o.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {said}", o.status))
    }
}

#[test]
fn systemd_analyze_verify_accepts_every_unit_and_refuses_a_broken_one() {
    let b = built();
    // A root holding this host's units (verify needs the targets they name) and the package.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("usr/lib/systemd")).unwrap();
    ok(Command::new("cp")
        .arg("-a")
        .arg(format!("/{UNIT_DIR}"))
        .arg(root.path().join("usr/lib/systemd/")));
    ok(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&b.deb)
        .arg(root.path()));
    // ... and the other programs the units run (ExecReload's kill), from this host: verify
    // checks that each is there.
    for (unit, _) in UNITS {
        let text = std::fs::read_to_string(b.root.join(&unit_path(unit)[1..])).unwrap();
        for (key, lines) in service_section(&text) {
            for l in lines.iter().filter(|_| key.starts_with("Exec")) {
                let prog = l.trim_start_matches(['-', '@', ':', '+', '!']);
                let prog = prog.split_whitespace().next().unwrap_or_default();
                if prog != "/usr/bin/tcpkit" {
                    let to = root.path().join(prog.trim_start_matches('/'));
                    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                    std::fs::copy(prog, &to).unwrap_or_else(|e| panic!("{unit}: {prog}: {e}"));
                }
            }
        }
    }
    let names: Vec<String> = UNITS.iter().map(|(u, _)| format!("{u}.service")).collect();
    verify(Some(root.path()), &names).unwrap_or_else(|e| panic!("{e}"));

    let echo = std::fs::read_to_string(root.path().join(&unit_path("tcpkit-echo")[1..])).unwrap();
    let broken = root.path().join(UNIT_DIR).join("tcpkit-broken.service");
    let check = |text: &str| {
        std::fs::write(&broken, text).unwrap();
        verify(Some(root.path()), &["tcpkit-broken.service".into()])
    };
    // The same unit under another name passes: what fails below is the error alone.
    check(&echo).unwrap_or_else(|e| panic!("the echo unit as tcpkit-broken: {e}"));
    for (what, from, to) in [
        (
            "a value systemd cannot parse",
            "Restart=on-failure",
            "Restart=on-failur",
        ),
        ("an unknown key", "KillMode=mixed", "KilMode=mixed"),
        (
            "a missing binary",
            "ExecStart=/usr/bin/tcpkit",
            "ExecStart=/usr/bin/tcpkitt",
        ),
        ("no command", "ExecStart=", "#ExecStart="),
    ] {
        assert!(echo.contains(from), "{from:?} not in the echo unit");
        let e = check(&echo.replace(from, to));
        assert!(e.is_err(), "verify passed {what} ({to})");
    }
}

/// A lock held across the install test's whole life, machine-wide: a flock on dpkg's database
/// directory, which dpkg itself never flocks (it takes fcntl locks on its lock files), so two
/// test processes never install the package at once and nothing is left behind for it.
struct MachineLock {
    _held: std::fs::File,
}

impl MachineLock {
    fn take() -> MachineLock {
        let f = std::fs::File::open("/var/lib/dpkg").expect("open /var/lib/dpkg");
        // SAFETY: flock on a descriptor this struct owns; it is released when it closes.
        let r = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
        assert_eq!(
            r,
            0,
            "flock /var/lib/dpkg: {}",
            std::io::Error::last_os_error()
        );
        MachineLock { _held: f }
    }
}

/// dpkg's state of package tcpkit: "" when it does not know it.
fn dpkg_status() -> String {
    let o = run(Command::new("dpkg-query").args(["-W", "-f=${Status}", "tcpkit"]));
    if o.status.success() {
        stdout(&o)
    } else {
        String::new()
    }
}

fn dpkg(args: &[&str]) -> Output {
    // No fsync per file: this is a test's install, removed again in seconds. The triggers our
    // files set off (man-db's index, seconds each time) run once, at the end ([`settle`]).
    run(Command::new("dpkg")
        .args(["--force-unsafe-io", "--no-triggers"])
        .args(args))
}

/// The packages whose triggers are waiting to run.
fn triggers_pending() -> BTreeSet<String> {
    ok(Command::new("dpkg-query").args(["-W", "-f=${Package} ${Status}\n"]))
        .lines()
        .filter(|l| l.ends_with(" triggers-pending"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The file man-db's trigger reads to decide whether to rebuild its index (debconf's
/// man-db/auto-update writes it).
const MANDB_AUTO_UPDATE: &str = "/var/lib/man-db/auto-update";

/// man-db's index update, off for as long as this lives and put back on drop (after a panic
/// too). Our pages are installed and purged with triggers deferred, so the index never held
/// them and is as it was; yet man-db's trigger would rescan every page of each directory our
/// files touched (/usr/share/man/man1: ~18,000 pages here) with a disk sync per batch:
/// 12-20 s of the suite spent waiting on the disk (3 s of CPU) to rebuild an unchanged index.
struct ManDbIndexPaused {
    aside: Option<PathBuf>,
}

impl ManDbIndexPaused {
    fn take() -> ManDbIndexPaused {
        let flag = Path::new(MANDB_AUTO_UPDATE);
        let aside = flag.with_extension(format!("tcpkit-test.{}", std::process::id()));
        let moved = std::fs::rename(flag, &aside).is_ok();
        ManDbIndexPaused {
            aside: moved.then_some(aside),
        }
    }

    fn resume(&mut self) -> Result<(), String> {
        match self.aside.take() {
            Some(aside) => std::fs::rename(&aside, MANDB_AUTO_UPDATE).map_err(|e| {
                format!(
                    "put man-db's {MANDB_AUTO_UPDATE} back from {}: {e}",
                    aside.display()
                )
            }),
            None => Ok(()),
        }
    }
}

impl Drop for ManDbIndexPaused {
    fn drop(&mut self) {
        if let Err(e) = self.resume() {
            eprintln!("{e}");
        }
    }
}

/// Runs the triggers the test left pending (those pending before it are not its to run).
fn settle(before: &BTreeSet<String>) -> Result<(), String> {
    let ours: Vec<String> = triggers_pending().difference(before).cloned().collect();
    if ours.is_empty() {
        return Ok(());
    }
    let mut index = ManDbIndexPaused::take();
    let o = run(Command::new("dpkg").arg("--triggers-only").args(&ours));
    index.resume()?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("dpkg --triggers-only {ours:?}: {}", stderr(&o)))
    }
}

/// The package installed on this machine, purged on drop (after a panic too), with any file
/// at one of its paths that no package owned (a completion script copied by hand) put back.
struct Installed {
    _lock: MachineLock,
    pending: BTreeSet<String>,
    moved: Vec<(PathBuf, PathBuf)>,
    backup: Option<tempfile::TempDir>,
    done: bool,
}

impl Installed {
    fn new(deb: &Path) -> Installed {
        let lock = MachineLock::take();
        let status = dpkg_status();
        assert!(
            status.is_empty() || status.ends_with("not-installed"),
            "dpkg knows a tcpkit package on this machine ({status}): this test installs and \
             purges its own and will not replace another (dpkg -P tcpkit first)"
        );
        let mut me = Installed {
            _lock: lock,
            pending: triggers_pending(),
            moved: Vec::new(),
            backup: None,
            done: false,
        };
        for f in files_in(deb) {
            let p = PathBuf::from(&f);
            if p.symlink_metadata().is_err() {
                continue;
            }
            let owner = run(Command::new("dpkg").args(["-S", &f]));
            assert!(
                !owner.status.success(),
                "{f} belongs to {}",
                stdout(&owner).trim()
            );
            let backup = me.backup.get_or_insert_with(|| {
                tempfile::Builder::new()
                    .prefix("tcpkit-package-test-")
                    .tempdir_in("/var/tmp")
                    .unwrap()
            });
            let to = backup
                .path()
                .join(f.trim_start_matches('/').replace('/', "%"));
            eprintln!(
                "{f} exists and no package owns it: kept at {} until the end",
                to.display()
            );
            std::fs::rename(&p, &to).unwrap_or_else(|e| panic!("move {f} aside: {e}"));
            me.moved.push((p, to));
        }
        let o = dpkg(&["-i", deb.to_str().unwrap()]);
        assert!(o.status.success(), "dpkg -i: {}{}", stdout(&o), stderr(&o));
        me
    }

    /// Purges the package and puts back what was moved aside; the errors, if any.
    fn undo(&mut self) -> Vec<String> {
        self.done = true;
        let mut errors = Vec::new();
        if !dpkg_status().is_empty() && !dpkg_status().ends_with("not-installed") {
            let o = dpkg(&["-P", "tcpkit"]);
            if !o.status.success() {
                errors.push(format!("dpkg -P tcpkit: {}", stderr(&o)));
            }
        }
        if let Err(e) = settle(&self.pending) {
            errors.push(e);
        }
        for (p, from) in self.moved.drain(..) {
            if let Err(e) = std::fs::rename(&from, &p) {
                errors.push(format!(
                    "put {} back from {}: {e}",
                    p.display(),
                    from.display()
                ));
            }
        }
        errors
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let errors = self.undo();
        if !errors.is_empty() && !std::thread::panicking() {
            panic!("cleaning up the installed package: {}", errors.join("; "));
        }
        for e in errors {
            eprintln!("cleaning up the installed package: {e}");
        }
    }
}

/// Every path whose name has "tcpkit" in it under the places a package and its maintainer
/// scripts write (not /tmp, /var/tmp or /run, where tests of their own make such names).
fn tcpkit_paths() -> BTreeSet<PathBuf> {
    fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().contains("tcpkit") {
                out.insert(p.clone());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    for d in ["/etc", "/usr", "/var/lib", "/var/log", "/opt", "/srv"] {
        walk(Path::new(d), &mut out);
    }
    out
}

#[test]
fn dpkg_installs_it_here_and_removes_and_purges_it_leaving_nothing() {
    let b = built();
    let before = tcpkit_paths();
    let t = Instant::now();
    let mut inst = Installed::new(&b.deb);
    let t_install = t.elapsed();
    assert_eq!(
        version(Path::new("/usr/bin/tcpkit"), "--version"),
        version(Path::new(tcpkit()), "--version")
    );
    // man finds the pages where the package put them (a page under /usr/local may come first).
    for page in ["tcpkit", "tcpkit-echo", "tcpkit-balance-up"] {
        let found = ok(Command::new("man").args(["-aw", page]));
        let want = format!("/usr/share/man/man1/{page}.1.gz");
        assert!(found.lines().any(|l| l == want), "man -aw {page}: {found}");
    }
    let names: Vec<String> = UNITS.iter().map(|(u, _)| format!("{u}.service")).collect();
    verify(None, &names).unwrap_or_else(|e| panic!("installed units: {e}"));
    let listed: Vec<PathBuf> = ok(Command::new("dpkg").args(["-L", "tcpkit"]))
        .lines()
        .map(PathBuf::from)
        .filter(|p| !p.is_dir())
        .collect();
    assert!(
        listed.contains(&PathBuf::from("/usr/bin/tcpkit")),
        "{listed:?}"
    );

    let t = Instant::now();
    let o = dpkg(&["-r", "tcpkit"]);
    assert!(o.status.success(), "dpkg -r: {}", stderr(&o));
    let t_remove = t.elapsed();
    // Removed: only the conffiles stay (policy: until purge), and a mask on each unit so none
    // starts with its binary gone.
    let left: BTreeSet<String> = listed
        .iter()
        .filter(|p| p.symlink_metadata().is_ok())
        .map(|p| p.display().to_string())
        .collect();
    let confs: BTreeSet<String> = UNITS.iter().map(|(u, _)| conf_path(u)).collect();
    assert_eq!(left, confs);
    assert_eq!(dpkg_status(), "deinstall ok config-files");

    let t = Instant::now();
    let o = dpkg(&["-P", "tcpkit"]);
    assert!(o.status.success(), "dpkg -P: {}", stderr(&o));
    let t_purge = t.elapsed();
    let t = Instant::now();
    let errors = inst.undo();
    let t_undo = t.elapsed();
    assert!(errors.is_empty(), "{errors:?}");
    let left: Vec<&PathBuf> = listed
        .iter()
        .filter(|p| p.symlink_metadata().is_ok() && !before.contains(*p))
        .collect();
    assert!(left.is_empty(), "left after purge: {left:?}");
    assert_eq!(dpkg_status(), "");
    let after = tcpkit_paths();
    assert_eq!(
        after.difference(&before).collect::<Vec<_>>(),
        Vec::<&PathBuf>::new(),
        "new after purge"
    );
    assert_eq!(
        before.difference(&after).collect::<Vec<_>>(),
        Vec::<&PathBuf>::new(),
        "gone after purge"
    );
    assert!(triggers_pending().is_subset(&inst.pending));
    eprintln!(
        "dpkg -i {:.1} s, -r {:.1} s, -P {:.1} s, triggers {:.1} s",
        t_install.as_secs_f64(),
        t_remove.as_secs_f64(),
        t_purge.as_secs_f64(),
        t_undo.as_secs_f64()
    );
}

/// A unit file's [Service] section: each key's values in order.
fn service_section(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut in_service = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service && !line.is_empty() && !line.starts_with(['#', ';']) {
            let (k, v) = line.split_once('=').expect("KEY=VALUE");
            out.entry(k.trim().into())
                .or_default()
                .push(v.trim().into());
        }
    }
    out
}

/// An EnvironmentFile's assignments as systemd reads them: `#`/`;` comments, KEY=VALUE with
/// the value bare, "double-quoted" (\" and \\ escaped) or 'single-quoted'; the last
/// assignment of a key wins. Anything else (line continuations, text after a closing quote)
/// fails the test rather than being read differently from systemd.
fn env_file(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{line:?}: not KEY=VALUE"));
        let v = v.trim_start();
        let value = if let Some(rest) = v.strip_prefix('"') {
            let mut s = String::new();
            let mut chars = rest.chars();
            loop {
                match chars.next() {
                    Some('\\') => s.push(chars.next().expect("an escaped character")),
                    Some('"') => break,
                    Some(c) => s.push(c),
                    None => panic!("{line:?}: no closing quote"),
                }
            }
            assert!(
                chars.as_str().trim().is_empty(),
                "{line:?}: text after the quote"
            );
            s
        } else if let Some(rest) = v.strip_prefix('\'') {
            let (s, after) = rest.split_once('\'').expect("a closing quote");
            assert!(after.trim().is_empty(), "{line:?}: text after the quote");
            s.to_string()
        } else {
            assert!(!v.contains(['\\', '"', '\'']), "{line:?}: unsupported");
            v.trim_end().to_string()
        };
        out.insert(k.trim().to_string(), value);
    }
    out
}

/// ExecStart's command line with the environment substituted as systemd does: `$VAR` alone as
/// a word becomes the value split at whitespace (zero or more words), `${VAR}` one word.
/// Returns the words and the variables named.
fn exec_start(line: &str, env: &BTreeMap<String, String>) -> (Vec<String>, BTreeSet<String>) {
    let line = line.trim_start_matches(['-', '@', ':', '+', '!']);
    let mut words = Vec::new();
    let mut named = BTreeSet::new();
    for w in line.split_whitespace() {
        assert!(
            !w.contains(['"', '\'', '\\']),
            "{line:?}: quoting is not read here"
        );
        if let Some(var) = w.strip_prefix('$').filter(|v| !v.starts_with('{')) {
            named.insert(var.to_string());
            let v = env.get(var).map_or("", String::as_str);
            words.extend(v.split_whitespace().map(str::to_string));
        } else if let Some(var) = w.strip_prefix("${").and_then(|v| v.strip_suffix('}')) {
            named.insert(var.to_string());
            words.push(env.get(var).cloned().unwrap_or_default());
        } else {
            assert!(!w.contains('$'), "{line:?}: {w} is not read here");
            words.push(w.to_string());
        }
    }
    (words, named)
}

/// The unit `unit` from the unpacked package and its conf file (the EnvironmentFile it names,
/// from the package too): the unit's [Service] section, the conf's path, text and
/// assignments, and ExecStart's words with them substituted. The two must agree on the
/// variables: systemd would quietly put nothing where the unit names one the conf does not
/// set, and ignore one the conf sets that the unit does not name.
struct UnitConf {
    svc: BTreeMap<String, Vec<String>>,
    conf: PathBuf,
    text: String,
    env: BTreeMap<String, String>,
    argv: Vec<String>,
}

fn unit_and_conf(b: &Built, unit: &str) -> UnitConf {
    let text = std::fs::read_to_string(b.root.join(&unit_path(unit)[1..])).unwrap();
    let svc = service_section(&text);
    let files = &svc["EnvironmentFile"];
    assert_eq!(files.len(), 1, "{unit}: {files:?}");
    // No leading `-`: a missing conf file is an error, not an empty configuration.
    assert_eq!(files[0], conf_path(unit), "{unit}");
    let conf = b.root.join(&files[0][1..]);
    let text = std::fs::read_to_string(&conf).unwrap();
    let env = env_file(&text);
    let (argv, named) = exec_start(&svc["ExecStart"][0], &env);
    let set: BTreeSet<String> = env.keys().cloned().collect();
    assert_eq!(
        named,
        set,
        "{unit}: ExecStart names {named:?}, {} sets {set:?}",
        conf.display()
    );
    UnitConf {
        svc,
        conf,
        text,
        env,
        argv,
    }
}

#[test]
fn every_setting_and_example_in_the_conf_files_parses_as_its_roles_flags() {
    let b = built();
    for (unit, role) in UNITS {
        let UnitConf {
            conf,
            text,
            env,
            argv,
            ..
        } = unit_and_conf(b, unit);
        let prefix = format!("/usr/bin/tcpkit {role}");
        assert!(argv.join(" ").starts_with(&prefix), "{unit}: {argv:?}");
        // The setting in force and every commented example, each as flags of the role.
        let mut examples = vec![env["TCPKIT_ARGS"].clone()];
        for l in text.lines().filter_map(|l| l.strip_prefix("#TCPKIT_ARGS=")) {
            examples.push(env_file(&format!("TCPKIT_ARGS={l}"))["TCPKIT_ARGS"].clone());
        }
        assert!(examples.len() >= 2, "{}: no example", conf.display());
        for args in examples {
            let o = run(Command::new(tcpkit())
                .args(role.split(' '))
                .args(args.split_whitespace())
                .arg("--help"));
            assert!(
                o.status.success(),
                "{}: TCPKIT_ARGS=\"{args}\": {}",
                conf.display(),
                stderr(&o)
            );
        }
    }
}

#[test]
fn the_echo_unit_serves_and_reports_at_stop_as_systemd_runs_it() {
    let b = built();
    let UnitConf { svc, env, argv, .. } = unit_and_conf(b, "tcpkit-echo");
    let one = |k: &str| svc.get(k).map(|v| v.last().unwrap().as_str());
    // What systemd would do that a test can: the unit's user (DynamicUser: an unprivileged
    // one; nobody here) with the capabilities it grants, no new privileges, a clean
    // environment of the conf's variables, / as the working directory, stdin from /dev/null.
    // The rest of the sandbox needs systemd itself.
    let mut cmd: Vec<String> = Vec::new();
    if one("DynamicUser") == Some("yes") {
        let caps: Vec<String> = one("AmbientCapabilities")
            .unwrap_or("")
            .split_whitespace()
            .map(|c| format!(",+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect();
        let caps = caps.concat();
        cmd.extend(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                &format!("--inh-caps=-all{caps}"),
                &format!("--ambient-caps=-all{caps}"),
                &format!("--bounding-set=-all{caps}"),
                "--no-new-privs",
                "--",
            ]
            .map(str::to_string),
        );
    }
    assert_eq!(argv[0], "/usr/bin/tcpkit");
    // The packaged binary, where that user can reach it.
    let bin_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = bin_dir.path().join("tcpkit");
    std::fs::copy(b.root.join("usr/bin/tcpkit"), &bin).unwrap();
    cmd.push(bin.display().to_string());
    cmd.extend(argv[1..].iter().cloned());

    let (lab, cli, srv, _link) = Lab::pair("pkgunit").unwrap_or_else(|e| panic!("{e}"));
    let journal = lab.dir().join("journal");
    let log = std::fs::File::create(&journal).unwrap();
    let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let mut c = srv.command(&args);
    c.env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
        .envs(&env)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut child = KillOnDrop(c.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}")));
    let said = || std::fs::read_to_string(&journal).unwrap_or_default();

    // Wherever the conf says to listen: the one listener in this namespace.
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        let ss = srv.run(&["ss", "-Hltn"]).unwrap_or_else(|e| panic!("{e}"));
        let port = stdout(&ss).lines().find_map(|l| {
            l.split_whitespace()
                .nth(3)?
                .rsplit(':')
                .next()?
                .parse::<u16>()
                .ok()
        });
        if let Some(p) = port {
            break p;
        }
        if let Some(st) = child.0.try_wait().unwrap() {
            panic!("{cmd:?} exited {st} before listening: {}", said());
        }
        assert!(Instant::now() < deadline, "never listened: {}", said());
        std::thread::sleep(Duration::from_millis(20));
    };
    let msg = b"hello unit";
    let back = cli.enter(|| {
        let mut s = TcpStream::connect(SocketAddr::from((SRV, port))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(msg).unwrap();
        let mut buf = [0u8; 10];
        s.read_exact(&mut buf).unwrap();
        buf
    });
    assert_eq!(&back, msg);

    // Stopped as the unit says (KillMode=mixed: SIGTERM to tcpkit alone): a clean exit with
    // the report, which systemd's journal keeps.
    assert_eq!(one("KillMode"), Some("mixed"));
    let pid = i32::try_from(child.0.id()).unwrap();
    // SAFETY: kill(2) on our own child, which has not been reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "no exit on SIGTERM: {}", said());
        std::thread::sleep(Duration::from_millis(20));
    };
    let journal = said();
    assert!(st.success(), "exit {st}: {journal}");
    for want in [
        "Connections: 1 accepted",
        "Bytes: 10 in, 10 out",
        "stopped by signal",
    ] {
        assert!(journal.contains(want), "{want:?} not in {journal}");
    }
}

#[test]
fn the_test_reads_environment_files_and_command_lines_as_systemd_does() {
    let env = env_file("# c\n; c\nA=\"x \\\"y\\\" z\"\nB='p q'\n  C = bare words  \nA=\"last\"\n");
    assert_eq!(env["A"], "last");
    assert_eq!(env["B"], "p q");
    assert_eq!(env["C"], "bare words");
    let (w, named) = exec_start("/usr/bin/x sub $C ${B} $D", &env);
    assert_eq!(w, ["/usr/bin/x", "sub", "bare", "words", "p q"]);
    assert_eq!(named, ["B", "C", "D"].map(String::from).into());
}
