// The HTTP API as the page uses it: JSON in, JSON or an event stream out, every error an
// ApiError built from the server's problem+json answer.

import { store } from "./store.js";

export class ApiError extends Error {
  constructor({ status = 0, code = "network", title = "", detail = "", retryAfter = null, body = {} }) {
    super(detail || title || code);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.title = title;
    this.detail = detail;
    this.retryAfter = retryAfter;
    this.body = body;
  }
}

/** Seconds from a Retry-After header: a number of seconds or an HTTP date; null if absent. */
export function parseRetryAfter(value) {
  if (!value) return null;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed);
  const when = Date.parse(trimmed);
  if (Number.isNaN(when)) return null;
  return Math.max(0, Math.ceil((when - Date.now()) / 1000));
}

function headers(extra = {}) {
  const result = { Accept: "application/json", ...extra };
  const key = store.apiKey();
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

async function problemOf(response) {
  let body = {};
  const type = response.headers.get("content-type") || "";
  try {
    if (type.includes("json")) body = await response.json();
    else body = { detail: (await response.text()).slice(0, 300) };
  } catch {
    body = {};
  }
  return new ApiError({
    status: response.status,
    code: body.code || `http_${response.status}`,
    title: body.title || response.statusText,
    detail: body.detail || "",
    retryAfter: parseRetryAfter(response.headers.get("retry-after")),
    body,
  });
}

async function send(method, path, { json, body, signal, extraHeaders, keepalive, cache = "no-store" } = {}) {
  const init = { method, headers: headers(extraHeaders), signal, cache, keepalive };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (body !== undefined) {
    init.body = body; // FormData: the browser writes the multipart Content-Type and boundary
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError({ code: "network", detail: "The server could not be reached." });
  }
  if (!response.ok) throw await problemOf(response);
  return response;
}

async function json(method, path, options) {
  const response = await send(method, path, options);
  if (response.status === 204) return null;
  return response.json();
}

const seg = encodeURIComponent;

// Paths are relative to the page, so the UI also works behind a proxy that serves the
// service under a prefix (https://example.org/agent/ → https://example.org/agent/v1/...).

export const api = {
  /** Start a run; ``options``: ``agent`` (a configured agent's name), ``branchFrom`` (the
   * run whose turn this run continues, or "start": ``branch_from``; none: the latest turn),
   * ``key`` (the send's Idempotency-Key: the same POST sent again attaches to the run it
   * started) and ``strategy`` (``multitask_strategy``: what to do when the session is busy). */
  startRun(sessionId, input, signal, options = {}) {
    // on_disconnect "continue": a reload or a dropped connection must not cancel the run;
    // the page reconnects to its events instead, and Stop cancels explicitly
    const body = { input, stream: true, on_disconnect: "continue" };
    if (options.agent) body.agent = options.agent;
    if (options.branchFrom) body.branch_from = options.branchFrom;
    if (options.strategy) body.multitask_strategy = options.strategy;
    const extraHeaders = { Accept: "text/event-stream" };
    if (options.key) extraHeaders["Idempotency-Key"] = options.key;
    return send("POST", `v1/sessions/${seg(sessionId)}/runs`, { json: body, extraHeaders, signal });
  },
  followRun(runId, lastSeq, signal) {
    return send("GET", `v1/runs/${seg(runId)}/events`, {
      extraHeaders: { Accept: "text/event-stream", "Last-Event-ID": String(lastSeq) },
      signal,
    });
  },
  getRun: (runId) => json("GET", `v1/runs/${seg(runId)}`),
  cancelRun: (runId) => json("POST", `v1/runs/${seg(runId)}/cancel`),
  /** A page of the caller's sessions, newest first: {sessions, next}. */
  sessions: (limit, before = null) =>
    json("GET", `v1/sessions?limit=${limit}${before ? `&before=${seg(before)}` : ""}`),
  session: (sessionId) => json("GET", `v1/sessions/${seg(sessionId)}`),
  messages: (sessionId) => json("GET", `v1/sessions/${seg(sessionId)}/messages`),
  /** ``keepalive``: the request outlives the page (a deletion sent as the page goes away). */
  deleteSession: (sessionId, keepalive = false) =>
    json("DELETE", `v1/sessions/${seg(sessionId)}`, { keepalive }),
  renameSession: (sessionId, title) => json("PATCH", `v1/sessions/${seg(sessionId)}`, { json: { title } }),
  /** The configured agents: {agents: [{name, description, model, skills, ready}]}. */
  agents: () => json("GET", "v1/agents"),
  /** Upload one file (multipart field ``file``): {file_id, filename, media_type, bytes, ...}. */
  uploadFile(file, signal) {
    const form = new FormData();
    form.append("file", file, file.name || "file");
    return json("POST", "v1/files", { body: form, signal });
  },
  /** A stored file's bytes, as a Blob. A file never changes under its id, so the browser's
   * cache may answer. */
  async fileContent(fileId, signal) {
    const response = await send("GET", `v1/files/${seg(fileId)}/content`, {
      extraHeaders: { Accept: "*/*" },
      signal,
      cache: "default",
    });
    return response.blob();
  },
  /** What an upload and a run's input may be: {max_bytes, media_types, max_input_bytes,
   * max_input_parts}. */
  fileLimits: () => json("GET", "v1/files/limits"),
  answer: (sessionId, runId, toolCallId, approved) =>
    json("POST", "external-events", {
      json: {
        session_id: sessionId,
        run_id: runId,
        name: "confirmation_response",
        payload: { tool_call_id: toolCallId, approved },
      },
    }),
};
