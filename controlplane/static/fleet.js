// The fleet section (SPEC §16): hosts live, and each host's leases and attempts in flight, from
// GET /control/v2/fleet. Embedded mode is a fleet of one and says so; an unavailable fleet state
// is said in words (mints are held), never shown as an empty fleet.

const $ = (id) => document.getElementById(id);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleTimeString();
}

// `result` is a Promise.allSettled entry.
export function renderFleet(result) {
  const status = $("fleet-status");
  const tbody = $("fleet-hosts").tBodies[0];
  status.replaceChildren();
  if (result.status === "rejected") {
    status.textContent = `fleet view could not be read (${result.reason.status || result.reason.kind})`;
    return;
  }
  const f = result.value;
  const available = f.state === "available";
  status.appendChild(el("span", `${f.mode} · ${f.state}`, `badge tone-${available ? "neutral" : "bad"}`));
  status.appendChild(document.createTextNode(
    f.mode === "embedded"
      ? " — no GATEWAY_FLEET_REDIS_URL: this host is the whole fleet"
      : ` — fleet ${f.fleet_id}, ${f.hosts_live} host${f.hosts_live === 1 ? "" : "s"} live` +
        (available ? "" : "; the fleet's Redis is unreachable: mints are held (fleet-state-unavailable) and the counts are this host's own") +
        (f.writes_owed ? `; ${f.writes_owed} write(s) owed to Redis` : "")));
  tbody.replaceChildren(...f.hosts.map((h) => {
    const tr = el("tr");
    tr.dataset.hostId = h.host_id;
    const name = el("td", h.host_id);
    if (h.this_host) name.appendChild(el("small", "this host"));
    tr.appendChild(name);
    const live = el("td");
    live.dataset.field = "live";
    live.appendChild(el("span", h.live ? "live" : "dead", `badge tone-${h.live ? "neutral" : "bad"}`));
    tr.appendChild(live);
    for (const [field, text] of [["last_seen_at", when(h.last_seen_at)], ["lease_count", h.lease_count],
                                 ["in_flight_count", h.in_flight_count]]) {
      const td = el("td", text);
      td.dataset.field = field;
      tr.appendChild(td);
    }
    return tr;
  }));
}
