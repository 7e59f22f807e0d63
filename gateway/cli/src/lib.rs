//! The `meridian` user commands: submit, list, inspect, explain and cancel jobs, and list member
//! clusters, by talking to a running gateway through [`crate::client::Client`].
//!
//! The binary parses [`UserCommand`] and [`ClientArgs`] with clap and calls [`run`]; everything
//! printed goes to the writer it passes, so the commands can be tested without a terminal.

pub mod client;
pub mod failover;
pub mod format;
pub mod render;
pub mod sse;
pub mod table;
pub mod watch;

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::client::{Client, ClientError};

/// The job states the API knows, in their canonical spelling.
const STATES: [&str; 8] = ["Queued", "Offered", "Bound", "Running", "Succeeded", "Failed", "Cancelled", "Unknown"];

/// The commands a user runs against a gateway.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum UserCommand {
    /// Submit a job spec (YAML or JSON).
    Submit {
        /// The job spec file; `-` reads standard input.
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
    /// List jobs.
    Jobs {
        /// Only jobs whose labels match, such as `project=llm`.
        #[arg(short = 'l', long = "selector")]
        selector: Option<String>,
        /// Only jobs of this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Only jobs in this state (Queued, Offered, Bound, Running, Succeeded, Failed, Cancelled).
        #[arg(long)]
        state: Option<String>,
        /// After the list, print each change as it happens (until interrupted).
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Show one job.
    Job {
        /// The job's id (`j-...`).
        id: String,
        /// After the job, print each change until it ends; exits 0 when it succeeds, 1 when it
        /// fails or is cancelled.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Explain where a job was placed and why the other clusters were not chosen.
    Explain {
        /// The job's id (`j-...`).
        id: String,
    },
    /// Show a job's output, as its member keeps it (a bounded tail).
    Logs {
        /// The job's id (`j-...`).
        id: String,
        /// Keep printing new output until the job ends.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Start this many bytes before the end of what the member keeps.
        #[arg(long, value_name = "BYTES", default_value_t = 16 * 1024)]
        tail: u32,
    },
    /// Cancel a job.
    Cancel {
        /// The job's id (`j-...`).
        id: String,
    },
    /// List member clusters with their free GPUs, queue and prices.
    Clusters,
}

/// Options shared by every user command: which gateway to ask and how to print the answer.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ClientArgs {
    /// The gateway's REST address: https://HOST:PORT, or HOST:PORT / http://HOST:PORT for an
    /// `insecure` gateway. Several gateways (one leader, standbys) are separated by commas: each
    /// request goes to the one that answered last, and on to the others (or to the leader a
    /// standby names) when it cannot serve it.
    #[arg(long, env = "MERIDIAN_GATEWAY", default_value = "127.0.0.1:7070", global = true)]
    pub gateway: String,
    /// The CA certificate (PEM) the gateway's certificate must chain to, for https://.
    #[arg(long, env = "MERIDIAN_CA", value_name = "FILE", global = true)]
    pub ca: Option<PathBuf>,
    /// How to print answers: readable tables, or the API's JSON.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table", global = true)]
    pub output: OutputFormat,
    /// A file holding the bearer token (default: MERIDIAN_TOKEN, else MERIDIAN_TOKEN_FILE).
    #[arg(long, value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
}

/// The environment variable holding the bearer token itself.
pub const TOKEN_ENV: &str = "MERIDIAN_TOKEN";
/// The environment variable naming a file that holds the bearer token.
pub const TOKEN_FILE_ENV: &str = "MERIDIAN_TOKEN_FILE";

/// The bearer token to send: the `--token-file` flag's file, else `env_token`
/// (`MERIDIAN_TOKEN`), else the file `env_file` (`MERIDIAN_TOKEN_FILE`) names; `None` when none
/// is given. Surrounding whitespace (a file's final newline) is dropped.
pub fn resolve_token(
    flag_file: Option<&Path>,
    env_token: Option<String>,
    env_file: Option<PathBuf>,
) -> Result<Option<String>, CliError> {
    let from_file = |path: &Path| -> Result<String, CliError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| CliError::ReadToken { path: path.to_owned(), source })?;
        let token = text.trim().to_owned();
        if token.is_empty() {
            return Err(CliError::EmptyToken(path.display().to_string()));
        }
        Ok(token)
    };
    if let Some(path) = flag_file {
        return from_file(path).map(Some);
    }
    if let Some(token) = env_token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) {
        return Ok(Some(token));
    }
    match env_file.filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => from_file(&path).map(Some),
        None => Ok(None),
    }
}

