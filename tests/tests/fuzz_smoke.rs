//! The bounded fuzz run of the test suite: every fuzz target's body (the same functions the
//! cargo-fuzz crate calls) over its checked-in seed corpus plus deterministic mutations. The long
//! runs are `scripts/fuzz.sh` on nightly; see `docs/security.md (Fuzzing the parsers that face untrusted input)`.

// Panicking on an unexpected result is how a test fails; the workspace lint targets library code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use meridian::certs::{Ca, Validity};
use meridian_e2e::fuzzing::{self, TARGETS, Target};
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{BackendKind, ClusterInfo, GpuRelease, Inventory, NodeFree, QueueLoad, QueuePressure};
use meridian_proto::job::JobState;
use meridian_proto::pb;
use meridian_proto::protocol::{AgentEvent, AgentHello, Assignment, GatewayCommand, JobReport, LogChunk};
use meridian_proto::testing::{self, cluster_info, dgx_shape, hello};
use meridian_proto::validate::parse_job_spec;
use prost::Message;

/// Mutated inputs per target: a few seconds for all targets in a debug build.
const MUTATIONS: usize = 4_000;

fn target(name: &str) -> &'static Target {
    TARGETS.iter().find(|t| t.name == name).unwrap()
}

fn run(name: &str) {
    let seeds = fuzzing::seeds(name).unwrap_or_else(|e| panic!("{}: {e}", fuzzing::seed_dir(name).display()));
    assert!(!seeds.is_empty(), "no seeds for {name}");
    let stats = fuzzing::bounded_run(target(name), &seeds, MUTATIONS, 0x5eed_0000 + name.len() as u64);
    eprintln!("{name}: {stats:?}");
    assert_eq!(stats.inputs, seeds.len() + MUTATIONS);
    // Mutants that still parse are what the round-trip checks need; all-garbage would test only
    // the error paths.
    assert!(stats.accepted_mutants >= MUTATIONS / 100, "{name}: only {stats:?} reached the round trip");
}

#[test]
fn job_spec_parser_holds_over_seeds_and_mutations() {
    run("job_spec");
}

#[test]
fn selector_parser_holds_over_seeds_and_mutations() {
    run("selector");
}

#[test]
fn agent_message_conversion_holds_over_seeds_and_mutations() {
    run("agent_message");
}

#[test]
fn gateway_message_conversion_holds_over_seeds_and_mutations() {
    run("gateway_message");
}

#[test]
fn certificate_san_reader_holds_over_seeds_and_mutations() {
    run("certificate_san");
}

#[test]
fn every_target_has_a_cargo_fuzz_target_and_seeds() {
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
    for target in TARGETS {
        assert!(manifest.contains(&format!("name = \"{}\"", target.name)), "{} is not in fuzz/Cargo.toml", target.name);
        let source = std::fs::read_to_string(fuzz.join("fuzz_targets").join(format!("{}.rs", target.name))).unwrap();
        assert!(source.contains(&format!("fuzzing::{}(", target.name)), "{}.rs does not call its body", target.name);
    }
}

