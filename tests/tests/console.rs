//! The web console in a real headless Chromium, against a real gateway with real agents.
//!
//! - The fleet view lists every cluster; a job submitted after the page opened appears in the
//!   job list without a reload; its page explains the placement with every cluster of the
//!   federation; the page fits a phone's width; screenshots at 1280×800 and 390×844 are kept
//!   under `<target>/artefacts/console/`.
//! - With authentication on: the page and its files load without a token, the console asks for
//!   one, refuses a bad one, and with a member's token lists only that member's tenant's jobs.
//!
//! Needs Chromium and chromedriver (`scripts/test.sh` installs Debian's `chromium` and
//! `chromium-driver`; or set `MERIDIAN_CHROMIUM` and `MERIDIAN_CHROMEDRIVER`).
//! Without it the tests fail, unless `MERIDIAN_SKIP_BROWSER=1` says to skip them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;
use std::time::Duration;

use meridian_e2e::browser::{self, Browser};
use meridian_e2e::{Agent, GATEWAY_CONFIG, Gateway, agent_config};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(30);
/// Jobs that must not end during a test: one hour of job time lasts an hour.
const SLOW: f64 = 1.0;
const H100_NODES: &str = "  - {shape: h100-node, count: 2, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
const A100_NODES: &str = "  - {shape: a100-node, count: 2, gpuType: a100-80g, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
const L4_NODES: &str = "  - {shape: l4-node, count: 4, gpuType: l4, gpus: 4, cpu: 32, memoryGiB: 256}\n";

/// Whether this machine can run the browser tests; without Chromium and chromedriver, a failure
/// unless skipping was asked for.
fn browser_available() -> bool {
    if browser::chromium().is_some() && browser::chromedriver().is_some() {
        return true;
    }
    if browser::skipped() {
        eprintln!("console browser test skipped: MERIDIAN_SKIP_BROWSER=1");
        return false;
    }
    panic!(
        "no Chromium or chromedriver to test the console with: run scripts/test.sh (it installs Debian's \
         `chromium` and `chromium-driver`), or set MERIDIAN_CHROMIUM and MERIDIAN_CHROMEDRIVER to their binaries, \
         or MERIDIAN_SKIP_BROWSER=1 to skip the browser tests knowingly"
    );
}

fn spec(name: &str, tenant: &str, gpu_types: &str) -> String {
    format!(
        "name: {name}\ntenant: {tenant}\nlabels: {{project: console-test}}\n\
         gang: {{replicas: 1, resources: {{gpus: 2, gpuTypes: [{gpu_types}], cpu: 8, memoryGiB: 64}}}}\n\
         runtime: {{estimate: 1h}}\npayload: {{image: registry.local/train:1, command: [python, train.py]}}\n"
    )
}

