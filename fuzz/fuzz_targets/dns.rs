#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_wire::dns::fuzz_dns(data));
