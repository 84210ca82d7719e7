// Images and documents: which files the server takes, and the stored files as the page shows
// them. An <img> cannot send the API key, so a stored file is fetched with it (api.js) and
// shown through an object URL; each file is fetched once and its URL kept while the
// conversation that shows it is open.

import { api } from "./api.js";

/** The media types the server takes (POST /v1/files), and the kind of part each becomes. */
export const MEDIA_KINDS = {
  "image/png": "image",
  "image/jpeg": "image",
  "image/gif": "image",
  "image/webp": "image",
  "application/pdf": "document",
  "text/plain": "document",
  "text/markdown": "document",
  "text/csv": "document",
};

// a browser may not know a type for these names (.md, often), or know another (.csv on some
// systems): the name says what the server will find when it reads the bytes
const BY_EXTENSION = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  pdf: "application/pdf",
  txt: "text/plain",
  text: "text/plain",
  md: "text/markdown",
  markdown: "text/markdown",
  csv: "text/csv",
};

/** The limits until the server says otherwise (GET /v1/files/limits): its defaults. One file
 * and the files of one message together take ``maxBytes`` and ``maxInputBytes`` at most; a
 * message has ``maxInputParts`` parts at most (its files, and its text). */
export const DEFAULT_LIMITS = Object.freeze({
  maxBytes: 20 * 1024 * 1024,
  mediaTypes: Object.keys(MEDIA_KINDS),
  maxInputBytes: 20 * 1024 * 1024,
  maxInputParts: 64,
});

/** The ``accept`` attribute of the file picker. */
export const ACCEPT = [...Object.keys(MEDIA_KINDS), ...Object.keys(BY_EXTENSION).map((e) => `.${e}`)].join(",");

/** The media type ``file`` will be taken as (its own type, else its name's), or null. */
export function mediaTypeOf(file, accepted = DEFAULT_LIMITS.mediaTypes) {
  const type = (file.type || "").toLowerCase().split(";")[0].trim();
  if (accepted.includes(type)) return type;
  const extension = /\.([a-z0-9]+)$/i.exec(file.name || "")?.[1]?.toLowerCase();
  const named = extension ? BY_EXTENSION[extension] : undefined;
  return named && accepted.includes(named) ? named : null;
}

/** "image" or "document", by media type. */
export const kindOf = (mediaType) => MEDIA_KINDS[mediaType] || "document";

/** A size as people read it: 812 bytes, 14 KB, 3.2 MB (1024-based, as file managers do). */
export function formatBytes(bytes) {
  if (!Number.isFinite(bytes)) return "";
  if (bytes < 1024) return `${bytes} byte${bytes === 1 ? "" : "s"}`;
  const units = ["KB", "MB", "GB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const shown = value < 10 && !Number.isInteger(value) ? value.toFixed(1) : String(Math.round(value));
  return `${shown} ${units[unit]}`;
}

/** The short name of a media type: PNG, PDF, Markdown, ... */
export function typeLabel(mediaType) {
  const names = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/gif": "GIF",
    "image/webp": "WebP",
    "application/pdf": "PDF",
    "text/plain": "text",
    "text/markdown": "Markdown",
    "text/csv": "CSV",
  };
  return names[mediaType] || mediaType || "file";
}

// --- stored files --------------------------------------------------------------------------

const urls = new Map(); // file id → Promise of its object URL
let generation = 0;

/** The object URL of a stored file's bytes (fetched with the API key, once). */
export function fileUrl(fileId) {
  let url = urls.get(fileId);
  if (!url) {
    const born = generation;
    url = api.fileContent(fileId).then((blob) => {
      const made = URL.createObjectURL(blob);
      // the conversation was left while the bytes came: nothing shows them any more
      if (born !== generation) URL.revokeObjectURL(made);
      return made;
    });
    // a failure is not kept: the next showing asks again
    url.catch(() => urls.get(fileId) === url && urls.delete(fileId));
    urls.set(fileId, url);
  }
  return url;
}

/** Show ``blob`` (just uploaded from this page) as ``fileId``'s bytes: no fetch needed. */
export function adoptFileUrl(fileId, blob) {
  if (!urls.has(fileId)) urls.set(fileId, Promise.resolve(URL.createObjectURL(blob)));
}

/** Let go of every file URL (the conversation showing them was replaced). */
export function releaseFileUrls() {
  generation += 1;
  for (const url of urls.values()) url.then((made) => URL.revokeObjectURL(made), () => {});
  urls.clear();
}
