//! agent (work in progress)
