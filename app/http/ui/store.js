// What the page remembers. localStorage (every tab, survives restarts): the current session,
// the list of sessions (the server's list as last seen, with the titles, so the page still has
// one when the server cannot be asked), the API key. sessionStorage (this tab, survives a
// reload): the run being followed, with the last event seen, so a reload resumes it.

const KEYS = {
  session: "agent-ui.session",
  sessions: "agent-ui.sessions",
  apiKey: "agent-ui.api-key",
  needsKey: "agent-ui.needs-key",
  activeRun: "agent-ui.active-run",
  agent: "agent-ui.agent",
};

/** The Recent list's length, and the page of GET /v1/sessions that fills it. */
export const MAX_SESSIONS = 50;

function read(storage, key, fallback) {
  try {
    const raw = storage.getItem(key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

function write(storage, key, value) {
  try {
    if (value === null || value === undefined) storage.removeItem(key);
    else storage.setItem(key, JSON.stringify(value));
  } catch {
    // private mode or a full quota: the page still works, it just forgets
  }
}

/** A new session id: 128 random bits (crypto.randomUUID needs a secure context; this does not). */
export function newSessionId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A new Idempotency-Key for one send: 128 random bits. */
export function newSendKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "send-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export const store = {
  sessionId() {
    let id = read(localStorage, KEYS.session, null);
    if (typeof id !== "string" || !/^[A-Za-z0-9._:-]{1,128}$/.test(id)) {
      id = newSessionId();
      write(localStorage, KEYS.session, id);
    }
    return id;
  },
  setSessionId(id) {
    write(localStorage, KEYS.session, id);
  },

  /** [{id, title, updated}] newest first; `updated` in ms of this browser's clock. */
  sessions() {
    const list = read(localStorage, KEYS.sessions, []);
    return Array.isArray(list) ? list.filter((s) => s && typeof s.id === "string") : [];
  },
  touchSession(id, title) {
    const list = store.sessions();
    const found = list.find((s) => s.id === id);
    const entry = { id, title: found?.title || title || "New chat", updated: Date.now() };
    write(localStorage, KEYS.sessions, [entry, ...list.filter((s) => s.id !== id)].slice(0, MAX_SESSIONS));
  },
  forgetSession(id) {
    write(localStorage, KEYS.sessions, store.sessions().filter((s) => s.id !== id));
  },
  setSessions(list) {
    write(localStorage, KEYS.sessions, list.slice(0, MAX_SESSIONS));
  },

  apiKey: () => read(localStorage, KEYS.apiKey, "") || "",
  setApiKey(key) {
    write(localStorage, KEYS.apiKey, key || null);
  },
  needsKey: () => Boolean(read(localStorage, KEYS.needsKey, false)),
  setNeedsKey(value) {
    write(localStorage, KEYS.needsKey, value ? true : null);
  },

  /** The agent chosen in the picker (null: the server's default). */
  agent: () => read(localStorage, KEYS.agent, null),
  setAgent(name) {
    write(localStorage, KEYS.agent, name || null);
  },

  /** {runId, sessionId, lastSeq, turn} of the run this tab follows, or null. */
  activeRun: () => read(sessionStorage, KEYS.activeRun, null),
  setActiveRun(snapshot) {
    write(sessionStorage, KEYS.activeRun, snapshot);
  },
};
