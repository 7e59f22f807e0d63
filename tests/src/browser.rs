//! Headless Chromium for tests of the web console, driven through Debian's `chromedriver` with the
//! `fantoccini` WebDriver client: start a private browser, open a page, evaluate JavaScript in
//! it, wait for a condition, take screenshots, and collect the page's script errors.
//!
//! Standard WebDriver commands open pages and take screenshots; the page's errors come from
//! chromedriver's browser log (`goog:loggingPrefs`), which records uncaught exceptions, console
//! calls and browser messages with their source. Two things WebDriver has no command for go
//! through chromedriver's DevTools pass-through (`goog/cdp/execute`): evaluating a script as the
//! console's address bar does (statements, completion value, promises awaited, the exception's
//! text and place), and a phone's viewport (`mobile` applies `<meta name=viewport>`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tokio::runtime::{Handle, RuntimeFlavor};

/// How long one WebDriver call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The Chromium binary to run: `MERIDIAN_CHROMIUM`, else `chromium`, `chromium-browser`,
/// `google-chrome` on `PATH`; `None` when there is none.
pub fn chromium() -> Option<PathBuf> {
    from_env_or_path("MERIDIAN_CHROMIUM", &["chromium", "chromium-browser", "google-chrome"])
}

/// The chromedriver binary that drives [`chromium()`]: `MERIDIAN_CHROMEDRIVER`, else
/// `chromedriver` on `PATH` (Debian's `chromium-driver`); `None` when there is none.
pub fn chromedriver() -> Option<PathBuf> {
    from_env_or_path("MERIDIAN_CHROMEDRIVER", &["chromedriver"])
}

/// Whether browser tests were knowingly turned off (`MERIDIAN_SKIP_BROWSER=1`).
pub fn skipped() -> bool {
    std::env::var("MERIDIAN_SKIP_BROWSER").is_ok_and(|v| v == "1")
}

/// Where test artefacts of `name` are kept: `<target dir>/artefacts/<name>/` (created).
pub fn artefact_dir(name: &str) -> Result<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
    let dir = target.join("artefacts").join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A headless Chromium with one page, quit (and its profile removed) on drop.
pub struct Browser {
    client: Client,
    // Dropped after `client` (fields drop in order): chromedriver is killed once the session
    // has quit Chromium, then the profile directory goes.
    _driver: KillOnDrop,
    profile: tempfile::TempDir,
    errors: Vec<String>,
}

impl Browser {
    /// Starts Chromium with a fresh profile and opens a blank page of `width`×`height`.
    pub async fn launch(width: u32, height: u32) -> Result<Self> {
        let binary = chromium().ok_or_else(|| {
            anyhow!(
                "no Chromium found: install Debian's `chromium` (scripts/test.sh does) or set MERIDIAN_CHROMIUM; \
                 set MERIDIAN_SKIP_BROWSER=1 to skip the browser tests knowingly"
            )
        })?;
        let driver_binary = chromedriver().ok_or_else(|| {
            anyhow!(
                "no chromedriver found: install Debian's `chromium-driver` (scripts/test.sh does) or set \
                 MERIDIAN_CHROMEDRIVER; set MERIDIAN_SKIP_BROWSER=1 to skip the browser tests knowingly"
            )
        })?;
        let profile = tempfile::tempdir()?;
        let log = std::fs::File::create(profile.path().join("chromedriver.log"))?;
        // Port 0: chromedriver picks a free port and says which on stdout (kept in the log).
        let child = Command::new(&driver_binary)
            .args(["--port=0", "--enable-chrome-logs"])
            // Its own process group, which Chromium joins: dropping the driver kills them all,
            // even when the session could not be ended first.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", driver_binary.display()))?;
        let mut driver = KillOnDrop(child);
        let port = driver_port(&mut driver.0, profile.path()).await?;
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--hide-scrollbars",
            "--mute-audio",
            "--password-store=basic",
            "--force-device-scale-factor=1",
        ]
        .map(String::from)
        .into_iter()
        .chain([
            format!("--user-data-dir={}", profile.path().join("data").display()),
            format!("--window-size={width},{height}"),
        ]);
        let capabilities = json!({
            "browserName": "chrome",
            // Navigation returns once the document is parsed; the test waits for content itself.
            "pageLoadStrategy": "eager",
            "goog:chromeOptions": {"binary": binary, "args": args.collect::<Vec<_>>()},
            "goog:loggingPrefs": {"browser": "ALL"},
        });
        let Value::Object(capabilities) = capabilities else { bail!("capabilities are not an object") };
        let client = tokio::time::timeout(
            CALL_TIMEOUT,
            ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .await
        .map_err(|_| anyhow!("chromedriver started no session within {CALL_TIMEOUT:?}"))?
        .with_context(|| {
            let log = std::fs::read_to_string(profile.path().join("chromedriver.log")).unwrap_or_default();
            format!("starting a Chromium session through chromedriver:\n{log}")
        })?;
        let mut browser = Browser { client, _driver: driver, profile, errors: Vec::new() };
        browser.set_viewport(width, height, false).await?;
        Ok(browser)
    }

