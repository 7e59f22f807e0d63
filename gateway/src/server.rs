//! server (work in progress)
