//! Start quotes: a round that leaves a job queued asks its best clusters that cannot start it
//! now, once per shape while a quote is fresh or a request in flight; the answer replaces the
//! estimate from the release profile; nothing waits for it.

use meridian_proto::inventory::{GpuRelease, QueuePressure};
use meridian_proto::protocol::{StartQuote, TypeStart};

use super::*;

const GANG: &str = "name: gang\ntenant: t\ngang: {replicas: 2, resources: {gpus: 8}}\npayload: {command: [x]}\n";

/// The quote requests in `fx`: (stream, request id, job).
fn quote_requests(fx: &Effects) -> Vec<(ConnId, u64, String)> {
    fx.sends
        .iter()
        .filter_map(|(c, m)| match m {
            GatewayCommand::Quote { request_id, job_id, .. } => Some((*c, *request_id, job_id.clone())),
            _ => None,
        })
        .collect()
}

fn quote(request_id: u64, after_secs: u64) -> AgentEvent {
    let starts = vec![TypeStart { gpu_type: "h100".into(), after_secs, preempts: false }];
    AgentEvent::Quote { request_id, result: Ok(StartQuote { starts, basis: "EASY plan".into() }) }
}

/// A busy cluster whose release profile says every GPU is back in 10 minutes.
fn busy(h: &mut Harness, name: &str) -> ConnId {
    let (conn, _) = h.connect(name, name);
    h.event(conn, inventory_event(&[0, 0]));
    let pressure = QueuePressure { releases: vec![GpuRelease { after_secs: 600, gpus: 16 }], ..Default::default() };
    h.event(conn, AgentEvent::Pressure(pressure));
    conn
}

fn wait_on(h: &mut Harness, id: &str, cluster: &str) -> Option<(f64, bool)> {
    let explained = h.core.view().explain(id)?;
    let candidate = explained.candidates.iter().find(|c| c.cluster == cluster)?;
    candidate.score.as_ref().map(|s| (s.expected_wait_secs, s.quoted))
}

#[test]
fn a_waiting_gang_asks_for_a_quote_once_and_its_answer_replaces_the_guess() {
    let mut h = Harness::new(CoreConfig::default());
    let east = busy(&mut h, "east");
    let gang = h.submit(GANG);
    // A second gang of the same shape shares the quote: one request for both.
    let twin = h.submit(&GANG.replace("name: gang", "name: twin"));
    let fx = h.step(Input::Round);
    assert_eq!(h.state(&gang), JobState::Queued);
    let asked = quote_requests(&fx);
    assert_eq!(asked.len(), 1, "{asked:?}");
    let (conn, request_id, job) = asked[0].clone();
    assert_eq!((conn, job.as_str()), (east, gang.as_str()));
    assert_eq!(wait_on(&mut h, &gang, "east"), Some((600.0, false)));
    // The round did not wait for the answer: both jobs are decided already.
    assert!(wait_on(&mut h, &twin, "east").is_some());

    // The member's plan: whole nodes are back only in two hours.
    h.advance(Duration::from_secs(5));
    let fx = h.event(east, quote(request_id, 7200));
    assert!(fx.sends.is_empty());
    assert!(h.core.wants_round(), "a quote that may change a decision asks for a round");
    // The next round decides again at once (the decision is older than the quote), and asks
    // nothing.
    h.advance(Duration::from_secs(1));
    let fx = h.step(Input::Round);
    assert!(quote_requests(&fx).is_empty(), "{:?}", fx.sends);
    assert_eq!(wait_on(&mut h, &gang, "east"), Some((7200.0 - 1.0, true)));
    // The quote keeps until its time to live: a later refresh reads it and asks nothing.
    h.advance(Duration::from_secs(23));
    let pressure = QueuePressure { releases: vec![GpuRelease { after_secs: 576, gpus: 16 }], ..Default::default() };
    h.event(east, AgentEvent::Pressure(pressure));
    h.advance(Duration::from_secs(8));
    let fx = h.step(Input::Round);
    assert!(quote_requests(&fx).is_empty(), "{:?}", fx.sends);
    assert_eq!(wait_on(&mut h, &gang, "east"), Some((7200.0 - 32.0, true)));
    let summary = h.summary(&gang);
    assert!(summary.contains("by east's own plan"), "{summary}");

    // Past the quote's time to live (60 s) it is dropped and asked again.
    h.advance(Duration::from_secs(30));
    h.event(east, AgentEvent::Pressure(QueuePressure::default()));
    h.step(Input::Tick);
    let fx = h.step(Input::Round);
    assert_eq!(quote_requests(&fx).len(), 1, "{:?}", fx.sends);
    assert!(wait_on(&mut h, &gang, "east").is_some_and(|(_, quoted)| !quoted));
}

