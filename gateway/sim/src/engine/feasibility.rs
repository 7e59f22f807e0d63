//! Which clusters could ever run a job, worked out once per job shape (GPU type, GPU memory and
//! gang) before the replay starts.

use std::collections::HashMap;

use super::Member;
use super::members::local_job;
use crate::{SimError, Workload};

/// Which clusters could ever run a job, shared by every job with the same GPU type, GPU memory
/// and gang.
pub(super) struct Feasibility<'a> {
    by_shape: HashMap<(Option<&'a str>, u32, u32, u32), usize>,
    lists: Vec<Vec<usize>>,
    of_job: Vec<usize>,
}

impl<'a> Feasibility<'a> {
    pub(super) fn new(workload: &'a Workload, members: &[Member]) -> Result<Self, SimError> {
        let mut feasibility = Self { by_shape: HashMap::new(), lists: Vec::new(), of_job: Vec::new() };
        for job in &workload.jobs {
            let key = (job.gpu_type.as_deref(), job.replicas, job.gpus_per_replica, job.gpu_memory_gib);
            let index = match feasibility.by_shape.get(&key) {
                Some(&index) => index,
                None => {
                    let probe = local_job(job, String::new(), String::new());
                    let list: Vec<usize> = members
                        .iter()
                        .enumerate()
                        .filter(|(_, m)| m.scheduler.can_ever_fit(&probe))
                        .map(|(c, _)| c)
                        .collect();
                    if list.is_empty() {
                        return Err(SimError::Invalid(format!(
                            "job {} ({}×{} GPUs{}) fits no cluster of the topology",
                            job.id,
                            job.replicas,
                            job.gpus_per_replica,
                            job.gpu_type.as_deref().map(|t| format!(" of type {t}")).unwrap_or_default()
                        )));
                    }
                    feasibility.lists.push(list);
                    let index = feasibility.lists.len() - 1;
                    feasibility.by_shape.insert(key, index);
                    index
                }
            };
            feasibility.of_job.push(index);
        }
        Ok(feasibility)
    }

    /// Clusters that could ever run job `id`, ascending.
    pub(super) fn of(&self, id: u32) -> &[usize] {
        self.of_job.get(id as usize).and_then(|&i| self.lists.get(i)).map_or(&[], Vec::as_slice)
    }
}
