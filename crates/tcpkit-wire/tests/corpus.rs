//! Runs the `rewrite` fuzz body over the seed corpus on every `cargo test`.

#[test]
fn fuzz_rewrite_over_seed_corpus() {
    let seeds = tcpkit_lab::corpus::seeds("rewrite");
    for s in &seeds {
        let data = &s.bytes;
        tcpkit_wire::fuzz_rewrite(data);
        // Every prefix too: the cut-at-every-length rule, for all link types at once.
        for k in 0..data.len() {
            tcpkit_wire::fuzz_rewrite(&data[..k]);
        }
    }
    let n = seeds.len();
    assert!(n >= 10, "seed corpus has only {n} files");
}
