//! backend (work in progress)
