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
