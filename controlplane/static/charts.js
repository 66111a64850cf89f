// Charts: spend against each budget, and each account's spend and requests over the last hours,
// drawn by the page itself as inline SVG — no library, nothing fetched. Data in, DOM out, as in
// render.js: every label is textContent, every colour a class in dashboard.css (the page's CSP
// allows no inline style). The SVG namespace is read from the page's own <template>, so no
// string here names another origin.
//
// Rules (seed 002): an hour the gateway does not hold (before this month) is drawn as "not held",
// never as a zero bar; a view that could not be read says why instead of looking empty.

const SVG_NS = document.getElementById("svg-template").content.firstElementChild.namespaceURI;
const $ = (id) => document.getElementById(id);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function svg(tag, attrs, className) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  if (className) node.setAttribute("class", className);
  return node;
}

function titled(node, text) {
  node.appendChild(svg("title")).textContent = text;
  return node;
}

export function usd(value) {
  if (value === null || value === undefined) return "—";
  const size = Math.abs(value);
  return `$${value.toFixed(size >= 1 ? 2 : size >= 0.01 ? 4 : 6)}`;
}

function hourOf(iso) {
  const d = new Date(iso);
  return `${String(d.getHours()).padStart(2, "0")}:00`;
}

function inWords(ms) {
  if (ms <= 0) return "now";
  const minutes = Math.ceil(ms / 60000);
  const days = Math.floor(minutes / 1440);
  const hours = Math.floor((minutes % 1440) / 60);
  if (days) return `in ${days} d ${hours} h`;
  return hours ? `in ${hours} h ${minutes % 60} min` : `in ${minutes} min`;
}

function unavailable(box, what, err) {
  const why = err.kind === "unreachable" ? "the control daemon is unreachable"
    : err.kind === "absent" ? "this gateway has no such view"
      : `the control daemon answered ${err.status}${err.detail ? `: ${err.detail}` : ""}`;
  box.replaceChildren(el("p", `${what} cannot be shown: ${why}.`, "note tone-warn"));
}

// ---- budgets --------------------------------------------------------------------------------

// `result` is a Promise.allSettled entry of GET /control/v2/budgets.
export function renderBudgets(result) {
  const box = $("budgets");
  if (result.status === "rejected") {
    unavailable(box, "Budgets", result.reason);
    return;
  }
  const view = result.value;
  $("budgets-meta").textContent = `policy revision ${view.policy_revision}; UTC windows; as of ` +
    `${new Date(view.as_of).toLocaleTimeString()}`;
  if (!view.budgets.length) {
    box.replaceChildren(el("p", "No budget is set: a policy level's `budgets` (hour, day or month, in USD) " +
                               "holds mints and refuses requests of its scope once spent.", "muted"));
    return;
  }
  box.replaceChildren(...view.budgets.map(budgetRow));
}

function stateOf(budget) {
  if (budget.exhausted) return ["exhausted", "bad"];
  return budget.spent_usd >= 0.8 * budget.usd ? ["warning", "warn"] : ["ok", "ok"];
}

function budgetRow(budget) {
  const [state, tone] = stateOf(budget);
  const row = el("div", null, `budget edge-${tone}`);
  row.dataset.level = budget.level;
  row.dataset.window = budget.window;
  row.dataset.state = state;
  const head = row.appendChild(el("div", null, "budget-head"));
  head.appendChild(el("strong", budget.level));
  head.appendChild(el("span", budget.window, "badge tone-neutral"));
  head.appendChild(el("span", state === "warning" ? "80 % reached" : state, `badge tone-${tone}`));
  head.appendChild(el("span", `${Math.round((100 * budget.spent_usd) / budget.usd)} %`, "budget-share"));
  row.appendChild(budgetBar(budget, tone));
  const resets = new Date(budget.resets_at);
  const facts = [`${usd(budget.spent_usd)} of ${usd(budget.usd)}`, `${usd(budget.remaining_usd)} left`,
                 `resets ${resets.toLocaleString()} (${inWords(resets - Date.now())})`];
  if (budget.overshoot_usd > 0) facts.push(`overshoot ${usd(budget.overshoot_usd)} (in flight when it ran out)`);
  if (budget.unpriced_attempts) facts.push(`${budget.unpriced_attempts} unpriced attempt(s): cost unknown, not zero`);
  row.appendChild(el("p", facts.join(" · "), "budget-facts"));
  if (budget.exhausted) {
    row.appendChild(el("p", "Mints of this scope are held 503 and its leases' requests refused 429 " +
                            "budget-exhausted until the window resets.", "budget-held"));
  }
  return row;
}

function budgetBar(budget, tone) {
  const width = 600;
  const height = 14;
  const scale = Math.max(budget.usd, budget.spent_usd) || 1;
  const x = (value) => (Math.max(0, value) / scale) * width;
  const bar = svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img",
                           "aria-label": `${budget.level} ${budget.window}: ${usd(budget.spent_usd)} of ${usd(budget.usd)}` },
                  "budget-bar");
  bar.appendChild(svg("rect", { x: 0, y: 0, width, height }, "bar-track"));
  bar.appendChild(svg("rect", { x: 0, y: 0, width: x(Math.min(budget.spent_usd, budget.usd)), height },
                      `bar-fill fill-${tone}`));
  if (budget.spent_usd > budget.usd) {
    bar.appendChild(svg("rect", { x: x(budget.usd), y: 0, width: x(budget.spent_usd - budget.usd), height }, "bar-over"));
  }
  for (const share of [0.8, 1]) {
    bar.appendChild(svg("line", { x1: x(share * budget.usd), x2: x(share * budget.usd), y1: 0, y2: height }, "bar-mark"));
  }
  return titled(bar, `${usd(budget.spent_usd)} spent of ${usd(budget.usd)} (marks at 80 % and 100 %)`);
}

