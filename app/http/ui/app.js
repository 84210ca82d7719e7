// The chat page: sends prompts, follows runs over SSE (reconnecting with Last-Event-ID),
// answers confirmations, lists the caller's sessions (GET /v1/sessions, kept in
// localStorage for when the server cannot be asked), and shows one branch of the
// conversation at a time (branches.js: edit and regenerate add branches, "‹ 2 / 3 ›" steps).

import { api, ApiError } from "./api.js";
import { AttachmentTray } from "./attachments.js";
import { BranchTree, BranchView } from "./branches.js";
import { ConfirmDialog } from "./confirm.js";
import { copyText, plainTitle } from "./markdown.js";
import { ACCEPT, adoptFileUrl, DEFAULT_LIMITS, fileUrl, releaseFileUrls } from "./media.js";
import { readEventStream } from "./sse.js";
import { MAX_SESSIONS, newSendKey, newSessionId, store } from "./store.js";
import { contentFiles, h, newTurn, TurnView, turnOptions, turnsFromMessages } from "./view.js";

const $ = (id) => document.getElementById(id);
const els = {
  app: $("app"),
  chat: $("chat"),
  log: $("log"),
  empty: $("empty"),
  composer: $("composer"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  stopLabel: $("stop-label"),
  title: $("chat-title"),
  sessionId: $("session-id"),
  sessions: $("sessions"),
  sidebar: $("sidebar"),
  scrim: $("scrim"),
  menu: $("menu-button"),
  conn: $("conn"),
  announcer: $("announcer"),
  keyButton: $("key-button"),
  keyDialog: $("key-dialog"),
  keyForm: $("key-form"),
  keyInput: $("api-key"),
  keyError: $("key-error"),
  agentPicker: $("agent-picker"),
  agentSelect: $("agent"),
  rename: $("rename"),
  jump: $("jump"),
  composerWrap: $("composer-wrap"),
  attach: $("attach"),
  fileInput: $("file-input"),
  attachments: $("attachments"),
  attachMessage: $("attach-message"),
};
// the open conversation: every branch's turns, one branch shown (branches.js)
const branches = new BranchView(els.log);

const TERMINAL = new Set(["run.completed", "run.failed", "run.cancelled"]);
const STORED = new Set(["completed", "cancelled"]); // how a run ends that stores its turn
const STALL_MS = 45_000; // the server pings every 15 s of silence: three missed pings
const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];
// a send whose POST got no answer at all is sent again (same Idempotency-Key) this often
const SEND_RETRIES = 4;
// a deleted conversation can be brought back this long; then the DELETE is sent
const UNDO_MS = 5000;

let sessionId = store.sessionId();
let current = null; // the run this tab follows: {runId, sessionId, view, lastSeq, ...}
let afterKey = null; // what to do once an API key is saved
let serverOffset = 0; // server clock minus ours, in ms (from the Date header)
let loadToken = 0;
let listToken = 0;
let agents = []; // GET /v1/agents, when the server has it
let following = true; // the view keeps the end of the conversation in sight
let lastScrollTop = 0;
let pendingDelete = null; // {id, entry, wasCurrent, timer}: deleted here, DELETE not sent yet

const serverNow = () => Date.now() + serverOffset;

function noteServerClock(response) {
  const date = Date.parse(response.headers.get("date") || "");
  if (Number.isNaN(date)) return;
  // Date has one-second resolution: only trust an offset clearly beyond it
  const offset = date + 500 - Date.now();
  serverOffset = Math.abs(offset) > 1500 ? offset : 0;
}

// --- small helpers -----------------------------------------------------------------------

function announce(text) {
  els.announcer.textContent = "";
  // a fresh text node so the same message twice is announced twice
  requestAnimationFrame(() => (els.announcer.textContent = text));
}

function setConn(state, text = "") {
  els.conn.dataset.state = state;
  els.conn.textContent = text;
}

// --- following the end of the conversation ----------------------------------------------
//
// As chat pages do: while the reader is at the bottom, the view follows what arrives (an
// answer growing word by word, a tool card, an error); scrolling up stops that, and scrolling
// back down to the bottom (or "Jump to the latest") starts it again. The view moves when the
// conversation's size changes (a ResizeObserver), so it follows what is drawn, whenever it is
// drawn (an answer is rendered once a frame), not only what arrived.

function atBottom() {
  const c = els.chat;
  return c.scrollHeight - c.scrollTop - c.clientHeight < 24;
}

function showJump() {
  els.jump.hidden = following || atBottom();
}

/** Keep the end in sight (``force``: start following again, as after a send). */
function scrollToEnd(force = false) {
  if (force) following = true;
  if (following) els.chat.scrollTop = els.chat.scrollHeight;
  lastScrollTop = els.chat.scrollTop;
  showJump();
}

function watchScrolling() {
  els.chat.addEventListener(
    "scroll",
    () => {
      const top = els.chat.scrollTop;
      // growing content never moves scrollTop: a move up is the reader's (or the content
      // shrank, and then the view is still at the bottom)
      if (atBottom()) following = true;
      else if (top < lastScrollTop) following = false;
      lastScrollTop = top;
      showJump();
    },
    { passive: true },
  );
  const onResize = () => {
    if (following) els.chat.scrollTop = els.chat.scrollHeight;
    lastScrollTop = els.chat.scrollTop;
    showJump();
  };
  const observer = new ResizeObserver(onResize);
  observer.observe(els.log);
  observer.observe(els.chat);
  els.jump.addEventListener("click", () => {
    scrollToEnd(true);
    els.prompt.focus({ preventScroll: true });
  });
}

