//! The metrics counters, as a cloud cluster's jobs are placed, run and finish.

use meridian_proto::inventory::{ClusterInfo, Tier};

use super::*;
use crate::tally::{GIB, Outcome, PendingReason, PriorityBand, Tally};

/// An 8-GPU burst job of tenant `vision` (priority 80) with 2 GiB of data homed in `us-east`.
const BURST_JOB: &str = "name: j\ntenant: vision\npriority: 80\ngang: {replicas: 1, resources: {gpus: 8}}\n\
    payload: {command: [x]}\nplacement: {burst: {after: 0s}}\n\
    data: [{uri: 's3://b/d', sizeGiB: 2, region: us-east}]\n";

impl Harness {
    /// A core with one connected cloud cluster `cloud-eu` in `eu-west` (one free 8-GPU node,
    /// H100 at $4/GPU-hour), and its stream.
    fn cloud() -> (Self, ConnId) {
        let mut h = Harness::new(CoreConfig::default());
        let info = ClusterInfo {
            region: "eu-west".into(),
            tier: Tier::Cloud,
            prices: BTreeMap::from([("h100".to_string(), 4.0)]),
            ..cluster_info("cloud-eu")
        };
        let (conn, _) = h.attach(AgentHello { info, ..hello("cloud-eu", "a") });
        h.event(conn, inventory_event(&[8]));
        (h, conn)
    }

    /// The answer to a submit of `text`: the new job's id, or why it was refused.
    fn try_submit(&mut self, text: &str) -> Result<String, Error> {
        let effects = self.step(Input::Submit { spec: spec(text), reply: 7 });
        match effects.replies.into_iter().next() {
            Some((_, Ok(Reply::Submitted { job, .. }))) => Ok(job.id.clone()),
            Some((_, Err(e))) => Err(e),
            other => panic!("{other:?}"),
        }
    }

    fn tally(&mut self) -> Tally {
        self.core.view().tally().clone()
    }
}

#[test]
fn a_burst_job_that_runs_and_succeeds_is_counted_once_everywhere() {
    let (mut h, conn) = Harness::cloud();
    let id = h.try_submit(BURST_JOB).unwrap();
    h.now_ms += 3_000;
    let effects = h.step(Input::Round);
    assert!(effects.sends.iter().any(|(_, c)| matches!(c, GatewayCommand::Offer(_))), "{effects:?}");
    h.event(conn, accept(&id, 1));
    h.now_ms += 2_000;
    h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Running)));
    let tally = h.tally();
    assert_eq!(tally.decisions(Outcome::Placed), 1);
    let key = ("vision".to_string(), PriorityBand::High);
    let delay = &tally.queueing_delay()[&key];
    assert_eq!((delay.count(), delay.sum()), (1, 5.0));
    assert_eq!(tally.moved_bytes().get(&("us-east".to_string(), "eu-west".to_string())), Some(&(2.0 * GIB)));
    assert!(tally.completion_time().is_empty() && tally.burst().is_empty());

    // Reported running again (a heartbeat's copy): nothing new is counted.
    h.now_ms += 1_800_000;
    h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Running)));
    assert_eq!(h.tally().queueing_delay()[&key].count(), 1);

    h.now_ms += 1_800_000;
    h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Succeeded)));
    let tally = h.tally();
    let completion = &tally.completion_time()[&key];
    assert_eq!((completion.count(), completion.sum()), (1, 3_605.0));
    assert_eq!(tally.finished().get(&("vision".to_string(), "succeeded")), Some(&1));
    // 8 GPUs for one hour at $4 per GPU-hour.
    let burst = tally.burst()["cloud-eu"];
    assert_eq!((burst.gpu_seconds, burst.usd), (8.0 * 3_600.0, 32.0));
    assert_eq!(tally.decisions(Outcome::Placed), 1);
}

#[test]
fn a_job_no_cluster_could_ever_run_is_counted_as_refused_at_submit() {
    let (mut h, _) = Harness::cloud();
    let error = h.try_submit(&BURST_JOB.replace("gpus: 8", "gpus: 16")).unwrap_err();
    assert!(matches!(error, Error::NeverFits { .. }), "{error}");
    assert_eq!(h.tally().decisions(Outcome::RefusedNeverFits), 1);
    assert_eq!(h.tally().decisions(Outcome::Placed), 0);
}

#[test]
fn a_job_every_cluster_rejects_now_waits_and_counts_the_reasons() {
    let (mut h, conn) = Harness::cloud();
    let id = h.try_submit(BURST_JOB).unwrap();
    assert_eq!(h.core.view().pending_reason(&id), Some(PendingReason::NotYetPlaced));
    h.step(Input::AgentGone { conn });
    h.step(Input::Round);
    let tally = h.tally();
    assert_eq!((tally.decisions(Outcome::Waiting), tally.decisions(Outcome::Placed)), (1, 0));
    assert_eq!(tally.rejections().get("disconnected"), Some(&1));
    assert_eq!(h.core.view().pending_reason(&id), Some(PendingReason::NoEligibleCluster));
}
