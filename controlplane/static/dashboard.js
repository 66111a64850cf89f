// Leasehold dashboard: a read-only view over the control daemon's read plane (SPEC §11, §18).
//
// Rules (seed 002): each account fact is shown on its own; `unverified` is neutral, never green;
// nothing absent is ever rendered as a fact — an unreachable daemon, a refused token or a missing
// route is said in words, and a table that could not be loaded says so instead of looking empty.
//
// Data flow: the event feed is opened first, then the views are fetched (so nothing falls between
// the snapshot and the feed); route events move rows between "live" and "recent" at once, and any
// event schedules one coalesced refetch of the views for the counts they carry.

import { SourceError, api, openFeed, readEvents } from "./source.js";
import { placeholder, renderAccounts, renderAdmin, renderHops, renderLive, renderRecent } from "./render.js";
import { renderBudgets, renderSpend } from "./charts.js";
import { renderFleet } from "./fleet.js";

const TOKEN_KEY = "leasehold.readToken";
const RECENT_LIMIT = 50;
const HOPS_LIMIT = 50;
const REFRESH_MS = 5000;
const SPEND_HOURS = 24;
const FEED_RETRY_MS = [500, 1000, 2000, 3000];

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  live: new Map(),        // attempt_id → { view, seenAt }
  recent: [],             // RouteView, newest first
  hops: [],               // dispatch.hop events with the time they arrived, newest first
  recentMeta: null,
  lastEventId: null,
  feedController: null,
  feedUp: false,
  loadedOnce: false,
  lastOkAt: null,
  refreshTimer: null,
  refreshSoon: null,
};

const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---- views -----------------------------------------------------------------------------------

async function refreshAll() {
  if (!state.token) return;
  const sentAt = Date.now();
  const token = state.token;
  const results = await Promise.allSettled([
    api("/control/v2/accounts", token),
    api("/control/v2/routes/active", token),
    api(`/control/v2/routes/recent?limit=${RECENT_LIMIT}`, token),
    api("/control/v2/accounts/admin", token),
    api("/control/v2/budgets", token),
    api(`/control/v2/spend?window=hour&by=account&hours=${SPEND_HOURS}`, token),
    api("/control/v2/fleet", token),
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
  renderBudgets(results[4]);
  renderSpend(results[5], results[0].value.accounts.map((a) => a.id));
  renderFleet(results[6]);
  renderRoutes();
}

// Coalesces bursts of events into one refetch of the views (counts, health, ring metadata).
function refreshSoon() {
  if (state.refreshSoon) return;
  state.refreshSoon = setTimeout(() => { state.refreshSoon = null; refreshAll(); }, 300);
}

// ---- the event feed ----------------------------------------------------------------------------

async function runFeed(controller) {
  let attempt = 0;
  while (state.token && !controller.signal.aborted) {
    try {
      const response = await openFeed(state.token, state.lastEventId, controller.signal);
      attempt = 0;
      setFeed("live");
      refreshAll();
      await readEvents(response.body, onEvent, noteHeartbeat);
      if (!controller.signal.aborted) setFeed("reconnecting");
    } catch (err) {
      if (controller.signal.aborted) return;
      if (!(err instanceof SourceError)) {
        setFeed("reconnecting");  // the stream broke mid-way
      } else {
        setFeed("down");
        reportFailure(err);
        if (err.kind === "refused") return;  // restarted when a new token is entered
      }
    }
    await sleep(FEED_RETRY_MS[Math.min(attempt++, FEED_RETRY_MS.length - 1)]);
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
    case "dispatch.hop":
      if (!state.hops.some((h) => h.mint_decision_id === data.mint_decision_id)) {
        state.hops.unshift({ ...data, at: new Date() });
        if (state.hops.length > HOPS_LIMIT) state.hops.length = HOPS_LIMIT;
        renderHops(state.hops);
      }
      refreshSoon();
      break;
    case "gap":  // events were missed (evicted, or a restarted daemon): refetch everything
      refreshAll();
      break;
    default:     // circuit, account.state, policy, budget
      refreshSoon();
      break;
  }
}

// ---- state merges ------------------------------------------------------------------------------

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
  for (const view of payload.routes) addRecent(view);
}

function addRecent(view) {
  if (state.recent.some((r) => r.attempt_id === view.attempt_id)) return;
  state.recent.push(view);
  state.recent.sort((a, b) => String(b.finished_at || "").localeCompare(String(a.finished_at || "")));
  if (state.recent.length > RECENT_LIMIT) state.recent.length = RECENT_LIMIT;
}

function renderRoutes() {
  renderLive([...state.live.values()].map((e) => e.view), state.feedUp);
  renderRecent(state.recent, state.recentMeta);
}

// ---- status: banner, feed pill, staleness ------------------------------------------------------

function reportFailure(err) {
  const banner = $("banner");
  banner.hidden = false;
  banner.className = "tone-bad";
  $("main").classList.add("stale");
  const since = state.lastOkAt
    ? ` The tables show what was received at ${state.lastOkAt.toLocaleTimeString()} and are stale.` : "";
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
    banner.textContent =
      `The control daemon answered ${err.status} for ${err.path}${err.detail ? `: ${err.detail}` : ""}.${since}`;
  }
  if (!state.loadedOnce) {
    const why = "not available: see the message above";
    placeholder($("accounts").tBodies[0], 9, why);
    placeholder($("live-routes").tBodies[0], 8, why);
    placeholder($("recent-routes").tBodies[0], 13, why);
    for (const id of ["evidence-window", "admin-status", "recent-meta"]) $(id).textContent = why;
    for (const id of ["budgets", "spend-charts"]) $(id).replaceChildren(document.createTextNode(why));
  }
}

function reportOk() {
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
  renderRoutes();
}

function noteHeartbeat() {
  $("feed-state").title = `last heartbeat ${new Date().toLocaleTimeString()}`;
}

// ---- token and lifecycle -----------------------------------------------------------------------

function showTokenForm() {
  stop();
  $("token-form").hidden = false;
  $("forget-token").hidden = true;
  $("token-input").focus();
}

function stop() {
  if (state.feedController) state.feedController.abort();
  state.feedController = null;
  clearInterval(state.refreshTimer);
  state.refreshTimer = null;
}

function start() {
  stop();
  $("token-form").hidden = true;
  $("forget-token").hidden = false;
  $("main").hidden = false;
  state.feedController = new AbortController();
  runFeed(state.feedController);
  state.refreshTimer = setInterval(refreshAll, REFRESH_MS);
}

function init() {
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
  setInterval(() => { if (state.live.size) renderRoutes(); }, 1000);  // elapsed times tick
  if (state.token) start(); else showTokenForm();
}

init();  // a module script runs once the document is parsed