function setBusy(busy) {
  // the button about to hide must not take the keyboard focus with it
  if (document.activeElement === (busy ? els.send : els.stop)) els.prompt.focus();
  els.send.hidden = busy;
  els.stop.hidden = !busy;
  els.stop.disabled = false;
  els.stopLabel.textContent = "Stop";
  els.log.setAttribute("aria-busy", busy ? "true" : "false");
  els.app.dataset.busy = busy ? "true" : "false";
  if (!busy) setConn("idle");
}

function showEmpty(show) {
  els.empty.hidden = !show;
  els.app.dataset.empty = show ? "true" : "false";
}

function describe(error) {
  if (error instanceof ApiError) return error.detail || error.title || error.code;
  return String(error?.message || error);
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      window.removeEventListener("online", done);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    window.addEventListener("online", done); // back online: retry at once
    signal?.addEventListener("abort", done);
  });
}

// --- sessions ----------------------------------------------------------------------------

function renderSessions() {
  const list = store
    .sessions()
    .filter((s) => s.id !== pendingDelete?.id)
    .map((s) => ({ ...s, title: plainTitle(s.title) || "New chat" }));
  if (!list.some((s) => s.id === sessionId)) list.unshift({ id: sessionId, title: "New chat", updated: Date.now() });
  els.sessions.replaceChildren(
    ...list.map((s) => {
      const active = s.id === sessionId;
      return h(
        "li",
        { class: "session-item" },
        h(
          "button",
          {
            type: "button",
            class: "session",
            "aria-current": active ? "page" : null,
            "data-session": s.id,
            title: s.title,
          },
          h("span", { class: "session-title", text: s.title }),
          h("span", { class: "session-when", text: relativeTime(s.updated) }),
        ),
        h(
          "button",
          {
            type: "button",
            class: "icon-button session-delete",
            "data-delete": s.id,
            "aria-label": `Delete the conversation “${s.title}”`,
          },
          h("span", { "aria-hidden": "true", text: "×" }),
        ),
      );
    }),
  );
  const title = list.find((s) => s.id === sessionId)?.title || "New chat";
  els.title.textContent = title;
  els.sessionId.textContent = sessionId;
  document.title = `${title} · agent-server`;
}

/** A prompt as a list entry's title until the server's is known: one line, as the server
 * keeps it (its Markdown is stripped where it is shown). */
function titleOf(prompt, attachments = []) {
  const text = (prompt || "").trim().replace(/\s+/g, " ").slice(0, 200);
  return text || attachments.find((a) => a.filename)?.filename || "";
}

/**
 * Fill the Recent list from the server, so it shows the caller's conversations from any
 * browser. The answer replaces the stored list, which keeps the titles and stands in for the
 * server when it cannot be asked (offline, no key yet, an older server): then the list stays
 * as it was.
 */
async function refreshSessions() {
  const token = ++listToken;
  const asked = Date.now();
  let page;
  try {
    page = await api.sessions(MAX_SESSIONS);
  } catch {
    return;
  }
  if (token !== listToken) return; // a later refresh (after a deletion, say) is under way
  // each session carries its own title (its first input, or what it was renamed to)
  const known = new Map(store.sessions().map((s) => [s.id, s]));
  const listed = page.sessions.map((item) => {
    const local = known.get(item.session_id);
    // touched since the request went out (a run just started here): the fresher entry
    if (local && local.updated > asked) return local;
    return {
      id: item.session_id,
      title: item.title || local?.title || "",
      updated: Date.parse(item.updated_at) - serverOffset,
    };
  });
  const ids = new Set(listed.map((s) => s.id));
  // sessions first used here after the request went out are not in the answer yet
  const fresh = [...known.values()].filter((s) => s.updated > asked && !ids.has(s.id));
  const list = [...fresh, ...listed].sort((a, b) => b.updated - a.updated);
  if (JSON.stringify(list) === JSON.stringify(store.sessions())) return;
  store.setSessions(list);
  renderSessions();
}

function relativeTime(ms) {
  const minutes = Math.round((Date.now() - ms) / 60_000);
  if (minutes < 1) return "just now";
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.round(minutes / 60);
  if (hours < 24) return `${hours} h ago`;
  return new Date(ms).toLocaleDateString();
}

function leaveCurrentRun() {
  // stop following (the run goes on server-side; coming back re-attaches to it)
  if (!current) return;
  current.abandoned = true;
  current.connection?.abort();
  current = null;
  confirmDialog.close();
  setBusy(false);
}

function switchSession(id) {
  closeSidebar();
  if (id === sessionId && !current?.abandoned) return;
  leaveCurrentRun();
  sessionId = id;
  store.setSessionId(id);
  renderSessions();
  loadSession();
}

function newChat() {
  closeSidebar();
  leaveCurrentRun();
  sessionId = newSessionId();
  store.setSessionId(sessionId);
  renderSessions();
  els.log.replaceChildren();
  branches.tree = new BranchTree();
  showEmpty(true);
  els.prompt.focus();
}

/**
 * × removes the conversation from the list at once and offers Undo for a few seconds; only
 * then is the DELETE sent. Deleting another one, or leaving the page, sends the earlier
 * deletion at once (leaving: as a keepalive request, which outlives the page).
 */
function deleteSession(id) {
  flushDelete();
  // the × goes away with the entry: its focus goes to Undo rather than to nothing
  const hadFocus = Boolean(document.activeElement?.closest?.(".sessions"));
  const entry = store.sessions().find((s) => s.id === id) || { id, title: "", updated: Date.now() };
  const wasCurrent = id === sessionId;
  const pending = { id, entry, wasCurrent, timer: null };
  pending.timer = setTimeout(() => commitDelete(pending), UNDO_MS);
  pendingDelete = pending;
  if (wasCurrent) newChat();
  else renderSessions();
  const title = plainTitle(entry.title) || "New chat";
  toast(`Deleted “${title}”`, () => undoDelete(pending), { label: "Undo", ms: UNDO_MS, focus: hadFocus });
  announce("Conversation deleted. Undo is offered for a few seconds.");
}

