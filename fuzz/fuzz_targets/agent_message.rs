#![no_main]
//! See `meridian_e2e::fuzzing::agent_message` for what it asserts.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    meridian_e2e::fuzzing::agent_message(data);
});
