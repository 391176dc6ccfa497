#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| qhx_fuzz::server_request(data));
