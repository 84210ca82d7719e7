// Images and documents sent by the official AG-UI client (@ag-ui/client's HttpAgent) and the AI
// SDK's Chat (npm `ai`: DefaultChatTransport, the Chat that useChat wraps), unmodified, to a real
// agent-server.
// Usage: node media_scenarios.mjs BASE_URL SCENARIO SAMPLES_FILE
// SAMPLES_FILE: a JSON file {"id": <thread or chat id>, "png": <base64>, "pdf": <base64>,
// "key": <API key>, "question": <the text sent with them>}.
// Prints one JSON object: what the scenario observed. Exits non-zero on a failed check, on any
// error the client raises that the scenario did not expect, and on any warning it prints.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { HttpAgent, verifyEvents } from "@ag-ui/client";
import { AbstractChat, DefaultChatTransport } from "ai";
import { from, lastValueFrom, toArray } from "rxjs";

const [base, scenario, samplesFile] = process.argv.slice(2);
const { id, png, pdf, key, question } = JSON.parse(readFileSync(samplesFile, "utf8"));
const headers = { Authorization: `Bearer ${key}` };

const warnings = [];
const warn = console.warn;
console.warn = (...args) => {
  warnings.push(args.map(String).join(" "));
  warn(...args);
};

// --- AG-UI ----------------------------------------------------------------------------------

const aguiUrl = `${base}/v1/agents/default/ag-ui`;

async function runAgui(threadId, content) {
  const agent = new HttpAgent({ url: aguiUrl, threadId, headers });
  agent.addMessage({ id: randomUUID(), role: "user", content });
  const events = [];
  let failure;
  try {
    await agent.runAgent({}, { onEvent: ({ event }) => void events.push(event) });
  } catch (error) {
    failure = error;
  }
  const verified = await lastValueFrom(from(events).pipe(verifyEvents(), toArray()));
  assert.equal(verified.length, events.length);
  const text = agent.messages
    .filter((m) => m.role === "assistant" && typeof m.content === "string")
    .at(-1)?.content;
  return { events, failure, text, types: events.map((e) => e.type) };
}

const image = (source) => ({ type: "image", source });
const document = (source, metadata) => ({ type: "document", source, ...(metadata && { metadata }) });

// --- the AI SDK -----------------------------------------------------------------------------

const chatApi = `${base}/v1/agents/default/ai-sdk/chat`;

class NodeChatState {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) {
    this.messages = [...this.messages, message];
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = this.messages.map((m, i) => (i === index ? message : m));
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class NodeChat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new NodeChatState() });
  }
  get messages() {
    return this.state.messages;
  }
}

const textOf = (message) =>
  message.parts
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("");

async function sendChat(chatId, parts) {
  const chat = new NodeChat({ id: chatId, transport: new DefaultChatTransport({ api: chatApi, headers }) });
  await chat.sendMessage({ role: "user", parts });
  return chat;
}

const pngUrl = `data:image/png;base64,${png}`;
const pdfUrl = `data:application/pdf;base64,${pdf}`;

const scenarios = {
  // text, a PNG and a PDF, as AG-UI 1.0's image and document parts with inline data sources
  async agui() {
    const { events, failure, text, types } = await runAgui(id, [
      { type: "text", text: question },
      image({ type: "data", value: png, mimeType: "image/png" }),
      document({ type: "data", value: pdf, mimeType: "application/pdf" }, { filename: "doc.pdf" }),
    ]);
    assert.equal(failure, undefined, String(failure));
    assert.equal(types[0], "RUN_STARTED");
    assert.equal(types.at(-1), "RUN_FINISHED");
    return { text, runId: events[0].rawEvent.run_id, types };
  },

  // what AG-UI cannot pass on: each refused with the protocol's own RUN_ERROR
  async aguiRefusals() {
    const cases = {
      lying: [image({ type: "data", value: pdf, mimeType: "image/png" })],
      audio: [{ type: "audio", source: { type: "url", value: "https://example.com/a.mp3" } }],
      unknownFile: [image({ type: "file", value: "file_0123456789abcdef0123456789abcdef" })],
      otherProvider: [image({ type: "file", value: "file-abc", provider: "openai" })],
      httpUrl: [image({ type: "url", value: "http://example.com/a.png" })],
    };
    const seen = {};
    for (const [name, content] of Object.entries(cases)) {
      const { events, failure, types } = await runAgui(`${id}-${name}`, [
        { type: "text", text: "look" },
        ...content,
      ]);
      // the run's own error event, which the client hands to onRunErrorEvent
      assert.equal(failure, undefined, String(failure));
      assert.deepEqual(types, ["RUN_ERROR"], `${name}: ${types}`);
      seen[name] = { code: events[0].code, message: events[0].message };
    }
    return seen;
  },

  // text, a PNG and a PDF as the AI SDK's file parts (data URLs), through the Chat useChat wraps
  async aiSdk() {
    const chat = await sendChat(id, [
      { type: "text", text: question },
      { type: "file", mediaType: "image/png", url: pngUrl },
      { type: "file", mediaType: "application/pdf", filename: "doc.pdf", url: pdfUrl },
    ]);
    assert.equal(chat.status, "ready", String(chat.error));
    const answer = chat.messages.at(-1);
    assert.equal(answer.role, "assistant");
    // the client keeps its own message as it sent it; the server's stream adds the answer only
    assert.equal(chat.messages.length, 2);
    return { text: textOf(answer), runId: answer.metadata.runId };
  },

  // the idiomatic call (text and files): the files go first, as the client orders them
  async aiSdkFiles() {
    const chat = new NodeChat({ id, transport: new DefaultChatTransport({ api: chatApi, headers }) });
    await chat.sendMessage({
      text: "and these?",
      files: [{ type: "file", mediaType: "image/png", filename: "dot.png", url: pngUrl }],
    });
    assert.equal(chat.status, "ready", String(chat.error));
    return { text: textOf(chat.messages.at(-1)) };
  },

  async aiSdkRefusals() {
    const cases = {
      lying: [{ type: "file", mediaType: "image/png", url: pdfUrl }],
      wrongBytes: [{ type: "file", mediaType: "image/png", url: `data:image/png;base64,${pdf}` }],
      httpUrl: [{ type: "file", mediaType: "image/png", url: "http://example.com/a.png" }],
      audio: [{ type: "file", mediaType: "audio/mpeg", url: "data:audio/mpeg;base64,SUQz" }],
      data: [{ type: "data-note", data: { a: 1 } }],
    };
    const seen = {};
    for (const [name, parts] of Object.entries(cases)) {
      const chat = await sendChat(`${id}-${name}`, [{ type: "text", text: "look" }, ...parts]);
      assert.equal(chat.status, "error", `${name}: ${chat.status}`);
      seen[name] = String(chat.error.message);
    }
    return seen;
  },
};

const fn = scenarios[scenario];
if (!fn) {
  console.error(`unknown scenario ${scenario}`);
  process.exit(2);
}
const result = await fn();
assert.deepEqual(warnings, [], "the client warned");
process.stdout.write(JSON.stringify(result));
