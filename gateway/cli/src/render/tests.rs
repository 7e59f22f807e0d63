//! Tests of the CLI's renderings.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use serde_json::json;

const SUBMITTED_MS: i64 = 1_764_000_000_000;

fn sample_job() -> Value {
    json!({
        "id": "j-7f3a", "state": "Running", "cluster": "onprem-east", "fencingToken": 3,
        "message": "", "submittedAtMs": SUBMITTED_MS, "startedAtMs": SUBMITTED_MS + 60_000,
        "finishedAtMs": null, "nodes": ["node-a", "node-b"],
        "spec": {
            "name": "llm-pretrain", "tenant": "research", "priority": 70,
            "labels": {"project": "llm"},
            "gang": {"replicas": 2, "resources": {"gpus": 8, "gpuTypes": ["h100"], "cpu": 32}},
            "runtime": {"estimate": "6h"},
            "data": [{"uri": "s3://corpus/v3", "sizeGiB": 500.0, "region": "us-east"}],
            "placement": {"regions": ["us-east"], "burst": {"after": "30m", "maxUsdPerHour": 80.0}},
            "payload": {"command": ["python", "train.py"]}
        }
    })
}

#[test]
fn jobs_table_shows_gang_size_and_age() {
    let list = json!({"jobs": [
        sample_job(),
        {"id": "j-2", "state": "Queued", "cluster": null, "submittedAtMs": SUBMITTED_MS + 180_000,
         "spec": {"name": "eval", "tenant": "ml", "gang": {"replicas": 1, "resources": {"gpus": 1}}}}
    ]});
    let text = jobs(&list, SUBMITTED_MS + 192_000);
    assert_eq!(
        text,
        "ID       NAME           TENANT     STATE     CLUSTER       GPUS   AGE\n\
         j-7f3a   llm-pretrain   research   Running   onprem-east   2×8    3m12s\n\
         j-2      eval           ml         Queued    -             1×1    12s\n"
    );
    assert_eq!(jobs(&json!({"jobs": []}), 0), "no jobs\n");
}

#[test]
fn job_detail_lists_status_and_spec() {
    let text = job(&sample_job(), SUBMITTED_MS + 3_600_000);
    assert!(text.starts_with("ID:             j-7f3a\n"), "{text}");
    assert!(
        text.contains(
            "Replicas:       RANK   NODE\n                0      node-a   coordinator\n                1      node-b\n"
        ),
        "{text}"
    );
    let mut queued = sample_job();
    queued["nodes"] = json!([]);
    queued["spec"]["payload"]["launcherEnv"] = json!("none");
    let shown = job(&queued, SUBMITTED_MS);
    assert!(shown.contains("Nodes:          -\n") && !shown.contains("RANK"), "{shown}");
    assert!(shown.contains("  Launcher:   none\n"), "{shown}");
    assert!(!job(&sample_job(), SUBMITTED_MS).contains("Launcher"), "the default is not repeated");
    assert!(text.contains("Submitted:      1h ago\n"), "{text}");
    assert!(text.contains("Finished:       -\n"), "{text}");
    assert!(text.contains("Run time:       59m\n"), "{text}");
    assert!(text.contains("  Gang:       2 replica(s) × 8 GPU (h100), 32 CPU\n"), "{text}");
    assert!(text.contains("  Labels:     project=llm\n"), "{text}");
    assert!(text.contains("  Data:       s3://corpus/v3 (500.0 GiB in us-east)\n"), "{text}");
    assert!(text.contains("  Placement:  regions us-east; burst after 30m up to $80.00/h\n"), "{text}");
    assert!(text.contains("  Command:    python train.py\n"), "{text}");
}

#[test]
fn an_idle_job_is_flagged_in_the_list_and_its_gpu_use_shown_in_the_detail() {
    let mut idle = sample_job();
    idle["state"] = json!("Running");
    idle["usage"] = json!({"gpuUtilization": 0.03, "idle": true, "idleSinceMs": SUBMITTED_MS, "sampledAtMs": SUBMITTED_MS, "windowSecs": 60});
    let list = jobs(&json!({"jobs": [idle.clone(), sample_job()]}), SUBMITTED_MS + 2_400_000);
    assert!(list.contains("Running IDLE"), "{list}");
    assert_eq!(list.matches("IDLE").count(), 1, "{list}");
    let text = job(&idle, SUBMITTED_MS + 2_400_000);
    assert!(text.contains("GPU use:") && text.contains("3% of its GPUs (mean of the last 1m"), "{text}");
    assert!(text.contains("IDLE since 40m"), "{text}");
    assert!(!self::job(&sample_job(), SUBMITTED_MS).contains("GPU use"), "absent when unknown");
}

