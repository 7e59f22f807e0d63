//! Kueue mode's headless Service per Job: the DNS names (`<job>-<index>.<job>`) that give a
//! gang's pods the job environment's coordinator address. Volcano's `svc` plugin makes its own.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use meridian_proto::protocol::Assignment;

use super::config::Mode;
use super::{Admission, BackendError, Result, Shared, api_error, objects};

impl Shared {
    /// Kueue mode: makes sure the headless Service that gives the job's pods their DNS names
    /// (the coordinator address) exists, named like the Job (`name`: the binding's object name,
    /// or its copy's when a grant made the copy the binding) and owned by it (`job_uid`); an
    /// existing one is fine.
    /// Volcano's `svc` plugin makes its own, so Volcano mode does nothing. A transient failure is
    /// an error, and the agent's retry of the submit comes back here. A refusal retrying cannot
    /// fix (no RBAC for Services, an invalid object): for a Job created just now, the Job is
    /// deleted and the answer is a permanent refusal naming the cause; for one created earlier
    /// (which may be running), it is logged and the Job kept.
    pub(super) async fn ensure_service(
        &self,
        job: &Assignment,
        name: &str,
        job_uid: &str,
        created: Created,
    ) -> Result<Option<Admission>> {
        if self.config.mode != Mode::Kueue {
            return Ok(None);
        }
        let services: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), self.ns(), &service_resource());
        let object: DynamicObject = serde_json::from_value(objects::headless_service(job, name, &self.config, job_uid))
            .map_err(|e| BackendError::permanent(format!("kubernetes: building the job's Service: {e}")))?;
        let error = match self.deadline("create service", services.create(&PostParams::default(), &object)).await? {
            Ok(_) => return Ok(None),
            Err(kube::Error::Api(status)) if status.code == 409 => return Ok(None),
            Err(error) => api_error("create the job's headless Service", error),
        };
        if error.is_transient() {
            return Err(error);
        }
        if created == Created::Earlier {
            tracing::error!(%error, job = %job.job_id, "kubernetes: the job's headless Service cannot be created; its replicas cannot resolve the coordinator");
            return Ok(None);
        }
        self.cancel_now(&job.job_id, job.fencing_token).await?;
        Ok(Some(Admission::Refused {
            reason: format!("{error}; the agent needs create on services in namespace `{}`", self.ns()),
            permanent: true,
        }))
    }
}

/// Whether a submit created the Job itself or found it from an earlier try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Created {
    /// This submit created it: nothing of it ran yet.
    Now,
    /// An earlier try did: it may be running.
    Earlier,
}

fn service_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Service"), "services")
}
