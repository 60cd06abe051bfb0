#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_fleet::wire::fuzz_frames(data));