/// How the user commands print what the gateway answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned tables and short sentences for people.
    #[default]
    Table,
    /// The API's JSON, pretty-printed, for scripts.
    Json,
}

/// Why a user command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Talking to the gateway failed, or it refused the request (the message lists each invalid
    /// field on its own line).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The job spec file could not be read.
    #[error("cannot read the job spec from {}: {source}", describe_path(path))]
    ReadSpec {
        /// The path given with `-f` (`-` for standard input).
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The token file could not be read.
    #[error("cannot read the token file {}: {source}", path.display())]
    ReadToken {
        /// The file (`--token-file` or MERIDIAN_TOKEN_FILE).
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The token file holds no token.
    #[error("the token file {0} is empty")]
    EmptyToken(String),
    /// A watched job ended without succeeding.
    #[error("job {id} {state}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    JobEnded {
        /// The job.
        id: String,
        /// `Failed` or `Cancelled`.
        state: String,
        /// Its last message.
        message: String,
    },
    /// The answer could not be written out.
    #[error("cannot write the output: {0}")]
    Output(#[source] std::io::Error),
}

/// Runs one user command against the gateway named in `args` and writes what it prints to
/// `out`. A closed pipe (`meridian jobs | head`) is not an error.
pub async fn run(cmd: UserCommand, args: &ClientArgs, out: &mut impl Write) -> Result<(), CliError> {
    let mut client = Client::new(&args.gateway)?;
    if let Some(ca) = &args.ca {
        client = client.with_ca_file(ca)?;
    }
    let token = resolve_token(
        args.token_file.as_deref(),
        std::env::var(TOKEN_ENV).ok(),
        std::env::var_os(TOKEN_FILE_ENV).map(PathBuf::from),
    )?;
    let client = client.with_token(token);

    let now = now_ms();
    let (answer, table): (Value, String) = match cmd {
        UserCommand::Submit { file } => {
            let spec = read_spec(&file).await?;
            let (job, created) = client.submit(&spec).await?;
            let text = render::submitted(&job, created);
            (job, text)
        }
        UserCommand::Jobs { selector, tenant, state, watch: true } => {
            let state = state.map(|s| canonical_state(&s));
            let watched = watch::Watched::Jobs { tenant, state, selector };
            return watch::run(&client, watched, args.output, out).await;
        }
        UserCommand::Job { id, watch: true } => {
            return watch::run(&client, watch::Watched::Job(id), args.output, out).await;
        }
        UserCommand::Jobs { selector, tenant, state, watch: false } => {
            let state = state.map(|s| canonical_state(&s));
            let list = client.list(tenant.as_deref(), state.as_deref(), selector.as_deref()).await?;
            let text = render::jobs(&list, now);
            (list, text)
        }
        UserCommand::Job { id, watch: false } => {
            let job = client.get(&id).await?;
            let text = render::job(&job, now);
            (job, text)
        }
        UserCommand::Explain { id } => {
            let explanation = client.explain(&id).await?;
            let text = render::explain(&explanation);
            (explanation, text)
        }
        // Output is printed as it comes, not as one answer.
        UserCommand::Logs { id, follow, tail } => return logs(&client, &id, follow, tail, args.output, out).await,
        UserCommand::Cancel { id } => {
            let job = client.cancel(&id).await?;
            let text = render::cancelled(&job);
            (job, text)
        }
        UserCommand::Clusters => {
            let list = client.clusters().await?;
            let text = render::clusters(&list);
            (list, text)
        }
    };
    let text = match args.output {
        OutputFormat::Table => table,
        OutputFormat::Json => {
            let mut json = serde_json::to_string_pretty(&answer).map_err(|e| CliError::Output(e.into()))?;
            json.push('\n');
            json
        }
    };
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result.map_err(CliError::Output),
    }
}

