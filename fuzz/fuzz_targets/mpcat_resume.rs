#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_mpcat::resume::fuzz_state(data));
