//! One Meridian job as one `sbatch` call: the command-line options (gang shape, GPUs, account,
//! QOS, limit, the comment that carries the binding) and the batch script fed on stdin, which
//! exports the payload's env and runs its command once per replica with `srun`.

use std::path::{Path, PathBuf};

use meridian_proto::job_env::{self, Source};
use meridian_proto::protocol::Assignment;

use super::config::SlurmConfig;
use super::parse::{comment_for, copy_comment_for};

/// Why a job cannot be expressed as a Slurm batch job (a permanent refusal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ScriptError {
    /// The payload has only a container image; this backend runs commands on the hosts.
    #[error("payload.image: the Slurm backend runs commands, not container images; give payload.command")]
    ImageOnly,
    /// Nothing to run.
    #[error("payload.command: empty; the Slurm backend needs a command to run")]
    NoCommand,
    /// An env name a shell cannot export.
    #[error("payload.env.{0}: not a valid environment variable name")]
    BadEnvName(String),
}

/// What to hand to `sbatch`: options and the script for its stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchJob {
    /// `sbatch` arguments.
    pub(crate) args: Vec<String>,
    /// The script.
    pub(crate) script: String,
    /// Where its output goes.
    pub(crate) output: PathBuf,
}

/// The file a binding's output is written to.
pub(crate) fn output_path(work_dir: &Path, job_id: &str, fencing_token: u64) -> PathBuf {
    work_dir.join(format!("meridian-{}-{fencing_token}.out", file_safe(job_id)))
}

/// The file a sibling copy's output is written to; after its grant, the binding's output (Slurm
/// fixes a job's output file at submit).
pub(crate) fn copy_output_path(work_dir: &Path, job_id: &str, copy_token: u64) -> PathBuf {
    work_dir.join(format!("meridian-{}-copy{copy_token}.out", file_safe(job_id)))
}

/// The mark Slurm job `slurm_id`'s start gate (a sibling copy's) creates once it waits at the
/// gate with its `USR2` trap set (the script names it from `$SLURM_JOB_ID` the same way).
pub(crate) fn gate_ready_path(work_dir: &Path, slurm_id: &str) -> PathBuf {
    work_dir.join(format!("meridian-gate-{}.ready", file_safe(slurm_id)))
}

fn file_safe(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// What a batch job is submitted as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submission {
    /// The binding `job.fencing_token` of the job: it runs as soon as Slurm starts it.
    Binding,
    /// Sibling copy `copy_token` of the job: queued and started by Slurm like the binding
    /// would be, but its script waits at a start gate, holding the nodes Slurm gave it and
    /// running nothing of the payload, until the agent rewrites the job's comment to the granted
    /// binding's; the payload then runs under that binding's token.
    Copy {
        /// The copy.
        copy_token: u64,
    },
}

/// The `--constraint` of a job's `placement.nodeSelector`: the features it requires (`ib` or
/// `ib=true`; Slurm features are labels set to "true"), joined with `&`. Requirements Slurm's
/// constraint syntax cannot say (`!ib`, `rack!=3`) are met by excluding the nodes that break
/// them instead.
pub(crate) fn node_constraint(spec: &meridian_proto::spec::JobSpec) -> Option<String> {
    use meridian_proto::selector::Operator;
    let features: Vec<&str> = spec
        .placement
        .node_selector()
        .iter()
        .filter_map(|(key, operator, value)| match (operator, value) {
            (Operator::Exists, _) | (Operator::Equals, Some("true")) => Some(key),
            _ => None,
        })
        .collect();
    (!features.is_empty()).then(|| features.join("&"))
}

/// What the agent decides for the job contract ([`job_env`]) when it submits: the cluster's name
/// and the coordinator port. The coordinator host comes from the allocation, in the script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contract<'a> {
    /// `MERIDIAN_CLUSTER`.
    pub(crate) cluster: &'a str,
    /// `MERIDIAN_COORDINATOR_PORT`, reserved for this binding by the agent.
    pub(crate) port: u16,
}

