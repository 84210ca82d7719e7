// The conversation's DOM. A turn is one prompt and the run that answered it; its model is a
// plain object (kept in sessionStorage while the run is live), and TurnView keeps the DOM in
// step with it one event at a time. A text part is Markdown: while it grows it is rendered
// again at most once a frame (text deltas only mark it stale), and once more, at once, when
// the run ends, so a finished turn's DOM is exactly what rendering its stored messages gives.
// A reasoning part (the model's thinking before an answer or a tool call) is plain text in a
// collapsed <details>, above what it led to; it grows in place, so a reader who opened it
// keeps it open while it streams.

import { renderMarkdown } from "./markdown.js";
import { fileUrl, formatBytes, typeLabel } from "./media.js";

const SVG_NS = "http://www.w3.org/2000/svg";

/** A small element builder: h("div", {class: "x"}, child, "text"). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const ICONS = {
  spark: "M12 3l1.9 5.6L19.5 10l-5.6 1.9L12 17.5l-1.9-5.6L4.5 10l5.6-1.4z",
  tool: "M14.7 6.3a4 4 0 0 0-5.4 5.2L4 16.8 7.2 20l5.3-5.3a4 4 0 0 0 5.2-5.4l-2.5 2.5-2.4-.6-.6-2.4z",
  check: "M5 12.5l4.2 4.2L19 7",
  cross: "M6 6l12 12M18 6L6 18",
  pause: "M9 6v12M15 6v12",
  stop: "M7 7h10v10H7z",
  alert: "M12 8v5m0 3.5v.5M10.3 3.9 2.4 17.6A2 2 0 0 0 4.1 20.6h15.8a2 2 0 0 0 1.7-3L13.7 3.9a2 2 0 0 0-3.4 0z",
  clock: "M12 7v5l3 2M21 12a9 9 0 1 1-18 0 9 9 0 0 1 18 0z",
  copy: "M9 9h10v11H9zM5 15V4h10",
  edit: "M4 20h4L19 9l-4-4L4 16zM14 6l4 4",
  redo: "M4 12a8 8 0 1 0 2.3-5.7M4 4v4.5h4.5",
  clip: "M20 11.5l-8.2 8.2a5 5 0 0 1-7.1-7.1l8.5-8.5a3.3 3.3 0 0 1 4.7 4.7l-8.5 8.5a1.7 1.7 0 0 1-2.4-2.4L14.8 7",
  file: "M14 3H7a2 2 0 0 0-2 2v14a2 2 0 0 0 2 2h10a2 2 0 0 0 2-2V8zM14 3v5h5M9 13h6M9 17h6",
  prev: "M14.5 6l-6 6 6 6",
  next: "M9.5 6l6 6-6 6",
};

/** The error result the runtime gives a tool call that a stop cut short. */
export const CANCELLED_CALL = "the run was cancelled before this call returned";

export function icon(name, cls = "icon") {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("class", cls);
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("focusable", "false");
  const path = document.createElementNS(SVG_NS, "path");
  path.setAttribute("d", ICONS[name]);
  svg.append(path);
  return svg;
}

/** Arguments as one readable line: path: "notes.txt", force: true. */
export function formatArguments(args) {
  if (args === null || args === undefined) return "";
  if (typeof args !== "object" || Array.isArray(args)) return JSON.stringify(args);
  const entries = Object.entries(args);
  if (!entries.length) return "no arguments";
  return entries.map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join(", ");
}

