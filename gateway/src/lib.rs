//! Meridian's federation control plane as a library: the server behind `meridian gateway`
//! (the command itself, with the demo and `meridian certs`, is crate `meridian`).
//!
//! The gateway's shape (see `docs/architecture.md`):
//! - crate `meridian-core`: one sans-IO state machine for jobs, clusters, offers, fencing, timers;
//! - [`runtime`]: the task that owns the core, group-commits to the store and publishes reads;
//! - [`api`]: REST and gRPC adapters over the runtime's handle (wire ↔ domain, error mapping);
//! - [`auth`]: tokens, JWTs and roles; [`tls`]: the agents' mTLS listener;
//! - [`metrics`]: Prometheus metrics at `GET /metrics`; `api::console`: the web console;
//! - [`config`]: the gateway's configuration file;
//! - [`server`]: wires store, runtime and APIs together;
//! - crate `meridian-store`: the durable store seam (embedded redb by default);
//! - crate `meridian-placement`: pure placement and the federation queue.

pub mod api;
pub mod auth;
pub mod config;
#[cfg(feature = "etcd")]
pub mod ha;
pub mod metrics;
pub mod runtime;
pub mod server;
pub mod tls;