// ---- spend and requests per account, per hour ---------------------------------------------------

// `result` is a Promise.allSettled entry of GET /control/v2/spend?window=hour&by=account&hours=N.
export function renderSpend(result, knownAccounts) {
  const box = $("spend-charts");
  if (result.status === "rejected") {
    unavailable(box, "Spend", result.reason);
    return;
  }
  const series = result.value.series || [];
  const byAccount = new Map();
  series.forEach((hour, index) => {
    for (const row of hour.rows) {
      if (!byAccount.has(row.key)) byAccount.set(row.key, series.map(() => null));
      byAccount.get(row.key)[index] = row;
    }
  });
  const unheld = series.filter((hour) => !hour.held).length;
  $("spend-meta").textContent = `last ${series.length} h, by UTC hour, as of ${new Date(result.value.as_of).toLocaleTimeString()}` +
    (unheld ? ` — ${unheld} h before this month are not held (drawn dashed, never as zero)` : "");
  const quiet = (knownAccounts || []).filter((id) => !byAccount.has(id));
  const cards = [...byAccount.entries()]
    .map(([account, rows]) => ({ account, rows, cost: rows.reduce((s, r) => s + (r ? r.cost_usd : 0), 0) }))
    .sort((a, b) => b.cost - a.cost || String(a.account).localeCompare(String(b.account)))
    .map(({ account, rows }) => accountCard(account, rows, series));
  if (!cards.length) cards.push(el("p", `No attempt in the last ${series.length} h.`, "muted"));
  if (quiet.length && byAccount.size) cards.push(el("p", `No attempt in these hours: ${quiet.join(", ")}.`, "muted spend-quiet"));
  box.replaceChildren(...cards);
}

function accountCard(account, rows, series) {
  const card = el("div", null, "spend-card");
  card.dataset.accountId = account;
  const totals = rows.reduce((t, r) => r ? { cost: t.cost + r.cost_usd, attempts: t.attempts + r.attempts,
                                              unpriced: t.unpriced + r.unpriced_attempts } : t,
                             { cost: 0, attempts: 0, unpriced: 0 });
  const head = card.appendChild(el("div", null, "spend-head"));
  head.appendChild(el("strong", account));
  head.appendChild(el("span", `${usd(totals.cost)} · ${totals.attempts} request${totals.attempts === 1 ? "" : "s"}` +
                              (totals.unpriced ? ` · ${totals.unpriced} unpriced` : ""), "spend-total"));
  card.appendChild(hourlyChart(account, rows, series));
  const legend = card.appendChild(el("div", null, "legend"));
  legend.appendChild(el("span", "spend (USD) per hour", "key key-cost"));
  legend.appendChild(el("span", "requests per hour", "key key-requests"));
  return card;
}

function hourlyChart(account, rows, series) {
  const width = 360;
  const height = 120;
  const top = 16;
  const bottom = height - 18;
  const plot = bottom - top;
  const step = width / Math.max(1, series.length);
  const maxCost = Math.max(...rows.map((r) => (r ? r.cost_usd : 0)), 0);
  const maxAttempts = Math.max(...rows.map((r) => (r ? r.attempts : 0)), 0);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img",
                             "aria-label": `${account}: spend and requests per hour` }, "spend-chart");
  chart.dataset.accountId = account;
  const points = [];
  series.forEach((hour, i) => {
    const x = i * step;
    if (!hour.held) {
      chart.appendChild(titled(svg("rect", { x: x + 0.5, y: top, width: step - 1, height: plot }, "slot-unheld"),
                               `${hourOf(hour.window_start)}: not held (before this month)`));
      return;
    }
    const row = rows[i];
    const cost = row ? row.cost_usd : 0;
    const attempts = row ? row.attempts : 0;
    const h = maxCost > 0 ? Math.max(cost > 0 ? 1.5 : 0, (cost / maxCost) * plot) : 0;
    const bar = svg("rect", { x: x + 1, y: bottom - h, width: Math.max(1, step - 2), height: h }, "bar-cost");
    bar.dataset.hour = hour.window_start;
    bar.dataset.cost = String(cost);
    bar.dataset.attempts = String(attempts);
    chart.appendChild(titled(bar, `${hourOf(hour.window_start)}: ${usd(cost)} · ${attempts} request(s)` +
                                  (row && row.unpriced_attempts ? ` · ${row.unpriced_attempts} unpriced` : "")));
    const y = maxAttempts > 0 ? bottom - (attempts / maxAttempts) * plot : bottom;
    points.push([x + step / 2, y, attempts]);
  });
  chart.appendChild(svg("line", { x1: 0, x2: width, y1: bottom, y2: bottom }, "axis"));
  if (points.length) {
    chart.appendChild(svg("polyline", { points: points.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ") },
                          "line-requests"));
    for (const [x, y, attempts] of points) {
      if (attempts) chart.appendChild(svg("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 2.2 }, "dot-requests"));
    }
  }
  label(chart, 2, 11, `max ${usd(maxCost)}/h`, "start");
  label(chart, width - 2, 11, `max ${maxAttempts} req/h`, "end");
  if (series.length) {   // the first hour, the middle one, and the one in progress
    const mid = Math.floor(series.length / 2);
    label(chart, 1, height - 4, hourOf(series[0].window_start), "start");
    if (mid > 0 && mid < series.length - 1) label(chart, mid * step + step / 2, height - 4, hourOf(series[mid].window_start), "middle");
    label(chart, width - 1, height - 4, "now", "end");
  }
  return chart;
}

function label(chart, x, y, text, anchor) {
  chart.appendChild(svg("text", { x, y, "text-anchor": anchor }, "chart-label")).textContent = text;
}
