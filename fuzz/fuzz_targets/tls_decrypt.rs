#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tcpkit_tls::decrypt::fuzz_decrypt(data);
});
