//! End to end over a real Slurm: the real `meridian gateway` and one `meridian-agent` with
//! `backend: slurm` in front of the test cluster of `scripts/slurm/up.sh` (4 nodes × 4 a100).
//!
//! Needs `MERIDIAN_SLURM_ENV` (the `env` file up.sh writes; `scripts/test.sh` sets it), or
//! `MERIDIAN_SKIP_SLURM=1` to skip. Tests share the cluster: one at a time, each with its own
//! job tag so earlier tests' finished jobs (kept for MinJobAge) are not adopted.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use meridian_e2e::{ClusterOptions, Federation, Gateway};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const WAIT: Duration = Duration::from_secs(90);

fn cluster() -> Option<BTreeMap<String, String>> {
    if std::env::var("MERIDIAN_SKIP_SLURM").is_ok_and(|v| v == "1") {
        eprintln!("skipped: MERIDIAN_SKIP_SLURM=1 (no real Slurm)");
        return None;
    }
    let path = std::env::var("MERIDIAN_SLURM_ENV").unwrap_or_else(|_| {
        panic!(
            "this test needs a real Slurm: run `scripts/test.sh`, or `scripts/slurm/up.sh DIR` with \
             MERIDIAN_SLURM_ENV=DIR/env, or set MERIDIAN_SKIP_SLURM=1 to skip it"
        )
    });
    Some(
        meridian_agent::backend::slurm::read_env_file(std::path::Path::new(&path))
            .unwrap_or_else(|e| panic!("MERIDIAN_SLURM_ENV={path}: {e}")),
    )
}

struct Setup {
    env: BTreeMap<String, String>,
    tag: String,
    work: PathBuf,
    /// The gateway and cluster `hpc`.
    federation: Federation,
}

impl Setup {
    /// squeue lines (`id|state|comment`) of this test's jobs.
    fn squeue(&self) -> Vec<String> {
        let out = slurm(&self.env, "squeue", &["-h", "-a", "-t", "all", "-o", "%i|%T|%k"]);
        out.lines().filter(|l| l.contains(&format!("|{}", self.tag))).map(String::from).collect()
    }
}

