//! `--against`: what every bench that compares this tcpkit build with an older one shares. The
//! builds a row runs with and in which order, the old build's flags it lacks, its cells in a
//! table (its figure and new / old), and the results file's line naming both builds.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::Against;

/// A tcpkit build a row runs with: this workspace's, or the one `--against` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Build {
    New,
    Old,
}

/// The builds a bench runs its tcpkit rows with: this one, and with `--against` the old one,
/// with the flags of each subcommand the bench passes that the old one's `--help` lacks.
pub(crate) struct Builds {
    pub new: PathBuf,
    pub against: Option<Against>,
    /// (subcommand, flag) pairs the old build lacks.
    lacks: Vec<(String, String)>,
}

impl Builds {
    /// Parses `--against PATH [--against-label L]` from `args`; `used` names the flags the
    /// bench passes each subcommand, to be looked up in the old build's `--help`.
    pub(crate) fn parse(args: &[String], new: PathBuf, used: &[(&str, &[&str])]) -> Result<Builds> {
        let against = Against::parse(args, &new)?;
        let mut lacks = Vec::new();
        if let Some(a) = &against {
            for (sub, flags) in used {
                for f in crate::missing_flags(&a.bin, sub, flags)? {
                    lacks.push(((*sub).to_string(), f));
                }
            }
        }
        Ok(Builds {
            new,
            against,
            lacks,
        })
    }

    pub(crate) fn bin(&self, b: Build) -> &Path {
        match (b, &self.against) {
            (Build::Old, Some(a)) => &a.bin,
            _ => &self.new,
        }
    }

    /// The builds of run `i` of a row, in the order they run: this one alone, or both with
    /// which goes first alternating from run to run (new, old, old, new, ...), so that
    /// neither always runs on a warmer lab or right after the same other run.
    pub(crate) fn order(&self, i: usize) -> Vec<Build> {
        match (&self.against, i % 2) {
            (None, _) => vec![Build::New],
            (Some(_), 0) => vec![Build::New, Build::Old],
            (Some(_), _) => vec![Build::Old, Build::New],
        }
    }

    /// Why build `b` cannot run `sub` with `flags` (`not in the old build: -Z`), if it cannot.
    pub(crate) fn lacking(&self, b: Build, sub: &str, flags: &[&str]) -> Option<String> {
        if b == Build::New {
            return None;
        }
        let missing: Vec<&str> = flags
            .iter()
            .copied()
            .filter(|f| self.lacks.iter().any(|(s, l)| s == sub && l == f))
            .collect();
        (!missing.is_empty()).then(|| format!("not in the old build: {}", missing.join(" ")))
    }

    /// Run `turn` of a row: `f` with each build in [`Builds::order`], the old build's run
    /// replaced by `lacks` (why it cannot run the row) when there is one.
    pub(crate) fn both<T>(
        &self,
        turn: usize,
        lacks: Option<String>,
        mut f: impl FnMut(Build) -> Result<T>,
    ) -> Result<(T, Old<T>)> {
        let (mut new, mut old) = (None, None);
        for b in self.order(turn) {
            match (b, &lacks) {
                (Build::New, _) => new = Some(f(b)?),
                (Build::Old, Some(why)) => old = Some(Err(why.clone())),
                (Build::Old, None) => old = Some(Ok(f(b)?)),
            }
        }
        Ok((new.context("this build's run")?, old))
    }

    /// The results file's line naming the two builds (empty without `--against`).
    pub(crate) fn header(&self) -> String {
        header(self.against.as_ref(), &self.new)
    }
}

/// The results file's line naming the two builds, this one at `new` (empty without
/// `--against`).
pub(crate) fn header(a: Option<&Against>, new: &Path) -> String {
    a.map_or_else(String::new, |a| {
        format!(
            "Builds compared (`--against`): tcpkit = {} ({}); old build = {}. Each tcpkit run is\n\
             also run with the old build, interleaved (which of the two goes first alternates),\n\
             the same number of runs each; new / old is this build's figure over the old one's.\n",
            a.new_label,
            new.display(),
            a.label
        )
    })
}

/// A row's run with the old build: none without `--against`; `Err` says why it did not run
/// (the flags it lacks).
pub(crate) type Old<T> = Option<std::result::Result<T, String>>;

/// The old build's cells of a row: its figure (`cell`) and new / old of `val`.
pub(crate) fn old_cells<T>(
    new: &T,
    old: &Old<T>,
    cell: impl Fn(&T) -> String,
    val: impl Fn(&T) -> f64,
) -> [String; 2] {
    match old {
        None => [String::new(), String::new()],
        Some(Err(why)) => [why.clone(), "—".into()],
        Some(Ok(o)) => [cell(o), crate::new_over_old(Some(val(new)), Some(val(o)))],
    }
}

/// A bench's markdown table; with `--against`, two more columns: the old build's figure and
/// new / old.
pub(crate) struct Table {
    head: Vec<String>,
    /// The old build's column's name.
    old_head: String,
    /// Whether the figures' columns are right-aligned.
    right: bool,
    rows: Vec<Vec<String>>,
    against: bool,
}

