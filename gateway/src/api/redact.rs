//! Jobs as users see them: secret `payload.env` values (those named in `payload.secretEnv`)
//! replaced by a set/empty marker. Every answer that carries a job (REST JSON, gRPC `Job`) goes
//! through here; the store and the agents keep the real values.

use std::borrow::Cow;
use std::sync::Arc;

use meridian_core::{JobRecord, JobUsage, ReadView};
use serde::Serialize;

/// `job` with its secret env values hidden; borrowed unchanged when it has none.
pub fn redacted(job: &JobRecord) -> Cow<'_, JobRecord> {
    if job.spec.payload.has_secrets() {
        Cow::Owned(JobRecord { spec: job.spec.redacted(), ..job.clone() })
    } else {
        Cow::Borrowed(job)
    }
}

/// Every job of a page, redacted.
pub fn redacted_all(jobs: &[Arc<JobRecord>]) -> Vec<Cow<'_, JobRecord>> {
    jobs.iter().map(|job| redacted(job)).collect()
}

/// A job as `GET /v1/jobs` and `GET /v1/jobs/{id}` show it: redacted, with `"usage"` (its GPUs'
/// utilisation and idle flag) while it runs and its member measures it.
#[derive(Debug, Serialize)]
pub struct ShownJob<'a> {
    #[serde(flatten)]
    job: Cow<'a, JobRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<JobUsage>,
}

/// `job` redacted, with its usage from `view` as of `now_ms`.
pub fn shown<'a>(job: &'a JobRecord, view: &ReadView, now_ms: i64) -> ShownJob<'a> {
    ShownJob { job: redacted(job), usage: view.usage(job, now_ms) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use meridian_proto::gpu::GpuCatalog;
    use meridian_proto::spec::SECRET_SET;
    use meridian_proto::validate::parse_job_spec;

    use super::*;

    fn job(payload: &str) -> JobRecord {
        let text = format!("name: job1\ntenant: t\ngang: {{resources: {{gpus: 1}}}}\npayload: {payload}\n");
        JobRecord::queued("j-1".into(), parse_job_spec(&text, &GpuCatalog::default()).unwrap(), "", 0)
    }

    #[test]
    fn secret_values_are_replaced_and_others_kept() {
        let job =
            job("{command: [x], env: {API_KEY: hunter2-secret, EMPTY: '', LR: '3e-4'}, secretEnv: [API_KEY, EMPTY]}");
        let shown = serde_json::to_string(&redacted(&job)).unwrap();
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        assert!(shown.contains(&format!("\"API_KEY\":\"{SECRET_SET}\"")), "{shown}");
        assert!(shown.contains("\"EMPTY\":\"<secret: empty>\""), "{shown}");
        assert!(shown.contains("\"LR\":\"3e-4\""), "{shown}");
        assert!(shown.contains("\"secretEnv\":[\"API_KEY\",\"EMPTY\"]"), "{shown}");
        // The record itself (what the store and the agent get) keeps the value.
        assert_eq!(job.spec.payload.env["API_KEY"], "hunter2-secret");
    }

    #[test]
    fn a_job_without_secrets_is_not_copied() {
        let job = job("{command: [x], env: {LR: '3e-4'}}");
        assert!(matches!(redacted(&job), Cow::Borrowed(_)));
    }
}
