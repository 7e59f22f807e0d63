// Meridian console: fleet, queues, jobs and a job page over the gateway's REST API, kept live by
// the event stream (GET /v1/events, server-sent events read with fetch so the bearer token goes
// in the Authorization header). Without the stream (404) it polls. No framework, no build step;
// every value from the API reaches the page through textContent, never as HTML.
"use strict";

(function () {
  const TOKEN_KEY = "meridian.token";
  const POLL_MS = 3000;
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const STATES = ["Queued", "Offered", "Bound", "Running", "Succeeded", "Failed", "Cancelled", "Unknown"];

  const state = {
    session: null, // {subject, role, tenants, authentication}
    clusters: new Map(), // name -> {cluster, receivedAt}
    tenants: [],
    jobs: new Map(), // id -> job, for the list shown
    jobsContinue: null,
    job: null, // the job page's job
    explain: null,
    live: [], // events seen on the job page: {atMs, text}
    route: { view: "fleet", id: null, query: new URLSearchParams() },
    stream: null, // AbortController of the event stream
    lastEventId: null,
    mode: "connecting", // "live", "polling", "offline"
    pollTimer: null,
    refreshTimers: new Map(),
    generation: 0, // bumps on every navigation, so late answers of an old view are dropped
    drawnGeneration: -1, // the navigation the jobs form was drawn for
  };

  // ---------- small helpers ----------

  /** Builds an element: h("a", {href: "#"}, "text", child, ...). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.className = value;
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  const $ = (id) => document.getElementById(id);

  /** Replaces the view's content (nested arrays flattened, nulls skipped). */
  function setView(...children) {
    $("view").replaceChildren(...children.flat(3).filter((c) => c !== null && c !== undefined && c !== false));
  }

  function fmtTime(ms) {
    if (ms === null || ms === undefined) return "—";
    const d = new Date(ms);
    const two = (n) => String(n).padStart(2, "0");
    return d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + " " +
      two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  function fmtDuration(secs) {
    if (secs === null || secs === undefined || !isFinite(secs)) return "—";
    secs = Math.max(0, Math.round(secs));
    if (secs < 60) return secs + " s";
    if (secs < 3600) return Math.floor(secs / 60) + " min " + (secs % 60) + " s";
    const hours = Math.floor(secs / 3600);
    if (hours < 48) return hours + " h " + Math.floor((secs % 3600) / 60) + " min";
    return Math.floor(hours / 24) + " d " + (hours % 24) + " h";
  }

  function ago(ms) {
    if (ms === null || ms === undefined) return "";
    return fmtDuration((Date.now() - ms) / 1000) + " ago";
  }

  function pct(x) {
    return x === null || x === undefined ? "—" : (100 * x).toFixed(x > 0 && x < 0.01 ? 1 : 0) + "%";
  }

  function plural(n, word) {
    return n + " " + word + (n === 1 ? "" : "s");
  }

  function usd(x) {
    return x === null || x === undefined ? "—" : "$" + Number(x).toFixed(2);
  }

  function stateBadge(s) {
    const name = String(s || "Unknown");
    return h("span", { class: "badge state-" + name.toLowerCase() }, name);
  }

  function jobGpus(job) {
    const gang = (job.spec && job.spec.gang) || {};
    const replicas = gang.replicas || 1;
    const gpus = (gang.resources && gang.resources.gpus) || 0;
    return { replicas, gpus, total: replicas * gpus };
  }

  function gpuText(job) {
    const g = jobGpus(job);
    const wanted = (job.spec && job.spec.gang && job.spec.gang.resources && job.spec.gang.resources.gpuTypes) || [];
    const type = job.gpuType || wanted.join("/");
    return (g.replicas > 1 ? g.replicas + "×" + g.gpus : String(g.gpus)) + (type ? " " + type : "");
  }

  function isIdle(job) {
    return !!(job && job.usage && job.usage.idle === true);
  }

  function idleFlag(job) {
    if (!isIdle(job)) return null;
    const u = job.usage;
    const util = typeof u.gpuUtilization === "number" ? " at " + pct(u.gpuUtilization > 1 ? u.gpuUtilization / 100 : u.gpuUtilization) : "";
    return h("span", { class: "badge idle", title: "GPUs held but under the idle threshold" + (u.idleSinceMs ? " since " + fmtTime(u.idleSinceMs) : "") },
      "idle GPUs" + util);
  }

  /** Names each cell of `tr` after its column, for the stacked layout of narrow screens. */
  function labelled(tr, labels) {
    [...tr.children].forEach((cell, i) => {
      if (labels[i] && i > 0) cell.dataset.label = labels[i];
      // Cells with nothing to say are left out of the stacked layout.
      if (cell.textContent === "—") cell.classList.add("empty");
    });
    return tr;
  }

  function head(labels) {
    return h("thead", {}, h("tr", {}, labels.map((t) => h("th", { scope: "col" }, t))));
  }

  const FLEET_COLUMNS = ["Cluster", "Tier", "Connection", "GPUs used / free", "Types and price", "Pressure", "Federated jobs"];
  const QUEUE_COLUMNS = ["Tenant", "Running", "Queued", "Fair share", "GPU share", "Quota", "Finished"];
  const JOB_COLUMNS = ["Job", "Tenant", "State", "GPUs", "Cluster", "Submitted"];
  const EXPLAIN_COLUMNS = ["Cluster", "Verdict", "Expected start", "Cost", "GPU", "Score", "Reasons"];

  function scroll(table, label) {
    return h("div", { class: "scroll", role: "region", "aria-label": label, tabindex: "0" }, table);
  }

  function banner(text, kind) {
    const el = $("banner");
    if (!text) {
      el.hidden = true;
      el.textContent = "";
      return;
    }
    el.hidden = false;
    el.className = "banner " + (kind || "error");
    el.textContent = text;
  }

  function setMode(mode) {
    state.mode = mode;
    const el = $("live");
    el.textContent = { live: "live", polling: "polling every " + POLL_MS / 1000 + " s", offline: "reconnecting", connecting: "connecting" }[mode] || mode;
    el.className = "live mode-" + mode;
    el.title = mode === "live" ? "following the gateway's event stream" : mode === "polling" ? "the gateway has no event stream; the page reloads its data" : "";
  }

  // ---------- API ----------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function authHeaders() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { Authorization: "Bearer " + token } : {};
  }

  async function api(path, options) {
    const opts = Object.assign({ headers: {} }, options || {});
    opts.headers = Object.assign({ Accept: "application/json" }, authHeaders(), opts.headers);
    let response;
    try {
      response = await fetch(path, opts);
    } catch (e) {
      throw new ApiError(0, "network", "the gateway could not be reached (" + e.message + ")");
    }
    let body = null;
    const text = await response.text();
    try {
      body = text ? JSON.parse(text) : null;
    } catch (e) {
      body = null;
    }
    if (!response.ok) {
      const err = body && body.error ? body.error : {};
      const error = new ApiError(response.status, err.code || "http_" + response.status, err.message || response.statusText || "request failed");
      if (response.status === 401) showSignin(error.message);
      throw error;
    }
    return body;
  }

  /** Shows an API failure: 401 is the sign-in prompt (already shown), 403 says what is missing. */
  function report(error) {
    if (!(error instanceof ApiError)) {
      banner(String(error));
      return;
    }
    if (error.status === 401) return;
    if (error.status === 403) banner("Not allowed: " + error.message);
    else banner(error.message + (error.status ? " (HTTP " + error.status + ")" : ""));
  }

  // ---------- session and sign-in ----------

  function showSignin(message) {
    stopStream();
    state.session = null;
    $("signin").hidden = false;
    $("view").hidden = true;
    $("signout").hidden = true;
    $("who").textContent = "";
    const had = sessionStorage.getItem(TOKEN_KEY);
    $("signin-error").textContent = had ? "That token was refused: " + message : "";
    sessionStorage.removeItem(TOKEN_KEY);
    setMode("connecting");
    $("live").textContent = "signed out";
    $("token").focus();
  }

  async function start() {
    banner(null);
    let session;
    try {
      session = await api("/console/session");
    } catch (e) {
      report(e);
      return;
    }
    state.session = session;
    $("signin").hidden = true;
    $("view").hidden = false;
    const tenants = session.role === "admin" ? "all tenants" : (session.tenants || []).join(", ") || "no tenant";
    $("who").textContent = session.authentication ? session.subject + " · " + session.role + " · " + tenants : "authentication off (anonymous admin)";
    $("signout").hidden = !session.authentication;
    showRole();
    startStream();
    render();
  }

  // With several gateways on etcd, this one may be a standby: it shows what it follows from the
  // store, and changes (cancel) go to the leader, whose address it names.
  async function showRole() {
    try {
      const response = await fetch("/readyz", { cache: "no-store" });
      const ready = await response.json();
      if (ready.role !== "standby") return;
      const leader = ready.leader ? "the leader is " + ready.leader.name + " at " + ready.leader.rest : "no leader is elected right now";
      banner("This gateway is a standby: it shows the federation as stored and takes no changes; " + leader + ".", "info");
    } catch (e) {
      // An older gateway without /readyz, or none reachable: nothing to say.
    }
  }

  function mayCancel(job) {
    const s = state.session;
    if (!s || !job) return false;
    if (s.role === "admin") return true;
    return (s.role === "member") && (s.tenants || []).includes(job.spec.tenant);
  }

  // ---------- routing ----------

  function parseRoute() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [path, query] = hash.split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    const q = new URLSearchParams(query || "");
    if (parts[0] === "jobs" && parts[1]) return { view: "job", id: parts[1], query: q };
    if (parts[0] === "jobs") return { view: "jobs", id: null, query: q };
    if (parts[0] === "queues") return { view: "queues", id: null, query: q };
    return { view: "fleet", id: null, query: q };
  }

  function render() {
    if (!state.session) return;
    state.route = parseRoute();
    state.generation += 1;
    banner(null);
    for (const a of document.querySelectorAll("nav a")) {
      const current = a.dataset.nav === state.route.view || (a.dataset.nav === "jobs" && state.route.view === "job");
      if (current) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const view = $("view");
    view.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    load();
  }

  /** Loads the current view's snapshot and draws it. */
  async function load() {
    const generation = state.generation;
    const route = state.route;
    try {
      if (route.view === "fleet") {
        const body = await api("/v1/clusters");
        if (generation !== state.generation) return;
        state.clusters = new Map(body.clusters.map((c) => [c.name, { cluster: c, receivedAt: Date.now() }]));
        drawFleet();
      } else if (route.view === "queues") {
        const body = await api("/v1/tenants");
        if (generation !== state.generation) return;
        state.tenants = body.tenants;
        drawQueues();
      } else if (route.view === "jobs") {
        const body = await api("/v1/jobs?" + listParams(route.query).toString());
        if (generation !== state.generation) return;
        state.jobs = new Map(body.jobs.map((j) => [j.id, j]));
        state.jobsContinue = body.continue || null;
        drawJobs();
      } else if (route.view === "job") {
        const id = route.id;
        const [job, explain] = await Promise.all([
          api("/v1/jobs/" + encodeURIComponent(id)),
          api("/v1/jobs/" + encodeURIComponent(id) + "/explain").catch((e) => (e.status === 404 ? null : Promise.reject(e))),
        ]);
        if (generation !== state.generation) return;
        if (!state.job || state.job.id !== id) state.live = [];
        state.job = job;
        state.explain = explain;
        drawJob();
        loadLogs();
      }
    } catch (e) {
      if (generation !== state.generation) return;
      if (e.status !== 401) setView(h("p", { class: "error" }, "Could not load this view."));
      report(e);
    }
  }

  /** Reloads part of the view at most once per `ms`, for bursts of events. */
  function refreshSoon(key, ms, fn) {
    if (state.refreshTimers.has(key)) return;
    state.refreshTimers.set(key, setTimeout(() => {
      state.refreshTimers.delete(key);
      fn();
    }, ms));
  }

  function listParams(query) {
    const params = new URLSearchParams();
    for (const key of ["tenant", "state", "selector"]) {
      const value = (query.get(key) || "").trim();
      if (value) params.set(key, value);
    }
    params.set("limit", "500");
    return params;
  }

  // ---------- fleet ----------

  function drawFleet() {
    const clusters = [...state.clusters.values()].map((e) => e.cluster);
    const total = clusters.reduce((n, c) => n + (c.gpusTotal || 0), 0);
    const free = clusters.reduce((n, c) => n + (c.gpusFree || 0), 0);
    const connected = clusters.filter((c) => c.connected).length;
    const pending = clusters.reduce((n, c) => n + (c.pendingGpus || 0), 0);
    const byType = new Map();
    for (const c of clusters) {
      for (const t of c.gpuTypes || []) byType.set(t, (byType.get(t) || []).concat([c.name]));
    }
    const cards = h("ul", { class: "cards", "aria-label": "Fleet totals" },
      card("Clusters connected", connected + " of " + clusters.length),
      card("GPUs used", (total - free) + " of " + total),
      card("GPUs free", String(free)),
      card("GPUs pending in member queues", String(pending)));
    const regions = new Map();
    for (const c of clusters) {
      if (!regions.has(c.region)) regions.set(c.region, []);
      regions.get(c.region).push(c);
    }
    const sections = [...regions.keys()].sort().map((region) => {
      const list = regions.get(region).sort((a, b) => (a.tier === b.tier ? a.name.localeCompare(b.name) : a.tier === "owned" ? -1 : 1));
      return h("section", { class: "region", "aria-labelledby": "region-" + region },
        h("h2", { id: "region-" + region }, region),
        scroll(h("table", { class: "grid reflow fleet" },
          head(FLEET_COLUMNS),
          h("tbody", {}, list.map(clusterRow))), "Clusters in " + region));
    });
    const types = h("section", { "aria-labelledby": "types-title" },
      h("h2", { id: "types-title" }, "GPU types"),
      h("ul", { class: "types" }, [...byType.keys()].sort().map((t) => h("li", {}, h("strong", {}, t), " — ", byType.get(t).join(", ")))));
    setView(
      h("h1", {}, "Fleet"),
      cards,
      clusters.length ? sections : h("p", { class: "muted" }, "No member cluster has connected yet."),
      byType.size ? types : null);
  }

  function card(label, value) {
    return h("li", { class: "card" }, h("span", { class: "card-label" }, label), h("span", { class: "card-value" }, value));
  }

  function clusterRow(c) {
    const used = (c.gpusTotal || 0) - (c.gpusFree || 0);
    const share = c.gpusTotal ? used / c.gpusTotal : 0;
    const entry = state.clusters.get(c.name);
    const prices = Object.entries(c.prices || {});
    const types = (c.gpuTypes || []).map((t) => {
      const price = (c.prices || {})[t];
      return h("li", {}, t + (price !== undefined ? " · " + usd(price) + "/GPU-h" : ""));
    });
    for (const [t, p] of prices) if (!(c.gpuTypes || []).includes(t)) types.push(h("li", { class: "muted" }, t + " · " + usd(p) + "/GPU-h"));
    return labelled(h("tr", { "data-cluster": c.name, class: c.connected ? "" : "down" },
      h("th", { scope: "row" }, c.name, h("div", { class: "muted small" }, c.backend || "")),
      h("td", {}, h("span", { class: "badge tier-" + c.tier }, c.tier)),
      h("td", {},
        h("span", { class: "badge " + (c.connected ? "ok" : "bad") }, c.connected ? "connected" : "disconnected"),
        h("div", { class: "muted small", "data-age": c.name }, reportAge(entry))),
      h("td", {},
        h("div", {}, used + " used · " + (c.gpusFree || 0) + " free", h("span", { class: "muted" }, " of " + (c.gpusTotal || 0))),
        h("meter", { min: 0, max: 1, value: share.toFixed(3), high: 0.9, "aria-label": "share of GPUs used" })),
      h("td", {}, h("ul", { class: "plain" }, types)),
      h("td", {},
        h("div", {}, plural(c.pendingJobs || 0, "job") + " · " + plural(c.pendingGpus || 0, "GPU") + " pending"),
        h("div", { class: "muted small" }, "est. wait " + fmtDuration(c.estimatedWaitSecs))),
      h("td", { class: "num" }, String(c.federatedJobs || 0))), FLEET_COLUMNS);
  }

  function reportAge(entry) {
    if (!entry || entry.cluster.lastSeenSecsAgo === null || entry.cluster.lastSeenSecsAgo === undefined) return "no report yet";
    const secs = entry.cluster.lastSeenSecsAgo + (Date.now() - entry.receivedAt) / 1000;
    return "report " + fmtDuration(secs) + " ago";
  }

  // ---------- queues ----------

  function drawQueues() {
    const rows = state.tenants.map((t) => {
      const quota = t.maxGpus !== undefined ? t.maxGpus : null;
      return labelled(h("tr", { "data-tenant": t.tenant },
        h("th", { scope: "row" }, h("a", { href: "#/jobs?tenant=" + encodeURIComponent(t.tenant) }, t.tenant)),
        h("td", { class: "num" }, plural(t.runningJobs, "job") + " · " + plural(t.runningGpus, "GPU")),
        h("td", { class: "num" }, plural(t.queuedJobs, "job") + " · " + plural(t.queuedGpus, "GPU")),
        h("td", { class: "num" }, pct(t.fairShare), h("div", { class: "muted small" }, "weight " + t.weight)),
        h("td", { class: "num" }, pct(t.gpuShare),
          h("meter", { min: 0, max: 1, value: Number(t.gpuShare || 0).toFixed(3), "aria-label": "share of held GPUs" })),
        h("td", { class: "num" }, quota === null ? "no limit" : t.runningGpus + " of " + quota + " GPUs",
          quota ? h("meter", { min: 0, max: quota, value: t.runningGpus, high: quota * 0.9, "aria-label": "GPUs held against quota" }) : null,
          t.maxQueuedJobs !== undefined ? h("div", { class: "muted small" }, "at most " + t.maxQueuedJobs + " queued jobs considered") : null),
        h("td", { class: "num" }, t.succeededJobs + " ok · " + t.failedJobs + " failed")), QUEUE_COLUMNS);
    });
    setView(
      h("h1", {}, "Queues"),
      h("p", { class: "muted" }, "Each tenant's running and queued GPUs against its fair share (its weight over the weights of tenants with active jobs) and its quota."),
      state.tenants.length
        ? scroll(h("table", { class: "grid reflow" },
          head(QUEUE_COLUMNS),
          h("tbody", {}, rows)), "Tenant queues")
        : h("p", { class: "muted" }, "No tenant has jobs yet."));
  }

  // ---------- jobs ----------

  function drawJobs() {
    const q = state.route.query;
    const tenantOptions = new Set((state.session.tenants || []));
    for (const j of state.jobs.values()) tenantOptions.add(j.spec.tenant);
    const form = h("form", { class: "filters", role: "search", "aria-label": "Filter jobs", onsubmit: (ev) => {
      ev.preventDefault();
      const data = new FormData(ev.target);
      const params = new URLSearchParams();
      for (const [k, v] of data.entries()) if (String(v).trim()) params.set(k, String(v).trim());
      location.hash = "#/jobs" + (params.toString() ? "?" + params.toString() : "");
    } },
      h("label", {}, "Tenant", h("input", { name: "tenant", list: "tenant-names", value: q.get("tenant") || "", placeholder: "any" })),
      h("datalist", { id: "tenant-names" }, [...tenantOptions].sort().map((t) => h("option", { value: t }))),
      h("label", {}, "State", h("select", { name: "state" },
        h("option", { value: "" }, "any"),
        STATES.map((s) => h("option", { value: s, selected: (q.get("state") || "").toLowerCase() === s.toLowerCase() }, s)))),
      h("label", { class: "wide" }, "Labels", h("input", { name: "selector", value: q.get("selector") || "", placeholder: "team=vision,stage!=dev" })),
      h("button", { type: "submit" }, "Filter"),
      listParams(q).toString() !== "limit=500" ? h("a", { href: "#/jobs", class: "clear" }, "Clear filters") : null);
    const jobs = [...state.jobs.values()].sort((a, b) => b.submittedAtMs - a.submittedAtMs);
    const rows = $("job-rows");
    if (rows && state.drawnGeneration === state.generation) {
      // A reload of the same view (polling, a selector refresh): keep the form as typed.
      rows.replaceChildren(...jobs.map(jobRow));
      const none = $("no-jobs");
      if (none) none.hidden = jobs.length > 0;
      return;
    }
    state.drawnGeneration = state.generation;
    const table = h("table", { class: "grid reflow jobs" },
      head(JOB_COLUMNS),
      h("tbody", { id: "job-rows" }, jobs.map(jobRow)));
    setView(
      h("h1", {}, "Jobs"),
      form,
      scroll(table, "Jobs"),
      h("p", { class: "muted", id: "no-jobs", hidden: jobs.length > 0 }, "No job matches."),
      state.jobsContinue ? h("p", { class: "muted" }, "Showing the first 500; narrow the filters to see others.") : null);
  }

  function jobRow(job) {
    return labelled(h("tr", { "data-job-id": job.id },
      h("th", { scope: "row" }, h("a", { href: "#/jobs/" + encodeURIComponent(job.id) }, job.spec.name || job.id), h("div", { class: "muted small mono" }, job.id)),
      h("td", {}, job.spec.tenant),
      h("td", {}, stateBadge(job.state), " ", idleFlag(job)),
      h("td", {}, gpuText(job)),
      h("td", {}, job.cluster || "—"),
      h("td", {}, h("time", { datetime: new Date(job.submittedAtMs).toISOString(), title: fmtTime(job.submittedAtMs), "data-ago": job.submittedAtMs }, ago(job.submittedAtMs)))), JOB_COLUMNS);
  }

  function matchesFilters(job) {
    const q = state.route.query;
    const tenant = (q.get("tenant") || "").trim();
    const st = (q.get("state") || "").trim().toLowerCase();
    if (tenant && job.spec.tenant !== tenant) return false;
    if (st && String(job.state).toLowerCase() !== st) return false;
    return true;
  }

  function updateJobRow(job) {
    const tbody = $("job-rows");
    if (!tbody) return;
    const existing = tbody.querySelector('tr[data-job-id="' + CSS.escape(job.id) + '"]');
    const hasSelector = (state.route.query.get("selector") || "").trim() !== "";
    if (hasSelector) {
      // Label selectors are evaluated by the gateway: ask it again.
      refreshSoon("jobs", 1000, load);
      return;
    }
    if (!matchesFilters(job)) {
      if (existing) existing.remove();
      state.jobs.delete(job.id);
      return;
    }
    state.jobs.set(job.id, job);
    const row = jobRow(job);
    if (existing) existing.replaceWith(row);
    else {
      tbody.prepend(row);
      const none = $("no-jobs");
      if (none) none.hidden = true;
    }
  }

  // ---------- job page ----------

  function drawJob() {
    const job = state.job;
    const explain = state.explain;
    const terminal = TERMINAL.has(String(job.state).toLowerCase());
    const cancel = mayCancel(job) && !terminal
      ? h("button", { type: "button", class: "danger", id: "cancel", onclick: () => cancelJob(job) }, "Cancel job")
      : null;
    const idle = isIdle(job)
      ? h("p", { class: "banner warn", id: "idle" },
        "Idle GPUs: this job holds " + plural(jobGpus(job).total, "GPU") +
        (typeof job.usage.gpuUtilization === "number" ? " at " + pct(job.usage.gpuUtilization > 1 ? job.usage.gpuUtilization / 100 : job.usage.gpuUtilization) + " utilisation" : "") +
        (job.usage.idleSinceMs ? ", idle since " + fmtTime(job.usage.idleSinceMs) : "") + ".")
      : null;
    const facts = h("dl", { class: "facts" },
      fact("ID", h("span", { class: "mono" }, job.id)),
      fact("Tenant", job.spec.tenant),
      fact("State", stateBadge(job.state)),
      fact("GPUs", gpuText(job)),
      fact("Priority", job.spec.priority !== undefined ? String(job.spec.priority) : "—"),
      fact("Cluster", job.cluster || "—"),
      job.nodes && job.nodes.length ? fact("Nodes", job.nodes.join(", ")) : null,
      job.usage && typeof job.usage.gpuUtilization === "number"
        ? fact("GPU utilisation", pct(job.usage.gpuUtilization > 1 ? job.usage.gpuUtilization / 100 : job.usage.gpuUtilization) + (job.usage.sampledAtMs ? " (" + ago(job.usage.sampledAtMs) + ")" : ""))
        : null,
      fact("Message", job.message || "—"));
    setView(
      h("p", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", job.spec.tenant),
      h("div", { class: "title-row" }, h("h1", {}, job.spec.name || job.id, " ", stateBadge(job.state)), cancel),
      idle,
      facts,
      h("section", { "aria-labelledby": "timeline-title" }, h("h2", { id: "timeline-title" }, "Timeline"), timeline(job)),
      h("section", { "aria-labelledby": "explain-title", id: "explanation" }, h("h2", { id: "explain-title" }, "Placement"), explanation(explain)),
      h("section", { "aria-labelledby": "logs-title" },
        h("div", { class: "title-row" }, h("h2", { id: "logs-title" }, "Logs (tail)"),
          h("button", { type: "button", class: "quiet", onclick: loadLogs }, "Refresh")),
        h("pre", { id: "logs", class: "logs", tabindex: "0", "aria-label": "Job output" }, "…")));
  }

  function fact(label, value) {
    return [h("dt", {}, label), h("dd", {}, value)];
  }

  function timeline(job) {
    const items = [];
    items.push({ at: job.submittedAtMs, text: "Submitted" });
    if (job.cluster) {
      const decided = state.explain && state.explain.decidedAtMs;
      items.push({ at: decided || null, text: "Placed on " + job.cluster + (job.fencingToken > 1 ? " (offer " + job.fencingToken + ")" : "") });
    }
    if (job.startedAtMs) items.push({ at: job.startedAtMs, text: "Started" + (job.nodes && job.nodes.length ? " on " + job.nodes.length + " node(s)" : "") });
    if (job.preemptions) items.push({ at: job.lastPreemptedAtMs || null, text: "Preempted " + job.preemptions + " time(s)" + (job.lastPreemptedAtMs ? ", last at this time" : "") });
    if (job.finishedAtMs) items.push({ at: job.finishedAtMs, text: "Finished: " + job.state });
    for (const e of state.live) items.push({ at: e.atMs, text: e.text, live: true });
    items.sort((a, b) => (a.at === null ? Infinity : a.at) - (b.at === null ? Infinity : b.at));
    return h("ol", { class: "timeline", id: "timeline" }, items.map((i) =>
      h("li", { class: i.live ? "live-event" : "" },
        h("time", { datetime: i.at ? new Date(i.at).toISOString() : "" }, i.at ? fmtTime(i.at) : "—"),
        h("span", {}, i.text, i.live ? h("span", { class: "muted small" }, " (seen live)") : null))));
  }

  // A compacted decision (a queued job in a large federation) counts the clusters it does not list.
  function omittedLine(omitted) {
    if (!omitted) return null;
    const parts = [];
    if (omitted.feasible) parts.push(omitted.feasible + " more feasible, each scored worse than those listed");
    const rejected = (omitted.rejected || []).map((r) => r.clusters + " " + r.reason);
    if (rejected.length) parts.push("more rejected like the examples above: " + rejected.join(", "));
    return parts.length ? h("p", { class: "muted small", "data-omitted": "" }, "Not listed: " + parts.join("; ")) : null;
  }

  function explanation(explain) {
    if (!explain) return h("p", { class: "muted" }, "No placement round has judged this job yet.");
    // The chosen cluster first, then the feasible ones, then the rejected, each by name.
    const rank = { chosen: 0, feasible: 1, rejected: 2 };
    const candidates = (explain.candidates || []).slice().sort((a, b) =>
      (rank[a.verdict] ?? 3) - (rank[b.verdict] ?? 3) || String(a.cluster).localeCompare(String(b.cluster)));
    const rows = candidates.map((c) => {
      const s = c.score;
      return labelled(h("tr", { "data-candidate": c.cluster, class: "verdict-" + c.verdict },
        h("th", { scope: "row" }, c.cluster, h("div", { class: "muted small" }, c.region + " · " + c.tier)),
        h("td", {}, h("span", { class: "badge verdict " + c.verdict }, c.verdict)),
        h("td", {}, s ? (s.fitsNow ? "now" : fmtDuration(s.expectedStartSecs)) : "—",
          s ? h("div", { class: "muted small" }, "wait " + fmtDuration(s.expectedWaitSecs) + (s.quoted ? " (member's quote)" : "") + " · transfer " + fmtDuration(s.transferSecs)) : null),
        h("td", { class: "num" }, s ? usd(s.computeUsd) : "—", s ? h("div", { class: "muted small" }, "egress " + usd(s.egressUsd)) : null),
        h("td", {}, s ? (s.gpuType || "—") + (s.fragmentation ? " · frag " + Number(s.fragmentation).toFixed(2) : "") : "—"),
        h("td", { class: "num" }, s ? Number(s.total).toLocaleString() : "—"),
        h("td", { class: "reasons" }, c.reasons && c.reasons.length ? h("ul", { class: "plain" }, c.reasons.map((r) => h("li", {}, r))) : "—")), EXPLAIN_COLUMNS);
    });
    return [
      h("p", { class: "summary" }, explain.summary || ""),
      explain.decidedAtMs ? h("p", { class: "muted small" }, "Decided " + fmtTime(explain.decidedAtMs)) : null,
      candidates.length
        ? scroll(h("table", { class: "grid reflow explain" },
          head(EXPLAIN_COLUMNS),
          h("tbody", {}, rows)), "Placement per cluster")
        : h("p", { class: "muted" }, "No cluster was considered in the last round."),
      omittedLine(explain.omittedCandidates),
    ];
  }

  async function loadLogs() {
    const job = state.job;
    const el = $("logs");
    if (!job || !el) return;
    try {
      const chunk = await api("/v1/jobs/" + encodeURIComponent(job.id) + "/logs?maxBytes=16384");
      if (!state.job || state.job.id !== job.id) return;
      el.textContent = chunk.data || "(no output yet)";
      el.scrollTop = el.scrollHeight;
    } catch (e) {
      if (e.status === 401) return;
      el.textContent = "No logs: " + e.message;
    }
  }

  async function cancelJob(job) {
    if (!confirm("Cancel job " + (job.spec.name || job.id) + "?")) return;
    try {
      state.job = await api("/v1/jobs/" + encodeURIComponent(job.id), { method: "DELETE" });
      drawJob();
      loadLogs();
    } catch (e) {
      report(e);
    }
  }

  // ---------- live updates ----------

  function stopStream() {
    if (state.stream) state.stream.abort();
    state.stream = null;
    if (state.pollTimer) clearInterval(state.pollTimer);
    state.pollTimer = null;
  }

  function startPolling() {
    setMode("polling");
    if (state.pollTimer) return;
    state.pollTimer = setInterval(() => {
      if (state.session && document.visibilityState !== "hidden") load();
    }, POLL_MS);
  }

  /** Follows /v1/events until stopped, reconnecting with Last-Event-ID. */
  async function startStream() {
    stopStream();
    const controller = new AbortController();
    state.stream = controller;
    let delay = 1000;
    while (state.stream === controller) {
      const headers = Object.assign({ Accept: "text/event-stream" }, authHeaders());
      if (state.lastEventId) headers["Last-Event-ID"] = state.lastEventId;
      try {
        const response = await fetch("/v1/events", { headers, signal: controller.signal, cache: "no-store" });
        if (response.status === 404 || response.status === 405 || response.status === 501) {
          startPolling();
          return;
        }
        if (response.status === 401) {
          showSignin("the event stream refused the token");
          return;
        }
        if (!response.ok || !response.body) throw new Error("HTTP " + response.status);
        await readEvents(response.body, controller, () => {
          delay = 1000;
          setMode("live");
        });
      } catch (e) {
        if (controller.signal.aborted) return;
      }
      if (state.stream !== controller) return;
      setMode("offline");
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 15000);
    }
  }

  /** Parses server-sent events from `body` (text/event-stream) and dispatches each. */
  async function readEvents(body, controller, onOpen) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let event = { type: "message", id: null, data: [] };
    onOpen();
    while (true) {
      const { value, done } = await reader.read();
      if (done || controller.signal.aborted) return;
      buffer += value;
      let newline;
      while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
        if (line === "") {
          if (event.data.length || event.type !== "message") dispatch(event);
          event = { type: "message", id: null, data: [] };
          continue;
        }
        if (line.startsWith(":")) continue; // keep-alive comment
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "event") event.type = val;
        else if (field === "data") event.data.push(val);
        else if (field === "id") event.id = val;
      }
    }
  }

  function dispatch(event) {
    let data = null;
    try {
      data = event.data.length ? JSON.parse(event.data.join("\n")) : null;
    } catch (e) {
      return;
    }
    if (event.id) state.lastEventId = event.id;
    if (event.type === "ready") {
      // The stream starts here: a snapshot loaded now misses nothing.
      if (data && data.cursor) state.lastEventId = data.cursor;
      setMode("live");
      load();
    } else if (event.type === "reset") {
      state.lastEventId = null;
      load();
    } else if (event.type === "job" && data && data.job) {
      onJob(data);
    } else if (event.type === "cluster" && data && data.cluster) {
      onCluster(data.cluster);
    }
  }

  function onJob(data) {
    const job = data.job;
    const view = state.route.view;
    if (view === "jobs") updateJobRow(job);
    else if (view === "queues") refreshSoon("tenants", 1000, load);
    else if (view === "job" && state.job && state.job.id === job.id) {
      const before = data.previousState;
      if (before === null || before === undefined) state.live.push({ atMs: data.atMs, text: "Submitted (event)" });
      else if (String(before).toLowerCase() !== String(job.state).toLowerCase()) state.live.push({ atMs: data.atMs, text: before + " → " + job.state });
      state.job = job;
      // A placement or state change may come with a new decision: read it again, once per burst.
      refreshSoon("explain", 500, async () => {
        try {
          state.explain = await api("/v1/jobs/" + encodeURIComponent(job.id) + "/explain");
        } catch (e) {
          /* keep the last one */
        }
        if (state.route.view === "job" && state.job && state.job.id === job.id) {
          drawJob();
          loadLogs();
        }
      });
    }
  }

  function onCluster(cluster) {
    state.clusters.set(cluster.name, { cluster, receivedAt: Date.now() });
    if (state.route.view === "fleet") refreshSoon("fleet", 250, drawFleet);
  }

  // A job's GPU utilisation (and its idle flag) changes without a change to its record, so no
  // event says so: while the stream is live, the job page asks for the job again now and then.
  setInterval(async () => {
    if (state.mode !== "live" || state.route.view !== "job" || !state.job || document.visibilityState === "hidden") return;
    const id = state.job.id;
    try {
      const job = await api("/v1/jobs/" + encodeURIComponent(id));
      if (state.route.view === "job" && state.job && state.job.id === id && JSON.stringify(job) !== JSON.stringify(state.job)) {
        state.job = job;
        drawJob();
        loadLogs();
      }
    } catch (e) {
      /* the next event or reload tells */
    }
  }, 15000);

  // Report ages keep counting between updates.
  setInterval(() => {
    for (const el of document.querySelectorAll("[data-age]")) el.textContent = reportAge(state.clusters.get(el.dataset.age));
    for (const el of document.querySelectorAll("time[data-ago]")) el.textContent = ago(Number(el.dataset.ago));
  }, 1000);

  // ---------- wiring ----------

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const token = $("token").value.trim();
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      $("token").value = "";
      $("signin-error").textContent = "";
      start();
    });
    $("signout").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      showSignin("");
    });
    window.addEventListener("hashchange", render);
    start();
  });
})();