/// The seeds themselves are valid inputs of the kind each target expects (a broken seed would
/// only exercise the error paths).
#[test]
fn the_seeds_are_valid_inputs() {
    let catalog = GpuCatalog::default();
    // `regression-*` seeds are inputs the fuzzer once failed on; they need not be valid.
    for entry in std::fs::read_dir(fuzzing::seed_dir("job_spec")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with("regression-") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        parse_job_spec(&text, &catalog).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    for seed in fuzzing::seeds("agent_message").unwrap() {
        let message = pb::AgentMessage::decode(seed.as_slice()).unwrap();
        assert!(message.body.is_some());
    }
    for seed in fuzzing::seeds("gateway_message").unwrap() {
        let message = pb::GatewayMessage::decode(seed.as_slice()).unwrap();
        GatewayCommand::try_from(message).unwrap();
    }
    let named: Vec<_> = fuzzing::seeds("certificate_san")
        .unwrap()
        .iter()
        .map(|s| meridian_gateway::tls::identity::clusters_named(s))
        .collect();
    assert!(named.contains(&vec!["gpu-east".to_string()]), "{named:?}");
}

/// Writes the binary seeds (protobuf messages, a DER certificate) into `fuzz/seeds/`. Run by
/// hand after a protocol change: `cargo test -p meridian-e2e --test fuzz_smoke -- --ignored`.
#[test]
#[ignore = "regenerates checked-in files"]
fn write_binary_seeds() {
    let write = |target: &str, name: &str, bytes: Vec<u8>| {
        let dir = fuzzing::seed_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };

    let report = |state| JobReport {
        message: "done".into(),
        nodes: vec!["n-0".into(), "n-1".into()],
        ..testing::report("j-1", 3, state)
    };
    let info = ClusterInfo {
        backend: BackendKind::Slurm,
        prices: BTreeMap::from([("h100".into(), 2.5), ("a100-80g".into(), 1.25)]),
        supports_bare_commands: false,
        labels: BTreeMap::from([("gpu-fabric".into(), "ib".into())]),
        ..cluster_info("gpu-east")
    };
    let hello = AgentHello { info, agent_version: "0.1.0".into(), ..hello("gpu-east", "i-7f3a") };
    let hello = pb::AgentMessage { body: Some(pb::agent_message::Body::Hello(pb::Hello::from(&hello))) };
    write("agent_message", "hello.pb", hello.encode_to_vec());
    // One DGX node all free and one with 2 GPUs, 10 CPUs and 64 GiB free, in rack r1.
    let mut shape = dgx_shape(&[8, 2]);
    shape.free[1] = NodeFree { gpus: 2, cpu: 10, memory_gib: 64 };
    shape.labels = BTreeMap::from([("rack".into(), "r1".into())]);
    let events = [
        ("inventory", AgentEvent::Inventory(Inventory { shapes: vec![shape] })),
        (
            "pressure",
            AgentEvent::Pressure(QueuePressure {
                queues: vec![QueueLoad {
                    queue: "default".into(),
                    weight: 1.5,
                    pending_jobs: 3,
                    pending_gpus: 24,
                    running_gpus: 40,
                }],
                releases: vec![GpuRelease { after_secs: 60, gpus: 8 }, GpuRelease { after_secs: 3600, gpus: 16 }],
                estimated_wait_secs: 900,
                preemptible: Vec::new(),
            }),
        ),
        (
            "offer_reply",
            AgentEvent::OfferReply {
                job_id: "j-2".into(),
                fencing_token: 1,
                accepted: false,
                reason: "no h100 free".into(),
                permanent: true,
            },
        ),
        ("status", AgentEvent::Status(report(JobState::Succeeded))),
        (
            "heartbeat",
            AgentEvent::Heartbeat { seq: 9, jobs: vec![report(JobState::Running), report(JobState::Failed)] },
        ),
        (
            "logs",
            AgentEvent::Logs {
                request_id: 4,
                result: Ok(LogChunk { data: "step 10 loss 1.9\n".into(), offset: 0, next_offset: 17, complete: false }),
            },
        ),
        ("logs_error", AgentEvent::Logs { request_id: 5, result: Err("no such job".into()) }),
    ];
    for (name, event) in &events {
        write("agent_message", &format!("{name}.pb"), pb::AgentMessage::from(event).encode_to_vec());
    }

    let spec_text = std::fs::read_to_string(fuzzing::seed_dir("job_spec").join("llama-finetune.yaml")).unwrap();
    let spec = parse_job_spec(&spec_text, &GpuCatalog::default()).unwrap();
    let assignment =
        Assignment { job_id: "j-1".into(), fencing_token: 2, spec, last_preempted_at_ms: Some(1_764_000_000_000) };
    let commands = [
        ("welcome", GatewayCommand::Welcome { bound: vec![assignment.clone()], lease: Some(Duration::from_secs(30)) }),
        ("welcome_empty", GatewayCommand::Welcome { bound: vec![], lease: None }),
        ("offer", GatewayCommand::Offer(assignment)),
        ("cancel", GatewayCommand::Cancel { job_id: "j-1".into(), fencing_token: 2 }),
        ("ack", GatewayCommand::Ack { job_id: "j-1".into(), fencing_token: 2 }),
        ("lease", GatewayCommand::Lease { heartbeat_seq: 9, lease: Duration::from_millis(30_500) }),
        (
            "logs",
            GatewayCommand::Logs {
                request_id: 4,
                job_id: "j-1".into(),
                fencing_token: 2,
                from: Some(1024),
                max_bytes: 65_536,
            },
        ),
    ];
    for (name, command) in &commands {
        write("gateway_message", &format!("{name}.pb"), pb::GatewayMessage::from(command).encode_to_vec());
    }

    let ca = Ca::generate(Validity::days(3650)).unwrap();
    let pair = ca.agent("gpu-east", Validity::days(3650)).unwrap();
    write("certificate_san", "agent-gpu-east.der", pem_to_der(&pair.cert_pem));
    let server = ca.server(&["gateway.example".into()], Validity::days(3650)).unwrap();
    write("certificate_san", "gateway.der", pem_to_der(&server.cert_pem));
}

/// The DER inside a one-certificate PEM (base64 between the armour lines).
fn pem_to_der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        other => panic!("not base64: {other}"),
    };
    let digits: Vec<u8> = body.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &d)| n | (u32::from(d) << (18 - 6 * i)));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

#[test]
fn rest_query_decoding_holds_over_seeds_and_mutations() {
    run("rest_query");
}
