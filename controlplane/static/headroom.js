// The accounts table's headroom cell (SPEC §22): one bar per kind the provider reported
// (requests, tokens, input tokens, output tokens), its share of the limit left and its reset.
// Data in, DOM out, as in render.js and charts.js: textContent only, colours are classes (the
// page's CSP allows no inline style), bars are inline SVG. A kind whose reset has passed says
// so (the window refilled since): it is never drawn as if it still held.

const SVG_NS = document.getElementById("svg-template").content.firstElementChild.namespaceURI;
const KIND_LABEL = { requests: "requests", tokens: "tokens", input_tokens: "input", output_tokens: "output" };
const WIDTH = 120;
const HEIGHT = 8;

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

function count(value) {
  return value === null || value === undefined ? "?" : Number(value).toLocaleString("en-US");
}

function toneOf(percent) {
  return percent < 10 ? "bad" : percent < 25 ? "warn" : "ok";
}

function bar(percent, tone) {
  const box = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, width: WIDTH, height: HEIGHT }, "headroom-bar");
  box.appendChild(svg("rect", { x: 0, y: 0, width: WIDTH, height: HEIGHT, rx: 2 }, "bar-track"));
  const filled = Math.max(0, Math.min(100, percent)) * WIDTH / 100;
  box.appendChild(svg("rect", { x: 0, y: 0, width: filled.toFixed(1), height: HEIGHT, rx: 2 }, `fill-${tone}`));
  return box;
}

function kindLine(kind, limit) {
  const line = el("div", null, "headroom-kind");
  line.dataset.kind = kind;
  line.appendChild(el("span", KIND_LABEL[kind] || kind, "headroom-label"));
  const percent = limit.headroom_percent;
  if (!limit.current) {
    line.classList.add("headroom-lapsed");
    line.appendChild(el("span", `${count(limit.remaining)} left, reset passed ${when(limit.reset_at)}`,
                        "headroom-facts"));
    return line;
  }
  if (percent !== null && percent !== undefined) line.appendChild(bar(percent, toneOf(percent)));
  const share = percent === null || percent === undefined ? "" : `${percent} % · `;
  line.appendChild(el("span", `${share}${count(limit.remaining)} / ${count(limit.limit)} · resets ${when(limit.reset_at)}`,
                      "headroom-facts"));
  return line;
}

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleTimeString();
}

// The cell's content for one account's `rate_limits` (kind → latest observation).
export function headroomContent(rateLimits) {
  const kinds = Object.entries(rateLimits || {});
  if (!kinds.length) return [el("span", "not reported", "muted")];
  return kinds.map(([kind, limit]) => kindLine(kind, limit));
}
