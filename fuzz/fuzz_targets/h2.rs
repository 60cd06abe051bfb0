#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_wire::h2::fuzz_h2(data));
