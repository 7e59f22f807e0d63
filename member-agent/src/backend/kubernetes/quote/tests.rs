//! Start quotes on Kubernetes: the planning over node states, node states from Nodes and Pods,
//! and a quote through the backend against the fake API server.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;
use meridian_proto::spec::JobSpec;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::*;
use crate::backend::kubernetes::fake::FakeApi;
use crate::backend::kubernetes::tests::{assignment, config};
use crate::backend::kubernetes::{KubernetesBackend, Mode};
use crate::backend::{LocalBackend, StartQuote};
use crate::test_jobs::job_spec;

// ---- planning over node states ----

/// An 8-GPU node of `gpu_type` (80 GiB per GPU, 96 cores, 1000 GiB) with `free_gpus` free.
fn node(name: &str, gpu_type: &str, free_gpus: f64) -> NodeState {
    NodeState {
        node: name.into(),
        gpu_type: gpu_type.into(),
        gpu_memory_gib: 80,
        labels: BTreeMap::new(),
        free: Amounts { gpus: free_gpus, cpu: 96.0, memory_gib: 1000.0 },
        releases: Vec::new(),
    }
}

/// `node` with a pod that gives back `gpus` GPUs (and nothing else) after `after_secs`.
fn releasing(mut node: NodeState, after_secs: u64, gpus: f64) -> NodeState {
    node.releases.push(Release { after_secs, amounts: Amounts { gpus, cpu: 0.0, memory_gib: 0.0 } });
    node
}

/// A gang of `replicas` × `gpus` (1 CPU, 1 GiB each) that takes any whole-GPU type.
fn gang(replicas: u32, gpus: u32) -> JobSpec {
    job_spec("t", replicas, gpus, 600)
}

fn starts(spec: &JobSpec, nodes: &[NodeState]) -> Vec<(String, u64)> {
    plan(spec, nodes).into_iter().map(|t| (t.gpu_type, t.after_secs)).collect()
}

fn quoted(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(t, s)| ((*t).to_owned(), *s)).collect()
}

#[test]
fn a_gang_that_fits_now_is_quoted_zero() {
    let nodes = [releasing(node("h-0", "h100", 8.0), 900, 0.0)];
    assert_eq!(starts(&gang(1, 8), &nodes), quoted(&[("h100", 0)]));
}

#[test]
fn several_replicas_share_a_node_with_room() {
    let nodes = [node("h-0", "h100", 8.0)];
    assert_eq!(starts(&gang(2, 4), &nodes), quoted(&[("h100", 0)]));
    assert!(starts(&gang(3, 4), &nodes).is_empty(), "three do not fit on one 8-GPU node");
}

#[test]
fn a_gang_that_needs_a_release_is_quoted_at_its_time() {
    let nodes = [releasing(releasing(node("h-0", "h100", 2.0), 300, 4.0), 120, 2.0)];
    assert_eq!(starts(&gang(1, 4), &nodes), quoted(&[("h100", 120)]));
    assert_eq!(starts(&gang(1, 8), &nodes), quoted(&[("h100", 300)]));
}

#[test]
fn two_replicas_needing_two_whole_nodes_wait_for_the_later_one() {
    // 12 GPUs free now and 20 after the first release: enough by count, but no two whole nodes
    // until both full nodes are back.
    let nodes = [
        releasing(node("h-0", "h100", 0.0), 100, 8.0),
        releasing(node("h-1", "h100", 4.0), 400, 4.0),
        node("h-2", "h100", 4.0),
        node("h-3", "h100", 4.0),
    ];
    assert_eq!(starts(&gang(2, 8), &nodes), quoted(&[("h100", 400)]));
}

#[test]
fn a_type_with_too_few_nodes_is_left_out_and_each_type_is_quoted_on_its_own() {
    let nodes = [
        node("a-0", "a100-80g", 8.0),
        releasing(node("h-0", "h100", 0.0), 60, 8.0),
        releasing(node("h-1", "h100", 0.0), 90, 8.0),
    ];
    assert_eq!(starts(&gang(2, 8), &nodes), quoted(&[("h100", 90)]));
    assert_eq!(starts(&gang(1, 8), &nodes), quoted(&[("a100-80g", 0), ("h100", 60)]));
}

