// Leasehold dashboard: a read-only view over the control daemon's read plane (SPEC §11).
//
// Rules (seed 002): each account fact is shown on its own; `unverified` is neutral, never green;
// nothing absent is ever rendered as a fact — an unreachable daemon, a refused token or a missing
// route is said in words, and a table that could not be loaded says so instead of looking empty.
// Data is written with textContent only; no response value is ever parsed as HTML.
"use strict";

const TOKEN_KEY = "leasehold.readToken";
const RECENT_LIMIT = 50;
const REFRESH_MS = 5000;
const FEED_RETRY_MS = [500, 1000, 2000, 3000];

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  live: new Map(),        // attempt_id → { view, seenAt }
  recent: [],             // RouteView, newest first
  recentMeta: null,
  lastEventId: null,
  feedController: null,
  feedUp: false,
  failure: null,          // the current SourceError, or null while everything answers
  loadedOnce: false,
  lastOkAt: null,
  refreshTimer: null,
  refreshSoon: null,
};

const $ = (id) => document.getElementById(id);

class SourceError extends Error {
  constructor(kind, status, path, detail) {
    super(`${kind} ${status || ""} ${path || ""}`);
    this.kind = kind;        // unreachable | refused | absent | http
    this.status = status;
    this.path = path;
    this.detail = detail;
  }
}

// ---- talking to the control daemon ---------------------------------------------------------

function authHeaders() {
  return { Authorization: `Bearer ${state.token}` };
}

async function api(path) {
  let response;
  try {
    response = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  } catch (err) {
    throw new SourceError("unreachable", 0, path);
  }
  if (response.status === 401) throw new SourceError("refused", 401, path);
  if (response.status === 404) throw new SourceError("absent", 404, path);
  if (!response.ok) {
    let detail = "";
    try { detail = ((await response.json()).error || {}).message || ""; } catch (err) { /* not JSON */ }
    throw new SourceError("http", response.status, path, detail);
  }
  return response.json();
}

async function refreshAll() {
  if (!state.token) return;
  const sentAt = Date.now();
  const results = await Promise.allSettled([
    api("/control/v2/accounts"),
    api("/control/v2/routes/active"),
    api(`/control/v2/routes/recent?limit=${RECENT_LIMIT}`),
    api("/control/v2/accounts/admin"),
  ]);
  const failed = results.slice(0, 3).find((r) => r.status === "rejected");
  if (failed) {
    reportFailure(failed.reason);
    return;
  }
  reportOk();
  renderAccounts(results[0].value);
  mergeActive(results[1].value, sentAt);
  mergeRecent(results[2].value);
  renderAdmin(results[3]);
  renderRoutes();
}

// Coalesces bursts of events into one refetch of the views (counts, health, ring metadata).
function refreshSoon() {
  if (state.refreshSoon) return;
  state.refreshSoon = setTimeout(() => { state.refreshSoon = null; refreshAll(); }, 300);
}

// ---- the event feed (fetch streaming, so the token travels in a header) ---------------------

async function runFeed() {
  let attempt = 0;
  while (state.token) {
    const controller = new AbortController();
    state.feedController = controller;
    const headers = authHeaders();
    if (state.lastEventId) headers["Last-Event-ID"] = state.lastEventId;
    let response;
    try {
      response = await fetch("/control/v2/events", { headers, cache: "no-store", signal: controller.signal });
    } catch (err) {
      if (controller.signal.aborted) return;
      setFeed("down");
      reportFailure(new SourceError("unreachable", 0, "/control/v2/events"));
      await sleep(FEED_RETRY_MS[Math.min(attempt++, FEED_RETRY_MS.length - 1)]);
      continue;
    }
    if (response.status === 401) {
      setFeed("down");
      reportFailure(new SourceError("refused", 401, "/control/v2/events"));
      return;  // restarted when a new token is entered
    }
    if (!response.ok) {
      setFeed("down");
      reportFailure(new SourceError("http", response.status, "/control/v2/events"));
      await sleep(FEED_RETRY_MS[Math.min(attempt++, FEED_RETRY_MS.length - 1)]);
      continue;
    }
    attempt = 0;
    setFeed("live");
    refreshAll();  // after the feed is open: nothing can fall between the snapshot and the feed
    try {
      await readEvents(response.body, onEvent);
    } catch (err) {
      if (controller.signal.aborted) return;
    }
    if (controller.signal.aborted) return;
    setFeed("reconnecting");
    await sleep(FEED_RETRY_MS[0]);
  }
}

