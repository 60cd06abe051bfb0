//! Runs the `reasm` fuzz body over its seed corpus on every `cargo test`.

#[test]
fn fuzz_reasm_over_seed_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/reasm");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        tcpkit_copy::reasm::fuzz_reasm(&data);
        // Every prefix of the hand-written seeds too (a capture can end anywhere); the inputs
        // a campaign grew (named by their SHA-1) are many, and each is replayed once.
        if !grown(&path) {
            for k in 0..data.len() {
                tcpkit_copy::reasm::fuzz_reasm(&data[..k]);
            }
        }
        n += 1;
    }
    assert!(n >= 15, "seed corpus has only {n} files");
}

/// An input cargo-fuzz kept (its name is the SHA-1 of its bytes), not a hand-written seed.
fn grown(p: &std::path::Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.len() == 40 && n.bytes().all(|b| b.is_ascii_hexdigit()))
}
