//! store (work in progress)
