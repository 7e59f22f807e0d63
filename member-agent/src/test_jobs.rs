//! Jobs the agent's unit tests offer, built on `meridian_proto::testing`'s job spec so every
//! test starts from the same record and changes only what it is about.

use meridian_proto::duration::HumanDuration;
use meridian_proto::protocol::Assignment;
use meridian_proto::spec::JobSpec;
use meridian_proto::testing::{JOB, spec};

/// A job `train` for `tenant` of `replicas` × `gpus` (1 CPU and 1 GiB each), estimated to run
/// `estimate_secs`, running image `img` with its own command.
pub(crate) fn job_spec(tenant: &str, replicas: u32, gpus: u32, estimate_secs: u64) -> JobSpec {
    let mut job = spec(JOB);
    job.name = "train".into();
    job.tenant = tenant.into();
    job.gang.replicas = replicas;
    job.gang.resources.gpus = gpus;
    job.gang.resources.cpu = 1;
    job.gang.resources.memory_gib = 1;
    job.runtime.estimate = HumanDuration::from_secs(estimate_secs);
    job.payload.image = Some("img".into());
    job.payload.command = Vec::new();
    job
}

/// Binding `fencing_token` of `job_id` running `spec`, never preempted.
pub(crate) fn assignment(job_id: &str, fencing_token: u64, spec: JobSpec) -> Assignment {
    Assignment { job_id: job_id.into(), fencing_token, spec, last_preempted_at_ms: None }
}
