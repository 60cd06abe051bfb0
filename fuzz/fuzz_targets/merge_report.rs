#![no_main]
// Any bytes as a report file `tcpkit merge` reads: as a load report and as a copy report.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tcpkit_load::merge::fuzz_merge_report(data);
    tcpkit_copy::merged::fuzz_merge_copy_report(data);
});
