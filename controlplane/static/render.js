// Rendering: data in, DOM out. Every value is written with textContent (never parsed as HTML),
// every fact gets its own cell, and an empty table always says why it is empty.

import { headroomContent } from "./headroom.js";

const HEALTH_TONE = { healthy: "ok", degraded: "bad", unverified: "neutral" };  // unverified is never green
const ADMIN_TONE = { enabled: "neutral", draining: "warn", disabled: "bad" };
const CIRCUIT_TONE = { closed: "neutral", "half-open": "warn", open: "bad" };
const STATUS_TONE = { completed: "ok", "client-aborted": "neutral", refused: "warn",
                      "upstream-error": "bad", "transport-error": "bad" };
const VERDICT_TONE = { verified: "ok", absent: "neutral", corrupt: "bad" };
const TOKEN_FIELDS = ["input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens"];

const $ = (id) => document.getElementById(id);
const ACCOUNT_COLUMNS = 10;

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function cell(row, text, sub) {
  const td = el("td", text);
  if (sub) td.appendChild(el("small", sub));
  row.appendChild(td);
  return td;
}

function field(row, name, text, sub) {
  const td = cell(row, text, sub);
  td.dataset.field = name;
  return td;
}

function badge(text, tone) {
  return el("span", text, `badge tone-${tone}`);
}

export function time(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleTimeString();
}

export function placeholder(tbody, columns, text) {
  const tr = el("tr", null, "placeholder");
  const td = el("td", text);
  td.colSpan = columns;
  tr.appendChild(td);
  tbody.replaceChildren(tr);
}

// ---- accounts ---------------------------------------------------------------------------------

export function renderAccounts(view) {
  $("evidence-window").textContent =
    `Health and observations over the last ${view.window_seconds} s, as of ${time(view.as_of)}; ` +
    `evidence since ${time(view.evidence_since)} (when this control daemon started observing).`;
  const truncated = $("evidence-truncated");
  truncated.hidden = !view.evidence_truncated;
  truncated.textContent = view.evidence_truncated
    ? "evidence_truncated: older evidence inside this window was evicted — health was computed from a subsample."
    : "";
  const tbody = $("accounts").tBodies[0];
  if (!view.accounts.length) {
    placeholder(tbody, ACCOUNT_COLUMNS, "the control daemon reported no account at all (it always has three legacy accounts: check its registry)");
    return;
  }
  tbody.replaceChildren(...view.accounts.map(accountRow));
}

function accountRow(a) {
  const tr = el("tr");
  tr.dataset.accountId = a.id;
  cell(tr, a.id, a.display_name);
  cell(tr, a.provider_binding, `${a.upstream_origin} · ${a.auth_style}`);
  field(tr, "configured", "").appendChild(a.configured ? badge("yes", "neutral") : badge("no", "warn"));
  if (!a.configured) tr.lastChild.appendChild(el("small", `set ${a.credential_env}`));
  field(tr, "administrative_state", "").appendChild(badge(a.administrative_state, ADMIN_TONE[a.administrative_state] || "bad"));
  field(tr, "leased", a.leased ? `${a.lease_count} lease${a.lease_count === 1 ? "" : "s"}` : "none");
  field(tr, "in_flight", a.in_flight ? `${a.in_flight_count} streaming` : "none",
        a.sockets_open ? `${a.sockets_open} WebSocket${a.sockets_open === 1 ? "" : "s"} open` : undefined);
  field(tr, "observed", a.observed ? `${a.observed_request_count} (${a.observed_aborted_count} aborted)` : "none",
        a.last_observed_at ? `last ${time(a.last_observed_at)}` : "never since evidence began");
  const circuit = field(tr, "circuit", "");
  circuit.appendChild(badge(a.circuit.state, CIRCUIT_TONE[a.circuit.state] || "bad"));
  if (a.circuit.state !== "closed") {
    circuit.appendChild(el("small", `by ${a.circuit.opened_by || "?"} at ${time(a.circuit.opened_at)}; ` +
                                    `retry ${time(a.circuit.retry_at)}`));
  }
  const health = field(tr, "health", "");
  health.appendChild(badge(a.health, HEALTH_TONE[a.health] || "neutral"));
  health.appendChild(el("small", a.health_reason));
  field(tr, "headroom", "").replaceChildren(...headroomContent(a.rate_limits));  // its own fact (SPEC §22)
  return tr;
}

