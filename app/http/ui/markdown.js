// Markdown to DOM for the agent's answers: marked (GitHub-flavoured Markdown) renders, DOMPurify
// sanitises, highlight.js colours code. All three are vendored (vendor/README.md).
//
// What the model writes is data, never markup: raw HTML in an answer is shown as text, images
// become links (nothing loads from another site), links open in a new tab without a referrer,
// and DOMPurify removes anything that could run (javascript: URLs, event handlers) from what
// is left. Under the page's Content-Security-Policy nothing inline could run anyway.

import DOMPurify from "./vendor/dompurify/purify.es.mjs";
import hljs from "./vendor/highlight/highlight.min.js";
import { Marked } from "./vendor/marked/marked.esm.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

// A streamed answer is rendered again on every frame while it grows: highlighting the code
// blocks that did not change is the expensive part, so it is remembered.
const highlighted = new Map();
const HIGHLIGHT_CACHE = 200;

function highlight(code, lang) {
  const language = lang && hljs.getLanguage(lang) ? lang : null;
  if (!language) return escapeHtml(code);
  const key = `${language}\u0000${code}`;
  let html = highlighted.get(key);
  if (html === undefined) {
    html = hljs.highlight(code, { language, ignoreIllegals: true }).value;
    if (highlighted.size >= HIGHLIGHT_CACHE) highlighted.delete(highlighted.keys().next().value);
    highlighted.set(key, html);
  }
  return html;
}

const marked = new Marked({ gfm: true, breaks: false, async: false });
marked.use({
  renderer: {
    // raw HTML in an answer is text to show, not markup
    html: ({ text }) => escapeHtml(text),
    image: ({ href, text }) => `<a href="${escapeHtml(href)}">${escapeHtml(text || href)}</a>`,
    code({ text, lang }) {
      const language = (lang || "").trim().split(/\s+/)[0].toLowerCase();
      const cls = language ? ` class="hljs language-${escapeHtml(language)}"` : ' class="hljs"';
      return `<pre data-lang="${escapeHtml(language)}"><code${cls}>${highlight(text, language)}</code></pre>\n`;
    },
  },
});

const purifier = DOMPurify();
purifier.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});
const SANITIZE = {
  RETURN_DOM_FRAGMENT: true,
  // no forms, media or styles from an answer; a style attribute would also break the CSP
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "img", "video", "audio", "iframe", "svg", "math"],
  FORBID_ATTR: ["style"],
};

/** The answer ``text`` as a sanitised DocumentFragment (code blocks get a Copy button). */
export function renderMarkdown(text) {
  const fragment = purifier.sanitize(marked.parse(text || ""), SANITIZE);
  for (const pre of fragment.querySelectorAll("pre")) {
    const lang = pre.dataset.lang || "";
    const head = document.createElement("div");
    head.className = "code-head";
    const label = document.createElement("span");
    label.className = "code-lang";
    label.textContent = lang || "text";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy-code";
    copy.dataset.copy = "code";
    copy.textContent = "Copy";
    copy.setAttribute("aria-label", `Copy the ${lang || "text"} code`);
    head.append(label, copy);
    const block = document.createElement("div");
    block.className = "code-block";
    pre.replaceWith(block);
    block.append(head, pre);
  }
  return fragment;
}

const TITLE_CHARS = 80;
const BLOCK_END = /<\/(p|h[1-6]|li|pre|blockquote|td|th|tr|table|ul|ol)>|<br\s*\/?>|<hr\s*\/?>/g;
const titles = new Map();

/**
 * A conversation's title as plain text: its Markdown drawn and read back as text (so
 * ``**bold**`` is "bold", ``[docs](url)`` is "docs", a heading's ``#`` goes), on one line, cut
 * at 80 characters with an ellipsis. Raw HTML stays text, as in an answer.
 */
export function plainTitle(text) {
  const source = String(text || "");
  let title = titles.get(source);
  if (title === undefined) {
    // blocks would run together as text: a space where each one ends
    const html = marked.parse(source).replace(BLOCK_END, " $&");
    const fragment = purifier.sanitize(html, SANITIZE);
    title = (fragment.textContent || "").replace(/\s+/g, " ").trim();
    if (title.length > TITLE_CHARS) title = `${title.slice(0, TITLE_CHARS - 1).trimEnd()}…`;
    if (titles.size >= HIGHLIGHT_CACHE) titles.delete(titles.keys().next().value);
    titles.set(source, title);
  }
  return title;
}

/** Put ``text`` on the clipboard; falls back to a selection where the Clipboard API is off. */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "sr-only";
    document.body.append(area);
    area.select();
    const done = document.execCommand("copy");
    area.remove();
    return done;
  }
}
