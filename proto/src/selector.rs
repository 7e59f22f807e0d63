//! Label selectors (`project=llm,type!=eval`). Filled in below.
