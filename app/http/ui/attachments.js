// The files attached to the message being written: added by the Attach button (a file
// picker), by pasting an image, or by dropping files on the composer. Each file is checked
// here first (its type, and the server's size limit) and refused without an upload if the
// server would refuse it; then it is uploaded at once (POST /v1/files), so that sending only
// names file ids. The tray shows a thumbnail (or the file's name) with a Remove button.

import { ApiError } from "./api.js";
import { DEFAULT_LIMITS, formatBytes, kindOf, mediaTypeOf } from "./media.js";
import { h, icon } from "./view.js";

let counter = 0;

export class AttachmentTray {
  /**
   * ``list``: the tray's <ul>; ``message``: where a refusal is said; ``upload(file, signal)``:
   * POST /v1/files, answering the stored file; ``onUnauthorized()``: an upload got 401 (ask for
   * a key); ``announce(text)``: say it to screen readers; ``onEmpty()``: the last one was
   * removed (focus goes back to the message box).
   */
  constructor({ list, message, upload, onUnauthorized, announce, onEmpty }) {
    this.list = list;
    this.message = message;
    this.upload = upload;
    this.onUnauthorized = onUnauthorized;
    this.announce = announce;
    this.onEmpty = onEmpty;
    this.limits = DEFAULT_LIMITS;
    this.items = []; // {key, file, name, mediaType, kind, preview, status, stored, controller, el}
  }

  /** The server's limits (see DEFAULT_LIMITS). */
  setLimits(limits) {
    this.limits = limits;
  }

  /** Check and upload ``files`` (a FileList or an array); how many were taken. */
  add(files) {
    const refusals = [];
    const added = [];
    for (const file of Array.from(files || [])) {
      const reason = this.refusal(file) || this.overMessage(file);
      if (reason) {
        refusals.push(reason);
        continue;
      }
      added.push(this.start(file));
    }
    this.say(refusals.join("\n"));
    if (added.length) {
      this.render();
      this.announce(added.length === 1 ? `Attaching ${added[0].name}` : `Attaching ${added.length} files`);
    }
    return added.length;
  }

  /** Why the server would refuse ``file``, in words, or "" if it would not. */
  refusal(file) {
    const name = displayName(file);
    const mediaType = mediaTypeOf(file, this.limits.mediaTypes);
    if (!mediaType) {
      return `“${name}” cannot be attached: only images (PNG, JPEG, GIF, WebP), PDF and text files (.txt, .md, .csv) can.`;
    }
    if (file.size === 0) return `“${name}” is empty.`;
    if (file.size > this.limits.maxBytes) {
      let [size, limit] = [formatBytes(file.size), formatBytes(this.limits.maxBytes)];
      // "64 KB: up to 64 KB" says nothing: just past the limit, the bytes say it
      if (size === limit) [size, limit] = [exactBytes(file.size), exactBytes(this.limits.maxBytes)];
      return `“${name}” is ${size}: the server takes files up to ${limit}.`;
    }
    return "";
  }

  /** Why ``file`` would not fit the message with the files already attached, or "". */
  overMessage(file) {
    const { maxInputBytes, maxInputParts } = this.limits;
    // one part is kept for the text
    if (this.items.length + 1 > maxInputParts - 1) {
      return `“${displayName(file)}” was not attached: a message takes ${maxInputParts - 1} files at most.`;
    }
    const total = this.items.reduce((sum, i) => sum + i.file.size, file.size);
    if (total > maxInputBytes) {
      return `“${displayName(file)}” was not attached: a message's files may come to ${formatBytes(maxInputBytes)} together, and these would be ${formatBytes(total)}.`;
    }
    return "";
  }

  start(file) {
    const mediaType = mediaTypeOf(file, this.limits.mediaTypes);
    const kind = kindOf(mediaType);
    const item = {
      key: `attachment-${++counter}`,
      file,
      name: displayName(file),
      mediaType,
      kind,
      preview: kind === "image" ? URL.createObjectURL(file) : null,
      status: "uploading",
      stored: null,
      controller: new AbortController(),
      el: null,
    };
    this.items.push(item);
    this.send(item);
    return item;
  }