function undoDelete(pending) {
  if (pendingDelete !== pending) return;
  clearTimeout(pending.timer);
  pendingDelete = null;
  if (pending.wasCurrent && !current) switchSession(pending.id);
  else renderSessions();
  announce("Conversation restored");
}

/** Send the waiting deletion now (another one was asked for, or the page is going away). */
function flushDelete(leaving = false) {
  const pending = pendingDelete;
  if (!pending) return;
  clearTimeout(pending.timer);
  commitDelete(pending, leaving);
}

async function commitDelete(pending, leaving = false) {
  if (pendingDelete === pending) pendingDelete = null;
  if (!leaving) document.querySelector(".toast[data-kind=undo]")?.remove();
  try {
    await api.deleteSession(pending.id, leaving);
  } catch (error) {
    if (leaving) return;
    if (error instanceof ApiError && error.status === 401) return needKey(() => commitDelete(pending));
    if (!(error instanceof ApiError && error.status === 404)) {
      // not deleted (a run is active in it, say): it is listed again
      renderSessions();
      announce(`Could not delete: ${describe(error)}`);
      toast(`Could not delete the conversation: ${describe(error)}`);
      return;
    }
  }
  store.forgetSession(pending.id);
  renderSessions();
  refreshSessions();
}

// --- loading a session -------------------------------------------------------------------

async function loadSession() {
  const token = ++loadToken;
  const id = sessionId;
  els.log.replaceChildren();
  branches.tree = new BranchTree();
  releaseFileUrls();
  showEmpty(false);
  let messages = [];
  if (!store.sessions().some((s) => s.id === id)) {
    // a session this browser made and never used: the server has not heard of it yet
    showEmpty(true);
    return;
  }
  els.app.dataset.loading = "true";
  let runs = [];
  try {
    const stored = await api.messages(id);
    messages = stored.messages;
    runs = stored.runs || [];
  } catch (error) {
    if (token !== loadToken) return;
    if (error instanceof ApiError && error.status === 401) {
      els.app.dataset.loading = "false";
      showEmpty(true);
      return needKey(() => loadSession());
    }
    if (!(error instanceof ApiError && error.status === 404)) {
      els.app.dataset.loading = "false";
      toast(`Could not load the conversation: ${describe(error)}`, () => loadSession());
      return;
    }
  }
  if (token !== loadToken) return;
  els.app.dataset.loading = "false";
  const tree = BranchTree.fromTurns(turnsFromMessages(messages, runs));
  branches.tree = tree;
  const known = new Set(messages.map((m) => m.run_id));

  const snapshot = store.activeRun();
  if (snapshot && snapshot.sessionId === id && snapshot.runId) {
    if (known.has(snapshot.runId)) {
      store.setActiveRun(null); // it finished while the page was away
    } else {
      // the branch the run continues, then the run
      const parent = snapshot.turn?.parent;
      branches.show(tree.path(parent === undefined ? tree.latest : parent));
      showEmpty(false);
      follow(snapshot.runId, snapshot.turn, snapshot.lastSeq);
      scrollToEnd(true);
      return;
    }
  }
  // the newest branch: the one the latest turn is on
  branches.show(tree.path(tree.latest));
  showEmpty(messages.length === 0);
  scrollToEnd(true); // opened at its end, following what comes
  // a run started elsewhere (another tab, a script) and still going: follow it from the start
  try {
    const info = await api.session(id);
    const runId = info.active_run_id;
    if (token === loadToken && runId && !current && !known.has(runId)) {
      const held = await promptOf(runId);
      if (token !== loadToken || current) return;
      showEmpty(false);
      follow(runId, newTurn(held.text, runId, held.attachments), 0);
    }
  } catch {
    // 404: a new session; anything else shows up on the next action
  }
}

// --- runs --------------------------------------------------------------------------------

function persist(run) {
  if (run.abandoned || !run.runId) return;
  store.setActiveRun({ runId: run.runId, sessionId: run.sessionId, lastSeq: run.lastSeq, turn: run.view.turn });
}

/** The prompt a run was started with (for a run this tab did not start): {text, attachments};
 * text is null when it is not known. */
async function promptOf(runId) {
  let input;
  try {
    input = (await api.getRun(runId)).input;
  } catch {
    input = null; // the turn goes without its prompt, as before the field existed
  }
  if (!Array.isArray(input)) return { text: input ?? null, attachments: [] };
  const text = input
    .filter((part) => part?.type === "text")
    .map((part) => part.text || "")
    .join("\n\n");
  return { text, attachments: contentFiles(input) };
}

/** A run's ``input``: the text alone, or the files as content parts, then the text. */
function inputOf(prompt, attachments) {
  if (!attachments.length) return prompt;
  const parts = attachments.map((a) => ({ type: a.kind === "image" ? "image" : "file", file_id: a.file_id }));
  if (prompt.trim()) parts.push({ type: "text", text: prompt });
  return parts;
}

function newRun(view) {
  return { runId: null, sessionId, view, lastSeq: 0, done: false, abandoned: false, connection: null, stopRequested: false };
}

/** POST the run; a network failure (no answer at all) sends the same POST again with the same
 * Idempotency-Key a few times: the server attaches a repeat to the run the first one may have
 * started, so a dropped connection never doubles the user's turn. */
async function startWithKey(run, input, options) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await api.startRun(sessionId, input, run.connection.signal, options);
    } catch (error) {
      const lost = error instanceof ApiError && error.code === "network";
      if (!lost || run.abandoned || attempt >= SEND_RETRIES) throw error;
      setConn("warn", "Reconnecting…");
      await sleep(BACKOFF_MS[Math.min(attempt, BACKOFF_MS.length - 1)], run.connection.signal);
    }
  }
}

