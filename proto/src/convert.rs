//! Conversions between wire (`pb`) and domain types. Filled in below.
