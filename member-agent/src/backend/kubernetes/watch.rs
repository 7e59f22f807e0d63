//! Status by watches (`statusUpdates: watch`, the default): three kube-rs reflectors keep the
//! namespace's Meridian jobs, their pods, and the PodGroups or Workloads in memory, each from one
//! list and then one long-lived watch. A change wakes the status loop, which computes every
//! tracked binding's phase from the caches: no API call per round, whatever the number of jobs.
//!
//! The watcher relists on its own when the server answers `410 Gone` (the watch fell behind
//! etcd's compaction) and re-watches with backoff when a connection ends or fails (an API server
//! restart), so a change made while the agent was cut off is seen once it is back.

use std::fmt::Debug;
use std::hash::Hash;
use std::pin::pin;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;

use super::config::Mode;
use super::copies::copy_object_of;
use super::{Snapshot, binding_of, group_resource, job_resource, managed_selector};

/// The watch caches of one namespace, and what wakes the status loop.
pub(super) struct Watched {
    jobs: Store<DynamicObject>,
    pods: Store<Pod>,
    groups: Store<DynamicObject>,
    changed: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl Watched {
    /// Starts the three reflectors.
    pub(super) fn start(client: &kube::Client, namespace: &str, mode: Mode) -> Self {
        let changed = Arc::new(Notify::new());
        let selector = managed_selector();
        let labelled = watcher::Config::default().labels(&selector);

        let job_kind = job_resource(mode);
        let jobs_writer = Writer::new(job_kind.clone());
        let jobs = jobs_writer.as_reader();
        let jobs_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &job_kind);

        let pods_writer = Writer::default();
        let pods = pods_writer.as_reader();
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);

        let group_kind = group_resource(mode);
        let groups_writer = Writer::new(group_kind.clone());
        let groups = groups_writer.as_reader();
        let groups_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &group_kind);

        let tasks = vec![
            reflect(jobs_api, labelled.clone(), jobs_writer, Arc::clone(&changed), "jobs"),
            reflect(pods_api, labelled, pods_writer, Arc::clone(&changed), "pods"),
            reflect(groups_api, watcher::Config::default(), groups_writer, Arc::clone(&changed), "pod groups"),
        ];
        Self { jobs, pods, groups, changed, tasks }
    }

    /// Waits until every cache holds its first complete list; false when a reflector stopped.
    pub(super) async fn ready(&self) -> bool {
        self.jobs.wait_until_ready().await.is_ok()
            && self.pods.wait_until_ready().await.is_ok()
            && self.groups.wait_until_ready().await.is_ok()
    }

    /// Resolves at the next change of any cache (at once when one came since the last call).
    pub(super) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// What the caches hold now.
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            bindings: self.jobs.state().iter().filter_map(|job| binding_of((**job).clone())).collect(),
            copies: self.jobs.state().iter().filter_map(|job| copy_object_of(job)).collect(),
            pods: self.pods.state().iter().map(|pod| (**pod).clone()).collect(),
            groups: self.groups.state().iter().filter_map(|group| serde_json::to_value(&**group).ok()).collect(),
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Runs one reflector until aborted, waking `changed` on every event; errors are logged and
/// retried with the watcher's default backoff.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    changed: Arc<Notify>,
    what: &'static str,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        let mut stream = pin!(reflector::reflector(writer, watcher(api, config)).default_backoff());
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => changed.notify_one(),
                Err(error) => tracing::warn!(%error, what, "kubernetes: watch failed; retrying"),
            }
        }
    })
}
