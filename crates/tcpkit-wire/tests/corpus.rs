//! Runs the `rewrite` fuzz body over the seed corpus on every `cargo test`.

#[test]
fn fuzz_rewrite_over_seed_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/rewrite");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        tcpkit_wire::fuzz_rewrite(&data);
        // Every prefix too: the cut-at-every-length rule, for all link types at once.
        for k in 0..data.len() {
            tcpkit_wire::fuzz_rewrite(&data[..k]);
        }
        n += 1;
    }
    assert!(n >= 10, "seed corpus has only {n} files");
}
