//! client (work in progress)
