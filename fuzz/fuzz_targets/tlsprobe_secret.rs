#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_tlsprobe::secret::fuzz_secret(data));
