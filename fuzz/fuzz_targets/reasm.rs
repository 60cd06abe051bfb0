#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_copy::reasm::fuzz_reasm(data));