/**
 * Send ``prompt`` as a new run, with the stored files of ``attachments`` (see newTurn). The
 * run continues ``parent`` (a turn's run id; null: none, a new first turn), by default the
 * last turn shown. With ``beside`` (a turn's element, for edit and regenerate) it is a new
 * branch beside that turn, continuing that turn's parent: the turn and the ones after it give
 * way while the run starts (they stay stored, a step away on "‹ ›"), and come back if the
 * start fails. ``key`` is the send's Idempotency-Key: the Retry of a failed send keeps it, so
 * a retry that reaches a run the failed attempt did start follows that run instead of
 * starting a second. ``strategy``: the multitask_strategy.
 */
async function send(
  prompt,
  { beside = null, parent = undefined, key = newSendKey(), strategy = null, attachments = [] } = {},
) {
  if (current || !(prompt.trim() || attachments.length)) return;
  showEmpty(false);
  if (parent === undefined) parent = beside ? branches.parentOf(beside) : branches.head();
  const branchFrom = branches.tree.branchFrom(parent);
  const giving = beside ? branches.from(beside) : [];
  for (const el of giving) el.hidden = true;
  const turn = newTurn(prompt, null, attachments);
  turn.parent = parent;
  const view = new TurnView(turn);
  els.log.append(view.el);
  scrollToEnd(true);
  store.touchSession(sessionId, titleOf(prompt, attachments));
  renderSessions();
  const run = newRun(view);
  current = run;
  setBusy(true);
  setConn("busy", "Sending…");
  run.connection = new AbortController();
  let response;
  try {
    const input = inputOf(prompt, attachments);
    response = await startWithKey(run, input, { agent: chosenAgent(), branchFrom, key, strategy });
  } catch (error) {
    if (run.abandoned) return;
    current = null;
    setBusy(false);
    for (const el of giving) el.hidden = false;
    startFailed(view, error, prompt, { parent, beside, key });
    return;
  }
  for (const el of giving) {
    el.hidden = false; // shown again when the person steps back to its branch
    el.remove();
  }
  noteServerClock(response);
  run.runId = response.headers.get("x-run-id");
  view.turn.runId = run.runId;
  if (!branches.tree.has(run.runId)) branches.tree.add(view.turn, parent, view);
  branches.render();
  persist(run);
  if (run.stopRequested) stop();
  await drive(run, response);
}

function follow(runId, turn, lastSeq) {
  // a run this tab did not start continues the latest turn, as far as the page can tell
  const tree = branches.tree;
  if (turn.parent === undefined) turn.parent = tree.latest;
  const view = new TurnView(turn);
  els.log.append(view.el);
  if (!tree.has(runId)) tree.add(turn, turn.parent, view);
  branches.render();
  const run = newRun(view);
  run.runId = runId;
  run.lastSeq = lastSeq;
  current = run;
  setBusy(true);
  persist(run);
  drive(run, null);
}

/** Read the run's events until its terminal event, reconnecting as often as it takes. */
async function drive(run, response) {
  let attempt = 0;
  for (;;) {
    if (response) {
      const status = run.view.turn.status;
      if (status === "reconnecting" || status === "sending") {
        run.view.turn.status = "running";
        run.view.renderStatus();
      }
      setConn("busy", "Streaming");
      // a question restored from before a reload is asked again (no new event may come)
      syncConfirmation(run);
      try {
        await consume(run, response);
      } catch (error) {
        if (run.abandoned) return;
        // a dropped connection (TypeError) or the stall watchdog (AbortError): reconnect
        // below; anything else is a bug worth seeing
        if (!(error instanceof TypeError) && error?.name !== "AbortError") console.error(error);
      }
      if (run.abandoned) return;
      if (run.done) break;
    }
    if (run.abandoned) return;
    response = null;
    run.view.turn.status = "reconnecting";
    run.view.renderStatus();
    setConn("warn", "Reconnecting…");
    if (attempt === 1) announce("Connection lost, reconnecting");
    await sleep(BACKOFF_MS[Math.min(attempt, BACKOFF_MS.length - 1)], run.connection?.signal);
    attempt += 1;
    if (run.abandoned) return;
    run.connection = new AbortController();
    try {
      response = await api.followRun(run.runId, run.lastSeq, run.connection.signal);
      noteServerClock(response);
      attempt = Math.min(attempt, 1);
      if (response.status === 204) {
        // the page already has the run's terminal event (it was cut right after it): the
        // record says how it ended
        await runGone(run);
        break;
      }
    } catch (error) {
      if (run.abandoned) return;
      if (error instanceof ApiError && error.status === 401) {
        await new Promise((resolve) => needKey(resolve));
      } else if (error instanceof ApiError && error.status === 404) {
        await runGone(run);
        break;
      }
    }
  }
  finish(run);
}

async function consume(run, response) {
  let watchdog = null;
  const connection = run.connection;
  const arm = () => {
    clearTimeout(watchdog);
    watchdog = setTimeout(() => connection.abort(), STALL_MS);
  };
  arm();
  try {
    await readEventStream(response, {
      onActivity: arm,
      onEvents: (events) => {
        if (run.abandoned) return true;
        for (const sse of events) {
          let wire;
          try {
            wire = JSON.parse(sse.data);
          } catch {
            continue;
          }
          const seq = Number(wire.seq ?? sse.id);
          // never apply an event twice; but a run.resumed restarts the count: after a restart
          // of the only worker its log begins again below the seqs this page saw, which it
          // replays from the run.resumed (whose from_seq says which words to drop)
          if (seq <= run.lastSeq && wire.type !== "run.resumed") continue;
          run.view.apply(wire);
          run.lastSeq = seq;
          if (TERMINAL.has(wire.type)) run.done = true;
        }
        persist(run);
        syncConfirmation(run);
        if (!run.done) {
          if (run.view.turn.status === "waiting") setConn("warn", "Needs your approval");
          else setConn("busy", "Streaming");
        }
        scrollToEnd();
        return run.done;
      },
    });
  } finally {
    clearTimeout(watchdog);
  }
}

