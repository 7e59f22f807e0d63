//! The `slurm:` section of the agent config: how the Slurm backend talks to the controller and
//! how Meridian's job fields map onto Slurm's (accounts, QOS, GRES types).

use std::collections::BTreeMap;
use std::path::PathBuf;

use meridian_proto::duration::HumanDuration;
use meridian_proto::gpu::GpuCatalog;
use serde::{Deserialize, Serialize};

/// Settings of the Slurm backend (`backend: slurm`, section `slurm:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SlurmConfig {
    /// Partition every job is submitted to (`--partition`), and the only partition whose nodes
    /// are reported as inventory. None: Slurm's default partition, and every node.
    #[serde(default)]
    pub partition: Option<String>,
    /// Slurm account (`--account`) by Meridian tenant.
    #[serde(default)]
    pub accounts: BTreeMap<String, String>,
    /// Account for tenants not in `accounts`. None: no `--account` (the user's default).
    #[serde(default)]
    pub default_account: Option<String>,
    /// Job priority → `--qos`: the rule with the highest `minPriority` not above the job's
    /// priority wins; no rule matching: no `--qos`.
    #[serde(default)]
    pub qos: Vec<QosRule>,
    /// `--qos` for jobs whose spec says `preemptible: true`, in place of the priority rules: a
    /// QOS that Slurm's `PreemptType=preempt/qos` lets higher QOSes preempt. A job Slurm
    /// preempts (state `PREEMPTED`) is reported preempted and queued again by the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible_qos: Option<String>,
    /// Also pass `--nice=100-priority` (clamped at 0), so higher Meridian priority sorts first
    /// inside Slurm's own queue.
    #[serde(default)]
    pub nice: bool,
    /// Slurm GRES type (`gpu:a100:4` → `a100`) → Meridian GPU type (`a100-80g`). A GRES type
    /// not listed maps to itself when the GPU catalog knows that name; otherwise the backend
    /// refuses to start, naming the type.
    #[serde(default)]
    pub gpu_types: BTreeMap<String, String>,
    /// Directory for batch scripts' output (`--output`, `--chdir`); must be visible at the same
    /// path on the compute nodes. Job logs are read from here.
    #[serde(default = "default_work_dir")]
    pub work_dir: PathBuf,
    /// Directory holding `sbatch`, `squeue`, `scontrol`, `scancel`. None: found on `PATH`.
    #[serde(default)]
    pub bin_dir: Option<PathBuf>,
    /// `SLURM_CONF` for every Slurm command. None: inherited from the agent's environment.
    #[serde(default)]
    pub slurm_conf: Option<PathBuf>,
    /// First word of the job comment (`<jobTag>:<job id>:<token>`) that marks a Slurm job as
    /// this Meridian's: jobs with another tag are never adopted, reported or cancelled. Give
    /// each Meridian installation sharing one Slurm its own tag. No `:` allowed.
    #[serde(default = "default_job_tag")]
    pub job_tag: String,
    /// How often the status loop asks `squeue` what changed.
    #[serde(default = "default_poll_interval")]
    pub poll_interval: HumanDuration,
    /// Deadline of every Slurm command; a command that takes longer is killed and the call fails
    /// as transient (a hung controller never hangs the agent).
    #[serde(default = "default_command_timeout")]
    pub command_timeout: HumanDuration,
    /// Ports the agent hands out as jobs' coordinator ports (`MERIDIAN_COORDINATOR_PORT`,
    /// `MASTER_PORT`) on the first node of their allocation: each binding the agent holds gets
    /// its own, so two jobs whose first node is the same never share one. Keep the range free
    /// of other services on the compute nodes.
    #[serde(default)]
    pub coordinator_ports: PortRange,
}

/// An inclusive range of TCP ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortRange {
    /// The first port.
    pub first: u16,
    /// The last port.
    pub last: u16,
}

impl Default for PortRange {
    /// 29500 (PyTorch's default `MASTER_PORT`) to 30499.
    fn default() -> Self {
        Self { first: 29_500, last: 30_499 }
    }
}

impl PortRange {
    /// How many ports the range holds (0 for a reversed one).
    pub fn len(&self) -> u32 {
        if self.last < self.first { 0 } else { u32::from(self.last - self.first) + 1 }
    }

    /// Whether the range holds no port.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The port `offset` places after `first`, wrapping inside the range.
    pub fn nth(&self, offset: u32) -> u16 {
        let len = self.len().max(1);
        let step = u16::try_from(offset % len).unwrap_or(0);
        self.first.saturating_add(step)
    }
}

/// One priority threshold of [`SlurmConfig::qos`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QosRule {
    /// Jobs with at least this Meridian priority get `qos`.
    pub min_priority: u32,
    /// The Slurm QOS name.
    pub qos: String,
}

fn default_work_dir() -> PathBuf {
    PathBuf::from("/var/lib/meridian-agent/slurm")
}
fn default_job_tag() -> String {
    "meridian".into()
}
fn default_poll_interval() -> HumanDuration {
    HumanDuration::from_secs(2)
}
fn default_command_timeout() -> HumanDuration {
    HumanDuration::from_secs(15)
}

impl Default for SlurmConfig {
    fn default() -> Self {
        Self {
            partition: None,
            accounts: BTreeMap::new(),
            default_account: None,
            qos: Vec::new(),
            preemptible_qos: None,
            nice: false,
            gpu_types: BTreeMap::new(),
            work_dir: default_work_dir(),
            bin_dir: None,
            slurm_conf: None,
            job_tag: default_job_tag(),
            poll_interval: default_poll_interval(),
            command_timeout: default_command_timeout(),
            coordinator_ports: PortRange::default(),
        }
    }
}

