#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_pcap::fuzz_prep_cache(data));
