#![no_main]
//! See `meridian_e2e::fuzzing::selector` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    meridian_e2e::fuzzing::selector(data);
});
