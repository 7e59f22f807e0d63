//! dispatch (work in progress)
