//! queue (work in progress)
