//! Meridian's shared language.
//!
//! - [`pb`]: the generated protobuf/gRPC types. Only edge code touches them; everything else
//!   uses the domain types below and converts once, in [`convert`].
//! - [`spec`]: the user-facing job spec (`JobSpec`) with its serde names, parsing and validation.
//! - [`inventory`]: what a member cluster reports (identity, node shapes, queue pressure).
//! - [`job`]: job identity and life-cycle states.
//! - [`protocol`]: the agent ↔ gateway messages as domain types.
//! - [`names`]: the grammar of cluster names, checked wherever one is accepted.

pub mod config_file;
pub mod convert;
pub mod duration;
pub mod gpu;
pub mod inventory;
pub mod job;
pub mod names;
pub mod protocol;
pub mod selector;
pub mod spec;
pub mod validate;

/// Generated protobuf and gRPC code for package `meridian.v1`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/meridian.v1.rs"));
}
