//! builtin scheduler (work in progress)
