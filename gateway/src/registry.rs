//! registry (work in progress)
