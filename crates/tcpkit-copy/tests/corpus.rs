//! Runs the `reasm` fuzz body over its seed corpus on every `cargo test`.

#[test]
fn fuzz_reasm_over_seed_corpus() {
    let seeds = tcpkit_lab::corpus::seeds("reasm");
    for s in &seeds {
        let data = &s.bytes;
        tcpkit_copy::reasm::fuzz_reasm(data);
        // Every prefix of the hand-written seeds too (a capture can end anywhere); the inputs
        // a campaign grew are many, and each is replayed once.
        if !s.grown() {
            for k in 0..data.len() {
                tcpkit_copy::reasm::fuzz_reasm(&data[..k]);
            }
        }
    }
    let n = seeds.len();
    assert!(n >= 15, "seed corpus has only {n} files");
}