async function runGone(run) {
  // the event log expired: show what the run's record says
  try {
    const info = await api.getRun(run.runId);
    const turn = run.view.turn;
    if (info.status === "completed") {
      const text = run.view.textParts().map((p) => p.text).join("");
      const content = info.output?.content || "";
      if (content.startsWith(text)) run.view.appendText(content.slice(text.length));
      turn.status = "completed";
      turn.usage = info.usage;
    } else if (info.status === "failed") {
      turn.status = "failed";
      turn.end = { kind: "failed", code: info.error?.code || "internal", message: info.error?.message || "" };
    } else {
      turn.status = "cancelled";
      turn.end = { kind: "cancelled", reason: "cancel_requested" };
    }
    run.view.renderStatus();
  } catch (error) {
    run.view.showError("This run can no longer be followed", describe(error));
  }
}

function finish(run) {
  if (current === run) current = null;
  store.setActiveRun(null);
  confirmDialog.settled(null);
  setBusy(false);
  const turn = run.view.turn;
  if (!STORED.has(turn.status)) {
    // a failed run stores no turn: it is no branch to step to or continue (it stays on
    // screen until the page shows another branch)
    branches.tree.remove(run.runId);
    branches.render();
  }
  store.touchSession(run.sessionId, titleOf(turn.prompt, turn.attachments));
  renderSessions();
  refreshSessions();
  if (turn.status === "completed") announce("Answer complete");
  else if (turn.status === "cancelled") announce("Run stopped");
  else if (turn.status === "failed") announce(`Run failed: ${turn.end?.code || ""}`);
  if (!document.activeElement || document.activeElement === document.body) els.prompt.focus();
}

async function stop() {
  const run = current;
  if (!run) return;
  els.stop.disabled = true;
  els.stopLabel.textContent = "Stopping…";
  if (!run.runId) {
    run.stopRequested = true;
    return;
  }
  try {
    await api.cancelRun(run.runId);
    // the run.cancelled event arrives on the stream and ends the turn
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return needKey(() => stop());
    els.stop.disabled = false;
    els.stopLabel.textContent = "Stop";
    toast(`Could not stop the run: ${describe(error)}`);
  }
}

// --- errors before a run starts ----------------------------------------------------------

const ERROR_TITLES = {
  overloaded: "The server is busy right now",
  draining: "The server is shutting down",
  starting: "The server is still starting",
  unavailable: "The server is not ready yet",
  session_busy: "This conversation already has a run in progress",
  unauthorized: "This server needs an API key",
  payload_too_large: "That message is too long for the server",
  input_too_large: "The attached files are too large together",
  too_many_parts: "That message has too many attachments",
  file_not_found: "An attached file is no longer on the server",
  unsupported_media_type: "The server does not take one of the attached files",
  validation_error: "The server did not accept the request",
  network: "The server could not be reached",
  internal: "The server failed to answer",
};

/** ``branch``: where the failed send went, {parent, beside, key} (see send). */
function startFailed(view, error, prompt, { parent, beside = null, key } = {}) {
  const attachments = view.turn.attachments || [];
  // the same branch again; the turn it was sent beside is hidden again if it is still shown
  const again = (options) => send(prompt, { parent, beside: beside?.isConnected ? beside : null, attachments, ...options });
  const err = error instanceof ApiError ? error : new ApiError({ detail: describe(error) });
  const title = ERROR_TITLES[err.code] || err.title || `Error ${err.status}`;
  let detail = err.detail ? err.detail.charAt(0).toUpperCase() + err.detail.slice(1) : "";
  const actions = [];
  const retry = h("button", { type: "button", class: "button small", text: "Retry" });
  retry.addEventListener("click", () => {
    if (current) return;
    view.el.remove();
    again({ key });
  });
  if (err.retryAfter !== null && err.retryAfter !== undefined) {
    const seconds = err.retryAfter;
    detail = `${detail ? detail.replace(/\.?$/, ". ") : ""}Try again in ${seconds} second${seconds === 1 ? "" : "s"}.`;
    countdownButton(retry, seconds);
  }
  if (err.code === "session_busy" && err.body?.active_run_id) {
    const runId = err.body.active_run_id;
    // the choice the API offers (multitask_strategy): wait behind the active run, or stop it
    // (its turn stays, stopped) and send this message instead
    for (const [label, strategy] of [
      ["Send after it", "enqueue"],
      ["Stop it and send", "interrupt"],
    ]) {
      actions.push(
        h("button", {
          type: "button",
          class: "button small",
          text: label,
          onclick: () => {
            if (current) return;
            view.el.remove();
            // a new send: another body under the old key would be refused as a reuse
            again({ strategy });
          },
        }),
      );
    }
    actions.push(
      h("button", {
        type: "button",
        class: "button small primary",
        text: "Follow that run",
        onclick: async (event) => {
          const button = event.currentTarget;
          if (current || button.disabled) return;
          button.disabled = true; // one follow, however often it is clicked meanwhile
          const held = await promptOf(runId);
          button.disabled = false;
          if (current) return;
          view.el.remove();
          follow(runId, newTurn(held.text, runId, held.attachments), 0);
        },
      }),
    );
  }
  if (err.status !== 401) actions.push(retry);
  const box = view.showError(title, detail, actions);
  box.dataset.code = err.code;
  announce(`${title}. ${detail}`);
  if (err.status === 401) {
    needKey(() => {
      view.el.remove();
      again({ key });
    });
  }
  scrollToEnd(true);
}

