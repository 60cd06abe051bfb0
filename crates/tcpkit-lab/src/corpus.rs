//! The fuzz targets' seed corpora, `fuzz/corpus/<target>/`. Each target's body is a `pub fn`
//! in the crate it tests, and a stable unit test there runs it over these files on every
//! `cargo test` (and an ignored one writes the hand-made seeds again when a format changes):
//! where the corpora are, how they are read and written, and which seeds a campaign grew,
//! said once here for every crate that has a target.

use std::path::PathBuf;

/// One file of a corpus.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seed {
    /// Its file name.
    pub name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

impl Seed {
    /// An input a fuzzing campaign kept (cargo-fuzz names them by the SHA-1 of their bytes),
    /// not a hand-written seed: they are many, so tests replay them once and mutate only the
    /// hand-written ones.
    pub fn grown(&self) -> bool {
        self.name.len() == 40 && self.name.bytes().all(|b| b.is_ascii_hexdigit())
    }
}

/// The folder of `target`'s corpus.
pub fn dir(target: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus")).join(target)
}

/// Every file of `target`'s corpus, sorted by name so that a failure reproduces in the same
/// order. For tests: a corpus that cannot be read panics, naming the path.
pub fn seeds(target: &str) -> Vec<Seed> {
    let dir = dir(target);
    let mut seeds: Vec<Seed> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .filter(|p| p.is_file())
        .map(|p| Seed {
            name: p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            bytes: std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        })
        .collect();
    seeds.sort();
    seeds
}

/// Writes the seed `name` of `target`'s corpus (the folder is made when missing). For the
/// ignored tests that make the hand-written seeds: a failed write panics, naming the path.
pub fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = dir(target);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corpus_is_read_in_name_order_and_grown_seeds_are_told_apart() {
        let seeds = seeds("dns");
        assert!(seeds.len() >= 2, "{} seeds", seeds.len());
        assert!(seeds.windows(2).all(|w| w[0].name < w[1].name));
        assert!(seeds.iter().all(|s| dir("dns").join(&s.name).is_file()));
        let grown = Seed {
            name: "0123456789abcdef0123456789ABCDEF01234567".into(),
            bytes: Vec::new(),
        };
        assert!(grown.grown());
        // The DNS corpus holds both: hand-written seeds and a campaign's.
        assert!(seeds.iter().any(Seed::grown) && !seeds.iter().all(Seed::grown));
        let hand = Seed {
            name: "query-a".into(),
            bytes: Vec::new(),
        };
        assert!(!hand.grown());
    }

    #[test]
    #[should_panic(expected = "no-such-target")]
    fn a_missing_corpus_names_its_folder() {
        seeds("no-such-target");
    }
}
