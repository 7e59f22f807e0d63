//! Workloads for the simulator: the Philly trace reader, the synthetic generator, and decoration.
//!
//! A trace or the generator yields [`RawJob`](crate::RawJob)s (submit time, run time, GPUs,
//! tenant). [`decorate`] then fits them to a fleet: each tenant gets a home cluster, each job a
//! gang shape that its home can run, and some jobs a GPU-type pin and a dataset in a region.
//!
//! - [`parse_philly`] / [`read_philly`]: the Philly CSV (`timestamp,duration,num_gpus,gpu_time,cluster`).
//! - [`synthesize`]: seeded synthetic workloads shaped like Philly, LLM training, or a mix.
//! - [`assign_homes`] / [`decorate`]: tenant homes, gang shapes, pins and datasets.
//! - [`apply_estimate_error`]: seeded log-normal error on runtime estimates (`--estimate-error`).
//! - [`apply_deadlines`]: seeded deadlines for a share of jobs (`--deadlines`).

mod deadline;
mod decorate;
mod estimate;
mod philly;
mod sample;
mod synthetic;

pub use deadline::{DEFAULT_SLACK, DeadlineShare, apply_deadlines};
pub use decorate::{FleetFacts, HomeCluster, HomeGpuType, assign_homes, decorate};
pub use estimate::{EstimateError, apply_estimate_error};
pub use philly::{parse_philly, read_philly};
pub use synthetic::{Profile, synthesize};
