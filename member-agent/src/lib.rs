//! Meridian's member agent: one per member cluster. It connects out to the gateway, reports the
//! cluster's inventory and queue pressure, and runs the jobs it accepts on a [`backend::LocalBackend`].

pub mod agent;
pub mod backend;
pub mod builtin;
pub mod config;