/// Builds the `sbatch` call for `job`; `excluded` names the nodes its `placement.nodeSelector`
/// rules out (see [`node_constraint`]).
pub(crate) fn batch_job(
    job: &Assignment,
    config: &SlurmConfig,
    excluded: &[String],
    contract: &Contract<'_>,
) -> Result<BatchJob, ScriptError> {
    build(job, Submission::Binding, config, excluded, contract)
}

/// Builds the `sbatch` call for sibling copy `copy_token` of `job` (see [`Submission::Copy`]).
pub(crate) fn copy_batch_job(
    job: &Assignment,
    copy_token: u64,
    config: &SlurmConfig,
    excluded: &[String],
    contract: &Contract<'_>,
) -> Result<BatchJob, ScriptError> {
    build(job, Submission::Copy { copy_token }, config, excluded, contract)
}

fn build(
    job: &Assignment,
    submission: Submission,
    config: &SlurmConfig,
    excluded: &[String],
    contract: &Contract<'_>,
) -> Result<BatchJob, ScriptError> {
    let spec = &job.spec;
    let payload = &spec.payload;
    if payload.command.is_empty() {
        return Err(if payload.image.is_some() { ScriptError::ImageOnly } else { ScriptError::NoCommand });
    }
    if payload.image.is_some() {
        return Err(ScriptError::ImageOnly);
    }
    let resources = &spec.gang.resources;
    let (output, comment) = match submission {
        Submission::Binding => (
            output_path(&config.work_dir, &job.job_id, job.fencing_token),
            comment_for(&config.job_tag, &job.job_id, job.fencing_token),
        ),
        Submission::Copy { copy_token } => (
            copy_output_path(&config.work_dir, &job.job_id, copy_token),
            copy_comment_for(&config.job_tag, &job.job_id, copy_token),
        ),
    };
    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name=meridian-{}", job.job_id),
        format!("--comment={comment}"),
        format!("--nodes={}", spec.gang.replicas.max(1)),
        "--ntasks-per-node=1".to_string(),
        format!("--output={}", output.display()),
        format!("--chdir={}", config.work_dir.display()),
    ];
    if resources.gpus > 0 {
        match resources.gpu_types.as_slice() {
            [one] => args.push(format!("--gres=gpu:{}:{}", config.slurm_gres_type(one), resources.gpus)),
            _ => args.push(format!("--gres=gpu:{}", resources.gpus)),
        }
    }
    if resources.cpu > 0 {
        args.push(format!("--cpus-per-task={}", resources.cpu));
    }
    if resources.memory_gib > 0 {
        args.push(format!("--mem={}M", u64::from(resources.memory_gib) * 1024));
    }
    if let Some(limit) = spec.runtime.limit {
        // Slurm counts in minutes; round up so a job is never cut before its limit.
        let minutes = limit.0.as_secs().div_ceil(60).max(1);
        args.push(format!("--time={minutes}"));
    }
    if let Some(partition) = &config.partition {
        args.push(format!("--partition={partition}"));
    }
    if let Some(constraint) = node_constraint(spec) {
        args.push(format!("--constraint={constraint}"));
    }
    if !excluded.is_empty() {
        args.push(format!("--exclude={}", excluded.join(",")));
    }
    if let Some(account) = config.account_for(&spec.tenant) {
        args.push(format!("--account={account}"));
    }
    let preemptible_qos = config.preemptible_qos.as_deref().filter(|_| spec.preemptible);
    if let Some(qos) = preemptible_qos.or_else(|| config.qos_for(spec.priority)) {
        args.push(format!("--qos={qos}"));
    }
    if config.nice {
        args.push(format!("--nice={}", 100u32.saturating_sub(spec.priority)));
    }

    let mut script = String::from("#!/bin/sh\n# Written by the Meridian agent for job ");
    script.push_str(&shell_quote(&job.job_id));
    script.push('\n');
    if let Submission::Copy { copy_token } = submission {
        script.push_str(&start_gate(job, config, copy_token));
    }
    script.push_str(&contract_lines(job, submission, config, contract));
    for (name, value) in &payload.env {
        if !job_env::is_env_name(name) {
            return Err(ScriptError::BadEnvName(name.clone()));
        }
        script.push_str(&format!("export {name}={}\n", shell_quote(value)));
    }
    script.push_str(SRUN);
    let per_replica: Vec<String> =
        job_env::variables(payload).into_iter().filter(|v| v.source.per_replica()).map(|v| v.name).collect();
    script.push_str(&replica_wrapper(&per_replica));
    for word in &payload.command {
        script.push(' ');
        script.push_str(&shell_quote(word));
    }
    script.push('\n');
    Ok(BatchJob { args, script, output })
}