#[test]
fn job_detail_says_how_often_and_when_the_job_was_preempted() {
    assert!(!job(&sample_job(), SUBMITTED_MS).contains("Preempted"));
    let mut preempted = sample_job();
    preempted["preemptions"] = json!(2);
    preempted["lastPreemptedAtMs"] = json!(SUBMITTED_MS + 600_000);
    let text = job(&preempted, SUBMITTED_MS + 3_600_000);
    let line = text.lines().find(|l| l.starts_with("Preempted")).unwrap_or_default();
    assert!(line.contains("2 times, last 50m ago"), "{text}");
}

#[test]
fn job_detail_shows_the_selectors() {
    let mut job_json = sample_job();
    job_json["spec"]["placement"] = json!({"clusterSelector": "gpu-fabric=ib", "nodeSelector": "rack,!preemptible"});
    let text = job(&job_json, SUBMITTED_MS + 3_600_000);
    assert!(
        text.contains("  Placement:  clusters matching gpu-fabric=ib; nodes matching rack,!preemptible\n"),
        "{text}"
    );
}

#[test]
fn explain_shows_scores_and_rejection_reasons() {
    let explanation = json!({
        "jobId": "j-7f3a", "state": "Bound", "cluster": "onprem-west", "decidedAtMs": SUBMITTED_MS,
        "summary": "Placed on onprem-west: it fits now and the data is 12s away.",
        "candidates": [
            {"cluster": "onprem-west", "region": "us-west", "tier": "owned", "verdict": "chosen",
             "reasons": ["fits now"],
             "score": {"fitsNow": true, "expectedWaitSecs": 0.0, "transferSecs": 12.5, "egressUsd": 1.2,
                       "computeUsd": 40.0, "fragmentation": 0.1, "total": 123.0}},
            {"cluster": "gcp-central", "region": "us-central", "tier": "cloud", "verdict": "feasible",
             "reasons": [],
             "score": {"fitsNow": false, "expectedWaitSecs": 720.0, "transferSecs": 95.0, "egressUsd": 10.0,
                       "computeUsd": 80.5, "fragmentation": 0.0, "total": 310.25}},
            {"cluster": "onprem-east", "region": "us-east", "tier": "owned", "verdict": "rejected",
             "reasons": ["the gang of 2×8 GPUs never fits: the largest node has 4 GPUs", "region not allowed"],
             "score": null}
        ]
    });
    assert_eq!(
        explain(&explanation),
        "Placed on onprem-west: it fits now and the data is 12s away.\n\
         \n\
         CLUSTER       REGION       TIER    VERDICT    WAIT   TRANSFER   COST($)   SCORE\n\
         onprem-west   us-west      owned   chosen     now    13s        41.20     123.0\n\
         gcp-central   us-central   cloud   feasible   12m    1m35s      90.50     310.2\n\
         onprem-east   us-east      owned   rejected   -      -          -         -\n\
         \n\
         rejected:\n  \
           onprem-east: the gang of 2×8 GPUs never fits: the largest node has 4 GPUs\n  \
           onprem-east: region not allowed\n"
    );
}

#[test]
fn explain_says_how_many_clusters_a_compacted_decision_counts_instead_of_listing() {
    let explanation = json!({
        "jobId": "j-1", "state": "Queued", "summary": "Waiting for c00 (owned, us-east) ...",
        "candidates": [
            {"cluster": "c00", "region": "us-east", "tier": "owned", "verdict": "chosen", "reasons": [],
             "score": {"fitsNow": false, "expectedWaitSecs": 60.0, "transferSecs": 0.0, "egressUsd": 0.0,
                       "computeUsd": 1.0, "fragmentation": 0.0, "total": 61.0}},
            {"cluster": "c30", "region": "us-east", "tier": "owned", "verdict": "rejected",
             "reasons": ["the cluster's agent is not connected"], "score": null}
        ],
        "omittedCandidates": {"feasible": 14, "rejected": [{"reason": "disconnected", "clusters": 9}]}
    });
    let text = explain(&explanation);
    assert!(
        text.ends_with(
            "\nnot listed: 14 more feasible, each scored worse than those listed; more rejected like the examples \
             above: 9 disconnected\n"
        ),
        "{text}"
    );
}

