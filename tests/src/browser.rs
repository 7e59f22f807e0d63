//! A small driver for headless Chromium over the DevTools protocol (CDP), for tests of the web
//! console: start a private browser, open a page, evaluate JavaScript in it, wait for a
//! condition, take screenshots, and collect the page's script errors.
//!
//! It speaks CDP as JSON over a WebSocket written here (client frames masked, text messages,
//! fragments, ping/pong, close); nothing beyond what CDP on loopback needs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// How long one DevTools call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The Chromium binary to run: `MERIDIAN_CHROMIUM`, else `chromium`, `chromium-browser`,
/// `google-chrome` on `PATH`; `None` when there is none.
pub fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("MERIDIAN_CHROMIUM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser", "google-chrome"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
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

/// A headless Chromium with one page, stopped (and its profile removed) on drop.
pub struct Browser {
    // Declared first: the browser stops before its profile directory is removed.
    _child: KillOnDrop,
    profile: tempfile::TempDir,
    cdp: Cdp,
    session: String,
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
        let profile = tempfile::tempdir()?;
        let log = std::fs::File::create(profile.path().join("chromium.log"))?;
        let child = Command::new(&binary)
            .args([
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
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().join("data").display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut child = KillOnDrop(child);
        let (port, path) = devtools_port(&mut child.0, profile.path()).await?;
        let mut cdp = Cdp::connect(port, &path).await?;
        let target = cdp.call(None, "Target.createTarget", json!({"url": "about:blank"})).await?;
        let target_id = target["targetId"].as_str().ok_or_else(|| anyhow!("createTarget answered {target}"))?;
        let attached = cdp.call(None, "Target.attachToTarget", json!({"targetId": target_id, "flatten": true})).await?;
        let session =
            attached["sessionId"].as_str().ok_or_else(|| anyhow!("attachToTarget answered {attached}"))?.to_string();
        let mut browser = Browser { _child: child, profile, cdp, session };
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({})).await?;
        }
        browser.set_viewport(width, height, false).await?;
        Ok(browser)
    }

    /// Calls `method` on the page.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let session = self.session.clone();
        self.cdp.call(Some(&session), method, params).await
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

    /// Opens `url` (returns once navigation started; wait for content with [`Self::wait_for`]).
    pub async fn navigate(&mut self, url: &str) -> Result<()> {
        let answer = self.call("Page.navigate", json!({"url": url})).await?;
        if let Some(error) = answer["errorText"].as_str() {
            bail!("navigating to {url}: {error}");
        }
        Ok(())
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
                    self.cdp.errors
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves a PNG of the viewport to `path`.
    pub async fn screenshot(&mut self, path: &Path) -> Result<()> {
        let answer = self.call("Page.captureScreenshot", json!({"format": "png"})).await?;
        let data = answer["data"].as_str().ok_or_else(|| anyhow!("captureScreenshot answered no data"))?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(data)?;
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// Script errors the page raised so far: uncaught exceptions, `console.error` calls and
    /// browser errors other than failed requests (a refused request is the API's answer, seen
    /// by the page; a blocked script or style, a Content-Security-Policy violation, is here).
    pub fn errors(&self) -> &[String] {
        &self.cdp.errors
    }

    /// What Chromium wrote to stderr.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.profile.path().join("chromium.log")).unwrap_or_default()
    }
}

/// A child process killed (and reaped) on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The DevTools port and browser path Chromium writes to `DevToolsActivePort` in its profile.
async fn devtools_port(child: &mut Child, profile: &Path) -> Result<(u16, String)> {
    let file = profile.join("data").join("DevToolsActivePort");
    let log = || std::fs::read_to_string(profile.join("chromium.log")).unwrap_or_default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let mut lines = text.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next())
                && let Ok(port) = port.trim().parse::<u16>()
            {
                return Ok((port, path.trim().to_string()));
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("chromium exited with {status}:\n{}", log());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("chromium wrote no DevToolsActivePort within 30 s:\n{}", log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One DevTools WebSocket connection.
struct Cdp {
    socket: BufReader<TcpStream>,
    next_id: u64,
    errors: Vec<String>,
}

impl Cdp {
    async fn connect(port: u16, path: &str) -> Result<Self> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.context("connecting to DevTools")?;
        let mut socket = BufReader::new(stream);
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: bWVyaWRpYW4tY29uc29sZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        socket.write_all(request.as_bytes()).await?;
        let mut status = String::new();
        socket.read_line(&mut status).await?;
        if !status.contains(" 101 ") {
            bail!("DevTools refused the WebSocket upgrade: {}", status.trim());
        }
        loop {
            let mut line = String::new();
            if socket.read_line(&mut line).await? == 0 {
                bail!("DevTools closed the connection during the upgrade");
            }
            if line == "\r\n" {
                break;
            }
        }
        Ok(Self { socket, next_id: 1, errors: Vec::new() })
    }

    /// Sends one command and reads messages until its answer, keeping the events seen meanwhile.
    async fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let answer = tokio::time::timeout(CALL_TIMEOUT, async {
            self.send(message.to_string().as_bytes()).await?;
            loop {
                let text = self.receive().await?;
                let message: Value = serde_json::from_str(&text).context("DevTools sent invalid JSON")?;
                if message["id"].as_u64() == Some(id) {
                    return Ok::<_, anyhow::Error>(message);
                }
                self.observe(&message);
            }
        })
        .await
        .map_err(|_| anyhow!("DevTools did not answer {method} within {CALL_TIMEOUT:?}"))??;
        if let Some(error) = answer.get("error") {
            bail!("{method} failed: {error}");
        }
        Ok(answer["result"].clone())
    }

    /// Keeps the page's errors from an event.
    fn observe(&mut self, event: &Value) {
        let params = &event["params"];
        match event["method"].as_str() {
            Some("Runtime.exceptionThrown") => {
                self.errors.push(format!("exception: {}", describe_exception(&params["exceptionDetails"])));
            }
            Some("Runtime.consoleAPICalled") if params["type"] == "error" => {
                let args: Vec<String> = params["args"]
                    .as_array()
                    .map(|args| args.iter().map(|a| a["value"].to_string()).collect())
                    .unwrap_or_default();
                self.errors.push(format!("console.error: {}", args.join(" ")));
            }
            Some("Log.entryAdded") if params["entry"]["level"] == "error" && params["entry"]["source"] != "network" => {
                self.errors.push(format!(
                    "{}: {}",
                    params["entry"]["source"].as_str().unwrap_or("browser"),
                    params["entry"]["text"].as_str().unwrap_or_default()
                ));
            }
            _ => {}
        }
    }

    /// Sends one text message (one masked frame).
    async fn send(&mut self, payload: &[u8]) -> Result<()> {
        let mut frame = Vec::with_capacity(payload.len() + 14);
        frame.push(0x81); // FIN, text
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= usize::from(u16::MAX) => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        // Clients must mask; the key only has to vary between frames, not be secret, here.
        let mask = (self.next_id as u32).wrapping_mul(0x9e37_79b9).to_be_bytes();
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, byte)| byte ^ mask[i % 4]));
        self.socket.write_all(&frame).await?;
        Ok(())
    }

    /// Reads one whole text message (joining fragments, answering pings).
    async fn receive(&mut self) -> Result<String> {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.socket.read_exact(&mut head).await.context("reading from DevTools")?;
            let fin = head[0] & 0x80 != 0;
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            let length = match head[1] & 0x7f {
                126 => u64::from(self.socket.read_u16().await?),
                127 => self.socket.read_u64().await?,
                n => u64::from(n),
            };
            let mut mask = [0u8; 4];
            if masked {
                self.socket.read_exact(&mut mask).await?;
            }
            let length = usize::try_from(length).context("frame too large")?;
            let mut payload = vec![0u8; length];
            self.socket.read_exact(&mut payload).await?;
            if masked {
                for (i, byte) in payload.iter_mut().enumerate() {
                    *byte ^= mask[i % 4];
                }
            }
            match opcode {
                0x0..=0x2 => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message).context("DevTools sent a non-UTF-8 message");
                    }
                }
                0x8 => bail!("DevTools closed the connection"),
                0x9 => self.pong(&payload).await?,
                _ => {}
            }
        }
    }

    async fn pong(&mut self, payload: &[u8]) -> Result<()> {
        let mut frame = vec![0x8a, 0x80 | payload.len().min(125) as u8, 0, 0, 0, 0];
        frame.extend_from_slice(&payload[..payload.len().min(125)]);
        self.socket.write_all(&frame).await?;
        Ok(())
    }
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