/// How the script starts the replicas: one task per node, all stopped when one fails.
const SRUN: &str = "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 --";

/// How long the start gate sleeps between looks at its job's comment when no signal wakes it:
/// the agent signals the batch shell (`SIGUSR2`) right after the grant, so this only bounds the
/// start of a copy whose signal was lost (an agent that stopped in between).
pub(crate) const GATE_LOOK_SECS: u32 = 5;

/// The script lines of a copy's start gate. They run first, on the allocation's first node,
/// before anything of the payload: mark the copy ready (after the `USR2` trap is set, so the
/// agent's signal can never kill the shell), then wait until the job's own comment in Slurm
/// names a binding of the job (`<tag>:<job>:<token>`: the grant), and run the payload under that
/// token (`MERIDIAN_GRANTED_TOKEN`, see [`contract_lines`]). The comment is the one record of
/// the grant: the payload runs exactly when a (restarted) agent would adopt the job as that
/// binding.
fn start_gate(job: &Assignment, config: &SlurmConfig, copy_token: u64) -> String {
    let dir = shell_quote(&config.work_dir.display().to_string());
    let binding = shell_quote(&format!("{}:{}:", config.job_tag, job.job_id));
    format!(
        "MERIDIAN_GATE={dir}/meridian-gate-\"$SLURM_JOB_ID\"\n\
         meridian_granted() {{\n\
         MERIDIAN_GRANTED_TOKEN=$({scontrol} -o show job \"$SLURM_JOB_ID\" | tr ' ' '\\n' | sed -n 's/^Comment=//p' | head -n 1)\n\
         case $MERIDIAN_GRANTED_TOKEN in {binding}*) MERIDIAN_GRANTED_TOKEN=${{MERIDIAN_GRANTED_TOKEN##*:}} ;; *) return 1 ;; esac\n\
         case $MERIDIAN_GRANTED_TOKEN in ''|*[!0-9]*) return 1 ;; esac\n\
         }}\n\
         trap : USR2\n\
         : > \"$MERIDIAN_GATE.ready\"\n\
         echo \"meridian: sibling copy {copy_token} holds its nodes; waiting for the gateway's start lock\"\n\
         until meridian_granted; do sleep {GATE_LOOK_SECS} & meridian_sleep=$!; wait $meridian_sleep; \
         kill $meridian_sleep 2>/dev/null; done\n\
         trap - USR2\n\
         rm -f \"$MERIDIAN_GATE.ready\"\n\
         echo \"meridian: granted; running as binding $MERIDIAN_GRANTED_TOKEN\"\n",
        scontrol = scontrol_word(config),
    )
}

/// `scontrol` as the script runs it: from `binDir` when configured, quoted.
fn scontrol_word(config: &SlurmConfig) -> String {
    shell_quote(
        &config
            .bin_dir
            .as_ref()
            .map_or_else(|| "scontrol".to_owned(), |dir| dir.join("scontrol").display().to_string()),
    )
}