async function readEvents(body, handle) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer = (buffer + decoder.decode(value, { stream: true })).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const parsed = parseBlock(block);
      if (parsed) handle(parsed);
    }
  }
}

function parseBlock(block) {
  let id = null, kind = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) { noteHeartbeat(); continue; }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") id = value;
    else if (field === "event") kind = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  try {
    return { id, kind, data: JSON.parse(data.join("\n")) };
  } catch (err) {
    return null;
  }
}

function onEvent(event) {
  if (event.id) state.lastEventId = event.id;
  const data = event.data;
  switch (event.kind) {
    case "route.started":
      if (!state.recent.some((r) => r.attempt_id === data.attempt_id)) {
        state.live.set(data.attempt_id, { view: data, seenAt: Date.now() });
      }
      renderRoutes();
      refreshSoon();
      break;
    case "route.finished":
      state.live.delete(data.attempt_id);
      addRecent(data);
      renderRoutes();
      refreshSoon();
      break;
    case "circuit":
    case "policy":
    case "account.state":
      refreshSoon();
      break;
    case "gap":
      $("last-update").textContent = `feed gap (${data.reason}): views refetched`;
      refreshAll();
      break;
    default:
      break;
  }
}

// ---- state merges ----------------------------------------------------------------------------

function mergeActive(payload, sentAt) {
  const snapshot = new Map(payload.routes.map((r) => [r.attempt_id, r]));
  for (const [id, entry] of state.live) {
    if (!snapshot.has(id) && entry.seenAt < sentAt) state.live.delete(id);  // finished meanwhile
  }
  for (const [id, view] of snapshot) {
    if (!state.live.has(id) && !state.recent.some((r) => r.attempt_id === id)) {
      state.live.set(id, { view, seenAt: Date.now() });
    }
  }
}

function mergeRecent(payload) {
  state.recentMeta = payload;
  for (const view of payload.routes) addRecent(view, true);
}

function addRecent(view, fromSnapshot) {
  if (state.recent.some((r) => r.attempt_id === view.attempt_id)) return;
  state.recent.push(view);
  state.recent.sort((a, b) => String(b.finished_at || "").localeCompare(String(a.finished_at || "")));
  if (state.recent.length > RECENT_LIMIT) state.recent.length = RECENT_LIMIT;
  if (!fromSnapshot) view.justFinished = true;
}

// ---- rendering ---------------------------------------------------------------------------------

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function cell(row, text, sub, className) {
  const td = el("td", text, className);
  if (sub) td.appendChild(el("small", sub));
  row.appendChild(td);
  return td;
}

function badge(text, tone) {
  return el("span", text, `badge tone-${tone}`);
}

function placeholder(tbody, columns, text) {
  const tr = el("tr", null, "placeholder");
  const td = el("td", text);
  td.colSpan = columns;
  tr.appendChild(td);
  tbody.replaceChildren(tr);
}

function time(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleTimeString();
}

const HEALTH_TONE = { healthy: "ok", degraded: "bad", unverified: "neutral" };
const ADMIN_TONE = { enabled: "neutral", draining: "warn", disabled: "bad" };
const CIRCUIT_TONE = { closed: "neutral", "half-open": "warn", open: "bad" };
const STATUS_TONE = { completed: "ok", "client-aborted": "neutral", refused: "warn",
                      "upstream-error": "bad", "transport-error": "bad" };

function renderAccounts(view) {
  const tbody = $("accounts").tBodies[0];
  $("evidence-window").textContent =
    `Health and observations over the last ${view.window_seconds} s, as of ${time(view.as_of)}; ` +
    `evidence since ${time(view.evidence_since)} (when this control daemon started observing).`;
  const truncated = $("evidence-truncated");
  truncated.hidden = !view.evidence_truncated;
  truncated.textContent = view.evidence_truncated
    ? "evidence_truncated: older evidence inside this window was evicted — health was computed from a subsample."
    : "";
  if (!view.accounts.length) {
    placeholder(tbody, 9, "the control daemon reported no account at all (it always has three legacy accounts: check its registry)");
    return;
  }
  tbody.replaceChildren(...view.accounts.map(accountRow));
}