function countdownButton(button, seconds) {
  let left = seconds;
  const label = () => {
    button.textContent = left > 0 ? `Retry in ${left} s` : "Retry";
    button.disabled = left > 0;
  };
  label();
  const timer = setInterval(() => {
    left -= 1;
    label();
    if (left <= 0 || !button.isConnected) clearInterval(timer);
  }, 1000);
}

let toastTimer = null;
/** A short message at the bottom, with an optional action (``label``, Retry by default). */
function toast(text, action, { label = "Retry", ms = 8000, focus = false } = {}) {
  let el = document.querySelector(".toast");
  if (!el) {
    el = h("div", { class: "toast", role: "alert" });
    document.body.append(el);
  }
  el.dataset.kind = label === "Undo" ? "undo" : "message";
  el.replaceChildren(h("span", { text }));
  if (action) {
    const act = () => {
      el.remove();
      action();
    };
    const button = h("button", { type: "button", class: "button small", text: label, onclick: act });
    el.append(button);
    if (focus) button.focus();
  }
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => el.remove(), ms);
}

// --- API key -----------------------------------------------------------------------------

function needKey(then) {
  afterKey = then;
  store.setNeedsKey(true);
  els.keyButton.hidden = false;
  const hadKey = Boolean(store.apiKey());
  openKeyDialog(hadKey ? "The server did not accept the saved key. Enter another one." : "");
}

function openKeyDialog(error = "") {
  els.keyError.textContent = error;
  els.keyInput.value = store.apiKey();
  if (!els.keyDialog.open) els.keyDialog.showModal();
  els.keyInput.focus();
  els.keyInput.select();
}

function saveKey(event) {
  event.preventDefault();
  const key = els.keyInput.value.trim();
  if (!key) {
    els.keyError.textContent = "Enter a key, or Cancel.";
    els.keyInput.focus();
    return;
  }
  store.setApiKey(key);
  els.keyDialog.close();
  const then = afterKey;
  afterKey = null;
  announce("API key saved");
  refreshSessions(); // the key's own conversations
  loadAgents();
  loadLimits();
  if (then) then();
  else loadSession();
}

// --- confirmations -----------------------------------------------------------------------

const confirmDialog = new ConfirmDialog($("confirm"), {
  now: serverNow,
  answer: (request, approved) => api.answer(request.sessionId, request.runId, request.tool_call_id, approved),
  onDecision: (request, decision) => {
    if (current && current.runId === request.runId) {
      current.view.markDecision(request.tool_call_id, decision === "expired" ? "denied" : decision);
      persist(current);
    }
    const said = { approved: "Approved", denied: "Denied", expired: "The request expired" };
    announce(said[decision] || "The request is no longer pending");
  },
  onError: (error) => {
    if (error instanceof ApiError && error.status === 401) needKey(null);
  },
});

function syncConfirmation(run) {
  const pending = run.view.pendingConfirmation();
  const openId = confirmDialog.openId;
  if (openId && (!pending || pending.id !== openId)) {
    const part = run.view.turn.parts.find((p) => p.id === openId);
    confirmDialog.settled(part);
  }
  if (pending && confirmDialog.openId === null && !run.done) {
    confirmDialog.open({ ...pending.confirmation, sessionId: run.sessionId, runId: run.runId });
    announce(`Approval needed: ${pending.name}`);
  }
}

// --- branches ------------------------------------------------------------------------------

/** Step between the branches of the turn ``turnEl`` (not while a run is going). */
function stepBranch(turnEl, delta) {
  if (current) return;
  const position = branches.step(turnEl, delta);
  if (position) announce(`Branch ${position.index} of ${position.count}`);
}

// --- copy, edit, regenerate ----------------------------------------------------------------

const viewOf = (turnEl) => TurnView.of(turnEl);

async function copyFrom(button, text) {
  const ok = await copyText(text);
  const label = button.querySelector("span") || button;
  const before = label.textContent;
  label.textContent = ok ? "Copied" : "Copy failed";
  button.dataset.copied = ok ? "true" : "false";
  announce(ok ? "Copied to the clipboard" : "Could not copy");
  setTimeout(() => {
    label.textContent = before;
    delete button.dataset.copied;
  }, 1500);
}

/** A turn's prompt becomes a text box: Send sends it as a new branch beside the turn (the
 * old one stays, a step away on "‹ ›"), Escape cancels. */
function startEdit(turnEl) {
  const view = viewOf(turnEl);
  if (!view || current || turnEl.querySelector(".edit-form")) return;
  const bubble = turnEl.querySelector(".msg.user .bubble");
  const box = h("textarea", { class: "edit-box", rows: "3", "aria-label": "Edit the message" });
  box.value = view.turn.prompt || "";
  const cancel = h("button", { type: "button", class: "button small", text: "Cancel" });
  const save = h("button", { type: "submit", class: "button small primary", text: "Send" });
  const form = h("form", { class: "edit-form" }, box, h("div", { class: "actions" }, cancel, save));
  // the message's own Copy and Edit stay hidden while it is being edited
  const actions = turnEl.querySelector(".user-actions");
  const close = () => {
    form.remove();
    bubble.hidden = !view.turn.prompt;
    if (actions) actions.hidden = false;
    turnEl.querySelector("[data-action=edit]")?.focus();
  };
  cancel.addEventListener("click", close);
  form.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      close();
    } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = box.value;
    const attachments = view.turn.attachments || [];
    if (!(text.trim() || attachments.length) || current) return;
    form.remove();
    bubble.hidden = !view.turn.prompt;
    if (actions) actions.hidden = false;
    send(text, { beside: turnEl, attachments });
  });
  bubble.hidden = true;
  if (actions) actions.hidden = true;
  bubble.after(form);
  box.focus();
  box.setSelectionRange(box.value.length, box.value.length);
}

