// The approve/deny dialog for a tool call whose policy is "ask".
//
// A modal <dialog role="alertdialog">: the page behind it is inert, focus starts on Deny (the
// answer that cannot do harm) and returns where it was when the dialog closes. Escape denies:
// a modal question must not be dismissed without an answer, and of the two answers only
// "deny" is safe to give by accident (the run goes on and the model is told "denied").
// The countdown runs on the server's clock (estimated from the Date header), so a browser
// whose clock is off still counts down to the server's expires_at.

import { ApiError } from "./api.js";
import { formatArguments } from "./view.js";

// The runtime's default question names the tool and repeats its arguments, which the dialog
// shows below it already: then the dialog asks in its own words. A question of the agent's
// own (a configured one) is shown as it is.
const DEFAULT_QUESTION = /^Allow the tool (['"]).*\1 to run with the arguments [\s\S]*\?$/;

function questionOf(request) {
  const question = (request.question || "").trim();
  if (!question || DEFAULT_QUESTION.test(question)) {
    return "The agent wants to run this tool with the arguments below.";
  }
  return question;
}

function formatRemaining(ms) {
  const total = Math.max(0, Math.ceil(ms / 1000));
  const minutes = Math.floor(total / 60);
  const seconds = String(total % 60).padStart(2, "0");
  return `${minutes}:${seconds}`;
}

export class ConfirmDialog {
  /**
   * @param {HTMLDialogElement} el
   * @param {{answer: (request, approved) => Promise<any>, now: () => number,
   *          onDecision: (request, decision) => void, onError: (error) => void}} hooks
   */
  constructor(el, hooks) {
    this.el = el;
    this.hooks = hooks;
    this.request = null; // {tool_call_id, tool, arguments, question, expires_at, sessionId, runId}
    this.state = "closed"; // pending | sending | expired | gone | closed
    this.returnFocus = null;
    this.timer = null;
    const $ = (id) => el.querySelector(`#${id}`);
    this.title = $("confirm-tool");
    this.question = $("confirm-question");
    this.args = $("confirm-args");
    this.countdown = $("confirm-countdown");
    this.bar = $("confirm-bar");
    this.message = $("confirm-message");
    this.approveBtn = $("confirm-approve");
    this.denyBtn = $("confirm-deny");
    this.closeBtn = $("confirm-close");
    this.approveBtn.addEventListener("click", () => this.answer(true));
    this.denyBtn.addEventListener("click", () => this.answer(false));
    this.closeBtn.addEventListener("click", () => this.close());
    // Escape: "cancel" in Chromium's close-watcher terms; keydown first so it can be stopped
    el.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        this.escape();
      }
    });
    el.addEventListener("cancel", (event) => {
      event.preventDefault();
      this.escape();
    });
    el.addEventListener("close", () => this.cleanup());
  }

  get openId() {
    return this.state === "closed" ? null : this.request?.tool_call_id ?? null;
  }

  open(request) {
    if (this.openId === request.tool_call_id) return;
    if (this.state !== "closed") this.close();
    this.request = request;
    this.state = "pending";
    this.title.textContent = request.tool;
    this.question.textContent = questionOf(request);
    this.args.textContent = JSON.stringify(request.arguments ?? {}, null, 2);
    this.args.setAttribute("aria-label", `Arguments: ${formatArguments(request.arguments)}`);
    this.message.textContent = "";
    this.message.className = "confirm-message";
    this.setButtons("pending");
    this.expiresAt = Date.parse(request.expires_at);
    this.total = Math.max(1, this.expiresAt - this.hooks.now());
    this.returnFocus = document.activeElement;
    this.el.showModal();
    this.denyBtn.focus();
    this.tick();
    this.timer = setInterval(() => this.tick(), 250);
  }

  setButtons(state) {
    const answering = state === "pending" || state === "sending";
    this.approveBtn.hidden = !answering;
    this.denyBtn.hidden = !answering;
    this.approveBtn.disabled = state === "sending";
    this.denyBtn.disabled = state === "sending";
    this.closeBtn.hidden = answering;
    this.el.dataset.state = state;
  }

  tick() {
    if (!this.request || Number.isNaN(this.expiresAt)) {
      this.countdown.textContent = "";
      return;
    }
    const left = this.expiresAt - this.hooks.now();
    this.bar.style.setProperty("--left", String(Math.max(0, Math.min(1, left / this.total))));
    if (left <= 0) {
      if (this.state === "pending") this.expire();
      return;
    }
    this.countdown.textContent = `Expires in ${formatRemaining(left)}`;
    this.el.dataset.urgent = left < 10_000 ? "true" : "false";
  }

  expire() {
    const at = new Date(this.expiresAt).toLocaleTimeString();
    this.finish("expired", `This request expired at ${at}. The call counts as denied.`);
    this.countdown.textContent = "Expired";
    this.hooks.onDecision(this.request, "expired");
  }

  /** The request was settled without this dialog: answered elsewhere, expired or cancelled. */
  settled(part) {
    if (this.state === "closed" || this.state === "sending") return;
    if (this.state === "pending") {
      if (/expired/i.test(part?.error || "")) this.expire();
      else this.close();
    }
  }

  finish(state, text, kind = "info") {
    this.state = state;
    clearInterval(this.timer);
    this.timer = null;
    this.message.textContent = text;
    this.message.className = `confirm-message ${kind}`;
    this.setButtons(state);
    this.closeBtn.focus();
  }

  async answer(approved) {
    if (this.state !== "pending") return;
    const request = this.request;
    this.state = "sending";
    this.setButtons("sending");
    this.message.textContent = approved ? "Approving…" : "Denying…";
    this.message.className = "confirm-message";
    try {
      await this.hooks.answer(request, approved);
      this.hooks.onDecision(request, approved ? "approved" : "denied");
      this.close();
    } catch (error) {
      if (error instanceof ApiError && error.status === 409) {
        const text = "This request is no longer pending: it was already answered, it expired, or the run ended.";
        this.finish("gone", text);
        this.hooks.onDecision(request, "gone");
      } else {
        this.state = "pending";
        this.setButtons("pending");
        const detail = error instanceof ApiError ? error.detail || error.title : String(error);
        this.message.textContent = `The answer was not delivered: ${detail} Try again.`;
        this.message.className = "confirm-message error";
        this.hooks.onError?.(error);
        (approved ? this.approveBtn : this.denyBtn).focus();
      }
    }
  }

  escape() {
    if (this.state === "pending") this.answer(false);
    else if (this.state !== "sending") this.close();
  }

  close() {
    if (this.el.open) this.el.close();
    this.cleanup();
  }

  cleanup() {
    if (this.state === "closed") return;
    clearInterval(this.timer);
    this.timer = null;
    this.state = "closed";
    const target = this.returnFocus;
    this.returnFocus = null;
    if (target && target.isConnected && typeof target.focus === "function") target.focus();
    else document.getElementById("prompt")?.focus();
  }
}