/// The script lines that export the job-wide variables of the contract. The coordinator is the
/// first node of the allocation (where the batch script and task 0 run), by its `NodeAddr`, the
/// address Slurm itself reaches it at (node names need not resolve); its name when Slurm does
/// not say.
fn contract_lines(job: &Assignment, submission: Submission, config: &SlurmConfig, contract: &Contract<'_>) -> String {
    let scontrol = scontrol_word(config);
    let mut lines = format!(
        "MERIDIAN_COORDINATOR_NODE=$({scontrol} show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n\
         MERIDIAN_COORDINATOR_HOST=$({scontrol} -o show node \"$MERIDIAN_COORDINATOR_NODE\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p' | head -n 1)\n\
         [ -n \"$MERIDIAN_COORDINATOR_HOST\" ] || MERIDIAN_COORDINATOR_HOST=$MERIDIAN_COORDINATOR_NODE\n\
         case $MERIDIAN_COORDINATOR_HOST in *:*) MERIDIAN_COORDINATOR=\"[$MERIDIAN_COORDINATOR_HOST]:{port}\" ;; \
         *) MERIDIAN_COORDINATOR=\"$MERIDIAN_COORDINATOR_HOST:{port}\" ;; esac\n",
        port = contract.port,
    );
    let facts = job_env::Facts {
        job_id: job.job_id.clone(),
        fencing_token: job.fencing_token,
        cluster: contract.cluster.to_owned(),
        replicas: job.spec.gang.replicas.max(1),
        gpus_per_replica: job.spec.gang.resources.gpus,
        coordinator_host: String::new(),
        coordinator_port: contract.port,
    };
    for variable in job_env::variables(&job.spec.payload) {
        let value = match variable.source {
            // Set per task by the wrapper around the command.
            Source::Replica => continue,
            Source::CoordinatorHost => "\"$MERIDIAN_COORDINATOR_HOST\"".to_owned(),
            Source::Coordinator => "\"$MERIDIAN_COORDINATOR\"".to_owned(),
            // A copy runs under the binding its grant made, known only at the gate.
            Source::FencingToken if matches!(submission, Submission::Copy { .. }) => {
                "\"$MERIDIAN_GRANTED_TOKEN\"".to_owned()
            }
            other => shell_quote(&facts.value(other, 0)),
        };
        lines.push_str(&format!("export {}={value}\n", variable.name));
    }
    lines
}

/// The words after `srun --` that set each task's own variables from its `SLURM_PROCID` (task
/// `i` runs on the `i`-th node of the allocation, so replica 0 is on the coordinator's node)
/// and then run the command in place of the shell.
fn replica_wrapper(per_replica: &[String]) -> String {
    let assignments: Vec<String> = per_replica.iter().map(|name| format!("{name}=$SLURM_PROCID")).collect();
    format!(" /bin/sh -c '{}; export {}; exec \"$@\"' meridian-replica", assignments.join(" "), per_replica.join(" "))
}

