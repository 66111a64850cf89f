// Talking to the control daemon: the read API and the event feed, both with the read token in an
// `Authorization` header. The feed is read with fetch streaming, not EventSource (which cannot
// send headers), and parsed here as Server-Sent Events.
//
// Every failure becomes a SourceError whose `kind` says what the page must tell the operator:
// unreachable (no answer at all), refused (401), absent (404: a route this gateway lacks), http.

export class SourceError extends Error {
  constructor(kind, status, path, detail) {
    super(`${kind} ${status || ""} ${path || ""}`);
    this.kind = kind;
    this.status = status;
    this.path = path;
    this.detail = detail;
  }
}

function authHeaders(token) {
  return { Authorization: `Bearer ${token}` };
}

async function request(path, token, extraHeaders, signal) {
  let response;
  try {
    response = await fetch(path, { headers: { ...authHeaders(token), ...extraHeaders }, cache: "no-store", signal });
  } catch (err) {
    if (signal && signal.aborted) throw err;
    throw new SourceError("unreachable", 0, path);
  }
  if (response.status === 401) throw new SourceError("refused", 401, path);
  if (response.status === 404) throw new SourceError("absent", 404, path);
  if (!response.ok) {
    let detail = "";
    try { detail = ((await response.json()).error || {}).message || ""; } catch (err) { /* not JSON */ }
    throw new SourceError("http", response.status, path, detail);
  }
  return response;
}

export async function api(path, token) {
  return (await request(path, token, {})).json();
}

// Opens the feed; resolves once the response headers arrived (the reader is subscribed).
export async function openFeed(token, lastEventId, signal) {
  const headers = lastEventId ? { "Last-Event-ID": lastEventId } : {};
  return request("/control/v2/events", token, headers, signal);
}

// Calls `handle({id, kind, data})` per event and `onComment()` per heartbeat until the stream ends.
export async function readEvents(body, handle, onComment) {
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
      const parsed = parseBlock(block, onComment);
      if (parsed) handle(parsed);
    }
  }
}

function parseBlock(block, onComment) {
  let id = null;
  let kind = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) { onComment(); continue; }
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
    return null;  // a malformed event is skipped; the next snapshot refetch covers it
  }
}
