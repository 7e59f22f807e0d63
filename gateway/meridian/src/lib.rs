//! The `meridian` command's own parts, beside the libraries it wires together:
//! - [`certs`]: `meridian certs`, a development CA and the gateway's and agents' certificates;
//! - [`demo`]: `meridian demo`, a gateway and three member clusters in one process.
//!
//! `main.rs` parses the command line and hands each subcommand to its library: the gateway
//! server (`meridian-gateway`), the placement lab (`meridian-sim`), the user command line
//! (`meridian-cli`), or the two modules here.

pub mod certs;
pub mod demo;