  async send(item) {
    try {
      item.stored = await this.upload(item.file, item.controller.signal);
    } catch (error) {
      if (!this.items.includes(item)) return; // removed while it went up
      this.drop(item);
      this.render();
      if (error instanceof ApiError && error.status === 401) {
        // attached again once there is a key: a tray waiting on a dialog that may be
        // cancelled would hold the message back for good
        this.say(`“${item.name}” was not attached: the server needs an API key. Attach it again once the key is saved.`);
        this.onUnauthorized();
        return;
      }
      this.say(`“${item.name}” was not attached: ${reasonOf(error)}`);
      return;
    }
    if (!this.items.includes(item)) return;
    item.status = "ready";
    this.render();
    this.announce(`${item.name} attached`);
  }

  /** Take ``key`` out of the tray (its upload, if still going, is abandoned). */
  remove(key) {
    const index = this.items.findIndex((i) => i.key === key);
    if (index < 0) return;
    const item = this.items[index];
    this.drop(item);
    this.render();
    this.announce(`${item.name} removed`);
    // focus stays in the tray: on the next file's Remove, else the previous one's
    const next = this.items[index] || this.items[index - 1];
    if (next) next.el.querySelector(".attachment-remove").focus();
    else this.onEmpty();
  }

  drop(item) {
    item.controller.abort();
    if (item.preview) URL.revokeObjectURL(item.preview);
    this.items = this.items.filter((i) => i !== item);
  }

  /** A file is still going up. */
  uploading() {
    return this.items.some((i) => i.status === "uploading");
  }

  /** The files as the turn shows them: [{kind, file_id, media_type, filename, bytes, blob}]. */
  attachments() {
    return this.items
      .filter((i) => i.status === "ready")
      .map((i) => ({
        kind: i.kind,
        file_id: i.stored.file_id,
        media_type: i.stored.media_type || i.mediaType,
        filename: i.stored.filename || i.name,
        bytes: i.stored.bytes ?? i.file.size,
        blob: i.file,
      }));
  }

  /** Empty the tray (the message was sent). */
  clear() {
    for (const item of this.items) this.drop(item);
    this.say("");
    this.render();
  }

  /** Say ``text`` under the composer ("" clears it). */
  say(text) {
    this.message.textContent = text;
    this.message.hidden = !text;
  }

  render() {
    this.list.hidden = this.items.length === 0;
    // an item's element is kept (its thumbnail is not decoded again), its state updated
    this.list.replaceChildren(...this.items.map((item) => this.update(item)));
  }

  update(item) {
    if (!item.el) item.el = this.itemEl(item);
    const uploading = item.status === "uploading";
    const kind = item.kind === "image" ? "image" : "document";
    const label = `${item.name}, ${kind}, ${formatBytes(item.file.size)}${uploading ? ", uploading" : ""}`;
    item.el.dataset.status = item.status;
    item.el.setAttribute("aria-label", label);
    item.el.setAttribute("aria-busy", uploading ? "true" : "false");
    item.el.querySelector(".attachment-progress").hidden = !uploading;
    return item.el;
  }

  itemEl(item) {
    const preview = item.preview
      ? h("img", { class: "attachment-thumb", src: item.preview, alt: "" })
      : h("span", { class: "attachment-doc" }, icon("file"), h("span", { class: "attachment-name", text: item.name }));
    return h(
      "li",
      { class: "attachment", "data-kind": item.kind, title: item.name },
      preview,
      h("span", { class: "attachment-progress" }, h("span", { class: "spinner" })),
      h(
        "button",
        {
          type: "button",
          class: "attachment-remove",
          "aria-label": `Remove ${item.name}`,
          title: "Remove",
          onclick: () => this.remove(item.key),
        },
        icon("cross"),
      ),
    );
  }
}

/** A file's name as shown: pasted images come without a useful one. */
function displayName(file) {
  const name = (file.name || "").trim();
  return name || `pasted ${kindOf(mediaTypeOf(file) || "") === "image" ? "image" : "file"}`;
}

const exactBytes = (n) => `${n.toLocaleString("en")} bytes`;

/** The server's reason (its problem+json ``detail``), as one sentence. */
function reasonOf(error) {
  const text = error instanceof ApiError ? error.detail || error.title || error.code : "";
  return (text || "the upload failed").replace(/\.?$/, ".");
}
