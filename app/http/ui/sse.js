// Server-Sent Events over fetch(): EventSource can only GET, and a run starts with a POST.
//
// The parser follows the WHATWG "event stream interpretation" rules: lines end with CRLF,
// LF or CR (a CR at the end of one chunk and an LF at the start of the next are one line
// end); a line starting with ":" is a comment; "field: value" loses one leading space;
// several data lines join with "\n"; a blank line dispatches; an event without data is
// dropped; an id containing NUL is ignored.

export class SSEParser {
  constructor() {
    this.buffer = "";
    this.pendingCR = false;
    this.reset();
    this.lastEventId = "";
    this.retry = null;
  }

  reset() {
    this.data = [];
    this.eventType = "";
    this.sawData = false;
  }

  /** Feed decoded text; returns the events it completed and the number of comments seen. */
  feed(text) {
    const events = [];
    let comments = 0;
    if (this.pendingCR && text.startsWith("\n")) text = text.slice(1);
    this.pendingCR = false;
    this.buffer += text;
    let start = 0;
    const buf = this.buffer;
    for (let i = 0; i < buf.length; i++) {
      const ch = buf.charCodeAt(i);
      if (ch !== 10 && ch !== 13) continue;
      const line = buf.slice(start, i);
      if (ch === 13) {
        if (i + 1 < buf.length) {
          if (buf.charCodeAt(i + 1) === 10) i++;
        } else {
          this.pendingCR = true; // the LF may come with the next chunk
        }
      }
      start = i + 1;
      const result = this.line(line);
      if (result === "comment") comments++;
      else if (result) events.push(result);
    }
    this.buffer = buf.slice(start);
    return { events, comments };
  }

  line(line) {
    if (line === "") {
      if (!this.sawData) {
        this.reset();
        return null;
      }
      const event = {
        id: this.lastEventId,
        event: this.eventType || "message",
        data: this.data.join("\n"),
      };
      this.reset();
      return event;
    }
    if (line.startsWith(":")) return "comment";
    const colon = line.indexOf(":");
    let field = line;
    let value = "";
    if (colon !== -1) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
    }
    switch (field) {
      case "data":
        this.data.push(value);
        this.sawData = true;
        break;
      case "event":
        this.eventType = value;
        break;
      case "id":
        if (!value.includes("\0")) this.lastEventId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retry = Number(value);
        break;
      default:
        break; // unknown fields are ignored
    }
    return null;
  }
}

/**
 * Read an event-stream response to its end.
 *
 * `onEvents(events)` gets each chunk's complete events at once (a replay arrives as one
 * burst, and the caller can settle its view once per burst). `onActivity()` is called for
 * every chunk, pings included: the caller's stall watchdog.
 */
export async function readEventStream(response, { onEvents, onActivity }) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SSEParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      onActivity?.();
      const { events } = parser.feed(decoder.decode(value, { stream: true }));
      if (events.length) {
        const stop = onEvents(events);
        if (stop) break;
      }
    }
    const { events } = parser.feed(decoder.decode());
    if (events.length) onEvents(events);
  } finally {
    reader.cancel().catch(() => {});
  }
}
