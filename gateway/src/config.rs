//! config (work in progress)
