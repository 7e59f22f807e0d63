//! The agent binary with the process runner on a host without an NVIDIA driver (this machine)
//! and no declared nodes: it says what to declare and exits 64.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn without_nvml_and_without_nodes_the_agent_exits_64_saying_what_to_declare() {
    if meridian_agent::backend::nvml::NvmlProbe::init().is_ok() {
        eprintln!("skipped: this host has an NVIDIA driver, so NVML finds GPUs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.yaml");
    std::fs::write(&config, "cluster: solo\nregion: us-east\ninsecure: true\nrunner: process\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_meridian-agent")).arg("--config").arg(&config).output().unwrap();
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no GPUs to run jobs on") && stderr.contains("`nodes`"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one clear line: {stderr}");
    assert!(stderr.contains("libnvidia-ml.so.1"), "names what is missing: {stderr}");
}