/// `word` quoted for a POSIX shell: single quotes, with each `'` written as `'\''`.
pub(crate) fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::backend::slurm::config::QosRule;
    use meridian_proto::duration::HumanDuration;
    use meridian_proto::spec::JobSpec;

    pub(super) const CONTRACT: Contract<'static> = Contract { cluster: "east", port: 29_517 };

    fn assignment(command: &[&str]) -> Assignment {
        let mut spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "t", "tenant": "vision", "priority": 90,
            "gang": {"replicas": 2, "resources": {"gpus": 4, "gpuTypes": ["a100-80g"], "cpu": 8, "memoryGiB": 2}},
            "payload": {"command": command}
        }))
        .unwrap();
        spec.runtime.limit = Some(HumanDuration::from_secs(90));
        Assignment { job_id: "j-1".into(), fencing_token: 3, spec, last_preempted_at_ms: None }
    }

    fn config() -> SlurmConfig {
        SlurmConfig {
            partition: Some("gpu".into()),
            accounts: [("vision".to_string(), "acct-v".to_string())].into(),
            qos: vec![QosRule { min_priority: 80, qos: "high".into() }],
            gpu_types: [("a100".to_string(), "a100-80g".to_string())].into(),
            work_dir: "/scratch/meridian".into(),
            ..SlurmConfig::default()
        }
    }

    #[test]
    fn a_gang_becomes_one_sbatch_with_every_option() {
        let batch = batch_job(&assignment(&["python", "train.py"]), &config(), &[], &CONTRACT).unwrap();
        for expected in [
            "--job-name=meridian-j-1",
            "--comment=meridian:j-1:3",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--gres=gpu:a100:4",
            "--cpus-per-task=8",
            "--mem=2048M",
            "--time=2",
            "--partition=gpu",
            "--account=acct-v",
            "--qos=high",
            "--output=/scratch/meridian/meridian-j-1-3.out",
        ] {
            assert!(batch.args.iter().any(|a| a == expected), "{expected} missing from {:?}", batch.args);
        }
        assert!(
            batch.script.ends_with(
                "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 -- /bin/sh -c 'MERIDIAN_REPLICA=$SLURM_PROCID \
                 RANK=$SLURM_PROCID NODE_RANK=$SLURM_PROCID PET_NODE_RANK=$SLURM_PROCID; export MERIDIAN_REPLICA RANK \
                 NODE_RANK PET_NODE_RANK; exec \"$@\"' meridian-replica 'python' 'train.py'\n"
            ),
            "{}",
            batch.script
        );
    }

    #[test]
    fn a_preemptible_job_gets_the_preemptible_qos_when_one_is_configured() {
        let mut job = assignment(&["true"]);
        job.spec.preemptible = true;
        let with_qos = SlurmConfig { preemptible_qos: Some("scavenger".into()), ..config() };
        let args = batch_job(&job, &with_qos, &[], &CONTRACT).unwrap().args;
        assert!(args.contains(&"--qos=scavenger".to_string()) && !args.contains(&"--qos=high".to_string()), "{args:?}");
        // Without the setting the priority rules apply, and a job not marked keeps them too.
        assert!(batch_job(&job, &config(), &[], &CONTRACT).unwrap().args.contains(&"--qos=high".to_string()));
        job.spec.preemptible = false;
        assert!(batch_job(&job, &with_qos, &[], &CONTRACT).unwrap().args.contains(&"--qos=high".to_string()));
    }

    #[test]
    fn any_gpu_type_omits_the_type_and_zero_gpus_omit_gres() {
        let mut job = assignment(&["true"]);
        job.spec.gang.resources.gpu_types.clear();
        assert!(batch_job(&job, &config(), &[], &CONTRACT).unwrap().args.contains(&"--gres=gpu:4".to_string()));
        job.spec.gang.resources.gpus = 0;
        assert!(!batch_job(&job, &config(), &[], &CONTRACT).unwrap().args.iter().any(|a| a.starts_with("--gres")));
    }

    #[test]
    fn quoting_survives_a_real_shell() {
        let nasty = "it's $HOME `id` \"q\" \\ ; echo pwned";
        let mut job = assignment(&["printf", "%s|%s", nasty, "two words"]);
        job.spec.payload.env.insert("NASTY".into(), nasty.into());
        let batch = batch_job(&job, &config(), &[], &CONTRACT).unwrap();
        // Run the script's lines with `srun` replaced by a function that prints its arguments.
        let script = batch.script.replace(SRUN, "");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{script}\nprintf '|%s' \"$NASTY\""))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{nasty}|two words|{nasty}"));
    }

    #[test]
    fn a_copy_is_the_same_sbatch_with_a_copy_comment_its_own_output_and_a_gate_before_the_payload() {
        let job = assignment(&["python", "train.py"]);
        let binding = batch_job(&job, &config(), &[], &CONTRACT).unwrap();
        let copy = copy_batch_job(&job, 17, &config(), &[], &CONTRACT).unwrap();
        let differing: Vec<(&String, &String)> = binding.args.iter().zip(&copy.args).filter(|(a, b)| a != b).collect();
        assert_eq!(
            differing,
            [
                (&"--comment=meridian:j-1:3".to_string(), &"--comment=meridian-copy:j-1:17".to_string()),
                (
                    &"--output=/scratch/meridian/meridian-j-1-3.out".to_string(),
                    &"--output=/scratch/meridian/meridian-j-1-copy17.out".to_string()
                ),
            ],
            "only the comment and the output differ"
        );
        let gate = copy.script.find("trap : USR2").expect("a gate");
        let ready = copy.script.find(".ready").expect("a ready mark");
        let payload = copy.script.find("export MERIDIAN_JOB_ID").expect("the contract");
        assert!(gate < ready && ready < payload, "trap, then ready, then the payload:\n{}", copy.script);
        assert!(copy.script.contains("export MERIDIAN_FENCING_TOKEN=\"$MERIDIAN_GRANTED_TOKEN\""), "{}", copy.script);
        assert!(!binding.script.contains("MERIDIAN_GATE"), "a binding has no gate");
    }

    #[test]
    fn the_gate_holds_the_payload_until_the_jobs_comment_names_a_binding_of_it() {
        let dir = std::env::temp_dir().join(format!("meridian-gate-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A stand-in `scontrol` that shows job $4 with the comment in `dir/comment`, and counts
        // its calls in `dir/calls`.
        let (comment, calls) = (dir.join("comment"), dir.join("calls"));
        std::fs::write(&comment, "meridian-copy:j-1:17").unwrap();
        let scontrol = dir.join("scontrol");
        std::fs::write(
            &scontrol,
            format!(
                "#!/bin/sh\necho x >> '{}'\necho \"JobId=$4 JobName=meridian-j-1 Comment=$(cat '{}') JobState=RUNNING\"\n",
                calls.display(),
                comment.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&scontrol, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let config = SlurmConfig { work_dir: dir.clone(), bin_dir: Some(dir.clone()), ..config() };
        let copy = copy_batch_job(&assignment(&["true"]), 17, &config, &[], &CONTRACT).unwrap();
        // The gate's lines, in a real shell as Slurm job 42; then print the token it ran under.
        let end = copy.script.find("export MERIDIAN_JOB_ID").unwrap();
        let script = format!("SLURM_JOB_ID=42\n{}echo \"token=$MERIDIAN_GRANTED_TOKEN\"\n", &copy.script[..end]);
        let mut shell = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let ready = dir.join("meridian-gate-42.ready");
        let looks = || std::fs::read_to_string(&calls).map(|t| t.lines().count()).unwrap_or(0);
        let wait_until = |what: &str, done: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !done() {
                assert!(std::time::Instant::now() < deadline, "{what}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        };
        wait_until("the gate marks itself ready", &|| ready.exists() && looks() >= 1);
        let pid = shell.id().to_string();
        let signal = || assert!(std::process::Command::new("kill").args(["-USR2", &pid]).status().unwrap().success());
        // Woken while the comment says cancelled (a drop): it looks, and keeps waiting.
        std::fs::write(&comment, "meridian-cancelled:j-1:17").unwrap();
        let before = looks();
        signal();
        wait_until("the signal makes the gate look again", &|| looks() > before);
        assert!(shell.try_wait().unwrap().is_none(), "it still waits at the gate");
        // The grant: the comment names binding 9; the signal wakes it at once.
        std::fs::write(&comment, "meridian:j-1:9").unwrap();
        signal();
        let out = shell.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.ends_with("running as binding 9\ntoken=9\n"), "{text}");
        assert!(!ready.exists(), "the gate cleans up after itself");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Runs the script in a real shell as task `procid` of an allocation on `n7,n9`, with a
    /// stand-in `scontrol` that knows n7's address and `srun` dropped; the job prints its
    /// environment.
    fn run_as_task(job: &Assignment, procid: u32, node_addr: &str) -> BTreeMap<String, String> {
        // Each call its own directory: tests run side by side, and each removes its own.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("meridian-contract-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let scontrol = dir.join("scontrol");
        std::fs::write(
            &scontrol,
            format!(
                "#!/bin/sh\ncase \"$1 $2\" in\n'show hostnames') echo n7; echo n9 ;;\n\
                 '-o show') echo \"NodeName=$4 Arch=x86_64 NodeAddr={node_addr} NodeHostName=$4 Port=0\" ;;\nesac\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&scontrol, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let config = SlurmConfig { bin_dir: Some(dir.clone()), ..config() };
        let batch = batch_job(job, &config, &[], &CONTRACT).unwrap();
        let script = batch.script.replace(SRUN, "");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("SLURM_JOB_NODELIST", "n[7,9]")
            .env("SLURM_PROCID", procid.to_string())
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn each_task_gets_the_job_contract_from_its_allocation() {
        let job = assignment(&["env"]);
        let env = run_as_task(&job, 1, "10.1.2.7");
        for (name, value) in [
            ("MERIDIAN_JOB_ID", "j-1"),
            ("MERIDIAN_FENCING_TOKEN", "3"),
            ("MERIDIAN_CLUSTER", "east"),
            ("MERIDIAN_REPLICA", "1"),
            ("MERIDIAN_REPLICAS", "2"),
            ("MERIDIAN_GPUS_PER_REPLICA", "4"),
            ("MERIDIAN_COORDINATOR_HOST", "10.1.2.7"),
            ("MERIDIAN_COORDINATOR_PORT", "29517"),
            ("MERIDIAN_COORDINATOR", "10.1.2.7:29517"),
            ("MASTER_ADDR", "10.1.2.7"),
            ("MASTER_PORT", "29517"),
            ("WORLD_SIZE", "2"),
            ("RANK", "1"),
            ("NODE_RANK", "1"),
            ("PET_NNODES", "2"),
            ("PET_NODE_RANK", "1"),
            ("PET_MASTER_ADDR", "10.1.2.7"),
            ("PET_MASTER_PORT", "29517"),
        ] {
            assert_eq!(env.get(name).map(String::as_str), Some(value), "{name}: {env:?}");
        }
        assert_eq!(run_as_task(&job, 0, "10.1.2.7")["RANK"], "0");
        // An IPv6 address is bracketed in host:port.
        assert_eq!(run_as_task(&job, 0, "fd00::7")["MERIDIAN_COORDINATOR"], "[fd00::7]:29517");
        // Without a NodeAddr the node's name is the host.
        assert_eq!(run_as_task(&job, 0, "")["MASTER_ADDR"], "n7");
    }

    #[test]
    fn a_spec_that_opts_out_or_renames_gets_exactly_that() {
        let mut job = assignment(&["env"]);
        job.spec.payload.launcher_env_names.insert("RANK".into(), "TRAINER_RANK".into());
        job.spec.payload.env.insert("MASTER_PORT".into(), "1234".into());
        let env = run_as_task(&job, 1, "10.1.2.7");
        assert_eq!(env.get("TRAINER_RANK").map(String::as_str), Some("1"), "{env:?}");
        assert!(!env.contains_key("RANK"), "{env:?}");
        assert_eq!(env["MASTER_PORT"], "1234", "the payload's own value wins");
        job.spec.payload.launcher_env = meridian_proto::spec::LauncherEnv::None;
        job.spec.payload.launcher_env_names.clear();
        let env = run_as_task(&job, 1, "10.1.2.7");
        assert!(!env.contains_key("WORLD_SIZE") && !env.contains_key("PET_NNODES"), "{env:?}");
        assert_eq!(env["MERIDIAN_REPLICA"], "1");
    }

    #[test]
    fn image_only_payloads_and_bad_env_names_are_refused() {
        let mut job = assignment(&[]);
        job.spec.payload.image = Some("nvcr.io/pytorch".into());
        assert_eq!(batch_job(&job, &config(), &[], &CONTRACT), Err(ScriptError::ImageOnly));
        let mut job = assignment(&["true"]);
        job.spec.payload.env.insert("BAD-NAME".into(), "x".into());
        assert_eq!(batch_job(&job, &config(), &[], &CONTRACT), Err(ScriptError::BadEnvName("BAD-NAME".into())));
    }
}

#[cfg(test)]
mod selector_tests {
    use super::tests::CONTRACT;
    use super::*;

    #[test]
    fn a_node_selector_becomes_a_constraint_and_an_exclusion_list() {
        let mut job: Assignment = Assignment {
            job_id: "j".into(),
            fencing_token: 1,
            spec: serde_json::from_value(serde_json::json!({
                "name": "n", "tenant": "t",
                "gang": {"replicas": 2, "resources": {"gpus": 1}},
                "placement": {"nodeSelector": "ib, nvlink=true, !slow"},
                "payload": {"command": ["true"]}
            }))
            .unwrap(),
            last_preempted_at_ms: None,
        };
        let config = SlurmConfig::default();
        let batch = batch_job(&job, &config, &["n3".to_string(), "n4".to_string()], &CONTRACT).unwrap();
        assert!(batch.args.contains(&"--constraint=ib&nvlink".to_string()), "{:?}", batch.args);
        assert!(batch.args.contains(&"--exclude=n3,n4".to_string()), "{:?}", batch.args);
        job.spec.placement = Default::default();
        let plain = batch_job(&job, &config, &[], &CONTRACT).unwrap();
        assert!(!plain.args.iter().any(|a| a.starts_with("--constraint") || a.starts_with("--exclude")));
    }
}
