//! Meridian's federation control plane: the gateway library behind the `meridian` command.
//!
//! The gateway's shape (see `docs/architecture.md`):
//! - [`meridian_core`]: one sans-IO state machine for jobs, clusters, offers, fencing, timers;
//! - [`runtime`]: the task that owns the core, group-commits to the store and publishes reads;
//! - [`api`]: REST and gRPC adapters over the runtime's handle (wire ↔ domain, error mapping);
//! - [`metrics`]: Prometheus metrics at `GET /metrics`;
//! - [`server`]: wires store, runtime and APIs together;
//! - [`meridian_store`]: the durable store seam (embedded redb by default);
//! - [`placement`] and [`queue`]: pure placement and the federation queue (crate `meridian-placement`);
//! - [`cli`] (crate `meridian-cli`, with its REST [`client`]): the user command line, which speaks
//!   only the public API; [`demo`] and [`sim`]: the demonstration and the placement lab.

pub mod api;
pub mod auth;
pub mod certs;
pub mod config;
pub mod console;
pub mod demo;
pub mod metrics;
pub mod runtime;
pub mod server;
pub mod tls;

pub use meridian_cli as cli;
pub use meridian_cli::client;
pub use meridian_core as core;
pub use meridian_placement as placement;
pub use meridian_placement::queue;
pub use meridian_sim as sim;
pub use meridian_store as store;