#[test]
fn an_answer_from_another_stream_or_to_an_unknown_request_changes_nothing() {
    let mut h = Harness::new(CoreConfig::default());
    let east = busy(&mut h, "east");
    let west = busy(&mut h, "west");
    let gang = h.submit(GANG);
    let fx = h.step(Input::Round);
    let asked = quote_requests(&fx);
    assert_eq!(asked.len(), 2, "both clusters are candidates: {asked:?}");
    let east_request = asked.iter().find(|(c, _, _)| *c == east).map(|a| a.1).unwrap();
    // West answers east's request, and someone answers a request never made.
    h.event(west, quote(east_request, 60));
    h.event(east, quote(9_999, 60));
    h.step(Input::Round);
    assert_eq!(wait_on(&mut h, &gang, "east"), Some((600.0, false)));
    assert_eq!(wait_on(&mut h, &gang, "west"), Some((600.0, false)));
}

#[test]
fn a_member_that_cannot_quote_is_not_asked_again_while_its_answer_is_fresh() {
    let mut h = Harness::new(CoreConfig::default());
    let east = busy(&mut h, "east");
    let gang = h.submit(GANG);
    let fx = h.step(Input::Round);
    let (_, request_id, _) = quote_requests(&fx)[0].clone();
    h.event(east, AgentEvent::Quote { request_id, result: Err("the kubernetes backend gives no start quotes".into()) });
    h.advance(Duration::from_secs(5));
    let fx = h.step(Input::Round);
    assert!(quote_requests(&fx).is_empty());
    assert_eq!(wait_on(&mut h, &gang, "east"), Some((600.0, false)), "the guess stays");
}

#[test]
fn quotes_are_off_with_no_candidates_and_a_job_that_starts_now_asks_nothing() {
    let mut config = CoreConfig::default();
    config.placement.quote_candidates = 0;
    let mut h = Harness::new(config);
    busy(&mut h, "east");
    h.submit(GANG);
    assert!(quote_requests(&h.step(Input::Round)).is_empty());

    let mut h = Harness::new(CoreConfig::default());
    h.east(&[8, 8]);
    let gang = h.submit(GANG);
    let fx = h.step(Input::Round);
    assert_eq!(h.state(&gang), JobState::Offered);
    assert!(quote_requests(&fx).is_empty());
}

#[test]
fn one_cluster_has_at_most_four_requests_in_flight_and_a_lost_answer_is_asked_again() {
    let mut h = Harness::new(CoreConfig::default());
    let (conn, _) = h.connect("east", "east");
    h.event(conn, inventory_event(&[0; 8]));
    for replicas in 2..=7 {
        h.submit(
            &GANG
                .replace("replicas: 2", &format!("replicas: {replicas}"))
                .replace("name: gang", &format!("name: g{replicas}")),
        );
    }
    let fx = h.step(Input::Round);
    assert_eq!(quote_requests(&fx).len(), 4, "six shapes, four in flight at most");
    assert_eq!(h.core.quotes.in_flight(), 4);
    // No answer comes: past the request timeout, the next refresh of the decisions asks again.
    h.advance(Duration::from_secs(31));
    let fx = h.step(Input::Round);
    assert_eq!(quote_requests(&fx).len(), 4);
}

