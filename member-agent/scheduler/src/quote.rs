//! Start quotes: when the member's own plan would start a gang of a given shape, per GPU type.
//!
//! The gateway asks for these where its own estimate, made from the member's release profile,
//! is a guess: the profile says how many GPUs come back when, not of which type nor on which
//! nodes, so a gang of eight 8-GPU replicas may be "expected" to start when 64 GPUs of any type
//! are back, scattered over nodes it cannot use. The quote replays the running jobs' expected
//! ends node by node (the same plan the member's backfill reservation uses, see
//! `reservation.rs`) and places the whole gang after each, one GPU type at a time.
//!
//! A job of higher priority than running preemptible jobs is quoted the preemption grace, marked
//! `preempts`, where stopping them would make room sooner (by the rules of
//! [`preempt`](BuiltinScheduler::preempt)): offered the job, the member queues it and preempts.
//!
//! What it does not count: jobs queued on the member itself. The gateway adds those (and the
//! federation's own jobs waiting for the member) from the pressure report, taking the later of
//! the quote and its own estimate when anything waits ahead.

use std::time::Duration;

use meridian_proto::protocol::{StartQuote, TypeStart};

use super::LocalJob;
use super::scheduler::BuiltinScheduler;

/// What a builtin member's quote says it is based on.
pub const QUOTE_BASIS: &str = "EASY plan: running jobs' expected ends, node by node";

impl BuiltinScheduler {
    /// When `job`'s gang could start, per GPU type of this member that it accepts (in the order
    /// the types are first declared), if running jobs end at their estimates. A type on which the
    /// gang can never start (too few nodes that accept it) is left out. Reads only; `now` is the
    /// scheduler's clock.
    pub fn quote(&self, job: &LocalJob, now: Duration) -> StartQuote {
        let mut types: Vec<&str> = Vec::new();
        for node in &self.nodes {
            let spec = &node.spec;
            if job.accepts_gpu(&spec.gpu_type, spec.gpu_memory_gib) && !types.contains(&spec.gpu_type.as_str()) {
                types.push(&spec.gpu_type);
            }
        }
        let starts = types
            .into_iter()
            .filter_map(|gpu_type| {
                let pinned = LocalJob { gpu_types: vec![gpu_type.to_string()], ..job.clone() };
                let plan = self.plan(&pinned, now)?;
                let after = plan.at.saturating_sub(now);
                // Sooner by preemption, for a job of higher priority than preemptible ones here.
                if !after.is_zero()
                    && let Some(grace) = self.start_by_preemption(&pinned, now)
                    && grace < after
                {
                    return Some(TypeStart {
                        gpu_type: gpu_type.to_string(),
                        after_secs: ceil_secs(grace),
                        preempts: true,
                    });
                }
                Some(TypeStart { gpu_type: gpu_type.to_string(), after_secs: ceil_secs(after), preempts: false })
            })
            .collect();
        StartQuote { starts, basis: QUOTE_BASIS.to_string() }
    }
}

