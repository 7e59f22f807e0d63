//! Meridian's shared language.
//!
//! - [`wire`] (feature `wire`, re-exported as [`pb`] and [`convert`]): the generated
//!   protobuf/gRPC types and every conversion between them and the domain types. Only edge code
//!   turns it on; everything else uses the domain types below, and builds without prost.
//! - [`spec`]: the user-facing job spec (`JobSpec`) with its serde names, parsing and validation.
//! - [`inventory`]: what a member cluster reports (identity, node shapes, queue pressure).
//! - [`job`]: job identity and life-cycle states.
//! - [`job_env`]: the environment every replica gets, on every backend (the job contract).
//! - [`protocol`]: the agent ↔ gateway messages as domain types.
//! - [`names`]: the grammar of cluster names, checked wherever one is accepted.
//! - [`testing`] (feature `testing`): fixtures shared by every crate's tests and benches.

pub mod config_file;
pub mod duration;
pub mod gpu;
pub mod inventory;
pub mod job;
pub mod job_env;
pub mod names;
pub mod protocol;
pub mod selector;
pub mod spec;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod validate;
#[cfg(feature = "wire")]
pub mod wire;

#[cfg(feature = "wire")]
pub use wire::{convert, pb};