/// `expression` quoted as a JavaScript string literal.
fn js(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// The page fits the viewport's width: nothing scrolls sideways except inside table containers.
async fn fits_width(page: &mut Browser, width: u32) {
    // One frame, so layout follows the new viewport.
    page.eval("new Promise(resolve => requestAnimationFrame(() => requestAnimationFrame(() => resolve(true))))")
        .await
        .unwrap();
    let scroll_width = page.eval("document.documentElement.scrollWidth").await.unwrap();
    assert!(
        scroll_width.as_u64().unwrap() <= u64::from(width),
        "the page is {scroll_width} px wide in a {width} px viewport: something overflows outside a scroll container"
    );
}

async fn shot(page: &mut Browser, dir: &std::path::Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    page.screenshot(&path).await.unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size > 5_000, "{} is only {size} bytes: a blank page?", path.display());
    println!("screenshot: {}", path.display());
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_follows_a_new_job_and_explains_it_against_every_cluster() {
    if !browser_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let clusters = [
        ("onprem-east", agent_config("onprem-east", "us-east", "owned", "{h100: 2.0}", H100_NODES, SLOW)),
        ("onprem-west", agent_config("onprem-west", "eu-west", "owned", "{a100-80g: 1.5}", A100_NODES, SLOW)),
        ("cloud-east", agent_config("cloud-east", "us-east", "cloud", "{h100: 4.1, l4: 0.8}", H100_NODES, SLOW)),
        ("edge-central", agent_config("edge-central", "us-central", "owned", "{l4: 0.4}", L4_NODES, SLOW)),
    ];
    let _agents: Vec<Agent> =
        clusters.iter().map(|(name, config)| Agent::start(dir.path(), name, config, &gateway).unwrap()).collect();
    gateway.wait_for_clusters(clusters.len()).await.unwrap();
    let artefacts = browser::artefact_dir("console").unwrap();
    let base = format!("http://{}", gateway.rest);

    let mut page = Browser::launch(1280, 800).await.unwrap();
    page.navigate(&format!("{base}/")).await.unwrap();

    // Fleet: every cluster, connected, under its region.
    page.wait_for("document.querySelectorAll('tr[data-cluster]:not(.down)').length === 4", WAIT).await.unwrap();
    for (name, _) in &clusters {
        let row =
            page.eval(&format!("document.querySelector('tr[data-cluster=\"{name}\"]')?.innerText")).await.unwrap();
        assert!(row.as_str().is_some_and(|text| text.contains("connected")), "fleet row of {name}: {row}");
    }
    let regions =
        page.eval("[...document.querySelectorAll('section.region h2')].map(h => h.textContent)").await.unwrap();
    assert_eq!(regions, serde_json::json!(["eu-west", "us-central", "us-east"]));
    page.wait_for("document.querySelector('.card-value')?.textContent === '4 of 4'", WAIT).await.unwrap();
    let fleet_wide = shot(&mut page, &artefacts, "fleet-1280x800.png").await;

    // Where the gateway has an event stream, the console follows it (else it polls).
    let events_status = page
        .eval("fetch('/v1/events').then(r => { const s = r.status; if (r.body) r.body.cancel(); return s; })")
        .await
        .unwrap();
    let streaming = events_status == 200;
    if streaming {
        page.wait_for("document.getElementById('live').classList.contains('mode-live')", WAIT).await.unwrap();
    }

    // Jobs: the list is open before the job exists; the job appears without a reload.
    page.eval("location.hash = '#/jobs'; window.__sameDocument = true").await.unwrap();
    page.wait_for("document.getElementById('job-rows') !== null", WAIT).await.unwrap();
    let (job, created) = gateway.client().submit(&spec("llama-ft", "team-a", "h100")).await.unwrap();
    assert!(created);
    let id = job["id"].as_str().unwrap().to_string();
    let row = format!("document.querySelector('tr[data-job-id=' + CSS.escape({}) + ']')", js(&id));
    page.wait_for(&format!("{row} !== null"), WAIT).await.unwrap();
    assert_eq!(
        page.eval("window.__sameDocument === true").await.unwrap(),
        true,
        "the page reloaded instead of updating"
    );
    let text = page.eval(&format!("{row}.innerText")).await.unwrap();
    assert!(text.as_str().unwrap().contains("team-a"), "{text}");

    // Filters: another tenant's job is listed until the list is narrowed to team-a.
    let (other, _) = gateway.client().submit(&spec("resnet", "team-b", "a100-80g")).await.unwrap();
    let other_row =
        format!("document.querySelector('tr[data-job-id=' + CSS.escape({}) + ']')", js(other["id"].as_str().unwrap()));
    page.wait_for(&format!("{other_row} !== null"), WAIT).await.unwrap();
    page.eval(
        "document.querySelector('form.filters [name=tenant]').value = 'team-a'; \
         document.querySelector('form.filters').requestSubmit()",
    )
    .await
    .unwrap();
    page.wait_for(&format!("location.hash === '#/jobs?tenant=team-a' && {other_row} === null && {row} !== null"), WAIT)
        .await
        .unwrap();
    shot(&mut page, &artefacts, "jobs-1280x800.png").await;

    // The job page: the placement explained with every cluster, the chosen one among them.
    page.eval(&format!("{row}.querySelector('a').click()")).await.unwrap();
    page.wait_for("document.querySelectorAll('#explanation tr[data-candidate]').length === 4", WAIT).await.unwrap();
    page.wait_for("document.querySelector('#explanation .badge.chosen') !== null", WAIT).await.unwrap();
    let verdicts: Value = page
        .eval(
            "Object.fromEntries([...document.querySelectorAll('#explanation tr[data-candidate]')]\
             .map(r => [r.dataset.candidate, {verdict: r.querySelector('.badge.verdict').textContent, \
             reasons: r.querySelector('td.reasons').innerText}]))",
        )
        .await
        .unwrap();
    for (name, _) in &clusters {
        assert!(verdicts.get(name).is_some(), "no explanation row for {name}: {verdicts}");
    }
    // Only the H100 clusters can run an H100 job; the others say why not.
    for name in ["onprem-west", "edge-central"] {
        assert_eq!(verdicts[name]["verdict"], "rejected", "{verdicts}");
        assert!(verdicts[name]["reasons"].as_str().unwrap().len() > 3, "a rejection without reasons: {verdicts}");
    }
    assert!(["chosen", "feasible"].contains(&verdicts["onprem-east"]["verdict"].as_str().unwrap()), "{verdicts}");
    let timeline = page.eval("document.getElementById('timeline').innerText").await.unwrap();
    assert!(timeline.as_str().unwrap().contains("Submitted"), "{timeline}");
    let summary = page.eval("document.querySelector('#explanation .summary').textContent").await.unwrap();
    assert!(!summary.as_str().unwrap().is_empty(), "the explanation has no summary");
    page.wait_for("document.querySelector('h1 .badge')?.textContent === 'Running'", WAIT).await.unwrap();
    let job_wide = shot(&mut page, &artefacts, "job-1280x800.png").await;

    // A phone: the same pages fit 390 px (tables scroll inside their own box).
    page.set_viewport(390, 844, true).await.unwrap();
    fits_width(&mut page, 390).await;
    let job_phone = shot(&mut page, &artefacts, "job-390x844.png").await;
    page.eval("document.getElementById('explanation').scrollIntoView()").await.unwrap();
    shot(&mut page, &artefacts, "job-explanation-390x844.png").await;
    page.eval("window.scrollTo(0, 0)").await.unwrap();
    page.eval("location.hash = '#/fleet'").await.unwrap();
    page.wait_for("document.querySelectorAll('tr[data-cluster]').length === 4", WAIT).await.unwrap();
    fits_width(&mut page, 390).await;
    let fleet_phone = shot(&mut page, &artefacts, "fleet-390x844.png").await;
    page.eval("location.hash = '#/queues'").await.unwrap();
    page.wait_for("document.querySelector('tr[data-tenant=\"team-a\"]') !== null", WAIT).await.unwrap();
    let queue = page.eval("document.querySelector('tr[data-tenant=\"team-a\"]').innerText").await.unwrap();
    assert!(queue.as_str().unwrap().contains("2 GPUs"), "team-a's queue row: {queue}");
    fits_width(&mut page, 390).await;
    shot(&mut page, &artefacts, "queues-390x844.png").await;

    // Cancel from the job page (the anonymous admin of a gateway without auth may).
    page.set_viewport(1280, 800, false).await.unwrap();
    page.eval(&format!("location.hash = '#/jobs/' + encodeURIComponent({})", js(&id))).await.unwrap();
    page.wait_for("document.getElementById('cancel') !== null", WAIT).await.unwrap();
    page.eval("window.confirm = () => true; document.getElementById('cancel').click()").await.unwrap();
    page.wait_for("document.querySelector('h1 .badge')?.textContent === 'Cancelled'", WAIT).await.unwrap();
    gateway.wait_for_state(&id, "Cancelled", WAIT).await.unwrap();
    if streaming {
        // The change arrives as an event too, and joins the timeline as seen live.
        page.wait_for(
            "[...document.querySelectorAll('#timeline li.live-event')].some(li => li.innerText.includes('Cancelled'))",
            WAIT,
        )
        .await
        .unwrap();
        shot(&mut page, &artefacts, "job-cancelled-1280x800.png").await;
    }

    assert!(page.errors().is_empty(), "the page raised errors: {:?}\nchromedriver log:\n{}", page.errors(), page.log());
    for path in [fleet_wide, job_wide, job_phone, fleet_phone] {
        assert!(path.exists());
    }
}

/// A raw HTTP/1.1 GET, for the headers the REST client does not show.
async fn raw_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread")]
async fn with_authentication_the_console_asks_for_a_token_and_shows_only_the_callers_tenants() {
    if !browser_available() {
        return;
    }
    const ALICE: &str = "alice-console-token-vision";
    const ROOT: &str = "root-console-token-admin";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokens.yaml"),
        format!(
            "tokens:\n- {{subject: alice, role: member, tenants: [vision], token: {ALICE}}}\n\
             - {{subject: root, role: admin, token: {ROOT}}}\n"
        ),
    )
    .unwrap();
    let config = format!("{GATEWAY_CONFIG}auth:\n  tokensFile: {}\n", dir.path().join("tokens.yaml").display());
    let gateway = Gateway::start(dir.path(), &config).await.unwrap();
    let agent = agent_config("onprem-east", "us-east", "owned", "{h100: 2.0}", H100_NODES, SLOW);
    let _agent = Agent::start(dir.path(), "onprem-east", &agent, &gateway).unwrap();
    let root = gateway.client().with_token(Some(ROOT.into()));
    meridian_e2e::poll(WAIT, || async {
        let clusters = root.clusters().await.ok()?;
        (clusters["clusters"][0]["gpusTotal"].as_u64()? > 0).then_some(())
    })
    .await
    .unwrap();
    let (vision, _) = root.submit(&spec("vision-job", "vision", "h100")).await.unwrap();
    let (nlp, _) = root.submit(&spec("nlp-job", "nlp", "h100")).await.unwrap();

    // The page and its files need no token; the data does.
    let page_answer = raw_get(gateway.rest, "/").await;
    assert!(page_answer.starts_with("HTTP/1.1 200"), "{page_answer}");
    let head = page_answer.to_ascii_lowercase();
    assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{page_answer}");
    assert!(head.contains("x-content-type-options: nosniff"), "{page_answer}");
    assert!(raw_get(gateway.rest, "/console/app.js").await.starts_with("HTTP/1.1 200"));
    let session = raw_get(gateway.rest, "/console/session").await;
    assert!(session.starts_with("HTTP/1.1 401"), "{session}");

    let artefacts = browser::artefact_dir("console").unwrap();
    let mut page = Browser::launch(1280, 800).await.unwrap();
    page.navigate(&format!("http://{}/#/jobs", gateway.rest)).await.unwrap();
    page.wait_for("!document.getElementById('signin').hidden && document.getElementById('view').hidden", WAIT)
        .await
        .unwrap();
    let jobs_shown = page.eval("document.querySelectorAll('tr[data-job-id]').length").await.unwrap();
    assert_eq!(jobs_shown, 0, "jobs shown before signing in");
    shot(&mut page, &artefacts, "signin-1280x800.png").await;

    // A wrong token is refused, and says so.
    let sign_in = |token: &str| {
        format!(
            "document.getElementById('token').value = {}; document.getElementById('signin-form').requestSubmit()",
            js(token)
        )
    };
    page.eval(&sign_in("not-a-token")).await.unwrap();
    page.wait_for("document.getElementById('signin-error').textContent.includes('refused')", WAIT).await.unwrap();

    // Alice, a member of vision, sees vision's job and not nlp's.
    page.eval(&sign_in(ALICE)).await.unwrap();
    page.wait_for("document.getElementById('who').textContent.includes('alice')", WAIT).await.unwrap();
    let vision_row = format!("document.querySelector('tr[data-job-id=\"{}\"]')", vision["id"].as_str().unwrap());
    page.wait_for(&format!("{vision_row} !== null"), WAIT).await.unwrap();
    let nlp_row = format!("document.querySelector('tr[data-job-id=\"{}\"]')", nlp["id"].as_str().unwrap());
    assert_eq!(page.eval(&format!("{nlp_row} === null")).await.unwrap(), true, "alice sees tenant nlp's job");
    let who = page.eval("document.getElementById('who').textContent").await.unwrap();
    assert!(who.as_str().unwrap().contains("member") && who.as_str().unwrap().contains("vision"), "{who}");
    shot(&mut page, &artefacts, "jobs-alice-1280x800.png").await;

    // Signing out forgets the token.
    page.eval("document.getElementById('signout').click()").await.unwrap();
    page.wait_for("!document.getElementById('signin').hidden", WAIT).await.unwrap();
    assert_eq!(page.eval("sessionStorage.getItem('meridian.token')").await.unwrap(), Value::Null);
    assert!(page.errors().is_empty(), "the page raised errors: {:?}", page.errors());
}