function formatResult(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

function row(label, value) {
  return h("div", { class: "tool-row" }, h("span", { class: "tool-label", text: label }), value);
}

/** A turn's model: ``attachments`` are the files sent with the prompt,
 * [{kind: "image" | "document", file_id, media_type, filename, bytes}]. Its ``parent`` (set
 * where it is known) is the run id of the turn it continues, null for a first turn
 * (branches.js). */
export function newTurn(prompt, runId = null, attachments = []) {
  return {
    runId,
    prompt,
    attachments,
    parts: [],
    status: "sending",
    agent: null,
    model: null,
    skill: null,
    usage: null,
    end: null,
  };
}

const LIVE = ["sending", "running", "waiting", "reconnecting"];

const TOOL_STATE = {
  running: "Running…",
  waiting: "Waiting for your approval",
  ok: "Done",
  error: "Failed",
  stopped: "Stopped",
};

/** Whether to name the agent on each turn (more than one is configured). */
export const turnOptions = { showAgent: false };

const END_TEXT = {
  cancel_requested: "Stopped. The run was cancelled at your request.",
  client_disconnected: "Cancelled: the connection to the server was lost.",
  shutdown: "Cancelled: the server shut down before the run finished.",
  superseded: "Stopped: a newer message took its place.",
};

const VIEWS = new WeakMap(); // a turn's element → its TurnView

export class TurnView {
  /** The TurnView of a turn's element, or null. */
  static of(el) {
    return VIEWS.get(el) || null;
  }

  constructor(turn) {
    this.turn = turn;
    this.textEls = new Map(); // part index → its element
    this.reasoningEls = new Map(); // part index → its <details>
    this.stale = new Set(); // indexes of text parts to render again
    this.frame = 0;
    this.toolEls = new Map(); // tool_call_id → element
    this.parts = h("div", { class: "parts" });
    this.typing = h("div", { class: "typing", "aria-hidden": "true" }, h("span"), h("span"), h("span"));
    this.notice = h("div", { class: "notices" });
    this.meta = h("div", { class: "meta" });
    this.actions = h("div", { class: "turn-actions", role: "group", "aria-label": "Answer actions" });
    this.noticeKey = "";
    this.assistant = h(
      "div",
      { class: "msg assistant" },
      h("div", { class: "avatar", "aria-hidden": "true" }, icon("spark")),
      h(
        "div",
        { class: "body" },
        h("h3", { class: "sr-only", text: "The agent" }),
        this.parts,
        this.typing,
        this.notice,
        this.meta,
        this.actions,
      ),
    );
    this.el = h("article", { class: "turn" });
    this.userEl = null;
    if (turn.prompt !== null && turn.prompt !== undefined) {
      this.userEl = h(
        "div",
        { class: "msg user" },
        h("h3", { class: "sr-only", text: "You" }),
        turn.attachments?.length ? attachmentList(turn.attachments) : null,
        h("div", { class: "bubble", hidden: !turn.prompt }, turn.prompt),
        h(
          "div",
          { class: "turn-actions user-actions", role: "group", "aria-label": "Message actions" },
          actionButton("copy", "copy-prompt", "Copy", "Copy the message"),
          actionButton("edit", "edit", "Edit", "Edit and resend the message", true),
        ),
      );
      this.el.append(this.userEl);
    }
    this.el.append(this.assistant);
    VIEWS.set(this.el, this);
    if (turn.runId) this.el.dataset.runId = turn.runId;
    turn.parts.forEach((part, index) => this.renderPart(part, index));
    this.renderStatus();
  }

  /** Show "‹ 2 / 3 ›" on a turn with siblings (``position``: {index, count}; branches.js),
   * with the message's own actions; nothing on a turn without. */
  setBranch(position) {
    const key = position && position.count > 1 ? `${position.index}/${position.count}` : "";
    if (key === (this.branchKey || "")) return;
    this.branchKey = key;
    const nav = key ? branchNav(position) : null;
    if (this.branchEl) this.branchEl.replaceWith(...(nav ? [nav] : []));
    else if (nav && this.userEl) this.userEl.querySelector(".user-actions").prepend(nav);
    else if (nav) this.actions.before(nav);
    this.branchEl = nav;
  }

  // --- events -------------------------------------------------------------------------

  /** Apply one wire event to the model and the DOM. */
  apply(event) {
    const turn = this.turn;
    const data = event.data || {};
    switch (event.type) {
      case "run.started":
        turn.agent = data.agent || null;
        if (turn.status === "sending") turn.status = "running";
        break;
      case "text.delta":
        this.markText(Number(event.seq), "text");
        this.appendText(data.delta || "");
        break;
      case "reasoning.delta":
        this.markText(Number(event.seq), "reasoning");
        this.appendReasoning(data.delta || "");
        break;
      case "run.resumed":
        // the run went on on another worker from a checkpoint: text after it belongs to a
        // model call the hand-over cut, which the resumed run makes again
        this.dropTextAfter(Number(data.from_seq));
        break;
      case "tool.call.started":
        this.upsertTool({
          kind: "tool",
          id: data.tool_call_id,
          name: data.name,
          arguments: data.arguments,
          status: "running",
        });
        break;
      case "tool.call.completed":
        this.upsertTool({
          kind: "tool",
          id: data.tool_call_id,
          name: data.name,
          status: data.is_error ? "error" : "ok",
          result: data.is_error ? undefined : data.result,
          error: data.is_error ? data.error : undefined,
        });
        break;
      case "custom":
        if (data.name === "skill_activated" && data.payload?.skill) {
          turn.skill = String(data.payload.skill);
        } else if (data.name === "confirmation_requested" && data.payload) {
          const p = data.payload;
          this.upsertTool({
            kind: "tool",
            id: p.tool_call_id,
            name: p.tool,
            arguments: p.arguments,
            status: "waiting",
            confirmation: { ...p, receivedTs: event.ts || null },
          });
        }
        break;
      case "usage": {
        // the model that answered each call (a fallback's after a failover), and the sum so
        // far, which is what a stopped run's record keeps; run.completed carries the total
        turn.usage = addUsage(turn.usage, data);
        if (data.model) turn.model = data.model;
        break;
      }
      case "run.completed": {
        const content = data.output?.content;
        if (!this.textParts().length && typeof content === "string" && content) this.appendText(content);
        if (data.usage) turn.usage = addUsage(null, data.usage);
        if (data.usage?.model) turn.model = data.usage.model;
        turn.status = "completed";
        break;
      }
      case "run.failed":
        turn.status = "failed";
        turn.end = { kind: "failed", code: data.error?.code || "internal", message: data.error?.message || "" };
        break;
      case "run.cancelled":
        turn.status = "cancelled";
        turn.end = { kind: "cancelled", reason: data.reason || "cancel_requested" };
        // a call the stop cut short is kept as stopped, as the stored turn shows it
        for (const part of turn.parts) {
          if (part.kind === "tool" && (part.status === "running" || part.status === "waiting")) {
            this.upsertTool({ id: part.id, status: "stopped" });
          }
        }
        break;
      default:
        return; // an event type this page does not know yet
    }
    if (turn.status === "running" || turn.status === "waiting") {
      turn.status = this.pendingConfirmation() ? "waiting" : "running";
    }
    this.renderStatus();
  }

  textParts() {
    return this.turn.parts.filter((p) => p.kind === "text" && p.text);
  }

  /** Remember where the text (or reasoning) stood before the delta of ``seq`` (for
   * ``run.resumed``). */
  markText(seq, kind) {
    if (!Number.isFinite(seq)) return;
    const parts = this.turn.parts;
    const last = parts[parts.length - 1];
    const index = last && last.kind === kind ? parts.length - 1 : parts.length;
    const offset = index < parts.length ? parts[index].text.length : 0;
    if (!this.marks) this.marks = [];
    this.marks.push({ seq, index, offset });
  }

  /** Discard the text deltas received after ``fromSeq`` (a cut model call's partial text). */
  dropTextAfter(fromSeq) {
    const marks = this.marks || [];
    const cut = marks.filter((m) => m.seq > fromSeq);
    this.marks = marks.filter((m) => m.seq <= fromSeq);
    const seen = new Set();
    for (const mark of cut) {
      if (seen.has(mark.index)) continue; // the earliest mark of a part says where it stood
      seen.add(mark.index);
      const part = this.turn.parts[mark.index];
      if (!part) continue;
      if (part.kind === "reasoning") {
        part.text = part.text.slice(0, mark.offset);
        this.renderReasoning(mark.index);
      } else if (part.kind === "text") {
        part.text = part.text.slice(0, mark.offset);
        this.stale.add(mark.index);
      }
    }
    if (seen.size) this.flush();
  }

  appendReasoning(delta) {
    if (!delta) return;
    const parts = this.turn.parts;
    const last = parts[parts.length - 1];
    if (last && last.kind === "reasoning") {
      last.text += delta;
      this.renderReasoning(parts.length - 1);
    } else {
      parts.push({ kind: "reasoning", text: delta });
      this.renderPart(parts[parts.length - 1], parts.length - 1);
    }
  }

  appendText(delta) {
    if (!delta) return;
    const parts = this.turn.parts;
    const last = parts[parts.length - 1];
    if (last && last.kind === "text") {
      last.text += delta;
      this.stale.add(parts.length - 1);
      if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
    } else {
      parts.push({ kind: "text", text: delta });
      this.renderPart(parts[parts.length - 1], parts.length - 1);
    }
  }

  /** Render the text parts that grew since the last frame. */
  flush() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    for (const index of this.stale) {
      this.textEls.get(index)?.replaceChildren(renderMarkdown(this.turn.parts[index].text));
    }
    this.stale.clear();
  }

  /** The answer's text, as the model wrote it (Markdown). */
  answerText() {
    return this.textParts().map((p) => p.text).join("\n\n");
  }

  upsertTool(update) {
    const parts = this.turn.parts;
    let part = parts.find((p) => p.kind === "tool" && p.id === update.id);
    if (!part) {
      part = { kind: "tool", id: update.id, name: update.name, arguments: update.arguments ?? {}, status: "running" };
      parts.push(part);
    }
    for (const [key, value] of Object.entries(update)) {
      if (value !== undefined) part[key] = value;
    }
    if (part.status === "ok" || part.status === "error") {
      // a decision the server made (expiry) or another tab made still closes the question
      if (part.confirmation && !part.decision) part.decision = part.status === "ok" ? "approved" : "denied";
    }
    this.renderPart(part, parts.indexOf(part));
    return part;
  }

  /** The tool call's confirmation was answered from this page. */
  markDecision(toolCallId, decision) {
    const part = this.turn.parts.find((p) => p.kind === "tool" && p.id === toolCallId);
    if (!part || part.status !== "waiting") return; // settled already: the server's word stands
    part.decision = decision;
    this.renderPart(part, this.turn.parts.indexOf(part));
  }

  pendingConfirmation() {
    return this.turn.parts.find((p) => p.kind === "tool" && p.status === "waiting" && !p.decision) || null;
  }

  // --- rendering ----------------------------------------------------------------------

  renderPart(part, index) {
    if (part.kind === "reasoning") {
      const body = h("div", { class: "reasoning-text", text: part.text });
      const el = h(
        "details",
        { class: "reasoning" },
        h("summary", {}, h("span", { class: "reasoning-label", text: "Reasoning" })),
        body,
      );
      this.reasoningEls.set(index, el);
      this.parts.append(el);
      return;
    }
    if (part.kind === "text") {
      const el = h("div", { class: "text markdown" }, renderMarkdown(part.text));
      this.textEls.set(index, el);
      this.parts.append(el);
      return;
    }
    const fresh = this.toolCard(part);
    const old = this.toolEls.get(part.id);
    if (old) old.replaceWith(fresh);
    else this.parts.append(fresh);
    this.toolEls.set(part.id, fresh);
  }

  /** The reasoning part at ``index`` grew (or was cut): its text, in place. */
  renderReasoning(index) {
    const el = this.reasoningEls.get(index);
    if (el) el.querySelector(".reasoning-text").textContent = this.turn.parts[index].text;
  }

  toolCard(part) {
    let state = TOOL_STATE[part.status] || part.status;
    let shown = part.status;
    if (part.status === "waiting" && part.decision) {
      state = { approved: "Approved, running…", denied: "Denied, finishing…" }[part.decision] || "Answered, finishing…";
    } else if (part.status === "ok" && (part.confirmation || part.approval === "approved")) {
      state = "Approved · done";
    } else if (part.status === "stopped") {
      shown = "stopped";
    } else if (part.status === "error") {
      if (/expired/i.test(part.error || "")) {
        state = "Expired";
        shown = "denied";
      } else if (
        part.approval === "denied" ||
        /\bdenied\b/i.test(part.error || "") ||
        (part.confirmation && part.decision === "denied")
      ) {
        state = "Denied";
        shown = "denied";
      }
    }
    const statusIcon =
      { ok: icon("check"), error: icon("cross"), waiting: icon("pause"), stopped: icon("stop") }[part.status] ||
      h("span", { class: "spinner" });
    const rows = [row("Arguments", h("code", { class: "tool-args", text: formatArguments(part.arguments) }))];
    if (part.status === "waiting" && !part.decision && part.confirmation) {
      const review = h("button", {
        type: "button",
        class: "button small",
        "data-review": part.id,
        text: "Review the request",
      });
      rows.push(row("Approval", review));
    }
    if (part.status === "ok") {
      rows.push(row("Result", h("pre", { class: "tool-result", text: formatResult(part.result) })));
    } else if (part.status === "error") {
      rows.push(row("Error", h("pre", { class: "tool-result tool-error", text: formatResult(part.error) })));
    }
    return h(
      "section",
      {
        class: "tool",
        "data-status": shown,
        "data-tool-call-id": part.id,
        "aria-label": `Tool call ${part.name}: ${state}`,
      },
      h(
        "div",
        { class: "tool-head" },
        h("span", { class: "tool-icon" }, icon("tool")),
        h("span", { class: "tool-name", text: part.name }),
        h("span", { class: "tool-state" }, statusIcon, h("span", { text: state })),
      ),
      ...rows,
    );
  }

  renderStatus() {
    const turn = this.turn;
    const live = LIVE.includes(turn.status);
    if (!live && this.stale.size) this.flush(); // the finished answer, rendered whole, now
    this.el.dataset.status = turn.status;
    if (turn.runId) this.el.dataset.runId = turn.runId;
    this.assistant.setAttribute("aria-busy", live ? "true" : "false");
    const last = turn.parts[turn.parts.length - 1];
    // the reasoning being written says so in its summary
    for (const [index, el] of this.reasoningEls) {
      el.dataset.live = live && turn.parts[index] === last ? "true" : "false";
    }
    // the dots fill the silences: before the first word, and while a tool runs
    const quiet = !(last && (last.kind === "text" || last.kind === "reasoning" || last.status === "waiting"));
    this.typing.hidden = !(live && turn.status !== "waiting" && quiet);
    this.renderNotice();
    const bits = [];
    if (turnOptions.showAgent && turn.agent) bits.push(turn.agent);
    if (turn.model) bits.push(turn.model);
    if (turn.usage) bits.push(usageText(turn.usage));
    const meta = [];
    if (turn.skill) meta.push(h("span", { class: "skill", text: `skill ${turn.skill}` }));
    if (bits.length) meta.push(h("span", { class: "model", text: bits.join(" · ") }));
    this.meta.replaceChildren(...(live ? [] : meta));
    this.renderActions(live);
  }

  renderActions(live) {
    const answered = !live && this.turn.status !== "error";
    const key = answered ? "done" : "";
    if (key === this.actionsKey) return;
    this.actionsKey = key;
    const buttons = [];
    if (answered && this.textParts().length) buttons.push(actionButton("copy", "copy-answer", "Copy", "Copy the answer"));
    if (answered && this.turn.prompt !== null && this.turn.prompt !== undefined) {
      buttons.push(actionButton("redo", "regenerate", "Regenerate", "Regenerate the answer", true));
    }
    this.actions.replaceChildren(...buttons);
  }

  renderNotice() {
    // rebuilt only when it changes: a live region re-inserted on every word would be re-read
    const turn = this.turn;
    const end = turn.end;
    const key = end ? `${end.kind}:${end.reason || end.code}` : turn.status === "reconnecting" ? "reconnecting" : "";
    if (key === this.noticeKey || turn.status === "error") return;
    this.noticeKey = key;
    let notice = null;
    if (end?.kind === "cancelled") {
      const text = END_TEXT[end.reason] || `Cancelled (${end.reason}).`;
      notice = h("p", { class: "notice stopped", role: "status" }, icon("stop"), text);
    } else if (end?.kind === "failed") {
      const body = h(
        "div",
        {},
        h("strong", { text: "The run failed " }),
        h("code", { text: end.code }),
        end.message ? h("p", { text: end.message }) : null,
      );
      notice = h("div", { class: "notice error", role: "alert" }, icon("alert"), body);
    } else if (key === "reconnecting") {
      const spinner = h("span", { class: "spinner" });
      notice = h("p", { class: "notice reconnecting", role: "status" }, spinner, "Connection lost, reconnecting…");
    }
    this.notice.replaceChildren(...(notice ? [notice] : []));
  }

  /** An error answered before the run started (problem+json), with optional actions. */
  showError(title, detail, actions = []) {
    this.turn.status = "error";
    this.renderStatus();
    const body = h(
      "div",
      {},
      h("strong", { text: title }),
      detail ? h("p", { text: detail }) : null,
      actions.length ? h("div", { class: "actions" }, actions) : null,
    );
    const box = h("div", { class: "notice error", role: "alert" }, icon("alert"), body);
    this.notice.replaceChildren(box);
    return box;
  }
}