#[test]
fn gpu_types_memory_node_selector_and_host_resources_narrow_the_nodes() {
    let mut labelled = releasing(node("h-1", "h100", 0.0), 50, 8.0);
    labelled.labels.insert("rack".into(), "r1".into());
    let mut slices = node("a-0", "a100-80g.1g.10gb", 7.0);
    slices.gpu_memory_gib = 10;
    let mut small = node("a-1", "a100-40g", 8.0);
    small.gpu_memory_gib = 40;
    let nodes = [small, slices, node("h-0", "h100", 8.0), labelled];
    let mut spec = gang(1, 4);
    // No gpuTypes: every whole-GPU type, never a MIG slice.
    assert_eq!(starts(&spec, &nodes), quoted(&[("a100-40g", 0), ("h100", 0)]));
    spec.gang.resources.gpu_memory_gib = 80;
    assert_eq!(starts(&spec, &nodes), quoted(&[("h100", 0)]));
    spec.placement.node_selector = "rack=r1".parse().unwrap();
    assert_eq!(starts(&spec, &nodes), quoted(&[("h100", 50)]));
    spec.placement.node_selector = "rack=r9".parse().unwrap();
    assert!(starts(&spec, &nodes).is_empty());
    let mut spec = gang(1, 4);
    spec.gang.resources.gpu_types = vec!["a100-80g.1g.10gb".into(), "h100".into()];
    assert_eq!(starts(&spec, &nodes), quoted(&[("a100-80g.1g.10gb", 0), ("h100", 0)]));
    // CPU counts as GPUs do: 97 cores is more than any node has.
    spec.gang.resources.cpu = 97;
    assert!(starts(&spec, &nodes).is_empty());
}

#[test]
fn releases_at_the_same_moment_count_together() {
    let nodes = [releasing(releasing(node("h-0", "h100", 0.0), 70, 4.0), 70, 4.0)];
    assert_eq!(starts(&gang(1, 8), &nodes), quoted(&[("h100", 70)]));
}

/// Whether `spec`'s gang fits on `nodes` once every release up to `at` has come, counted from
/// scratch (what [`earliest_fit`] counts incrementally).
fn fits_at(spec: &JobSpec, nodes: &[NodeState], at: u64) -> bool {
    let need = &spec.gang.resources;
    let placed: u64 = nodes
        .iter()
        .map(|n| {
            let free = n.releases.iter().filter(|r| r.after_secs <= at).fold(n.free, |f, r| f + r.amounts);
            u64::from(free.whole().replicas_fitting(need.gpus, need.cpu, need.memory_gib))
        })
        .sum();
    placed >= u64::from(spec.gang.replicas)
}

proptest::proptest! {
    #[test]
    fn the_quote_is_the_first_moment_the_whole_gang_fits(
        cluster in proptest::collection::vec(
            (0u32..=8, proptest::collection::vec((0u64..1000, 1u32..=8), 0..3)),
            0..6,
        ),
        replicas in 1u32..=4,
        gpus in 1u32..=8,
    ) {
        let nodes: Vec<NodeState> = cluster
            .into_iter()
            .enumerate()
            .map(|(i, (free, releases))| {
                releases.into_iter().fold(node(&format!("h-{i}"), "h100", f64::from(free)), |n, (after, gpus)| {
                    releasing(n, after, f64::from(gpus))
                })
            })
            .collect();
        let spec = gang(replicas, gpus);
        let moments: Vec<u64> =
            std::iter::once(0).chain(nodes.iter().flat_map(|n| n.releases.iter().map(|r| r.after_secs))).collect();
        match plan(&spec, &nodes).first() {
            Some(start) => {
                proptest::prop_assert!(fits_at(&spec, &nodes, start.after_secs));
                proptest::prop_assert!(moments.contains(&start.after_secs));
                for earlier in moments.iter().filter(|&&m| m < start.after_secs) {
                    proptest::prop_assert!(!fits_at(&spec, &nodes, *earlier), "fits at {earlier} already");
                }
            }
            None => proptest::prop_assert!(!fits_at(&spec, &nodes, u64::MAX)),
        }
    }
}

// ---- node states from Nodes and Pods ----

/// A fixed "now" for the pure tests.
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn member_nodes() -> Value {
    serde_json::from_str(include_str!("../testdata/member-nodes.json")).unwrap()
}

/// A Running pod on `node` holding `gpus` GPUs, 8 cores and 64 GiB, started `ago` before `at`.
/// A Meridian pod carries the labels and (when given) the estimate annotation the agent writes.
fn pod(name: &str, node: &str, gpus: u32, meridian_estimate: Option<Option<u64>>, ago: u64, at: SystemTime) -> Value {
    let started = Timestamp::try_from(at - Duration::from_secs(ago)).unwrap().to_string();
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {
            "limits": {"nvidia.com/gpu": gpus.to_string()},
            "requests": {"cpu": "8", "memory": "64Gi"}}}]},
        "status": {"phase": "Running", "startTime": started},
    });
    if let Some(estimate) = meridian_estimate {
        pod["metadata"]["labels"] = json!({MANAGED_LABEL: MANAGED_VALUE});
        if let Some(secs) = estimate {
            pod["metadata"]["annotations"] = json!({ESTIMATE_KEY: secs.to_string()});
        }
    }
    pod
}

fn states_of(pods: Vec<Value>, at: SystemTime) -> Vec<NodeState> {
    let nodes: Vec<Node> = serde_json::from_value(member_nodes()).unwrap();
    let pods: Vec<Pod> = serde_json::from_value(Value::Array(pods)).unwrap();
    node_states(&nodes, &pods, &GpuTypeMapper::default(), at).unwrap()
}

