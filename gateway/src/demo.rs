//! demo (work in progress)