const USAGE_DETAILS = ["cached_input_tokens", "cache_write_tokens", "reasoning_tokens"];

/** ``usage`` (a wire event's counts) added to ``sum``: totals, and the details reported. */
function addUsage(sum, usage) {
  const out = {
    input_tokens: (sum?.input_tokens || 0) + (usage.input_tokens || 0),
    output_tokens: (sum?.output_tokens || 0) + (usage.output_tokens || 0),
  };
  for (const name of USAGE_DETAILS) {
    if (typeof usage[name] === "number" || typeof sum?.[name] === "number") {
      out[name] = (sum?.[name] || 0) + (usage[name] || 0);
    }
  }
  return out;
}

/** "1200 tokens in (1000 cached) · 300 out (120 reasoning)": the details where reported. */
function usageText(usage) {
  const cached = typeof usage.cached_input_tokens === "number" ? ` (${usage.cached_input_tokens} cached)` : "";
  const reasoning = typeof usage.reasoning_tokens === "number" ? ` (${usage.reasoning_tokens} reasoning)` : "";
  return `${usage.input_tokens} tokens in${cached} · ${usage.output_tokens} out${reasoning}`;
}

function actionButton(iconName, action, label, description, idleOnly = false) {
  return h(
    "button",
    {
      type: "button",
      class: "turn-action",
      "data-action": action,
      "data-idle-only": idleOnly ? "true" : null,
      "aria-label": description,
      title: description,
    },
    icon(iconName),
    h("span", { text: label }),
  );
}