#[test]
fn a_meridian_pod_releases_at_its_start_plus_estimate_and_other_pods_never_do() {
    let states = states_of(
        vec![
            pod("m-a-t1-main-0", "h100-0", 8, Some(Some(600)), 100, now()),
            pod("someone-else", "h100-1", 8, None, 100, now()),
        ],
        now(),
    );
    let names: Vec<&str> = states.iter().map(|s| s.node.as_str()).collect();
    assert_eq!(names, ["h100-0", "h100-1"]);
    assert_eq!(states[0].free.gpus, 0.0);
    assert_eq!(
        states[0].releases,
        [Release { after_secs: 500, amounts: Amounts { gpus: 8.0, cpu: 8.0, memory_gib: 64.0 } }]
    );
    assert!(states[1].releases.is_empty(), "a pod Meridian did not create has no known end");
    assert!(!states[1].labels.contains_key("kubernetes.io/hostname"), "matched as the inventory's shapes are");
    assert_eq!(starts(&gang(1, 8), &states), quoted(&[("h100", 500)]));
    assert!(starts(&gang(2, 8), &states).is_empty(), "h100-1 never comes back");
}

#[test]
fn a_meridian_pod_without_an_estimate_never_releases_and_an_overdue_one_runs_on() {
    let states = states_of(
        vec![
            pod("old-agent", "h100-0", 8, Some(None), 100, now()),
            pod("overdue", "h100-1", 8, Some(Some(600)), 1000, now()),
        ],
        now(),
    );
    assert!(states[0].releases.is_empty());
    // 1000 s into a 600 s estimate: expected to run on for half its age.
    assert_eq!(states[1].releases[0].after_secs, 500);
    assert_eq!(starts(&gang(1, 8), &states), quoted(&[("h100", 500)]));
}

#[test]
fn a_pod_not_started_yet_holds_its_whole_estimate_and_finished_pods_hold_nothing() {
    let mut waiting = pod("bound", "h100-0", 4, Some(Some(300)), 0, now());
    waiting["status"] = json!({"phase": "Pending"});
    let mut done = pod("done", "h100-1", 8, None, 100, now());
    done["status"]["phase"] = json!("Succeeded");
    let states = states_of(vec![waiting, done], now());
    assert_eq!(states[0].releases[0].after_secs, 300);
    assert_eq!((states[0].free.gpus, states[1].free.gpus), (4.0, 8.0));
}

#[test]
fn an_unready_node_is_never_quoted() {
    let mut nodes = member_nodes();
    nodes[1]["spec"]["unschedulable"] = json!(true);
    let nodes: Vec<Node> = serde_json::from_value(nodes).unwrap();
    let states = node_states(&nodes, &[], &GpuTypeMapper::default(), now()).unwrap();
    assert_eq!(states.len(), 1);
    assert!(starts(&gang(2, 8), &states).is_empty());
}

// ---- through the backend, against the fake API server ----

async fn quote_on(api: &Arc<FakeApi>, mode: Mode, replicas: u32, gpus: u32) -> StartQuote {
    let (tx, _rx) = mpsc::unbounded_channel();
    let backend = KubernetesBackend::with_client(api.client(), config(mode), "k8s-test".into(), tx).await.unwrap();
    let mut job = assignment("quoted", 0, "t", replicas, gpus);
    job.spec.gang.resources.gpu_types = vec!["h100".into()];
    backend.quote(&job).await.unwrap()
}

#[tokio::test]
async fn the_backend_quotes_from_the_nodes_and_pods_it_lists_and_creates_nothing() {
    // h100-0: a Meridian pod 100 s into a 600 s estimate holds all 8 GPUs; h100-1: someone
    // else's pod holds 4.
    let at = SystemTime::now();
    let pods = json!([
        pod("m-a-t1-main-0", "h100-0", 8, Some(Some(600)), 100, at),
        pod("someone-else", "h100-1", 4, None, 100, at),
    ]);
    let api = FakeApi::start(member_nodes(), pods).await;
    for mode in [Mode::Volcano, Mode::Kueue] {
        let now = quote_on(&api, mode, 1, 4).await;
        assert_eq!(now.starts, [TypeStart { gpu_type: "h100".into(), after_secs: 0, preempts: false }]);
        assert!(now.basis.contains("other pods never end"), "{}", now.basis);
        let later = quote_on(&api, mode, 1, 8).await;
        let after = later.starts[0].after_secs;
        // About 500 s; the clock moved a little between writing the pod and the quote.
        assert!((495..=501).contains(&after), "{later:?}");
        assert!(quote_on(&api, mode, 2, 8).await.starts.is_empty(), "h100-1 never comes back whole");
    }
    assert!(api.created().is_empty(), "a quote creates nothing");
}
