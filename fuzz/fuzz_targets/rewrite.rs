#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_wire::fuzz_rewrite(data));