/**
 * Turns from the stored conversation (GET /v1/sessions/{id}/messages): its messages, and the
 * runs behind them (model, token usage, agent, skill), so that a stored turn shows what the
 * live one did. Every branch's turns, in the order they were stored, each with its ``parent``.
 */
export function turnsFromMessages(messages, runs = []) {
  const byRun = new Map(runs.map((run) => [run.run_id, run]));
  const turns = [];
  let turn = null;
  const tools = new Map();
  for (const message of messages) {
    if (message.role === "user" || !turn || turn.runId !== message.run_id) {
      const user = message.role === "user";
      const previous = turn?.runId ?? null;
      turn = newTurn(user ? contentText(message.content) : null, message.run_id, user ? contentFiles(message.content) : []);
      turn.status = "completed";
      // the turn it continues (branches.js); a server that does not say: the one before it
      turn.parent = "parent_run" in message ? message.parent_run : previous;
      const run = byRun.get(message.run_id);
      if (run) {
        turn.agent = run.agent || null;
        turn.model = run.model || run.usage?.model || null;
        turn.skill = run.skill || null;
        // token counts once a model answered (a run stopped before that has none to show)
        if (run.usage && turn.model) turn.usage = addUsage(null, run.usage);
      }
      turns.push(turn);
    }
    if (message.stopped) {
      turn.status = "cancelled";
      turn.end = { kind: "cancelled", reason: message.stopped };
    }
    if (message.role === "user") continue;
    if (message.role === "assistant") {
      if (message.reasoning) turn.parts.push({ kind: "reasoning", text: message.reasoning });
      const text = contentText(message.content);
      if (text) turn.parts.push({ kind: "text", text });
      for (const call of message.tool_calls || []) {
        const part = { kind: "tool", id: call.id, name: call.name, arguments: call.arguments, status: "running" };
        tools.set(call.id, part);
        turn.parts.push(part);
      }
    } else if (message.role === "tool") {
      const part = tools.get(message.tool_call_id);
      if (part) {
        // the model reads a failed call as "Error: <error>"; the live card shows the error
        const text = contentText(message.content);
        const error = text.startsWith("Error: ") ? text.slice(7) : text;
        if (message.approval) part.approval = message.approval;
        if (message.is_error && message.stopped && error === CANCELLED_CALL) part.status = "stopped";
        else if (message.is_error) Object.assign(part, { status: "error", error });
        else Object.assign(part, { status: "ok", result: resultOf(text) });
      }
    }
  }
  return turns;
}

