//! Members' start quotes: where a gang does not fit now, the member's own plan replaces the
//! estimate from its release profile.

use std::sync::Arc;

use super::*;

const NOW_MS: i64 = 1_000_000;

/// `c` with quotes for `spec`'s shape: (GPU type, seconds from now) per type.
fn quoted(c: ClusterSnapshot, spec: &JobSpec, starts: &[(&str, u64)]) -> ClusterSnapshot {
    let mut quotes = Quotes::new();
    let starts = starts
        .iter()
        .map(|(t, secs)| QuotedStart {
            gpu_type: Name::from(*t),
            start_at_ms: NOW_MS + *secs as i64 * 1000,
            preempts: false,
        })
        .collect();
    quotes.insert(quote_key(spec), Quote { starts, received_at_ms: NOW_MS });
    c.with_quotes(Arc::new(quotes), NOW_MS)
}

fn wait_on(d: &Decision, cluster: &str) -> (f64, bool) {
    let score = d.candidates.iter().find(|c| c.cluster == cluster).and_then(|c| c.score()).cloned();
    score.map(|s| (s.expected_wait_secs, s.quoted)).unwrap_or((f64::NAN, false))
}

#[test]
fn a_members_quote_replaces_the_guess_from_its_release_profile() {
    let spec = job(2, 8);
    // By their profiles, `a` frees all its GPUs in 10 minutes and `b` in 30.
    let a = busy("a", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], 600);
    let b = busy("b", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], 1800);
    let d = place(&spec, &federation(vec![a.clone(), b.clone()]), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("a"));
    assert_eq!(wait_on(&d, "a"), (600.0, false));

    // Their plans say otherwise: `a`'s whole nodes come back only in an hour, `b`'s in 15 minutes.
    let fed = federation(vec![quoted(a, &spec, &[("h100", 3600)]), quoted(b, &spec, &[("h100", 900)])]);
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("b"), "{}", d.summary());
    assert_eq!(wait_on(&d, "a"), (3600.0, true));
    assert_eq!(wait_on(&d, "b"), (900.0, true));
    assert_eq!(d.chosen.as_ref().map(|c| c.expected_start_secs), Some(900.0));

    // A quote for another shape is not used.
    let other = job(1, 8);
    let d = place(&other, &fed, &PlacementConfig::default());
    assert_eq!(wait_on(&d, "a"), (600.0, false));
}

#[test]
fn with_work_waiting_ahead_the_later_of_quote_and_guess_counts() {
    let spec = job(2, 8);
    let a = busy("a", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], 1800);
    let mut fed = federation(vec![quoted(a, &spec, &[("h100", 300)])]);
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(wait_on(&d, "a"), (300.0, true));
    // A federation job decided earlier in the round waits for `a`: the member's plan does not
    // know it, so the profile's later estimate counts.
    fed.clusters[0].expect_waiting(16);
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(wait_on(&d, "a"), (1800.0, true));
}

#[test]
fn the_quoted_type_that_starts_soonest_for_its_price_is_the_one_waited_for() {
    let spec = job(2, 8);
    let c = busy("c", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0]), shape("a100-80g", 8, &[0, 0])], 600);
    let c = priced(priced(c, "h100", 4.0), "a100-80g", 2.0);
    // The cheaper A100s start in 5 hours, the H100s in 10 minutes: one hour of the gang costs $64
    // on H100s (64 minutes of waiting at 60 s per $), so the H100s win.
    let fed = federation(vec![quoted(c, &spec, &[("a100-80g", 5 * 3600), ("h100", 600)])]);
    let d = place(&spec, &fed, &PlacementConfig::default());
    let score = d.chosen_candidate().and_then(|c| c.score()).cloned().expect("scored");
    assert_eq!((score.gpu_type.as_str(), score.expected_wait_secs, score.quoted), ("h100", 600.0, true));
}

#[test]
fn a_quote_past_its_time_reads_as_now_and_a_gang_that_fits_ignores_quotes() {
    let spec = job(1, 8);
    let a = busy("a", "us-east", Tier::Owned, vec![shape("h100", 8, &[0])], 1800);
    let mut quotes = Quotes::new();
    quotes.insert(
        quote_key(&spec),
        Quote {
            starts: vec![QuotedStart { gpu_type: Name::from("h100"), start_at_ms: NOW_MS - 5000, preempts: false }],
            received_at_ms: 0,
        },
    );
    let fed = federation(vec![a.with_quotes(Arc::new(quotes), NOW_MS)]);
    assert_eq!(wait_on(&place(&spec, &fed, &PlacementConfig::default()), "a"), (0.0, true));

    let free = cluster("f", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let fed = federation(vec![quoted(free, &spec, &[("h100", 3600)])]);
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(wait_on(&d, "f"), (0.0, false));
    assert!(d.chosen.as_ref().is_some_and(|c| c.starts_now));
}

#[test]
fn a_quote_that_starts_by_preemption_is_offered_now_and_the_summary_says_so() {
    let spec = job(1, 8);
    let a = busy("a", "us-east", Tier::Owned, vec![shape("h100", 8, &[0])], 3600);
    let b = busy("b", "us-east", Tier::Owned, vec![shape("h100", 8, &[0])], 1800);
    let mut quotes = Quotes::new();
    let start = QuotedStart { gpu_type: Name::from("h100"), start_at_ms: NOW_MS + 30_000, preempts: true };
    quotes.insert(quote_key(&spec), Quote { starts: vec![start], received_at_ms: NOW_MS });
    let fed = federation(vec![a.with_quotes(Arc::new(quotes), NOW_MS), b]);
    let d = place(&spec, &fed, &PlacementConfig::default());
    let choice = d.chosen.clone().expect("chosen");
    assert_eq!((choice.cluster.as_str(), choice.starts_now), ("a", true));
    let score = d.chosen_candidate().and_then(|c| c.score()).cloned().expect("scored");
    assert!(score.preempts && score.quoted && !score.fits_now, "{score:?}");
    assert!(d.summary().contains("once a preempts lower-priority preemptible jobs"), "{}", d.summary());
}
