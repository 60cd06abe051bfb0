#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_copy::control::fuzz_control(data));