/** A stored result as the live card showed it: JSON objects and lists come back as values. */
function resultOf(text) {
  if (!/^[[{]/.test(text)) return text;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/**
 * The files among a stored message's content parts ({type: "image" | "document", file_id,
 * media_type, filename, bytes}), or among a run's input parts ({type: "image" | "file",
 * file_id}); parts that name no stored file (an https URL) are not shown.
 */
export function contentFiles(content) {
  if (!Array.isArray(content)) return [];
  return content
    .filter((c) => c && typeof c === "object" && ["image", "document", "file"].includes(c.type) && c.file_id)
    .map((c) => ({
      kind: c.type === "image" ? "image" : "document",
      file_id: String(c.file_id),
      media_type: c.media_type || null,
      filename: c.filename || null,
      bytes: Number.isFinite(c.bytes) ? c.bytes : Number.isFinite(c.size) ? c.size : null,
    }));
}

/** The files sent with a prompt: images as pictures, documents as chips; each opens the file. */
function attachmentList(attachments) {
  return h(
    "ul",
    { class: "turn-files", "aria-label": "Attached files" },
    attachments.map((file) => h("li", {}, fileLink(file))),
  );
}

function fileLink(file) {
  const name = file.filename || (file.kind === "image" ? "image" : "document");
  const about = [typeLabel(file.media_type), formatBytes(file.bytes)].filter(Boolean).join(", ");
  // the plain URL works where no key is needed (a middle click, say); a click fetches the
  // bytes with the key and opens them (app.js)
  const link = h("a", {
    class: `file-link ${file.kind}`,
    href: `v1/files/${encodeURIComponent(file.file_id)}/content`,
    target: "_blank",
    rel: "noopener noreferrer",
    "data-file-id": file.file_id,
    title: about ? `${name} (${about})` : name,
  });
  if (file.kind === "image") {
    const img = h("img", { class: "file-image", alt: name, "data-state": "loading" });
    fileUrl(file.file_id).then(
      (url) => {
        img.src = url;
        img.dataset.state = "loaded";
      },
      () => {
        img.dataset.state = "missing";
        link.append(h("span", { class: "file-missing", text: "image unavailable" }));
      },
    );
    link.append(img);
  } else {
    link.append(
      icon("file"),
      h("span", { class: "file-name", text: name }),
      about ? h("span", { class: "file-about", text: about }) : null,
    );
  }
  return link;
}

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .filter((c) => typeof c === "string" || c?.type === undefined || c?.type === "text")
      .map((c) => (typeof c === "string" ? c : c?.text || ""))
      .join("\n\n");
  }
  return JSON.stringify(content);
}

/** "‹ 2 / 3 ›": the buttons step to the previous and next sibling of a turn (app.js). */
function branchNav({ index, count }) {
  const step = (iconName, action, label, disabled) =>
    h(
      "button",
      { type: "button", class: "turn-action branch-step", "data-action": action, "aria-label": label, title: label, disabled },
      icon(iconName),
    );
  return h(
    "div",
    { class: "branch-nav", role: "group", "aria-label": `Branch ${index} of ${count}` },
    step("prev", "branch-prev", "Show the previous branch", index <= 1),
    h("span", { class: "branch-count", "aria-hidden": "true", text: `${index} / ${count}` }),
    step("next", "branch-next", "Show the next branch", index >= count),
  );
}
