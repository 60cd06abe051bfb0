#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_load::merge::fuzz_merge_report(data));