impl Table {
    pub(crate) fn new(head: &[&str], old_head: &str, right: bool, against: bool) -> Table {
        Table {
            head: head.iter().map(|h| (*h).to_string()).collect(),
            old_head: old_head.to_string(),
            right,
            rows: Vec::new(),
            against,
        }
    }

    fn width(&self) -> usize {
        self.head.len() + if self.against { 2 } else { 0 }
    }

    /// A row holding only `title`, in bold.
    pub(crate) fn section(&mut self, title: &str) {
        let mut r = vec![format!("**{title}**")];
        r.resize(self.width(), String::new());
        self.rows.push(r);
    }

    /// A row with no old figure (another tool's, or one the old build has no part in).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.row_ab(cells, [String::new(), String::new()]);
    }

    /// A row with the old build's figure and new / old (left out without `--against`).
    pub(crate) fn row_ab(&mut self, mut cells: Vec<String>, old: [String; 2]) {
        cells.resize(self.head.len(), String::new());
        if self.against {
            cells.extend(old);
        }
        self.rows.push(cells);
    }

    pub(crate) fn markdown(&self) -> String {
        let mut head = self.head.clone();
        if self.against {
            head.push(self.old_head.clone());
            head.push("new / old".into());
        }
        let align = if self.right { "---:" } else { "---" };
        let mut s = format!("| {} |\n|---|", head.join(" | "));
        for _ in 1..head.len() {
            let _ = write!(s, "{align}|");
        }
        s.push('\n');
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builds(against: bool) -> Builds {
        Builds {
            new: PathBuf::from("/new/tcpkit"),
            against: against.then(|| Against {
                bin: PathBuf::from("/old/tcpkit"),
                label: "old".into(),
                new_label: "new".into(),
            }),
            lacks: vec![("mpcat".into(), "-Z".into())],
        }
    }

    #[test]
    fn the_old_build_runs_beside_the_new_first_or_second_by_turns() {
        let b = builds(true);
        assert_eq!(b.order(0), [Build::New, Build::Old]);
        assert_eq!(b.order(1), [Build::Old, Build::New]);
        assert_eq!(b.order(2), [Build::New, Build::Old]);
        assert_eq!(b.bin(Build::Old), Path::new("/old/tcpkit"));
        assert_eq!(builds(false).order(1), [Build::New]);
        assert_eq!(builds(false).bin(Build::Old), Path::new("/new/tcpkit"));
    }

    #[test]
    fn both_runs_each_build_once_in_turn_and_says_why_the_old_one_did_not() {
        let b = builds(true);
        let mut ran = Vec::new();
        let (new, old) = b
            .both(1, None, |x| {
                ran.push(x);
                Ok(ran.len())
            })
            .unwrap();
        assert_eq!(ran, [Build::Old, Build::New]);
        assert_eq!((new, old), (2, Some(Ok(1))));
        let (new, old) = b
            .both(0, Some("not in the old build: -Z".into()), |_| Ok(7))
            .unwrap();
        assert_eq!(
            (new, old),
            (7, Some(Err("not in the old build: -Z".into())))
        );
        let (new, old) = builds(false).both(0, None, |_| Ok(7)).unwrap();
        assert_eq!((new, old), (7, None));
    }

    #[test]
    fn a_flag_the_old_build_lacks_is_named_for_its_subcommand_only() {
        let b = builds(true);
        assert_eq!(
            b.lacking(Build::Old, "mpcat", &["-i", "-Z"]).as_deref(),
            Some("not in the old build: -Z")
        );
        assert_eq!(b.lacking(Build::Old, "mpcat", &["-i"]), None);
        assert_eq!(b.lacking(Build::Old, "load", &["-Z"]), None);
        assert_eq!(b.lacking(Build::New, "mpcat", &["-Z"]), None);
    }

    #[test]
    fn a_table_gains_the_old_columns_with_against_only() {
        let mut t = Table::new(
            &["what", "tcpkit", "peer"],
            "tcpkit, old build",
            false,
            false,
        );
        t.section("s");
        t.row_ab(
            vec!["a".into(), "2".into(), "1".into()],
            ["x".into(), "y".into()],
        );
        assert_eq!(
            t.markdown(),
            "| what | tcpkit | peer |\n|---|---|---|\n| **s** |  |  |\n| a | 2 | 1 |\n"
        );
        let mut t = Table::new(&["what", "tcpkit", "peer"], "tcpkit, old build", true, true);
        t.row_ab(
            vec!["a".into(), "2".into(), "1".into()],
            old_cells(&2.0, &Some(Ok(1.0)), |v| format!("{v}"), |v| *v),
        );
        t.row_ab(
            vec!["b".into(), "2".into()],
            old_cells(
                &2.0,
                &Some(Err("not in the old build: -Z".into())),
                |v| format!("{v}"),
                |v| *v,
            ),
        );
        t.row(vec!["c".into()]);
        assert_eq!(
            t.markdown(),
            "| what | tcpkit | peer | tcpkit, old build | new / old |\n|---|---:|---:|---:|---:|\n\
             | a | 2 | 1 | 1 | 2.00 |\n\
             | b | 2 |  | not in the old build: -Z | — |\n\
             | c |  |  |  |  |\n"
        );
    }
}
