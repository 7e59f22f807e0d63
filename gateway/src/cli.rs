//! cli (work in progress)
