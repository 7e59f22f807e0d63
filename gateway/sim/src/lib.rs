//! `meridian sim`: replays a workload over a simulated federation in virtual time.
//!
//! The replay drives the production code unchanged: for the `meridian` policy, the gateway's own
//! core ([`meridian_core::Core`]: queue, placement rounds, offers, fencing, holds) talks to one
//! simulated agent per member, and every member cluster is a
//! [`meridian_scheduler::BuiltinScheduler`] (gang placement, weighted fair share) fed the
//! same `LocalJob`s an agent would feed it. Time advances from event to event (arrivals, data
//! arrivals, completions), never by sleeping.
//!
//! - [`job`]: the shared vocabulary (jobs, outcomes, usage).
//! - [`workload`]: the Philly trace reader, the synthetic generator, and decoration (tenant
//!   homes, datasets, GPU-type pins).
//! - [`topology`]: the simulated fleet from YAML (clusters, node shapes, prices, network).
//! - `engine` and `policy`: the event loop (with, for `meridian`, the gateway's core and the
//!   simulated agents), and the placement policies (ours and the baselines).
//! - [`metrics`], [`report`], [`plot`]: what a run measured, as a table, JSON and an SVG chart;
//!   [`deadline`]: deadline misses and the cloud dollars spent on jobs with deadlines.
//! - [`progress`]: one progress bar per replayed policy on a terminal's stderr.

pub mod command;
pub mod deadline;
pub mod engine;
pub mod job;
pub mod metrics;
pub mod plot;
pub mod policy;
pub mod preemption;
pub mod progress;
pub mod report;
pub mod topology;
pub mod workload;

use std::path::PathBuf;

pub use job::{ClusterUsage, Dataset, GatewayCounts, Outcome, RawJob, RunResult, SimJob, SizeBucket, Tenant, Workload};

/// Why a simulation could not run. Every variant names what was wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A trace row is malformed.
    #[error("{}:{line}: {message}", path.display())]
    Trace {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number (the header is line 1).
        line: usize,
        /// What is wrong, naming the column.
        message: String,
    },
    /// The topology file is not valid.
    #[error(transparent)]
    Topology(#[from] meridian_proto::config_file::ConfigError),
    /// The `--plot` chart could not be drawn.
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
    /// A command-line value or a combination of them is not valid.
    #[error("{0}")]
    Invalid(String),
}
