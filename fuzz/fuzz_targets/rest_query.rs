#![no_main]
//! See `meridian_e2e::fuzzing::rest_query` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    meridian_e2e::fuzzing::rest_query(data);
});