function onTurnAction(button) {
  const turnEl = button.closest(".turn");
  const view = turnEl && viewOf(turnEl);
  switch (button.dataset.action) {
    case "copy-answer":
      if (view) copyFrom(button, view.answerText());
      break;
    case "copy-prompt":
      if (view) copyFrom(button, view.turn.prompt || "");
      break;
    case "edit":
      startEdit(turnEl);
      break;
    case "regenerate":
      if (view && !current) send(view.turn.prompt || "", { beside: turnEl, attachments: view.turn.attachments || [] });
      break;
    case "branch-prev":
      stepBranch(turnEl, -1);
      break;
    case "branch-next":
      stepBranch(turnEl, 1);
      break;
  }
}

// --- agents and titles -----------------------------------------------------------------------

function chosenAgent() {
  const name = store.agent();
  return agents.length > 1 && agents.some((a) => a.name === name) ? name : null;
}

/** The agent picker, when the server lists more than one agent (GET /v1/agents). */
async function loadAgents() {
  try {
    agents = (await api.agents()).agents || [];
  } catch {
    agents = []; // an older server (404), or no key yet: one agent, no picker
  }
  const many = agents.length > 1;
  turnOptions.showAgent = many;
  els.agentPicker.hidden = !many;
  if (!many) return;
  const chosen = chosenAgent() || (agents.some((a) => a.name === "default") ? "default" : agents[0].name);
  els.agentSelect.replaceChildren(
    ...agents.map((agent) =>
      h(
        "option",
        { value: agent.name, disabled: agent.ready === false ? true : null, title: agent.description || null },
        agent.ready === false ? `${agent.name} (not ready)` : agent.name,
      ),
    ),
  );
  els.agentSelect.value = chosen;
  store.setAgent(chosen);
}

function startRename() {
  if (els.title.querySelector("input")) return;
  const entry = store.sessions().find((s) => s.id === sessionId);
  if (!entry) return; // nothing sent yet: the server has no session to rename
  const input = h("input", { class: "rename-box", "aria-label": "Conversation title", maxlength: "200" });
  const shown = plainTitle(entry.title);
  input.value = shown;
  let finished = false;
  const done = async (save) => {
    if (finished) return; // Enter, then the blur of the box going away
    finished = true;
    const title = input.value.trim().replace(/\s+/g, " ");
    input.remove();
    els.rename.hidden = false;
    renderSessions();
    if (!save || !title || title === shown || title === entry.title) return els.rename.focus();
    try {
      const session = await api.renameSession(sessionId, title);
      store.setSessions(store.sessions().map((s) => (s.id === sessionId ? { ...s, title: session.title } : s)));
      renderSessions();
      announce("Conversation renamed");
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return needKey(startRename);
      toast(`Could not rename the conversation: ${describe(error)}`);
    }
    els.rename.focus();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      done(true);
    } else if (event.key === "Escape") {
      event.preventDefault();
      done(false);
    }
  });
  input.addEventListener("blur", () => done(true));
  els.title.replaceChildren(input);
  els.rename.hidden = true;
  input.focus();
  input.select();
}

// --- sidebar (a drawer on narrow screens) ------------------------------------------------

function openSidebar() {
  els.app.dataset.sidebar = "open";
  els.menu.setAttribute("aria-expanded", "true");
  els.scrim.hidden = false;
  els.sidebar.querySelector("button:not([hidden])")?.focus();
}

function closeSidebar() {
  if (els.app.dataset.sidebar !== "open") return;
  els.app.dataset.sidebar = "closed";
  els.menu.setAttribute("aria-expanded", "false");
  els.scrim.hidden = true;
  if (els.sidebar.contains(document.activeElement)) els.menu.focus();
}

// --- wiring ------------------------------------------------------------------------------

function autoGrow() {
  const p = els.prompt;
  p.style.height = "auto";
  p.style.height = `${Math.min(p.scrollHeight, 220)}px`;
}

function submitPrompt() {
  const text = els.prompt.value;
  if (current) return;
  if (tray.uploading()) {
    tray.say("Wait a moment: the files are still uploading.");
    return;
  }
  const files = tray.attachments();
  if (!text.trim() && !files.length) return;
  // the bytes just uploaded are what the turn shows: no need to fetch them back
  const attachments = files.map(({ blob, ...file }) => {
    adoptFileUrl(file.file_id, blob);
    return file;
  });
  els.prompt.value = "";
  autoGrow();
  tray.clear();
  send(text, { attachments });
}

// --- attachments -------------------------------------------------------------------------

const tray = new AttachmentTray({
  list: els.attachments,
  message: els.attachMessage,
  upload: (file, signal) => api.uploadFile(file, signal),
  onUnauthorized: () => needKey(null),
  announce,
  onEmpty: () => els.prompt.focus(),
});

/** The server's upload limits (GET /v1/files/limits); its defaults without an answer. */
async function loadLimits() {
  try {
    const limits = await api.fileLimits();
    tray.setLimits({
      maxBytes: Number(limits.max_bytes) || DEFAULT_LIMITS.maxBytes,
      mediaTypes: Array.isArray(limits.media_types) ? limits.media_types : DEFAULT_LIMITS.mediaTypes,
      maxInputBytes: Number(limits.max_input_bytes) || DEFAULT_LIMITS.maxInputBytes,
      maxInputParts: Number(limits.max_input_parts) || DEFAULT_LIMITS.maxInputParts,
    });
  } catch {
    // an older server, or no key yet: the defaults, and the server's own answer on upload
  }
}