#[test]
fn a_cluster_past_the_best_three_is_asked_when_its_preemptible_gpus_could_hold_a_higher_priority_gang() {
    let mut h = Harness::new(CoreConfig::default());
    for name in ["a", "b", "c", "d"] {
        busy(&mut h, name);
    }
    // `e` frees nothing for two hours, but runs 16 GPUs of preemptible priority-10 jobs.
    let (e, _) = h.connect("e", "e");
    h.event(e, inventory_event(&[0, 0]));
    let pressure = QueuePressure {
        releases: vec![GpuRelease { after_secs: 7200, gpus: 16 }],
        preemptible: vec![meridian_proto::inventory::PreemptibleGpus { priority: 10, gpus: 16 }],
        ..Default::default()
    };
    h.event(e, AgentEvent::Pressure(pressure));
    let urgent = h.submit(&GANG.replace("tenant: t", "tenant: t\npriority: 90"));
    let fx = h.step(Input::Round);
    assert_eq!(h.state(&urgent), JobState::Queued);
    let asked: Vec<ConnId> = quote_requests(&fx).into_iter().map(|(c, _, _)| c).collect();
    assert_eq!(asked.len(), 4, "the best three and `e`: {asked:?}");
    assert!(asked.contains(&e), "{asked:?}");

    // A job that does not outrank `e`'s preemptible jobs (priority 10) gains nothing there.
    let low = h.submit(&GANG.replace("tenant: t", "tenant: u\npriority: 10").replace("replicas: 2", "replicas: 1"));
    let fx = h.step(Input::Round);
    assert_eq!(h.state(&low), JobState::Queued);
    let asked: Vec<ConnId> = quote_requests(&fx).into_iter().filter(|(_, _, j)| *j == low).map(|(c, _, _)| c).collect();
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert!(!asked.contains(&e), "{asked:?}");
}

#[test]
fn a_higher_priority_job_asks_the_cluster_by_its_data_before_copying_its_data_away() {
    let mut h = Harness::new(CoreConfig::default());
    let (home, urgent) = home_full_of_preemptible_jobs_and_far_idle(&mut h);

    // It starts now on `far` only after a long copy: the round asks `home` first, offers nothing.
    let fx = h.step(Input::Round);
    assert_eq!(h.state(&urgent), JobState::Queued);
    let asked = quote_requests(&fx);
    assert!(matches!(&asked[..], [(c, _, _)] if *c == home), "{asked:?}");
    assert!(offers(&fx).is_empty(), "{:?}", fx.sends);
    let message = h.job(&urgent).message;
    assert!(message.contains("far can start it now after copying its data; asking home first"), "{message}");
    // While the answer is on its way, later rounds wait for it.
    let fx = h.step(Input::Round);
    assert!(offers(&fx).is_empty() && quote_requests(&fx).is_empty(), "{:?}", fx.sends);

    // `home` would preempt for it in 30 s: it is offered there, with no copy.
    let starts = vec![TypeStart { gpu_type: "h100".into(), after_secs: 30, preempts: true }];
    let answer =
        AgentEvent::Quote { request_id: asked[0].1, result: Ok(StartQuote { starts, basis: "EASY plan".into() }) };
    h.event(home, answer);
    let fx = h.step(Input::Round);
    assert_eq!(h.job(&urgent).cluster.as_deref(), Some("home"), "{:?}", fx.sends);
    assert_eq!(offers(&fx), vec![urgent.clone()]);
}

#[test]
fn a_job_asks_the_cluster_by_its_data_before_a_copy_and_waits_there_when_its_plan_starts_it_sooner() {
    // `home`, by the data, is full and holds no preemptible job; its release profile guesses two
    // hours. `far` starts the gang now, after copying 2 TiB (well over an hour).
    let mut h = Harness::new(CoreConfig::default());
    let home = full_cluster_by_the_data(&mut h, Vec::new());
    let gang = h.submit(&format!("{GANG}{TWO_TIB}"));
    let fx = h.step(Input::Round);
    assert!(offers(&fx).is_empty(), "{:?}", fx.sends);
    let asked = quote_requests(&fx);
    assert!(matches!(&asked[..], [(c, _, j)] if *c == home && *j == gang), "{asked:?}");
    let message = h.job(&gang).message;
    assert!(message.contains("far can start it now after copying its data; asking home first"), "{message}");

    // Its own plan frees the nodes in 5 minutes: the job waits for `home` instead of copying.
    h.event(home, quote(asked[0].1, 300));
    let fx = h.step(Input::Round);
    assert!(offers(&fx).is_empty(), "{:?}", fx.sends);
    assert_eq!(h.state(&gang), JobState::Queued);
    assert_eq!(wait_on(&mut h, &gang, "home"), Some((300.0, true)));
    let explained = h.core.view().explain(&gang).expect("explained");
    assert!(explained.summary.starts_with("Waiting for home"), "{}", explained.summary);

    // A job whose copy takes less than a minute longer than at `home` is offered to `far` at
    // once: the question is not worth the round trip.
    let near = "data: [{uri: 's3://b/n', sizeGiB: 1, region: us-east}]\n";
    let small = h.submit(&format!("{}{near}", GANG.replace("name: gang", "name: small")));
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), vec![small.clone()], "{:?}", fx.sends);
    assert_eq!(h.job(&small).cluster.as_deref(), Some("far"));
}