function accountRow(a) {
  const tr = el("tr");
  tr.dataset.accountId = a.id;
  cell(tr, a.id, a.display_name);
  cell(tr, a.provider_binding, `${a.upstream_origin} · ${a.auth_style}`);
  const configured = cell(tr, "");
  configured.dataset.field = "configured";
  configured.appendChild(a.configured ? badge("yes", "neutral") : badge("no", "warn"));
  if (!a.configured) configured.appendChild(el("small", `set ${a.credential_env}`));
  const admin = cell(tr, "");
  admin.dataset.field = "administrative_state";
  admin.appendChild(badge(a.administrative_state, ADMIN_TONE[a.administrative_state] || "bad"));
  cell(tr, a.leased ? `${a.lease_count} lease${a.lease_count === 1 ? "" : "s"}` : "none").dataset.field = "leased";
  cell(tr, a.in_flight ? `${a.in_flight_count} streaming` : "none").dataset.field = "in_flight";
  cell(tr, a.observed ? `${a.observed_request_count} (${a.observed_aborted_count} aborted)` : "none",
       a.last_observed_at ? `last ${time(a.last_observed_at)}` : "never since evidence began").dataset.field = "observed";
  const circuit = cell(tr, "");
  circuit.dataset.field = "circuit";
  circuit.appendChild(badge(a.circuit.state, CIRCUIT_TONE[a.circuit.state] || "bad"));
  if (a.circuit.state !== "closed") {
    circuit.appendChild(el("small", `by ${a.circuit.opened_by || "?"} at ${time(a.circuit.opened_at)}; retry ${time(a.circuit.retry_at)}`));
  }
  const health = cell(tr, "");
  health.dataset.field = "health";
  health.appendChild(badge(a.health, HEALTH_TONE[a.health] || "neutral"));
  health.appendChild(el("small", a.health_reason));
  return tr;
}

function renderAdmin(result) {
  const node = $("admin-status");
  node.replaceChildren();
  node.className = "";
  if (result.status === "rejected") {
    const err = result.reason;
    node.className = "muted";
    node.textContent = err.kind === "absent"
      ? "admin overlay not available on this gateway"
      : `admin overlay could not be read (${err.status || err.kind})`;
    return;
  }
  const view = result.value;
  const verdict = view.chain_verdict || view.verdict || "unknown";
  const tone = { verified: "ok", absent: "neutral", corrupt: "bad" }[verdict] || "warn";
  node.appendChild(badge(`chain ${verdict}`, tone));
  node.appendChild(document.createTextNode(` revision ${view.revision}`));
  const reason = view.chain_reason || view.reason;
  if (reason) node.appendChild(document.createTextNode(` — ${reason}`));
  if (verdict === "absent") node.appendChild(document.createTextNode(" (no administrative record yet: every account is enabled)"));
  if (verdict === "corrupt") node.appendChild(document.createTextNode(" — every v2 mint is held (account-state-unavailable) and every mutation is refused"));
}

function renderRoutes() {
  renderLive();
  renderRecent();
}

function renderLive() {
  const tbody = $("live-routes").tBodies[0];
  $("live-count").textContent = state.feedUp ? `(${state.live.size})` : "";
  if (!state.live.size) {
    placeholder(tbody, 8, state.feedUp
      ? `no route in flight (following the feed live, ${new Date().toLocaleTimeString()})`
      : "unknown: the event feed is not connected");
    return;
  }
  const rows = [...state.live.values()].map((e) => e.view)
    .sort((a, b) => String(a.started_at).localeCompare(String(b.started_at)));
  tbody.replaceChildren(...rows.map((r) => {
    const tr = el("tr");
    tr.dataset.attemptId = r.attempt_id;
    cell(tr, time(r.started_at));
    cell(tr, elapsed(r.started_at)).dataset.field = "elapsed";
    cell(tr, r.account_id);
    cell(tr, r.requested_model || "—");
    cell(tr, `${r.wire} ${r.path}`);
    cell(tr, r.stream ? "stream" : "single");
    cell(tr, r.principal_id, r.repo_slug);
    cell(tr, r.attempt_id).dataset.field = "attempt_id";
    return tr;
  }));
}

function elapsed(iso) {
  const ms = Date.now() - new Date(iso).getTime();
  return isNaN(ms) ? "—" : `${Math.max(0, ms / 1000).toFixed(1)} s`;
}

function renderRecent() {
  const tbody = $("recent-routes").tBodies[0];
  const meta = state.recentMeta;
  if (meta) {
    $("recent-meta").textContent =
      `${state.recent.length} shown; as of ${time(meta.as_of)} the control daemon retained ${meta.retained} ` +
      "(a ring of 200)" + (meta.truncated ? " — truncated: older routes are not shown" : "") +
      (meta.evidence_since ? `; oldest retained started ${time(meta.evidence_since)}.` : "; none retained yet.");
  }
  if (!state.recent.length) {
    placeholder(tbody, 13, meta ? "no route has finished since this control daemon started" : "not loaded yet");
    return;
  }
  tbody.replaceChildren(...state.recent.map(recentRow));
}

