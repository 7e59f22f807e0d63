//! Meridian's federation control plane: the gateway library behind the `meridian` command.
//!
//! Modules by concern: [`api`] (REST and gRPC adapters), [`queue`] (federation queue order and
//! tenant fair share), [`placement`] (pure filter/score/explain), [`dispatch`] (offers, fencing),
//! [`registry`] (member clusters), [`store`] (durable job records), [`client`] and [`cli`] (the
//! user command line), [`demo`] (the self-contained demonstration).

pub mod api;
pub mod cli;
pub mod client;
pub mod config;
pub mod demo;
pub mod dispatch;
pub mod registry;
pub mod server;
pub mod sim;
pub mod store;

pub use meridian_placement as placement;
pub use meridian_placement::queue;
