// The service's own SSE streams read by the third-party clients real apps use, unmodified:
// npm `eventsource` (the WHATWG EventSource, as browsers implement it) and
// `@microsoft/fetch-event-source` (what browser apps use for POST streams).
// Usage: node sse_scenarios.mjs SCENARIO JSON_ARGUMENTS
// Prints one JSON object: what the client saw. Exits non-zero on a failed check or timeout.
import assert from "node:assert/strict";
import { EventSource } from "eventsource";
import { fetchEventSource } from "@microsoft/fetch-event-source";

const [scenario, rawArgs] = process.argv.slice(2);
const args = JSON.parse(rawArgs);
const TERMINAL = new Set(["run.completed", "run.failed", "run.cancelled"]);
const deadline = (ms, what) =>
  // a timer that keeps the process alive too (the clients unref their own reconnect timers)
  new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), ms));

// eventsource: follow a run's events_url through cuts, and do NOT close at the end: the
// client must stop by itself, told by the server's 204 to its reconnect after the terminal
// event (a forgotten EventSource in a browser tab).
async function eventsource() {
  const events = [];
  const errors = [];
  let opens = 0;
  const source = new EventSource(args.url);
  const stopped = new Promise((resolve) => {
    source.onopen = () => void opens++;
    source.onerror = (error) => {
      errors.push({ code: error.code ?? null, message: String(error.message ?? "") });
      if (source.readyState === EventSource.CLOSED) resolve();
    };
  });
  for (const type of args.types) {
    source.addEventListener(type, (event) => {
      events.push({ type: event.type, id: event.lastEventId, data: JSON.parse(event.data) });
    });
  }
  await Promise.race([stopped, deadline(args.timeout_ms ?? 60000, "EventSource to stop")]);
  source.close();
  return { events, opens, errors, ready_state: source.readyState };
}

// fetch-event-source: POST a run start with an Idempotency-Key; after a cut the library sends
// the same POST again (with Last-Event-ID), as it does by default.
//
// One correction, which docs/api.md tells every user of this library to make: the library
// takes Last-Event-ID from an `id:` line as soon as it reads it, before the event is whole, so
// a cut inside an event would skip that event on the retry. The wrapped fetch sends the id of
// the last event actually delivered instead (and counts the retries where the two differ).
async function fetchEvents() {
  globalThis.window ??= globalThis; // the library schedules its retries on window
  globalThis.document ??= { hidden: false, addEventListener() {}, removeEventListener() {} };
  const events = [];
  const attempts = [];
  let ended = false;
  let delivered = null;
  let corrected = 0;
  const send = (input, init) => {
    const headers = { ...init.headers };
    if (headers["last-event-id"] !== (delivered ?? undefined)) corrected++;
    delete headers["last-event-id"];
    if (delivered !== null) headers["last-event-id"] = delivered;
    return fetch(input, { ...init, headers });
  };
  const done = fetchEventSource(args.url, {
    fetch: send,
    method: "POST",
    headers: { "content-type": "application/json", ...(args.headers ?? {}) },
    body: JSON.stringify(args.body),
    openWhenHidden: true,
    async onopen(response) {
      attempts.push({
        status: response.status,
        run_id: response.headers.get("x-run-id"),
        replayed: response.headers.get("idempotent-replayed"),
      });
      if (response.status === 204) {
        ended = true; // the server says this client already has the run's end
        throw new Error("204");
      }
      if (!response.ok) {
        ended = true;
        throw new Error(`HTTP ${response.status}: ${await response.text()}`);
      }
    },
    onmessage(message) {
      const data = JSON.parse(message.data);
      events.push({ type: message.event, id: message.id, data });
      delivered = message.id;
      if (TERMINAL.has(message.event)) ended = true;
    },
    onclose() {
      // a stream that ended before the run did was cut: have the library retry
      if (!ended) throw new Error("the stream ended before the run's terminal event");
    },
    onerror(error) {
      if (ended || attempts.length > 200) throw error; // stop: done, or hopeless
      return undefined; // retry after the server's retry: interval
    },
  }).catch((error) => {
    if (!ended) throw error;
  });
  await Promise.race([done, deadline(args.timeout_ms ?? 60000, "fetch-event-source to finish")]);
  return { events, attempts, corrected };
}

const scenarios = { eventsource, "fetch-event-source": fetchEvents };
assert.ok(scenarios[scenario], `no scenario ${scenario}`);
const result = await scenarios[scenario]();
process.stdout.write(JSON.stringify(result));
process.exit(0);