function recentRow(r) {
  const tr = el("tr", null, r.justFinished ? "just-finished" : "");
  tr.dataset.attemptId = r.attempt_id;
  tr.dataset.status = r.status || "";
  cell(tr, time(r.finished_at));
  cell(tr, r.account_id);
  cell(tr, r.served_model || r.requested_model || "—");
  cell(tr, "").appendChild(badge(r.status || "?", STATUS_TONE[r.status] || "neutral"));
  cell(tr, r.http_status ?? "—");
  cell(tr, r.condition || r.refusal_reason || "—");
  for (const field of ["input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens"]) {
    const td = cell(tr, r.usage ? r.usage[field] : "—");
    td.dataset.field = field;
    if (!r.usage) td.title = "the upstream reported no usage";
  }
  cell(tr, r.cost_usd === null || r.cost_usd === undefined ? (r.cost_reason || "—") : r.cost_usd.toFixed(6))
    .dataset.field = "cost_usd";
  cell(tr, r.overhead_ms === null || r.overhead_ms === undefined ? "—" : `${r.overhead_ms.toFixed(1)} ms`);
  cell(tr, r.attempt_id).dataset.field = "attempt_id";
  return tr;
}

// ---- status: banner, feed pill, staleness --------------------------------------------------------

function reportFailure(err) {
  state.failure = err;
  const banner = $("banner");
  banner.hidden = false;
  banner.className = "tone-bad";
  $("main").classList.add("stale");
  const since = state.lastOkAt ? ` The tables show what was received at ${state.lastOkAt.toLocaleTimeString()} and are stale.` : "";
  if (err.kind === "unreachable") {
    banner.textContent =
      `Cannot reach the control daemon at ${location.origin} — is leasehold-control running? ` +
      `Start it (systemctl start leasehold-control, or make run); this page reconnects by itself.${since}`;
  } else if (err.kind === "refused") {
    banner.textContent =
      "The control daemon refused this token (401). Enter a token with scope read " +
      "(GATEWAY_READ_TOKEN, or the mint or control token).";
    showTokenForm();
  } else {
    banner.textContent = `The control daemon answered ${err.status} for ${err.path}${err.detail ? `: ${err.detail}` : ""}.${since}`;
  }
  if (!state.loadedOnce) {
    const why = "not available: see the message above";
    placeholder($("accounts").tBodies[0], 9, why);
    placeholder($("live-routes").tBodies[0], 8, why);
    placeholder($("recent-routes").tBodies[0], 13, why);
    $("evidence-window").textContent = why;
    $("admin-status").textContent = why;
    $("recent-meta").textContent = "";
  }
}

function reportOk() {
  state.failure = null;
  state.loadedOnce = true;
  state.lastOkAt = new Date();
  $("banner").hidden = true;
  $("main").classList.remove("stale");
  $("last-update").textContent = `updated ${state.lastOkAt.toLocaleTimeString()}`;
}

function setFeed(mode) {
  state.feedUp = mode === "live";
  const pill = $("feed-state");
  pill.dataset.state = mode;
  pill.className = `pill tone-${{ live: "ok", reconnecting: "warn", down: "bad" }[mode] || "neutral"}`;
  pill.textContent = `feed: ${mode}`;
  renderLive();
}

function noteHeartbeat() {
  $("feed-state").title = `last heartbeat ${new Date().toLocaleTimeString()}`;
}

// ---- token and lifecycle -------------------------------------------------------------------------

function showTokenForm() {
  stopFeed();
  $("token-form").hidden = false;
  $("forget-token").hidden = true;
  $("token-input").focus();
}

function stopFeed() {
  if (state.feedController) state.feedController.abort();
  state.feedController = null;
  clearInterval(state.refreshTimer);
  state.refreshTimer = null;
}

function start() {
  $("token-form").hidden = true;
  $("forget-token").hidden = false;
  $("main").hidden = false;
  stopFeed();
  runFeed();
  state.refreshTimer = setInterval(() => { refreshAll(); }, REFRESH_MS);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token-input").value = "";
    $("banner").hidden = true;
    start();
  });
  $("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    $("main").hidden = true;
    showTokenForm();
  });
  setInterval(() => { if (state.live.size) renderLive(); }, 1000);
  if (state.token) start(); else showTokenForm();
});