/// Writes a DCGM-style textfile (percent per GPU) whole, by rename, as an exporter does.
fn write_utilization(path: &std::path::Path, percent: u32) {
    let text = format!("DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\"}} {percent}\nDCGM_FI_DEV_GPU_UTIL{{gpu=\"1\"}} {percent}\n");
    let staging = path.with_extension("tmp");
    std::fs::write(&staging, text).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_holding_idle_gpus_is_flagged_in_the_list_and_on_its_page() {
    if !browser_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{GATEWAY_CONFIG}idleGpu: {{threshold: 0.05, after: 1s}}\n");
    let gateway = Gateway::start(dir.path(), &config).await.unwrap();
    let file = dir.path().join("gpu.prom");
    write_utilization(&file, 2);
    let agent = format!(
        "cluster: gpu-host\nregion: us-east\nbackend: builtin\nrunner: process\n\
         process: {{gpuDiscovery: none, killGrace: 1s}}\nreportInterval: 200ms\n\
         nodes:\n  - {{shape: l4-host, count: 1, gpuType: l4, gpus: 2, cpu: 8, memoryGiB: 32}}\n\
         utilization: {{file: {}, interval: 100ms, window: 300ms}}\n",
        file.display()
    );
    let _agent = Agent::start(dir.path(), "gpu-host", &agent, &gateway).unwrap();
    gateway.wait_for_clusters(1).await.unwrap();
    let spec = "name: notebook\ntenant: team-a\ngang: {replicas: 1, resources: {gpus: 1}}\nruntime: {estimate: 1h}\n\
                payload: {command: [sleep, '600']}\n";
    let (job, _) = gateway.client().submit(spec).await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let client = gateway.client();
    meridian_e2e::poll(WAIT, || async { (client.get(&id).await.ok()?["usage"]["idle"] == true).then_some(()) })
        .await
        .unwrap();

    let artefacts = browser::artefact_dir("console").unwrap();
    let mut page = Browser::launch(1280, 800).await.unwrap();
    page.navigate(&format!("http://{}/#/jobs", gateway.rest)).await.unwrap();
    let row = format!("document.querySelector('tr[data-job-id=' + CSS.escape({}) + ']')", js(&id));
    let flag = page.wait_for(&format!("{row}?.querySelector('.badge.idle')?.textContent"), WAIT).await.unwrap();
    assert!(flag.as_str().unwrap().contains("2%"), "the list's idle flag: {flag}");
    page.eval(&format!("{row}.querySelector('a').click()")).await.unwrap();
    let warning = page.wait_for("document.getElementById('idle')?.textContent", WAIT).await.unwrap();
    let warning = warning.as_str().unwrap();
    assert!(warning.contains("Idle GPUs") && warning.contains("2%") && warning.contains("idle since"), "{warning}");
    shot(&mut page, &artefacts, "job-idle-1280x800.png").await;
    assert!(page.errors().is_empty(), "the page raised errors: {:?}", page.errors());
}