/// How long `logs -f` waits before asking again when nothing new came.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Bytes asked for per request while following.
const FOLLOW_CHUNK: u32 = 64 * 1024;

/// `meridian logs`: the tail of a job's output, then (with `follow`) what it writes next until
/// its member says the output is complete or the job has ended.
async fn logs(
    client: &Client,
    id: &str,
    follow: bool,
    tail: u32,
    output: OutputFormat,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let mut chunk = client.logs(id, None, tail.max(1)).await?;
    loop {
        let data = chunk.get("data").and_then(Value::as_str).unwrap_or_default();
        let printed = match output {
            OutputFormat::Table => out.write_all(data.as_bytes()),
            OutputFormat::Json => writeln!(out, "{chunk}"),
        };
        match printed.and_then(|()| out.flush()) {
            Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            result => result.map_err(CliError::Output)?,
        }
        let complete = chunk.get("complete").and_then(Value::as_bool).unwrap_or(false);
        if !follow || complete {
            return Ok(());
        }
        let next = chunk.get("nextOffset").and_then(Value::as_u64).unwrap_or(0);
        if data.is_empty() {
            // A member that cannot tell the end of the output (or a job that ended after this
            // read) must not keep `-f` waiting forever: stop once the job is over.
            let job = client.get(id).await?;
            let state = job.get("state").and_then(Value::as_str).unwrap_or_default();
            if ["Succeeded", "Failed", "Cancelled"].contains(&state) {
                chunk = client.logs(id, Some(next), FOLLOW_CHUNK).await?;
                if chunk.get("data").and_then(Value::as_str).unwrap_or_default().is_empty() {
                    return Ok(());
                }
                continue;
            }
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
        chunk = client.logs(id, Some(next), FOLLOW_CHUNK).await?;
    }
}

/// Reads the spec text from a file, or from standard input for `-`.
async fn read_spec(path: &Path) -> Result<String, CliError> {
    let read_error = |source| CliError::ReadSpec { path: path.to_owned(), source };
    if path == Path::new("-") {
        // tokio's stdin needs a feature the workspace does not enable; read on a blocking thread.
        tokio::task::spawn_blocking(|| std::io::read_to_string(std::io::stdin()))
            .await
            .map_err(|join| read_error(std::io::Error::other(join)))?
            .map_err(read_error)
    } else {
        tokio::fs::read_to_string(path).await.map_err(read_error)
    }
}

/// `running` → `Running`, so users need not remember the API's capitalisation; unknown words
/// pass through for the gateway to judge.
fn canonical_state(state: &str) -> String {
    STATES.iter().find(|known| known.eq_ignore_ascii_case(state)).map_or_else(|| state.to_owned(), |k| (*k).to_owned())
}

fn describe_path(path: &Path) -> String {
    if path == Path::new("-") { "standard input".to_owned() } else { path.display().to_string() }
}

/// Wall-clock milliseconds since the Unix epoch, the clock the API's timestamps use.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct TestCli {
        #[command(subcommand)]
        command: UserCommand,
        #[command(flatten)]
        client: ClientArgs,
    }

    fn parse(args: &[&str]) -> TestCli {
        TestCli::try_parse_from(std::iter::once("meridian").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn the_token_comes_from_the_flag_then_the_variable_then_the_variable_file() {
        let dir = tempfile::tempdir().unwrap();
        let flag_file = dir.path().join("flag-token");
        let env_file = dir.path().join("env-token");
        std::fs::write(&flag_file, "from-flag\n").unwrap();
        std::fs::write(&env_file, "  from-env-file \n").unwrap();
        let env = || Some("from-env".to_string());
        assert_eq!(resolve_token(Some(&flag_file), env(), Some(env_file.clone())).unwrap().unwrap(), "from-flag");
        assert_eq!(resolve_token(None, env(), Some(env_file.clone())).unwrap().unwrap(), "from-env");
        assert_eq!(resolve_token(None, Some(" ".into()), Some(env_file.clone())).unwrap().unwrap(), "from-env-file");
        assert_eq!(resolve_token(None, None, None).unwrap(), None);
        let missing = resolve_token(Some(&dir.path().join("nope")), None, None).unwrap_err();
        assert!(missing.to_string().contains("cannot read the token file"), "{missing}");
        std::fs::write(&env_file, "\n").unwrap();
        assert!(matches!(resolve_token(None, None, Some(env_file)), Err(CliError::EmptyToken(_))));
        assert_eq!(parse(&["--token-file", "t.txt", "clusters"]).client.token_file, Some(PathBuf::from("t.txt")));
    }

    #[test]
    fn commands_parse_with_global_options_anywhere() {
        let cli = parse(&["--gateway", "gw:1", "jobs", "-l", "project=llm", "--state", "running", "-o", "json"]);
        assert_eq!(
            cli.command,
            UserCommand::Jobs {
                selector: Some("project=llm".into()),
                tenant: None,
                state: Some("running".into()),
                watch: false
            }
        );
        assert_eq!(cli.client.output, OutputFormat::Json);
        assert_eq!(cli.client.gateway, "gw:1");

        let cli = parse(&["--gateway", "gw:1", "submit", "-f", "-"]);
        assert_eq!(cli.command, UserCommand::Submit { file: PathBuf::from("-") });
        assert_eq!(cli.client.output, OutputFormat::Table);
        assert_eq!(parse(&["--gateway", "x", "explain", "j-1"]).command, UserCommand::Explain { id: "j-1".into() });
        assert_eq!(parse(&["--gateway", "x", "clusters"]).command, UserCommand::Clusters);
        assert_eq!(parse(&["job", "j-1", "--watch"]).command, UserCommand::Job { id: "j-1".into(), watch: true });
        assert!(matches!(parse(&["jobs", "-w"]).command, UserCommand::Jobs { watch: true, .. }));
        assert!(TestCli::try_parse_from(["meridian", "-o", "yaml", "clusters"]).is_err());
    }

    #[test]
    fn command_definitions_are_consistent() {
        <TestCli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn states_are_capitalised_like_the_api() {
        assert_eq!(canonical_state("running"), "Running");
        assert_eq!(canonical_state("CANCELLED"), "Cancelled");
        assert_eq!(canonical_state("weird"), "weird");
    }

    #[test]
    fn api_errors_print_the_message_then_each_field() {
        let error = CliError::from(ClientError::Api {
            status: 400,
            code: "invalid_spec".into(),
            message: "the job spec has 2 problems".into(),
            fields: vec![
                crate::client::FieldError { field: "gang.resources.gpus".into(), reason: "must be at least 1".into() },
                crate::client::FieldError { field: "tenant".into(), reason: "must not be empty".into() },
            ],
        });
        assert_eq!(
            error.to_string(),
            "the job spec has 2 problems\n  gang.resources.gpus: must be at least 1\n  tenant: must not be empty"
        );
    }

    #[tokio::test]
    async fn unreadable_spec_files_are_named() {
        let args =
            ClientArgs { gateway: "127.0.0.1:9".into(), ca: None, output: OutputFormat::Table, token_file: None };
        let missing = PathBuf::from("/definitely/not/here.yaml");
        let mut out = Vec::new();
        let error = run(UserCommand::Submit { file: missing }, &args, &mut out).await.unwrap_err();
        assert!(error.to_string().starts_with("cannot read the job spec from /definitely/not/here.yaml: "), "{error}");
    }
}