// `result` is a Promise.allSettled entry: a 404 means this gateway has no overlay routes.
export function renderAdmin(result) {
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
  node.appendChild(badge(`chain ${verdict}`, VERDICT_TONE[verdict] || "warn"));
  node.appendChild(document.createTextNode(` revision ${view.revision}`));
  const reason = view.chain_reason || view.reason;
  if (reason) node.appendChild(document.createTextNode(` — ${reason}`));
  if (verdict === "absent") node.appendChild(document.createTextNode(" (no administrative record yet: every account is enabled)"));
  if (verdict === "corrupt") {
    node.appendChild(document.createTextNode(" — every v2 mint is held (account-state-unavailable) and every mutation is refused"));
  }
}

// ---- routes -----------------------------------------------------------------------------------

export function renderLive(views, feedUp) {
  const tbody = $("live-routes").tBodies[0];
  $("live-count").textContent = feedUp ? `(${views.length})` : "";
  if (!views.length) {
    placeholder(tbody, 8, feedUp
      ? `no route in flight (following the feed live, ${new Date().toLocaleTimeString()})`
      : "unknown: the event feed is not connected");
    return;
  }
  const rows = [...views].sort((a, b) => String(a.started_at).localeCompare(String(b.started_at)));
  tbody.replaceChildren(...rows.map((r) => {
    const tr = el("tr");
    tr.dataset.attemptId = r.attempt_id;
    cell(tr, time(r.started_at));
    field(tr, "elapsed", elapsed(r.started_at));
    cell(tr, r.account_id);
    cell(tr, r.requested_model || "—");
    cell(tr, `${r.wire} ${r.path}`);
    cell(tr, r.transport === "websocket" ? "websocket" : r.stream ? "stream" : "single");
    cell(tr, r.principal_id, r.repo_slug);
    field(tr, "attempt_id", r.attempt_id);
    return tr;
  }));
}

function elapsed(iso) {
  const ms = Date.now() - new Date(iso).getTime();
  return isNaN(ms) ? "—" : `${Math.max(0, ms / 1000).toFixed(1)} s`;
}

// ---- dispatch hops ----------------------------------------------------------------------------

export function renderHops(hops) {
  const tbody = $("hops").tBodies[0];
  if (!hops.length) {
    placeholder(tbody, 8, "no hop since this page connected");
    return;
  }
  tbody.replaceChildren(...hops.map((hop) => {
    const tr = el("tr");
    tr.dataset.key = hop.key_id;
    field(tr, "at", hop.at.toLocaleTimeString());
    field(tr, "dispatch", hop.dispatch_id || "—");
    field(tr, "key", hop.key_id);
    field(tr, "from", hop.from_account);
    field(tr, "to", hop.to_account);
    field(tr, "condition", "").appendChild(badge(hop.condition, "warn"));
    field(tr, "hop", hop.hop);
    field(tr, "decision", hop.mint_decision_id);
    return tr;
  }));
}

export function renderRecent(recent, meta) {
  if (meta) {
    $("recent-meta").textContent =
      `${recent.length} shown; as of ${time(meta.as_of)} the control daemon retained ${meta.retained} ` +
      "(a ring of 200)" + (meta.truncated ? " — truncated: older routes are not shown" : "") +
      (meta.evidence_since ? `; oldest retained started ${time(meta.evidence_since)}.` : "; none retained yet.");
  }
  const tbody = $("recent-routes").tBodies[0];
  if (!recent.length) {
    placeholder(tbody, 13, meta ? "no route has finished since this control daemon started" : "not loaded yet");
    return;
  }
  tbody.replaceChildren(...recent.map(recentRow));
}

function recentRow(r) {
  const tr = el("tr");
  tr.dataset.attemptId = r.attempt_id;
  tr.dataset.status = r.status || "";
  cell(tr, time(r.finished_at));
  cell(tr, r.account_id);
  cell(tr, r.served_model || r.requested_model || "—");
  cell(tr, "").appendChild(badge(r.status || "?", STATUS_TONE[r.status] || "neutral"));
  cell(tr, r.http_status ?? "—");
  cell(tr, r.condition || r.refusal_reason || "—");
  for (const name of TOKEN_FIELDS) {
    const td = field(tr, name, r.usage ? r.usage[name] : "—");
    if (!r.usage) td.title = "the upstream reported no usage";
  }
  // A null cost is shown by its reason (unpriced, no-usage): never as 0.
  field(tr, "cost_usd", r.cost_usd === null || r.cost_usd === undefined ? (r.cost_reason || "—") : r.cost_usd.toFixed(6));
  cell(tr, r.overhead_ms === null || r.overhead_ms === undefined ? "—" : `${r.overhead_ms.toFixed(1)} ms`);
  field(tr, "attempt_id", r.attempt_id);
  return tr;
}