#[test]
fn explain_shows_what_the_member_says_now() {
    let explanation = json!({
        "jobId": "j-1", "state": "Bound", "cluster": "slurm-a", "summary": "Placed on slurm-a: it fits now.",
        "memberSays": "queued on slurm-a: Slurm: Resources (waiting for GPUs to free up)", "candidates": []
    });
    assert_eq!(
        explain(&explanation),
        "Placed on slurm-a: it fits now.\nnow: queued on slurm-a: Slurm: Resources (waiting for GPUs to free up)\n\nno member clusters were considered\n"
    );
}

#[test]
fn explain_lists_the_sibling_copies_and_which_asked_for_the_lock() {
    let explanation = json!({
        "jobId": "j-1", "state": "Queued", "summary": "Waiting.", "candidates": [],
        "siblingCopies": [{"cluster": "a", "gpuType": "h100", "ready": false}, {"cluster": "b", "gpuType": "", "ready": true}]
    });
    assert_eq!(
        explain(&explanation),
        "Waiting.\nwaiting as sibling copies on: a (h100), b: ready, asked for the start lock\n\nno member clusters were considered\n"
    );
}

#[test]
fn explain_without_candidates_says_so() {
    let text = explain(&json!({"jobId": "j-1", "state": "Queued", "summary": "", "candidates": []}));
    assert_eq!(text, "job j-1 is Queued\n\nno member clusters were considered\n");
}

#[test]
fn clusters_table_shows_capacity_queue_and_prices() {
    let list = json!({"clusters": [
        {"name": "onprem-east", "region": "us-east", "tier": "owned", "backend": "slurm", "connected": true,
         "lastSeenSecsAgo": 1.2, "gpusTotal": 64, "gpusFree": 12, "gpuTypes": ["h100"], "pendingJobs": 3,
         "pendingGpus": 24, "estimatedWaitSecs": 600, "federatedJobs": 5, "prices": {}},
        {"name": "gcp", "region": "us-central", "tier": "cloud", "backend": "kubernetes", "connected": false,
         "lastSeenSecsAgo": 95.0, "gpusTotal": 32, "gpusFree": 32, "gpuTypes": ["a100", "h100"],
         "pendingJobs": 0, "pendingGpus": 0, "estimatedWaitSecs": 0, "federatedJobs": 0,
         "prices": {"a100": 1.8, "h100": 2.5}}
    ]});
    assert_eq!(
        clusters(&list),
        "NAME          REGION       TIER    BACKEND      UP               GPUS    PENDING       WAIT   PRICE\n\
         onprem-east   us-east      owned   slurm        yes              12/64   3 (24 GPUs)   10m    -\n\
         gcp           us-central   cloud   kubernetes   no (1m35s ago)   32/32   0 (0 GPUs)    0s     a100 $1.80, h100 $2.50\n"
    );
    assert_eq!(clusters(&json!({"clusters": []})), "no member clusters\n");
}

#[test]
fn submit_and_cancel_lines() {
    let job = json!({"id": "j-1", "state": "Queued"});
    assert_eq!(submitted(&job, true), "job j-1 submitted (Queued)\n");
    assert_eq!(submitted(&job, false), "job j-1 already submitted (Queued)\n");
    assert_eq!(cancelled(&json!({"id": "j-1", "state": "Cancelled"})), "job j-1 Cancelled\n");
    assert_eq!(
        cancelled(&json!({"id": "j-1", "state": "Succeeded"})),
        "job j-1 had already Succeeded; nothing to cancel\n"
    );
}

#[test]
fn explain_marks_a_wait_that_is_the_members_own_quote() {
    let explanation = json!({
        "jobId": "j-7f3b", "state": "Queued", "summary": "Waiting for east.",
        "candidates": [
            {"cluster": "east", "region": "us-east", "tier": "owned", "verdict": "chosen", "reasons": [],
             "score": {"fitsNow": false, "expectedWaitSecs": 9000.0, "quoted": true, "transferSecs": 0.0,
                       "egressUsd": 0.0, "computeUsd": 0.0, "fragmentation": 0.0, "total": 9000.0}},
            {"cluster": "west", "region": "us-west", "tier": "owned", "verdict": "feasible", "reasons": [],
             "score": {"fitsNow": false, "expectedWaitSecs": 7200.0, "transferSecs": 0.0,
                       "egressUsd": 0.0, "computeUsd": 0.0, "fragmentation": 0.0, "total": 9100.0}}
        ]
    });
    let text = explain(&explanation);
    assert!(text.contains("2h30m (quoted)"), "{text}");
    assert!(text.contains("   2h     ") || text.contains(" 2h "), "the estimate is not marked: {text}");
    assert!(!text.contains("2h (quoted)"), "{text}");
}
