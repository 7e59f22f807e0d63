//! placement (work in progress)
