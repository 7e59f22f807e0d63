//! End to end on a GPU host without a scheduler: the real `meridian gateway` and one
//! `meridian-agent` with the builtin backend's process runner, which runs each job's command as
//! a child process. This machine has no NVIDIA driver, so the host's two GPUs are declared
//! (`gpuDiscovery: none`); the runner hands them out through `CUDA_VISIBLE_DEVICES`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use meridian_e2e::{GATEWAY_CONFIG, Gateway, ProcessHost};

const WAIT: Duration = Duration::from_secs(30);

async fn host() -> ProcessHost {
    ProcessHost::start(GATEWAY_CONFIG, "2s").await.unwrap()
}

fn job(name: &str, gpus: u32, script: &str) -> String {
    let script = serde_json::to_string(script).unwrap();
    format!(
        "name: {name}\ntenant: t\ngang: {{replicas: 1, resources: {{gpus: {gpus}}}}}\nruntime: {{estimate: 1m}}\n\
         payload: {{command: [sh, -c, {script}], env: {{GREETING: hello}}}}\n"
    )
}

async fn submit(gateway: &Gateway, spec: &str) -> String {
    let (job, created) = gateway.client().submit(spec).await.unwrap();
    assert!(created);
    job["id"].as_str().unwrap().to_string()
}

fn stdout(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_runs_with_its_gpus_and_env_and_its_output_reaches_the_user() {
    let h = host().await;
    let id = submit(&h.gateway, &job("prints", 2, "echo \"$GREETING on $CUDA_VISIBLE_DEVICES\"; echo step 2")).await;
    h.gateway.wait_for_state(&id, "Succeeded", WAIT).await.unwrap();
    let logs = stdout(&h.gateway.cli(&["logs", &id]));
    assert_eq!(logs, "hello on 0,1\nstep 2\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_command_fails_the_job_with_its_exit_code_and_last_lines() {
    let h = host().await;
    let id = submit(&h.gateway, &job("fails", 1, "echo loading; echo 'CUDA error: out of memory' >&2; exit 4")).await;
    let failed = h.gateway.wait_for_state(&id, "Failed", WAIT).await.unwrap();
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains("code 4") && message.contains("out of memory"), "{message}");
    let shown = stdout(&h.gateway.cli(&["job", &id]));
    assert!(shown.contains("out of memory"), "`meridian job` shows the last lines: {shown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_follow_a_running_job_to_its_end() {
    let h = host().await;
    let gate = h.dir.path().join("go");
    let script = format!("echo first; while [ ! -e {} ]; do sleep 0.1; done; echo last", gate.display());
    let id = submit(&h.gateway, &job("follows", 1, &script)).await;
    h.gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    let so_far = meridian_e2e::poll(WAIT, || async {
        let text = stdout(&h.gateway.cli(&["logs", &id]));
        text.contains("first").then_some(text)
    })
    .await
    .unwrap();
    assert_eq!(so_far, "first\n", "only what it wrote so far");
    // `logs -f` keeps reading until the job ends.
    let follow = {
        let mut command = std::process::Command::new(&meridian_e2e::binaries().meridian);
        command.args(["logs", "-f", &id]).env("MERIDIAN_GATEWAY", h.gateway.rest.to_string());
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    std::fs::write(&gate, "go").unwrap();
    let followed = tokio::time::timeout(WAIT, follow).await.expect("logs -f ends with the job").unwrap();
    assert_eq!(stdout(&followed), "first\nlast\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_the_process() {
    let h = host().await;
    let stopped = h.dir.path().join("stopped");
    let script = format!("trap 'echo term > {}; exit 0' TERM; while true; do sleep 0.1; done", stopped.display());
    let id = submit(&h.gateway, &job("long", 1, &script)).await;
    h.gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    h.gateway.client().cancel(&id).await.unwrap();
    h.gateway.wait_for_state(&id, "Cancelled", WAIT).await.unwrap();
    let signalled = meridian_e2e::poll(WAIT, || async { std::fs::read_to_string(&stopped).ok() }).await;
    assert_eq!(signalled.unwrap().trim(), "term", "the job's process got SIGTERM");
}
