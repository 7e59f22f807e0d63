//! What readers see: job lists, GPU usage and tenants.

use super::*;
use crate::record::{CandidateView, VerdictKind};

#[test]
fn lists_are_paged_oldest_first_with_a_continue_token() {
    let mut h = Harness::new(CoreConfig::default());
    h.east(&[8]);
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(h.submit(&JOB.replace("name: j", &format!("name: j{i}"))));
        h.advance(Duration::from_millis(1));
    }
    let view = h.core.view();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = view.list(&JobFilter::default(), 3, after.as_deref());
        seen.extend(page.jobs.iter().map(|j| j.id.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ids);
}

#[test]
fn a_list_limited_to_a_tenant_set_pages_through_only_those_tenants() {
    let mut h = Harness::new(CoreConfig::default());
    h.east(&[8]);
    let mut mine = Vec::new();
    for (i, tenant) in ["a", "b", "c", "a", "b", "a", "c", "a"].iter().enumerate() {
        let id = h
            .submit(&JOB.replace("name: j", &format!("name: j{i}")).replace("tenant: t", &format!("tenant: {tenant}")));
        if *tenant != "b" {
            mine.push(id);
        }
        h.advance(Duration::from_millis(1));
    }
    let view = h.core.view();
    let filter = JobFilter { tenants: Some(["a".to_string(), "c".to_string()].into()), ..JobFilter::default() };
    let (mut seen, mut after) = (Vec::new(), None);
    loop {
        let page = view.list(&filter, 2, after.as_deref());
        assert!(page.jobs.iter().all(|j| j.spec.tenant != "b"));
        seen.extend(page.jobs.iter().map(|j| j.id.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, mine);
}

fn used(job: &str, gpu_utilization: f64) -> JobReport {
    let usage = meridian_proto::protocol::GpuUsage { gpu_utilization, window: Duration::from_secs(60), samples: 6 };
    JobReport { usage: Some(usage), ..report(job, 1, JobState::Running) }
}

#[test]
fn a_running_job_whose_gpus_stay_under_the_threshold_becomes_idle_and_a_busy_sample_clears_it() {
    let idle_gpu = crate::IdleGpuConfig { threshold: 0.05, after: Duration::from_secs(120) };
    let mut h = Harness::new(CoreConfig { idle_gpu, ..Default::default() });
    let (id, conn) = h.running();
    let job = h.job(&id);
    assert_eq!(h.core.view().usage(&job, h.now_ms), None, "unknown before a sample");
    h.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![used(&id, 0.02)] });
    let first_low = h.now_ms;
    let seen = h.core.view().usage(&job, h.now_ms).unwrap();
    assert_eq!((seen.gpu_utilization, seen.idle), (0.02, false));
    h.advance(Duration::from_secs(60));
    // A heartbeat without a sample keeps the streak; one more low sample does not restart it.
    h.event(conn, AgentEvent::Heartbeat { seq: 2, jobs: vec![report(&id, 1, JobState::Running)] });
    h.event(conn, AgentEvent::Heartbeat { seq: 3, jobs: vec![used(&id, 0.01)] });
    h.advance(Duration::from_secs(60));
    let seen = h.core.view().usage(&job, h.now_ms).unwrap();
    assert!(seen.idle, "{seen:?}");
    assert_eq!(seen.idle_since_ms, Some(first_low));
    assert_eq!(h.core.view().usages(h.now_ms).count(), 1);
    h.event(conn, AgentEvent::Heartbeat { seq: 4, jobs: vec![used(&id, 0.9)] });
    let seen = h.core.view().usage(&job, h.now_ms).unwrap();
    assert_eq!((seen.gpu_utilization, seen.idle, seen.idle_since_ms), (0.9, false, None));
    // Once the job ends its usage is gone.
    h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Succeeded)));
    assert_eq!(h.core.view().usage(&h.job(&id), h.now_ms), None);
    assert_eq!(h.core.view().usages(h.now_ms).count(), 0);
}

#[test]
fn tenants_show_what_they_hold_and_wait_for_against_their_configured_weight_and_quota() {
    let mut config = CoreConfig::default();
    config.tenant_weights.insert("nlp".into(), 3.0);
    config.quotas.insert("vision".into(), crate::TenantQuota { max_gpus: Some(16), max_queued_jobs: None });
    let mut h = Harness::new(config);
    h.east(&[8]);
    let first = h.submit(JOB);
    let second = h.submit(&JOB.replace("name: j", "name: k"));
    h.step(Input::Round);
    assert_eq!((h.state(&first), h.state(&second)), (JobState::Offered, JobState::Queued));
    let tenants = h.core.view().tenants();
    let by_name =
        |name: &str| tenants.iter().find(|t| t.tenant == name).unwrap_or_else(|| panic!("{name}: {tenants:?}"));
    // Configured tenants are listed without jobs, with their weight and quota.
    let nlp = by_name("nlp");
    assert_eq!((nlp.weight, nlp.fair_share, nlp.running_jobs, nlp.queued_jobs), (3.0, 0.0, 0, 0));
    assert_eq!(by_name("vision").max_gpus, Some(16));
    // The only tenant with work gets the whole fair share and holds every GPU held.
    let t = by_name("t");
    assert_eq!((t.weight, t.fair_share, t.gpu_share), (1.0, 1.0, 1.0));
    assert_eq!((t.running_jobs, t.running_gpus, t.queued_jobs, t.queued_gpus), (1, 8, 1, 8));
    assert_eq!(t.max_gpus, None);
}

/// At scale a queued job keeps a compacted decision: its best feasible clusters, one example of
/// each kind of rejection, and counts for the rest; the summary still counts every cluster.
#[test]
fn a_waiting_jobs_explanation_lists_its_best_clusters_and_counts_the_rest() {
    let mut h = Harness::new(CoreConfig::default());
    let (clusters, gone) = (40, 10);
    for i in 0..clusters {
        let (conn, _) = h.connect(&format!("c{i:02}"), "a1");
        h.event(conn, inventory_event(&[0]));
        if i >= clusters - gone {
            h.step(Input::AgentGone { conn });
        }
    }
    let waits = h.submit(JOB);
    h.step(Input::Round);
    assert_eq!(h.state(&waits), JobState::Queued);

    let explained = h.core.view().explain(&waits).unwrap();
    let kept = meridian_placement::KEPT_FEASIBLE;
    let listed = |verdict| explained.candidates.iter().filter(|c| c.verdict == verdict).count();
    assert_eq!(listed(VerdictKind::Chosen) + listed(VerdictKind::Feasible), kept, "{:?}", explained.candidates);
    let rejected: Vec<&CandidateView> =
        explained.candidates.iter().filter(|c| c.verdict == VerdictKind::Rejected).collect();
    assert_eq!(rejected.len(), 1, "one example of the one kind of rejection");
    assert_eq!(rejected[0].cluster, format!("c{:02}", clusters - gone), "the first by name");
    let omitted = explained.omitted_candidates.expect("the rest are counted");
    assert_eq!(omitted.feasible as usize, clusters - gone - kept);
    assert_eq!(omitted.rejected.len(), 1);
    assert_eq!(
        (omitted.rejected[0].reason.as_str(), omitted.rejected[0].clusters as usize),
        ("disconnected", gone - 1)
    );
    let counts = format!("best of {} feasible, {gone} rejected", clusters - gone);
    assert!(explained.summary.contains(&counts), "{}", explained.summary);
}