/// Whole seconds, rounded up, so a quote never promises a start earlier than the plan.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::testkit::{job, node};
    use crate::{BuiltinScheduler, NodeSpec, QueueSpec};

    const MIN: u64 = 60;

    fn typed(name: &str, gpu_type: &str) -> NodeSpec {
        NodeSpec { shape: gpu_type.to_lowercase(), gpu_type: gpu_type.into(), ..node(name, 8) }
    }

    #[test]
    fn a_gang_is_quoted_when_whole_nodes_of_its_type_come_back_not_when_enough_gpus_do() {
        // Two A100 nodes and two V100 nodes of 8 GPUs. A 1-GPU job holds each A100 node for 10
        // minutes, and an 8-GPU job holds each V100 node for 5 minutes. 14 GPUs are free now, so
        // by count a 2 × 8 gang needs only one 8-GPU release; but the A100 nodes are not whole
        // until 10 minutes, while both V100 nodes are back at 5.
        let nodes = vec![typed("a1", "A100"), typed("a2", "A100"), typed("v1", "V100"), typed("v2", "V100")];
        let mut s = BuiltinScheduler::new(nodes, vec![QueueSpec::new("q", 1.0)]).unwrap();
        let now = Duration::ZERO;
        for (id, gpus, gpu_type, mins) in
            [("x1", 1, "A100", 10), ("x2", 1, "A100", 10), ("y1", 8, "V100", 5), ("y2", 8, "V100", 5)]
        {
            let mut j = job(id, "q", 1, gpus, mins * MIN);
            j.gpu_types = vec![gpu_type.to_string()];
            s.start_now(j, now).unwrap();
        }
        let gang = job("g", "q", 2, 8, 3600);
        let quote = s.quote(&gang, now);
        let starts: Vec<(&str, u64)> = quote.starts.iter().map(|t| (t.gpu_type.as_str(), t.after_secs)).collect();
        assert_eq!(starts, [("A100", 600), ("V100", 300)]);
        assert_eq!(quote.earliest().map(|t| t.gpu_type.as_str()), Some("V100"));

        // A pinned job gets only its type; a gang too big for the member gets nothing.
        let mut pinned = job("p", "q", 2, 8, 60);
        pinned.gpu_types = vec!["A100".into()];
        assert_eq!(s.quote(&pinned, now).starts.len(), 1);
        assert!(s.quote(&job("big", "q", 3, 8, 60), now).starts.is_empty());
        // Later on the same plan, the wait shrinks with the clock.
        assert_eq!(s.quote(&gang, Duration::from_secs(MIN)).starts[1].after_secs, 240);
    }

    #[test]
    fn a_gang_that_fits_now_is_quoted_zero() {
        let s = BuiltinScheduler::new(vec![node("a1", 8)], vec![QueueSpec::new("q", 1.0)]).unwrap();
        let quote = s.quote(&job("g", "q", 1, 8, 60), Duration::ZERO);
        assert_eq!(quote.starts.len(), 1);
        assert_eq!(quote.starts[0].after_secs, 0);
    }
}

#[cfg(test)]
mod preemption_tests {
    use std::time::Duration;

    use crate::testkit::{job, node};
    use crate::{BuiltinScheduler, PreemptionPolicy, QueueSpec};

    #[test]
    fn a_higher_priority_gang_is_quoted_the_grace_where_preemption_makes_room() {
        let mut s = BuiltinScheduler::new(vec![node("n1", 8), node("n2", 8)], vec![QueueSpec::new("q", 1.0)]).unwrap();
        let now = Duration::ZERO;
        let mut victim = job("victim", "q", 1, 8, 3600);
        victim.preemptible = true;
        victim.priority = 10;
        s.start_now(victim, now).unwrap();
        s.start_now(job("steady", "q", 1, 8, 7200), now).unwrap();

        // Reported: 8 GPUs a job above priority 10 could have.
        let pressure = s.pressure(now);
        assert_eq!(pressure.preemptible.len(), 1);
        assert_eq!((pressure.preemptible[0].priority, pressure.preemptible[0].gpus), (10, 8));
        assert_eq!(pressure.preemptible_below(11), 8);
        assert_eq!(pressure.preemptible_below(10), 0);

        let mut urgent = job("urgent", "q", 1, 8, 600);
        urgent.priority = 90;
        let quote = s.quote(&urgent, now);
        assert_eq!(quote.starts.len(), 1);
        assert!(quote.starts[0].preempts);
        assert_eq!(quote.starts[0].after_secs, PreemptionPolicy::default().grace.as_secs());

        // Equal priority: no preemption, the plan's hour.
        let mut peer = job("peer", "q", 1, 8, 600);
        peer.priority = 10;
        let quote = s.quote(&peer, now);
        assert_eq!((quote.starts[0].after_secs, quote.starts[0].preempts), (3600, false));

        // A gang of two nodes cannot have the non-preemptible node: the plan, not preemption.
        let mut gang = job("gang", "q", 2, 8, 600);
        gang.priority = 90;
        let quote = s.quote(&gang, now);
        assert_eq!((quote.starts[0].after_secs, quote.starts[0].preempts), (7200, false));

        // A member that does not preempt quotes the plan and reports nothing preemptible.
        s.set_preemption(PreemptionPolicy::disabled());
        assert!(s.pressure(now).preemptible.is_empty());
        assert!(!s.quote(&urgent, now).starts[0].preempts);
    }
}