fn slurm(env: &BTreeMap<String, String>, tool: &str, args: &[&str]) -> String {
    let bin = env.get("MERIDIAN_SLURM_BIN_DIR").map_or(PathBuf::from(tool), |d| Path::new(d).join(tool));
    let out = Command::new(bin).args(args).env("SLURM_CONF", &env["SLURM_CONF"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `hpc`'s agent config: `backend: slurm` in front of the test cluster, adopting only the jobs
/// tagged `tag`.
fn agent_config(env: &BTreeMap<String, String>, work: &Path, tag: &str) -> String {
    let bin = env.get("MERIDIAN_SLURM_BIN_DIR").cloned().unwrap_or_else(|| "/usr/bin".into());
    format!(
        "cluster: hpc\nregion: us-east\nbackend: slurm\nsupportsContainers: false\nreportInterval: 300ms\n\
         slurm:\n  partition: gpu\n  gpuTypes: {{a100: a100-80g}}\n  workDir: {}\n  binDir: {bin}\n  \
         slurmConf: {}\n  pollInterval: 1s\n  jobTag: {tag}\n",
        work.display(),
        env["SLURM_CONF"],
    )
}

async fn setup(env: BTreeMap<String, String>) -> Setup {
    slurm(&env, "scancel", &["--user=root"]);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let tag = format!("e2e{nanos}");
    let work = PathBuf::from(&env["MERIDIAN_SLURM_DIR"]).join("work-e2e");
    let hpc = ClusterOptions::whole_config(agent_config(&env, &work, &tag));
    let federation = Federation::builder().cluster("hpc", hpc).start().await.unwrap();
    Setup { env, tag, work, federation }
}

fn job(name: &str, replicas: u32, gpus: u32, command: &str) -> String {
    let command = serde_json::to_string(command).unwrap();
    format!(
        "name: {name}\ntenant: team-a\ngang: {{replicas: {replicas}, resources: {{gpus: {gpus}, cpu: 1, memoryGiB: 1}}}}\n\
         runtime: {{estimate: 10m}}\npayload: {{command: [sh, -c, {command}]}}\n"
    )
}

async fn submit(gateway: &Gateway, spec: &str) -> String {
    let (job, created) = gateway.client().submit(spec).await.unwrap();
    assert!(created);
    job["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_two_node_gang_runs_on_slurm_and_succeeds() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup(env).await;
    let out = s.work.join(format!("{}-gang.txt", s.tag));
    let id =
        submit(&s.federation.gateway, &job("gang", 2, 2, &format!("echo $SLURMD_NODENAME >> {}", out.display()))).await;
    let done = s.federation.gateway.wait_for_state(&id, "Succeeded", WAIT).await.unwrap();
    assert_eq!(done["cluster"], "hpc");
    let mut nodes: Vec<String> = std::fs::read_to_string(&out).unwrap().lines().map(String::from).collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 2, "one replica on each of two nodes: {nodes:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_command_ends_failed_with_its_exit_code() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup(env).await;
    let id = submit(&s.federation.gateway, &job("fails", 1, 1, "echo oops >&2; exit 3")).await;
    let failed = s.federation.gateway.wait_for_state(&id, "Failed", WAIT).await.unwrap();
    assert!(failed.to_string().contains("exit code 3"), "{failed}");
    // The job's output file, read by the agent and passed through the gateway.
    let logs = s.federation.gateway.cli(&["logs", &id]);
    assert!(logs.status.success(), "{}", String::from_utf8_lossy(&logs.stderr));
    assert!(String::from_utf8_lossy(&logs.stdout).contains("oops"), "{}", String::from_utf8_lossy(&logs.stdout));
}

/// Puts the test partition back up however the test ends.
struct PartitionUp<'a>(&'a BTreeMap<String, String>);

impl Drop for PartitionUp<'_> {
    fn drop(&mut self) {
        slurm(self.0, "scontrol", &["update", "PartitionName=gpu", "State=UP"]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slurms_pending_reason_shows_in_explain_until_the_job_starts() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup(env).await;
    // An operator takes the partition down for maintenance: the nodes are idle (the gateway
    // sees free GPUs and offers the job), but Slurm holds it with its own reason.
    let _up = PartitionUp(&s.env);
    slurm(&s.env, "scontrol", &["update", "PartitionName=gpu", "State=DOWN"]);
    let id = submit(&s.federation.gateway, &job("waits", 1, 1, "echo started")).await;
    s.federation.gateway.wait_for_state(&id, "Bound", WAIT).await.unwrap();
    let explained = meridian_e2e::poll(WAIT, || async {
        let out = s.federation.gateway.cli(&["explain", &id]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("PartitionDown").then_some(text)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "explain never showed Slurm's reason: {}",
            String::from_utf8_lossy(&s.federation.gateway.cli(&["explain", &id]).stdout)
        )
    });
    assert!(explained.contains("now: queued on hpc: Slurm"), "{explained}");
    slurm(&s.env, "scontrol", &["update", "PartitionName=gpu", "State=UP"]);
    s.federation.gateway.wait_for_state(&id, "Succeeded", WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_job_stops_it_in_slurm() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup(env).await;
    let id = submit(&s.federation.gateway, &job("long", 1, 1, "sleep 600")).await;
    s.federation.gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    assert!(s.squeue().iter().any(|l| l.contains("|RUNNING|")), "{:?}", s.squeue());
    s.federation.gateway.client().cancel(&id).await.unwrap();
    s.federation.gateway.wait_for_state(&id, "Cancelled", WAIT).await.unwrap();
    let stopped = meridian_e2e::poll(WAIT, || async {
        let slurm = slurm(&s.env, "squeue", &["-h", "-t", "PENDING,RUNNING", "-o", "%k"]);
        (!slurm.lines().any(|l| l.contains(&s.tag))).then_some(())
    })
    .await;
    assert!(stopped.is_ok(), "the Slurm job still runs: {:?}", s.squeue());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_bigger_than_any_slurm_node_is_refused_at_submit_with_the_reason() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup(env).await;
    // The Slurm inventory (4 GPUs per node) already tells the gateway: it never offers the job.
    match s.federation.gateway.client().submit(&job("huge", 1, 5, "true")).await {
        Err(meridian_cli::client::ClientError::Api { status, code, message, .. }) => {
            assert_eq!((status, code.as_str()), (422, "never_fits"), "{message}");
            assert!(message.contains("hpc") && message.contains("largest node: 4 GPUs"), "{message}");
        }
        other => panic!("a 5-GPU replica must be refused: {other:?}"),
    }
    assert!(s.squeue().is_empty(), "nothing reached Slurm: {:?}", s.squeue());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_agent_adopts_the_running_slurm_job_which_then_succeeds() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let mut s = setup(env).await;
    let marker = s.work.join(format!("{}-go", s.tag));
    let command = format!("while [ ! -e {} ]; do sleep 0.2; done", marker.display());
    let id = submit(&s.federation.gateway, &job("adopt", 1, 1, &command)).await;
    s.federation.gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    s.federation.agent_mut("hpc").proc.kill();
    assert!(s.squeue().iter().any(|l| l.contains("|RUNNING|")), "the job outlives its agent: {:?}", s.squeue());
    s.federation.restart_agent("hpc").await.unwrap();
    std::fs::write(&marker, "go").unwrap();
    let done = s.federation.gateway.wait_for_state(&id, "Succeeded", WAIT).await.unwrap();
    assert_eq!(done["cluster"], "hpc");
    assert_eq!(s.squeue().len(), 1, "one Slurm job, not resubmitted: {:?}", s.squeue());
}

/// The job contract as a user meets it: a two-replica job submitted through the gateway finds
/// its peer through `MASTER_ADDR`/`MASTER_PORT` on Slurm (the job fails unless both ranks meet),
/// its output shows both ranks, and `meridian job ID` shows each replica's rank and node.
#[tokio::test(flavor = "multi_thread")]
async fn a_gangs_replicas_find_each_other_on_slurm_and_the_cli_shows_their_ranks() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let s = setup(env).await;
    let script = serde_json::to_string(include_str!("../../member-agent/src/backend/rendezvous.py")).unwrap();
    let spec = format!(
        "name: meet\ntenant: team-a\ngang: {{replicas: 2, resources: {{gpus: 1, cpu: 1, memoryGiB: 1}}}}\n\
         runtime: {{estimate: 10m}}\npayload: {{command: [python3, -c, {script}]}}\n"
    );
    let id = submit(&s.federation.gateway, &spec).await;
    let done = s.federation.gateway.wait_for_state(&id, "Succeeded", WAIT).await;
    let logs = s.federation.gateway.cli(&["logs", &id]);
    let output = String::from_utf8_lossy(&logs.stdout).into_owned();
    let done = done.unwrap_or_else(|e| panic!("the replicas did not meet: {e}\n{output}"));
    assert!(output.contains(": listening on 127.0.0.1:") && output.contains(": reached 127.0.0.1:"), "{output}");
    let nodes: Vec<&str> = done["nodes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    assert_eq!(nodes.len(), 2, "{done}");
    let shown = s.federation.gateway.cli(&["job", &id]);
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| !l.starts_with("Replicas:"))
        .take(3)
        .map(|l| l.trim_start_matches("Replicas:").split_whitespace().collect())
        .collect();
    assert_eq!(rows, [vec!["RANK", "NODE"], vec!["0", nodes[0], "coordinator"], vec!["1", nodes[1]]], "{text}");
    // The ranks ran where the gateway says: rank i on nodes[i].
    for (rank, node) in nodes.iter().enumerate() {
        assert!(output.contains(&format!("rank {rank}/2 of {id} on hpc node {node}:")), "{node}: {output}");
    }
    eprintln!("{text}\n{output}");
}

/// Cancels the jobs submitted straight to Slurm (outside Meridian) however the test ends.
struct CancelOutsideJobs<'a>(&'a BTreeMap<String, String>, &'static str);

impl Drop for CancelOutsideJobs<'_> {
    fn drop(&mut self) {
        slurm(self.0, "scancel", &["--name", self.1]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slurms_own_plan_decides_where_a_gang_waits() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    slurm(&env, "scancel", &["--user=root"]);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let tag = format!("e2e{nanos}");
    let work = PathBuf::from(&env["MERIDIAN_SLURM_DIR"]).join("work-e2e");
    let hpc = ClusterOptions::whole_config(format!("{}prices: {{a100-80g: 2.0}}\n", agent_config(&env, &work, &tag)));
    // `lab`: a builtin cluster of two 4-GPU nodes of the same type, where an hour is an hour.
    let lab = ClusterOptions::default()
        .prices("{a100-80g: 2.0}")
        .nodes("  - {shape: a100-node, count: 2, gpuType: a100-80g, gpus: 4, cpu: 8, memoryGiB: 16}\n")
        .time_scale(1.0);
    let f = Federation::builder().cluster("hpc", hpc).cluster("lab", lab).start().await.unwrap();

    // Slurm, outside Meridian: a whole node for 10 minutes and one GPU on each other node for
    // an hour (time limits, which Slurm plans with). 9 GPUs are free and 4 come back in 10
    // minutes, so by its release profile a 2 × 4 gang could start then; but only one node is
    // whole before the hour is up.
    let _cancel = CancelOutsideJobs(&env, "outside");
    let outside = |nodelist: &str, gpus: u32, minutes: u32| {
        let gres = format!("--gres=gpu:a100:{gpus}");
        let (nodes, time) = (format!("--nodelist={nodelist}"), format!("--time={minutes}"));
        let args = ["--job-name=outside", "--partition=gpu", "--output=/dev/null", &gres, &nodes, &time];
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--mem=100M", "--cpus-per-task=1", "--wrap", "sleep 3600"]);
        slurm(&env, "sbatch", &all);
    };
    outside("n1", 4, 10);
    for node in ["n2", "n3", "n4"] {
        outside(node, 1, 60);
    }
    let running = |s: &str| s.lines().filter(|l| l.contains("RUNNING")).count();
    meridian_e2e::poll(WAIT, || async {
        let out = slurm(&env, "squeue", &["-h", "-n", "outside", "-o", "%T"]);
        (running(&out) == 4).then_some(())
    })
    .await
    .expect("the outside jobs run");
    // The agent has reported them: 9 of hpc's 16 GPUs free.
    let client = f.gateway.client();
    let free = |clusters: &serde_json::Value| {
        let hpc = clusters["clusters"].as_array()?.iter().find(|c| c["name"] == "hpc")?.clone();
        hpc["gpusFree"].as_u64()
    };
    meridian_e2e::poll(WAIT, || async { (free(&client.clusters().await.ok()?) == Some(9)).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("hpc never reported 9 free GPUs: {e}\n{}", f.gateway.proc.log()));
    // `lab`: both nodes busy for 30 minutes.
    for name in ["lab-1", "lab-2"] {
        let spec = job(name, 1, 4, "sleep 3600")
            .replace("runtime: {estimate: 10m}", "runtime: {estimate: 30m}")
            .replace("payload:", "placement: {clusters: {include: [lab]}}\npayload:");
        let id = submit(&f.gateway, &spec).await;
        f.gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    }

    let id = submit(&f.gateway, &job("gang", 2, 4, "true")).await;
    let explained = meridian_e2e::poll(WAIT, || async {
        let e = client.explain(&id).await.ok()?;
        let quoted = |cluster: &str| {
            e["candidates"].as_array()?.iter().find(|c| c["cluster"] == cluster)?["score"]["quoted"].as_bool()
        };
        (quoted("hpc") == Some(true) && quoted("lab") == Some(true)).then_some(e)
    })
    .await
    .unwrap_or_else(|e| panic!("no quoted decision: {e}\n{}", f.gateway.proc.log()));
    let wait = |cluster: &str| {
        let candidate = explained["candidates"].as_array().unwrap().iter().find(|c| c["cluster"] == cluster).unwrap();
        candidate["score"]["expectedWaitSecs"].as_f64().unwrap()
    };
    // Slurm's own plan (`sbatch --test-only`): the hour of the 1-GPU jobs' limits.
    assert!((wait("hpc") - 3600.0).abs() < 180.0, "hpc: {}\n{explained}", wait("hpc"));
    assert!((wait("lab") - 1800.0).abs() < 180.0, "lab: {}\n{explained}", wait("lab"));
    let chosen = explained["candidates"].as_array().unwrap().iter().find(|c| c["verdict"] == "chosen").unwrap();
    assert_eq!(chosen["cluster"], "lab", "{explained}");
    // Nothing of the quotes reached Slurm's queue: only the four outside jobs are there.
    let queued = slurm(&env, "squeue", &["-h", "-o", "%j"]);
    assert_eq!(queued.lines().filter(|l| !l.trim().is_empty()).count(), 4, "{queued}");
}

/// Two members that both run real commands, each fully busy with a blocker that runs until its
/// file exists: `hpc` (the real Slurm, 4 × 4 a100) and `lab` (builtin, one 4-GPU a100 node under
/// the process runner), with sibling copies on. A 4-GPU job submitted then fits nowhere, so it
/// waits as a copy on both; the test frees `first` and the job must run exactly once, there.
/// The job is its own witness: it appends `<cluster> <token>` to a file.
async fn copies_on_slurm_and_lab(env: &BTreeMap<String, String>, first: &str) {
    slurm(env, "scancel", &["--user=root"]);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let tag = format!("e2e{nanos}");
    let work = PathBuf::from(&env["MERIDIAN_SLURM_DIR"]).join("work-e2e");
    let port = |_| std::net::SocketAddr::from(([127, 0, 0, 1], meridian_e2e::free_port().unwrap()));
    let (hpc_metrics, lab_metrics) = (port(()), port(()));
    let hpc = ClusterOptions::whole_config(format!(
        "{}prices: {{a100-80g: 2.0}}\nmetrics: {{listen: {hpc_metrics}}}\n",
        agent_config(env, &work, &tag)
    ));
    let lab = ClusterOptions::default()
        .prices("{a100-80g: 2.0}")
        .nodes("  - {shape: a100-node, count: 1, gpuType: a100-80g, gpus: 4, cpu: 8, memoryGiB: 16}\n")
        .process_runner("2s")
        .extra(format!("metrics: {{listen: {lab_metrics}}}\n"));
    let config = format!("{}placement: {{siblingCopies: 2}}\n", meridian_e2e::GATEWAY_CONFIG);
    let f = Federation::builder().gateway_config(config).cluster("hpc", hpc).cluster("lab", lab).start().await.unwrap();
    let logs = || {
        format!(
            "gateway log:\n{}\nhpc log:\n{}\nlab log:\n{}",
            f.gateway.proc.log(),
            f.agent("hpc").proc.log(),
            f.agent("lab").proc.log()
        )
    };
    let squeue = || -> Vec<String> {
        let out = slurm(env, "squeue", &["-h", "-a", "-t", "all", "-o", "%i|%T|%k"]);
        out.lines().filter(|l| l.contains(&format!("|{tag}"))).map(String::from).collect()
    };
    let wait_for_metric = |addr: std::net::SocketAddr, line: String| async move {
        let found =
            meridian_e2e::poll(WAIT, || async { meridian_e2e::scrape(addr).await.filter(|text| text.contains(&line)) })
                .await;
        assert!(found.is_ok(), "the agent on {addr} never showed `{line}`");
    };
    let copies = |outcome: &str, n: u32| format!("meridian_agent_sibling_copies_total{{outcome=\"{outcome}\"}} {n}");

    let dir = f.dir().to_path_buf();
    let blocker = |cluster: &str, replicas: u32| {
        let end = dir.join(format!("end-{cluster}"));
        let spec = job(
            &format!("blocker-{cluster}"),
            replicas,
            4,
            &format!("while [ ! -e {} ]; do sleep 0.2; done", end.display()),
        )
        .replace("payload:", &format!("placement: {{clusters: {{include: [{cluster}]}}}}\npayload:"));
        (spec, end)
    };
    let (hpc_blocker, hpc_end) = blocker("hpc", 4);
    let (lab_blocker, lab_end) = blocker("lab", 1);
    let mut blockers = BTreeMap::new();
    for (cluster, spec) in [("hpc", hpc_blocker), ("lab", lab_blocker)] {
        let id = submit(&f.gateway, &spec).await;
        f.gateway.wait_for_state(&id, "Running", WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", logs()));
        blockers.insert(cluster, id);
    }

    let witness = work.join(format!("{tag}.witness"));
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&witness).unwrap_or_default().lines().map(str::to_string).collect()
    };
    let id = submit(
        &f.gateway,
        &job(
            "witnessed",
            1,
            4,
            &format!("echo \"$MERIDIAN_CLUSTER $MERIDIAN_FENCING_TOKEN\" >> {}", witness.display()),
        ),
    )
    .await;
    // Both members hold a copy before either frees up; Slurm's is a pending job.
    wait_for_metric(hpc_metrics, copies("queued", 1)).await;
    wait_for_metric(lab_metrics, copies("queued", 1)).await;
    let copy_tag = format!("|{tag}-copy:{id}:");
    assert!(squeue().iter().any(|l| l.contains("|PENDING|") && l.contains(&copy_tag)), "{:?}", squeue());
    assert_eq!(f.gateway.client().get(&id).await.unwrap()["state"], "Queued");
    assert!(lines().is_empty(), "nothing ran before a member freed up");

    let end = if first == "hpc" { &hpc_end } else { &lab_end };
    std::fs::write(end, "end").unwrap();
    let done = f.gateway.wait_for_state(&id, "Succeeded", WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert_eq!(done["cluster"], first, "{done}");
    let token = done["fencingToken"].as_u64().unwrap_or_else(|| panic!("no fencing token in {done}"));
    assert_eq!(lines(), [format!("{first} {token}")], "ran once, on {first}, under its binding");
    let (winner, loser) = if first == "hpc" { (hpc_metrics, lab_metrics) } else { (lab_metrics, hpc_metrics) };
    // The winner's copy was granted the start lock: the gateway did not replace it with an offer
    // when the winner's GPUs showed free before its scheduler had started the copy.
    let winner_text = meridian_e2e::scrape(winner).await.unwrap_or_default();
    assert!(winner_text.contains(&copies("granted", 1)), "{winner_text}\n{}", logs());
    wait_for_metric(loser, copies("dropped", 1)).await;
    if first == "lab" {
        // Slurm's copy is gone: squeue shows it cancelled, and nothing live of the job's copies.
        let gone = meridian_e2e::poll(WAIT, || async {
            let rows = squeue();
            (!rows.iter().any(|l| l.contains(&copy_tag))).then_some(rows)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", squeue(), logs()));
        let cancelled = format!("|{tag}-cancelled:{id}:");
        assert!(gone.iter().any(|l| l.contains("|CANCELLED|") && l.contains(&cancelled)), "{gone:?}");
    }

    // The other member frees up too: nothing more of the job runs anywhere.
    let other_end = if first == "hpc" { &lab_end } else { &hpc_end };
    std::fs::write(other_end, "end").unwrap();
    for blocker in blockers.values() {
        f.gateway.wait_for_state(blocker, "Succeeded", WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    }
    let loser_text = meridian_e2e::scrape(loser).await.unwrap_or_default();
    for outcome in ["ready", "granted"] {
        let line = format!("meridian_agent_sibling_copies_total{{outcome=\"{outcome}\"}}");
        assert!(!loser_text.contains(&line), "the other copy never got to {outcome}:\n{loser_text}");
    }
    assert_eq!(lines(), [format!("{first} {token}")], "still exactly once");
    assert!(!squeue().iter().any(|l| l.contains("|RUNNING|") || l.contains("|PENDING|")), "{:?}", squeue());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_waiting_as_copies_runs_once_on_the_builtin_member_and_its_slurm_copy_is_cancelled() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    copies_on_slurm_and_lab(&env, "lab").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_waiting_as_copies_runs_once_on_slurm_through_its_start_gate() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    copies_on_slurm_and_lab(&env, "hpc").await;
}
