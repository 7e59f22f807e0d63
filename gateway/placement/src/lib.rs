//! Placement v1: which member cluster should run a job, as pure functions over a snapshot.
//!
//! [`place()`] runs one job through four stages over every cluster of a [`FederationSnapshot`]:
//!
//! 1. **Filter**: can the cluster ever run the job (GPU type and memory, the gang fits the node
//!    shapes counted per node, only shapes the job's `nodeSelector` accepts, residency,
//!    include/exclude, `clusterSelector`, payload kind, burst rules and budget), and is its agent
//!    connected. Selectors were parsed when the spec was read; here they are lookups.
//! 2. **Score**: expected start (queue wait vs. data transfer), compute and egress cost,
//!    fragmentation, combined into one number of seconds.
//! 3. **Burst and deadline**: cloud clusters stay out unless the best owned cluster's expected
//!    wait exceeds the job's `burst.after` (or no owned cluster can run it), or it is expected to
//!    finish the job past its `runtime.deadline`; clusters expected to finish late are penalised.
//! 4. **Decide**: the lowest score wins, ties by cluster name. Late binding: the caller offers the
//!    job only when [`Choice::starts_now`]; otherwise it stays queued.
//!
//! # Files, in pipeline order
//!
//! Each file uses only files listed above it (the tests use them all).
//!
//! - What every stage reads, leaves first:
//!   - `name.rs`: [`Name`] and [`Names`], shared text for clusters, regions and GPU types.
//!   - `network.rs`: the [`NetworkTable`] of links between regions (transfer time, egress).
//!   - `index.rs`: each cluster's free nodes bucketed by free GPUs, for best fit.
//!   - `quote.rs`: members' start quotes ([`Quotes`], [`quote_key`]), kept per cluster.
//!   - `snapshot.rs`: [`ClusterSnapshot`] and [`FederationSnapshot`], what placement reads.
//!   - `need.rs`: the job as placement reads it ([`PayloadKind`], the gang's per-replica demand).
//!   - `reasons.rs`: why a cluster may not take a job ([`Rejection`], [`Reasons`]) in words.
//!   - `config.rs`: the weights placement runs with ([`PlacementConfig`]).
//!   - `breakdown.rs`: the terms of a cluster's score ([`ScoreBreakdown`]) and their total.
//!   - `verdict.rs`: one cluster's [`Verdict`] as a [`Candidate`], and how candidates rank.
//! - The stages:
//!   - `fit.rs` (and `fit/scan.rs`, its reference for the tests): best fit of a gang onto a
//!     cluster's free nodes, one GPU type per gang.
//!   - `filter.rs`: stage 1, the checks that do not change with load.
//!   - `reserve.rs`: [`ClusterSnapshot::reserve`] and [`ClusterSnapshot::fits_now`], the same
//!     filter and best fit applied to a cluster once a job is offered there.
//!   - `score.rs`: stage 2, the score formula.
//!   - `deadline.rs`: stage 3's deadline ([`DeadlineOutlook`]): the miss penalty and early burst.
//!   - `decision.rs`: the outcome ([`Decision`], [`Choice`]) and its one-sentence summary.
//!   - `place.rs`: [`place()`], [`place_waited`] and [`never_fits`], running the stages in order
//!     (stage 3's burst gate is here).
//!   - `hold.rs`: [`Holds`], clusters held for gangs that have waited long enough, with backfill.
//! - Beside the pipeline: `queue.rs` ([`queue`]), the federation queue's fair-share order.
//!
//! There is no I/O here, so the same code is unit-tested, property-tested, benchmarked
//! (`benches/placement.rs`) and replayed by the simulator.

mod breakdown;
mod config;
mod deadline;
mod decision;
mod filter;
mod fit;
mod hold;
mod index;
mod name;
mod need;
pub mod network;
mod options;
mod place;
pub mod queue;
mod quote;
mod reasons;
mod reserve;
mod score;
mod snapshot;
mod statics;
mod verdict;

#[cfg(test)]
mod tests;

pub use breakdown::ScoreBreakdown;
pub use config::{MAX_SIBLING_COPIES, PlacementConfig};
pub use deadline::DeadlineOutlook;
pub use decision::{Choice, Decision, JobLabel, KEPT_FEASIBLE, Omitted, OmittedRejections};
pub use hold::{HOLD_SCAN, Holds};
pub use name::{Name, Names};
pub use need::PayloadKind;
pub use network::{DataCopy, LinkCost, NetworkError, NetworkLink, NetworkTable};
pub use place::{never_fits, place, place_waited};
pub use quote::{Quote, QuotedStart, Quotes, quote_key};
pub use reasons::{Reasons, Rejection};
pub use snapshot::{ClusterSnapshot, FederationSnapshot};
pub use statics::{JobClass, StaticCache};
pub use verdict::{Candidate, Verdict};