    /// Calls the DevTools method `method` on the page (through chromedriver) and returns its result.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let answer =
            self.issue(ChromeCommand::cdp(method, params)).await.with_context(|| format!("{method} failed"))?;
        self.collect_errors().await?;
        Ok(answer)
    }

    /// Sets the page's viewport; `mobile` applies the page's `<meta name=viewport>` as a phone does.
    pub async fn set_viewport(&mut self, width: u32, height: u32, mobile: bool) -> Result<()> {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        )
        .await?;
        Ok(())
    }

    /// Opens `url` (returns once the document is parsed; wait for content with [`Self::wait_for`]).
    pub async fn navigate(&mut self, url: &str) -> Result<()> {
        timed(self.client.goto(url)).await.with_context(|| format!("navigating to {url}"))?;
        self.collect_errors().await
    }

    /// Evaluates `expression` in the page (promises awaited) and returns its value as JSON.
    pub async fn eval(&mut self, expression: &str) -> Result<Value> {
        let answer = self
            .call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true, "awaitPromise": true}))
            .await?;
        if let Some(details) = answer.get("exceptionDetails") {
            bail!("`{expression}` threw: {}", describe_exception(details));
        }
        Ok(answer["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// Polls `expression` every 100 ms until it is truthy (not null, false, 0 or "") and
    /// returns that value; after `timeout`, fails with the page's visible text. An expression
    /// that throws (the page is still loading, an element is not there yet) counts as false.
    pub async fn wait_for(&mut self, expression: &str, timeout: Duration) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // `last` is what the expression gave, or why it threw.
            let last = match self.eval(expression).await {
                Ok(value) if truthy(&value) => return Ok(value),
                Ok(value) => value.to_string(),
                Err(error) if error.to_string().contains(" threw: ") => error.to_string(),
                Err(error) => return Err(error),
            };
            if tokio::time::Instant::now() > deadline {
                let text = self.eval("document.body ? document.body.innerText.slice(0, 3000) : ''").await?;
                bail!(
                    "`{expression}` was not true within {timeout:?} (last: {last}); the page shows:\n{}\nscript errors: {:?}",
                    text.as_str().unwrap_or_default(),
                    self.errors
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves a PNG of the viewport to `path`.
    pub async fn screenshot(&mut self, path: &Path) -> Result<()> {
        let bytes = timed(self.client.screenshot()).await.context("taking a screenshot")?;
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
        self.collect_errors().await
    }

    /// Script errors the page raised so far: uncaught exceptions, `console.error` calls and
    /// browser errors other than failed requests (a refused request is the API's answer, seen
    /// by the page; a blocked script or style, a Content-Security-Policy violation, is here).
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// What chromedriver and Chromium wrote to stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.profile.path().join("chromedriver.log")).unwrap_or_default()
    }

    /// Sends a chromedriver command, within [`CALL_TIMEOUT`].
    async fn issue(&self, command: ChromeCommand) -> Result<Value> {
        timed(self.client.issue_cmd(command)).await
    }

    /// Moves the browser log's new errors into `errors`. Chromedriver hands each entry out once,
    /// so every command ends with this, as a DevTools client sees events between its calls.
    async fn collect_errors(&mut self) -> Result<()> {
        let entries = self.issue(ChromeCommand::browser_log()).await.context("reading the browser log")?;
        for entry in entries.as_array().into_iter().flatten() {
            // Warnings and `console.log` are not errors; a failed request is the server's answer.
            if entry["level"] == "SEVERE" && entry["source"] != "network" {
                let source = entry["source"].as_str().unwrap_or("browser");
                self.errors.push(format!("{source}: {}", entry["message"].as_str().unwrap_or_default()));
            }
        }
        Ok(())
    }
}

impl Drop for Browser {
    /// Ends the WebDriver session, which quits Chromium: killing chromedriver alone would leave
    /// Chromium running. Blocking needs a multi-threaded runtime (the console tests use one);
    /// elsewhere the session ends when fantoccini's task sees its client gone.
    fn drop(&mut self) {
        let Ok(runtime) = Handle::try_current() else { return };
        if runtime.runtime_flavor() != RuntimeFlavor::MultiThread {
            return;
        }
        let client = self.client.clone();
        tokio::task::block_in_place(|| {
            runtime.block_on(async {
                let _ = tokio::time::timeout(CALL_TIMEOUT, client.close()).await;
            });
        });
    }
}

/// A chromedriver extension command, posted to `/session/{id}/{path}`.
#[derive(Debug)]
struct ChromeCommand {
    path: &'static str,
    body: Value,
}

impl ChromeCommand {
    /// A DevTools method run on the current page (`goog/cdp/execute`).
    fn cdp(method: &str, params: Value) -> Self {
        ChromeCommand { path: "goog/cdp/execute", body: json!({"cmd": method, "params": params}) }
    }

    /// The browser log's entries since the last read (`se/log`).
    fn browser_log() -> Self {
        ChromeCommand { path: "se/log", body: json!({"type": "browser"}) }
    }
}

impl WebDriverCompatibleCommand for ChromeCommand {
    fn endpoint(&self, base_url: &url::Url, session_id: Option<&str>) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!("session/{}/{}", session_id.unwrap_or_default(), self.path))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.to_string()))
    }
}

