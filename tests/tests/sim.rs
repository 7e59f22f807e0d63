#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `meridian sim` as a user runs it: the real binary, the shipped topologies.

use std::path::Path;
use std::process::Command;

use meridian_e2e::binaries;

fn sim(args: &[&str]) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    Command::new(&binaries().meridian).current_dir(root).arg("sim").args(args).output().unwrap()
}

#[test]
fn one_policy_on_a_synthetic_workload_prints_json_with_its_metrics() {
    let out = sim(&[
        "--topology",
        "deploy/sim/fleet-12.yaml",
        "--profile",
        "philly",
        "--load",
        "1.0",
        "--jobs",
        "800",
        "--seed",
        "3",
        "--policy",
        "meridian",
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["topology"], "fleet-12");
    assert_eq!(report["jobs"], 800);
    let run = &report["runs"][0];
    assert_eq!(run["policy"], "meridian");
    assert_eq!(run["overall"]["jobs"], 800);
    assert_eq!(run["clusters"].as_array().unwrap().len(), 12);
    assert!(run["totalUsd"].as_f64().unwrap() > 0.0);
}

#[test]
fn contradictory_or_missing_arguments_fail_with_a_usage_error() {
    for args in [
        vec!["--topology", "deploy/sim/hybrid-3region.yaml", "--policy", "meridian"],
        vec!["--topology", "deploy/sim/hybrid-3region.yaml", "--profile", "llm", "--policy", "meridian"],
        vec!["--topology", "deploy/sim/hybrid-3region.yaml", "--profile", "llm", "--load", "1", "--trace", "x.csv"],
        vec![
            "--topology",
            "deploy/sim/hybrid-3region.yaml",
            "--profile",
            "llm",
            "--load",
            "1",
            "--policy",
            "x",
            "--compare",
        ],
        vec!["--profile", "llm", "--load", "1", "--compare"],
    ] {
        let out = sim(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
}

/// Runs `script` from the repository root with the test build's `meridian` and small workloads.
fn lab_script(script: &str, out: &Path, args: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new("bash")
        .current_dir(root)
        .arg(script)
        .arg(out)
        .args(args)
        .env("MERIDIAN_BIN", &binaries().meridian)
        .env("MERIDIAN_SIM_JOBS", "120")
        .output()
        .unwrap();
    assert!(output.status.success(), "{script}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_goal_scripts_run_as_the_docs_say_and_score_every_cell() {
    let dir = tempfile::tempdir().unwrap();
    let goal = lab_script("scripts/placement-goal.sh", &dir.path().join("goal"), &["1", "0.5", "backfill", "fleet-12"]);
    let cells: Vec<&str> = goal.lines().filter(|l| l.starts_with("fleet-12 ")).collect();
    assert_eq!(cells.len(), 9, "{goal}");
    for cell in cells {
        // Six figures and the goals met: mean, p99, cost, data, jain (or `-` for each missed).
        let goals = cell.split_whitespace().last().unwrap();
        assert_eq!(goals.split(',').count(), 5, "{cell}");
    }
    let preemption = lab_script("scripts/placement-preemption.sh", &dir.path().join("pre"), &["1", "fleet-12"]);
    let cells: Vec<&str> = preemption.lines().filter(|l| l.starts_with("fleet-12 ")).collect();
    assert_eq!(cells.len(), 2, "{preemption}");
    assert!(cells.iter().all(|c| c.contains('/') && !c.contains("nan")), "{preemption}");
}