const carriesFiles = (event) => Array.from(event.dataTransfer?.types || []).includes("Files");

function wireAttachments() {
  els.fileInput.accept = ACCEPT;
  els.attach.addEventListener("click", () => els.fileInput.click());
  els.fileInput.addEventListener("change", () => {
    tray.add(els.fileInput.files);
    els.fileInput.value = ""; // the same file, picked again, is a change again
  });
  els.prompt.addEventListener("paste", (event) => {
    const files = Array.from(event.clipboardData?.files || []);
    if (!files.length) return;
    tray.add(files);
    // text that came with the files (from an office document, say) is still pasted as text
    if (!Array.from(event.clipboardData.types).includes("text/plain")) event.preventDefault();
  });
  // files dropped on the composer are attached; dropped anywhere else they are not opened
  // in place of the page
  let depth = 0;
  const zone = els.composerWrap;
  const dragging = (on) => (zone.dataset.dragging = on ? "true" : "false");
  zone.addEventListener("dragenter", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    depth += 1;
    dragging(true);
  });
  zone.addEventListener("dragover", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = "copy";
  });
  zone.addEventListener("dragleave", () => {
    depth = Math.max(0, depth - 1);
    if (!depth) dragging(false);
  });
  zone.addEventListener("drop", (event) => {
    depth = 0;
    dragging(false);
    if (!event.dataTransfer?.files?.length) return;
    event.preventDefault();
    tray.add(event.dataTransfer.files);
    els.prompt.focus();
  });
  for (const type of ["dragover", "drop"]) {
    window.addEventListener(type, (event) => {
      if (carriesFiles(event) && !zone.contains(event.target)) event.preventDefault();
    });
  }
}

/** Open a stored file (an image or a document of the conversation) in a new tab. */
async function openFile(link) {
  const fileId = link.dataset.fileId;
  try {
    const url = await fileUrl(fileId);
    const opener = h("a", { href: url, target: "_blank", rel: "noopener noreferrer" });
    opener.click();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return needKey(() => openFile(link));
    toast(`Could not open the file: ${describe(error)}`);
  }
}

function wire() {
  els.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    submitPrompt();
  });
  els.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && !event.altKey) {
      event.preventDefault();
      submitPrompt();
    }
  });
  els.prompt.addEventListener("input", autoGrow);
  els.stop.addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("new-chat-top").addEventListener("click", newChat);
  els.empty.addEventListener("click", (event) => {
    const button = event.target.closest("[data-prompt]");
    if (button) send(button.dataset.prompt);
  });
  els.sessions.addEventListener("click", (event) => {
    const del = event.target.closest("[data-delete]");
    if (del) return deleteSession(del.dataset.delete);
    const item = event.target.closest("[data-session]");
    if (item) switchSession(item.dataset.session);
  });
  els.menu.addEventListener("click", () => (els.app.dataset.sidebar === "open" ? closeSidebar() : openSidebar()));
  $("close-sidebar").addEventListener("click", closeSidebar);
  els.scrim.addEventListener("click", closeSidebar);
  els.sidebar.addEventListener("keydown", (event) => {
    if (event.key === "Escape") closeSidebar();
  });
  els.log.addEventListener("click", (event) => {
    const file = event.target.closest("a[data-file-id]");
    if (file && !event.ctrlKey && !event.metaKey && !event.shiftKey) {
      // the file's own URL cannot carry the API key: its bytes are fetched with it
      event.preventDefault();
      openFile(file);
      return;
    }
    const code = event.target.closest("[data-copy=code]");
    if (code) {
      copyFrom(code, code.closest(".code-block")?.querySelector("pre")?.textContent || "");
      return;
    }
    const action = event.target.closest("[data-action]");
    if (action) {
      onTurnAction(action);
      return;
    }
    const review = event.target.closest("[data-review]");
    if (review && current) {
      const part = current.view.turn.parts.find((p) => p.id === review.dataset.review);
      if (part?.confirmation) {
        confirmDialog.open({ ...part.confirmation, sessionId: current.sessionId, runId: current.runId });
      }
    }
  });
  els.keyButton.addEventListener("click", () => openKeyDialog());
  els.rename.addEventListener("click", startRename);
  els.agentSelect.addEventListener("change", () => store.setAgent(els.agentSelect.value));
  els.keyForm.addEventListener("submit", saveKey);
  $("key-cancel").addEventListener("click", () => {
    afterKey = null;
    els.keyDialog.close();
  });
  $("key-forget").addEventListener("click", () => {
    store.setApiKey("");
    els.keyInput.value = "";
    announce("API key forgotten");
    els.keyInput.focus();
  });
  // a deletion still waiting for its Undo goes through when the page goes away
  window.addEventListener("pagehide", () => flushDelete(true));
  window.addEventListener("storage", (event) => {
    if (event.key === "agent-ui.sessions") renderSessions();
  });
  // back to this tab: conversations may have started elsewhere in the meantime
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") refreshSessions();
  });
  els.keyButton.hidden = !(store.needsKey() || store.apiKey());
}

wire();
wireAttachments();
watchScrolling();
renderSessions();
loadSession();
refreshSessions();
loadAgents();
loadLimits();
// straight to typing; not on touch screens, where focus would pop the keyboard up
if (matchMedia("(hover: hover)").matches) els.prompt.focus();

// for the end-to-end tests and the curious: the state of the page, read-only
window.agentUI = {
  get sessionId() {
    return sessionId;
  },
  get runId() {
    return current?.runId ?? null;
  },
  get lastSeq() {
    return current?.lastSeq ?? null;
  },
};
