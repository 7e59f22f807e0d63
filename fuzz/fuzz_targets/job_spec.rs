#![no_main]
//! See `meridian_e2e::fuzzing::job_spec` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    meridian_e2e::fuzzing::job_spec(data);
});
