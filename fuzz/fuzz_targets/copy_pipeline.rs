#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_copy::pipeline::fuzz_pipeline(data));
