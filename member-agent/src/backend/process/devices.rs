//! Which GPUs of this host each running job holds, so concurrent jobs get disjoint devices.
//!
//! The builtin scheduler counts GPUs per node; this table names them. Each node lists its device
//! identifiers as `CUDA_VISIBLE_DEVICES` takes them: indices (`"0"`, `"3"`) for whole GPUs, MIG
//! instance UUIDs (`"MIG-…"`) for slices when NVML gave them.

use std::collections::BTreeMap;

/// Devices of each node and which are free.
#[derive(Debug, Clone, Default)]
pub struct DeviceTable {
    nodes: BTreeMap<String, NodeDevices>,
}

#[derive(Debug, Clone)]
struct NodeDevices {
    ids: Vec<String>,
    free: Vec<bool>,
}

/// The devices a job holds: one list per replica, in replica order, with the node of each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    /// (node, device ids) per replica.
    pub replicas: Vec<(String, Vec<String>)>,
}

impl DeviceTable {
    /// A table over `nodes`: node name → device identifiers.
    pub fn new(nodes: impl IntoIterator<Item = (String, Vec<String>)>) -> Self {
        Self {
            nodes: nodes
                .into_iter()
                .map(|(name, ids)| {
                    let free = vec![true; ids.len()];
                    (name, NodeDevices { ids, free })
                })
                .collect(),
        }
    }

    /// Takes `per_replica` free devices on the node of each replica (`nodes`, one name per
    /// replica; names repeat when replicas share a node). All or nothing: on failure nothing is
    /// taken and the error says which node ran short.
    pub fn allocate(&mut self, nodes: &[String], per_replica: u32) -> Result<Allocation, String> {
        let mut allocation = Allocation::default();
        for node in nodes {
            let taken = self.nodes.get_mut(node).and_then(|devices| {
                let picks: Vec<usize> =
                    (0..devices.ids.len()).filter(|&i| devices.free[i]).take(per_replica as usize).collect();
                if picks.len() < per_replica as usize {
                    return None;
                }
                for &i in &picks {
                    devices.free[i] = false;
                }
                Some(picks.iter().map(|&i| devices.ids[i].clone()).collect::<Vec<_>>())
            });
            match taken {
                Some(ids) => allocation.replicas.push((node.clone(), ids)),
                None => {
                    self.release(&allocation);
                    return Err(format!(
                        "node `{node}` has fewer than {per_replica} free GPUs known to the process runner"
                    ));
                }
            }
        }
        Ok(allocation)
    }

    /// Gives back what `allocation` took.
    pub fn release(&mut self, allocation: &Allocation) {
        for (node, ids) in &allocation.replicas {
            let Some(devices) = self.nodes.get_mut(node) else { continue };
            for id in ids {
                if let Some(i) = devices.ids.iter().position(|d| d == id) {
                    devices.free[i] = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> DeviceTable {
        DeviceTable::new([("n".to_string(), (0..4).map(|i| i.to_string()).collect())])
    }

    #[test]
    fn concurrent_allocations_are_disjoint_and_released_devices_come_back() {
        let mut devices = table();
        let a = devices.allocate(&["n".into()], 2).unwrap();
        let b = devices.allocate(&["n".into()], 2).unwrap();
        assert_eq!(a.replicas[0].1, vec!["0", "1"]);
        assert_eq!(b.replicas[0].1, vec!["2", "3"]);
        assert!(devices.allocate(&["n".into()], 1).is_err());
        devices.release(&a);
        assert_eq!(devices.allocate(&["n".into()], 1).unwrap().replicas[0].1, vec!["0"]);
    }

    #[test]
    fn a_failed_allocation_takes_nothing() {
        let mut devices = table();
        let err = devices.allocate(&["n".into(), "n".into(), "n".into()], 2).unwrap_err();
        assert!(err.contains("`n`"), "{err}");
        assert_eq!(devices.allocate(&["n".into()], 4).unwrap().replicas[0].1.len(), 4);
    }
}
