#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_mpcat::frame::fuzz_frame(data));
