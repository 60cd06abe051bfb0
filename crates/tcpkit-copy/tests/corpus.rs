//! Runs the `reasm` fuzz body over its seed corpus on every `cargo test`.

#[test]
fn fuzz_reasm_over_seed_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/reasm");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = e.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        // Every prefix too: a capture can end anywhere.
        for k in 0..=data.len() {
            tcpkit_copy::reasm::fuzz_reasm(&data[..k]);
        }
        n += 1;
    }
    assert!(n >= 15, "seed corpus has only {n} files");
}
