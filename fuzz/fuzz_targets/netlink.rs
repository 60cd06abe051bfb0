#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpkit_kernel::netlink::fuzz_netlink(data));