impl SlurmConfig {
    /// Pushes every problem as `slurm.<field>: <reason>`.
    pub fn check(&self, problems: &mut Vec<String>) {
        let catalog = GpuCatalog::default();
        if self.coordinator_ports.first == 0 || self.coordinator_ports.is_empty() {
            problems.push(format!(
                "slurm.coordinatorPorts: {}-{} holds no usable port; give first ≥ 1 and last ≥ first",
                self.coordinator_ports.first, self.coordinator_ports.last
            ));
        }
        if self.partition.as_deref().is_some_and(|p| p.trim().is_empty()) {
            problems.push("slurm.partition: must not be empty (leave it out for Slurm's default)".into());
        }
        for (tenant, account) in &self.accounts {
            if account.trim().is_empty() {
                problems.push(format!("slurm.accounts.{tenant}: must name a Slurm account"));
            }
        }
        if self.default_account.as_deref().is_some_and(|a| a.trim().is_empty()) {
            problems.push("slurm.defaultAccount: must not be empty (leave it out for none)".into());
        }
        for (i, rule) in self.qos.iter().enumerate() {
            if rule.qos.trim().is_empty() {
                problems.push(format!("slurm.qos[{i}].qos: must name a Slurm QOS"));
            }
        }
        for (gres, meridian) in &self.gpu_types {
            if !catalog.contains(meridian) {
                problems.push(format!(
                    "slurm.gpuTypes.{gres}: `{meridian}` is not a known GPU type; use one of {}",
                    catalog.names().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        if !self.work_dir.is_absolute() {
            problems.push(format!("slurm.workDir: `{}` must be an absolute path", self.work_dir.display()));
        }
        if self.job_tag.is_empty() || self.job_tag.contains(':') || self.job_tag.contains(char::is_whitespace) {
            problems.push(format!("slurm.jobTag: `{}` must be a non-empty word without `:`", self.job_tag));
        }
        if self.poll_interval.0.is_zero() {
            problems.push("slurm.pollInterval: must be longer than 0s".into());
        }
        if self.command_timeout.0.is_zero() {
            problems.push("slurm.commandTimeout: must be longer than 0s".into());
        }
    }

    /// The account for `tenant`'s jobs.
    pub fn account_for(&self, tenant: &str) -> Option<&str> {
        self.accounts.get(tenant).or(self.default_account.as_ref()).map(String::as_str)
    }

    /// The QOS for a job of `priority`.
    pub fn qos_for(&self, priority: u32) -> Option<&str> {
        self.qos.iter().filter(|r| r.min_priority <= priority).max_by_key(|r| r.min_priority).map(|r| r.qos.as_str())
    }

    /// The Meridian GPU type of Slurm GRES type `gres` (None: unknown, a start-up error).
    pub fn meridian_gpu_type(&self, gres: &str) -> Option<String> {
        match self.gpu_types.get(gres) {
            Some(mapped) => Some(mapped.clone()),
            None => GpuCatalog::default().contains(gres).then(|| gres.to_string()),
        }
    }

    /// The Slurm GRES type of Meridian GPU type `meridian` (the map read backwards, else itself).
    pub fn slurm_gres_type(&self, meridian: &str) -> String {
        self.gpu_types
            .iter()
            .find(|(_, m)| m.as_str() == meridian)
            .map(|(gres, _)| gres.clone())
            .unwrap_or_else(|| meridian.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_documented_values() {
        let config: SlurmConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(config, SlurmConfig::default());
        assert_eq!(config.poll_interval.as_secs(), 2);
        assert_eq!(config.command_timeout.as_secs(), 15);
    }

    #[test]
    fn every_problem_names_its_field() {
        let config = SlurmConfig {
            partition: Some(" ".into()),
            gpu_types: [("a100".to_string(), "a1000".to_string())].into(),
            work_dir: "relative".into(),
            poll_interval: HumanDuration::from_secs(0),
            qos: vec![QosRule { min_priority: 1, qos: String::new() }],
            ..SlurmConfig::default()
        };
        let mut problems = Vec::new();
        config.check(&mut problems);
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("slurm.gpuTypes.a100: `a1000`")), "{problems:?}");
    }

    #[test]
    fn mappings_pick_accounts_qos_and_gpu_types() {
        let config = SlurmConfig {
            accounts: [("vision".to_string(), "acct-v".to_string())].into(),
            default_account: Some("shared".into()),
            qos: vec![
                QosRule { min_priority: 80, qos: "high".into() },
                QosRule { min_priority: 0, qos: "normal".into() },
            ],
            gpu_types: [("a100".to_string(), "a100-80g".to_string())].into(),
            ..SlurmConfig::default()
        };
        assert_eq!(config.account_for("vision"), Some("acct-v"));
        assert_eq!(config.account_for("nlp"), Some("shared"));
        assert_eq!(config.qos_for(90), Some("high"));
        assert_eq!(config.qos_for(50), Some("normal"));
        assert_eq!(config.meridian_gpu_type("a100").as_deref(), Some("a100-80g"));
        assert_eq!(config.meridian_gpu_type("h100").as_deref(), Some("h100"));
        assert_eq!(config.meridian_gpu_type("rtx9000"), None);
        assert_eq!(config.slurm_gres_type("a100-80g"), "a100");
        assert_eq!(config.slurm_gres_type("h100"), "h100");
    }
}
