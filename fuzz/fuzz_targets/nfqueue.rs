#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_capture::nfqueue::fuzz_nfqueue(data));