#[test]
fn the_answer_that_home_cannot_preempt_soon_sends_the_job_to_its_copy() {
    let mut h = Harness::new(CoreConfig::default());
    let (home, urgent) = home_full_of_preemptible_jobs_and_far_idle(&mut h);
    let fx = h.step(Input::Round);
    let asked = quote_requests(&fx);
    assert_eq!(asked.len(), 1, "{asked:?}");
    // Its plan starts the gang only in two hours: the copy wins.
    h.event(home, quote(asked[0].1, 7200));
    let fx = h.step(Input::Round);
    assert_eq!(h.job(&urgent).cluster.as_deref(), Some("far"), "{:?}", fx.sends);
}

#[test]
fn a_member_that_never_answers_is_not_waited_for_before_the_copy_again() {
    let mut h = Harness::new(CoreConfig::default());
    let (home, urgent) = home_full_of_preemptible_jobs_and_far_idle(&mut h);
    let fx = h.step(Input::Round);
    assert_eq!(quote_requests(&fx).len(), 1);
    assert!(offers(&fx).is_empty());
    // `home` never answers: past the request timeout the copy goes ahead, and `home` is not
    // asked again for it.
    h.advance(Duration::from_secs(16));
    let fx = h.step(Input::Round);
    assert_eq!(h.job(&urgent).cluster.as_deref(), Some("far"), "{:?}", fx.sends);
    assert!(quote_requests(&fx).iter().all(|(c, _, _)| *c != home), "{:?}", fx.sends);
}

/// Data by `home` (us-east) that takes well over an hour to copy to `far` (eu-west).
const TWO_TIB: &str = "data: [{uri: 's3://b/d', sizeGiB: 2000, region: us-east}]\n";

/// `home`, in the data's region, full and freeing nothing for two hours by its release profile,
/// with `preemptible` GPUs of running jobs; `far`, in another region, idle. Returns `home`'s
/// stream.
fn full_cluster_by_the_data(h: &mut Harness, preemptible: Vec<meridian_proto::inventory::PreemptibleGpus>) -> ConnId {
    let (home, _) = h.connect("home", "home");
    h.event(home, inventory_event(&[0, 0]));
    let pressure =
        QueuePressure { releases: vec![GpuRelease { after_secs: 7200, gpus: 16 }], preemptible, ..Default::default() };
    h.event(home, AgentEvent::Pressure(pressure));
    let (far, _) = h.attach(AgentHello {
        info: meridian_proto::inventory::ClusterInfo { region: "eu-west".into(), ..cluster_info("far") },
        ..hello("far", "far")
    });
    h.event(far, inventory_event(&[8, 8]));
    home
}

/// [`full_cluster_by_the_data`], its running jobs preemptible at priority 10, and a priority-90
/// gang whose 2 TiB of data sit by `home`, submitted. Returns `home`'s stream and the gang's id.
fn home_full_of_preemptible_jobs_and_far_idle(h: &mut Harness) -> (ConnId, String) {
    let preemptible = vec![meridian_proto::inventory::PreemptibleGpus { priority: 10, gpus: 16 }];
    let home = full_cluster_by_the_data(h, preemptible);
    (home, h.submit(&format!("{GANG}priority: 90\n{TWO_TIB}")))
}

#[test]
fn quote_before_copy_secs_sets_which_copies_wait_for_a_question_and_must_not_be_negative() {
    // A copy of well over an hour, but a threshold above it: the job copies at once.
    let mut config = CoreConfig::default();
    config.placement.quote_before_copy_secs = 86_400.0;
    let mut h = Harness::new(config);
    full_cluster_by_the_data(&mut h, Vec::new());
    let gang = h.submit(&format!("{GANG}{TWO_TIB}"));
    let fx = h.step(Input::Round);
    assert!(quote_requests(&fx).is_empty(), "{:?}", fx.sends);
    assert_eq!(offers(&fx), vec![gang.clone()]);
    assert_eq!(h.job(&gang).cluster.as_deref(), Some("far"));

    let bad = meridian_placement::PlacementConfig { quote_before_copy_secs: -1.0, ..Default::default() };
    assert_eq!(bad.problems("placement."), ["placement.quoteBeforeCopySecs: -1 must be a finite number >= 0"]);
}