/// A child process leading its own process group: the whole group is killed, and the child
/// reaped, on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `future` (a WebDriver call), failing after [`CALL_TIMEOUT`].
async fn timed<T, E>(future: impl Future<Output = Result<T, E>>) -> Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::time::timeout(CALL_TIMEOUT, future)
        .await
        .map_err(|_| anyhow!("chromedriver did not answer within {CALL_TIMEOUT:?}"))?
        .map_err(anyhow::Error::from)
}

/// The port chromedriver says it listens on (`… started successfully on port N.`).
async fn driver_port(child: &mut Child, profile: &Path) -> Result<u16> {
    let log = || std::fs::read_to_string(profile.join("chromedriver.log")).unwrap_or_default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let port = log().lines().find_map(|line| {
            let rest = line.split("started successfully on port ").nth(1)?;
            rest.trim_end_matches('.').trim().parse::<u16>().ok()
        });
        if let Some(port) = port {
            return Ok(port);
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("chromedriver exited with {status}:\n{}", log());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("chromedriver named no port within 30 s:\n{}", log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The binary named by the environment variable `variable`, else the first of `names` on `PATH`.
fn from_env_or_path(variable: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Whether a JavaScript value is truthy (not null, false, 0 or "").
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        _ => true,
    }
}

/// An exception's text as DevTools reports it.
fn describe_exception(details: &Value) -> String {
    let text = details["exception"]["description"].as_str().or_else(|| details["text"].as_str()).unwrap_or("?");
    format!(
        "{text} at {}:{}",
        details["url"].as_str().unwrap_or("?"),
        details["lineNumber"].as_u64().map_or_else(|| "?".into(), |n| (n + 1).to_string())
    )
}
