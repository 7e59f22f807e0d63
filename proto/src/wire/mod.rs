//! The wire edge (feature `wire`): the generated protobuf/gRPC types and the one home of every
//! conversion between them and the domain types.
//!
//! - [`pb`]: generated from `proto/meridian/v1/meridian.proto` (service stubs only with the
//!   `grpc` feature);
//! - [`convert`]: the rules for fields the wire cannot express, the [`convert::ConvertError`]
//!   that names a bad field, and the enums; job specs in `convert/job_spec.rs`, cluster
//!   identities, inventories and queue pressure in `convert/cluster.rs`;
//! - [`protocol`]: the agent ↔ gateway messages of [`crate::protocol`].
//!
//! Only edge code (the gateway's gRPC API, the agent's link, tests of the wire) turns this on;
//! the pure crates (core, placement, scheduler, simulator) build without prost.

pub mod convert;
pub mod protocol;

/// Generated protobuf and gRPC code for package `meridian.v1`.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/meridian.v1.rs"));
}
