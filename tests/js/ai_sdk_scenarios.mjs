// Scenarios run by the official AI SDK client (npm `ai`: DefaultChatTransport, readUIMessageStream
// and the Chat that useChat wraps), unmodified, against a real agent-server.
// Usage: node ai_sdk_scenarios.mjs BASE_URL SCENARIO
// Prints one JSON object: what the scenario observed; exits non-zero on a failed check.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
} from "ai";

const [base, scenario] = process.argv.slice(2);
const api = `${base}/v1/agents/default/ai-sdk/chat`;

// The state a framework binding gives the Chat (as @ai-sdk/react does with React state).
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

const chatId = () => `chat-${randomUUID()}`;
// long enough to still be streaming when the scenario acts on it, even on a loaded machine
const SLOW = `a slow one ${Array.from({ length: 30 }, (_, i) => `w${i}`).join(" ")}`;
const textOf = (message) =>
  message.parts
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("");
const tools = (message) => message.parts.filter((p) => p.type === "dynamic-tool");

// every chunk of one response, and the message readUIMessageStream built from them
async function collect(stream) {
  const chunks = [];
  const tee = stream.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        chunks.push(chunk);
        controller.enqueue(chunk);
      },
    }),
  );
  let message;
  for await (const snapshot of readUIMessageStream({ stream: tee })) message = snapshot;
  return { chunks, message };
}

function userMessage(text) {
  return { id: randomUUID(), role: "user", parts: [{ type: "text", text }] };
}

const scenarios = {
  // the "thinker" agent of tests/fakes/reasoning_models.py: reasoning, a tool call, the answer
  async reasoning() {
    const transport = new DefaultChatTransport({ api: `${base}/v1/agents/thinker/ai-sdk/chat` });
    const stream = await transport.sendMessages({
      chatId: chatId(),
      messages: [userMessage("what time is it?")],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: undefined,
    });
    const { chunks, message } = await collect(stream);
    const reasoning = message.parts.filter((p) => p.type === "reasoning");
    assert.ok(reasoning.every((p) => p.state === "done"));
    assert.match(textOf(message), /^The time is /);
    return {
      parts: message.parts.map((p) => p.type),
      reasoning: reasoning.map((p) => p.text),
      usage: message.metadata.usage,
      chunks,
    };
  },

  async text() {
    const transport = new DefaultChatTransport({ api });
    const id = chatId();
    const stream = await transport.sendMessages({
      chatId: id,
      messages: [userMessage("hello there")],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: undefined,
    });
    const { chunks, message } = await collect(stream);
    assert.equal(textOf(message), "You said: hello there");
    assert.equal(chunks[0].type, "start");
    assert.equal(chunks.at(-1).type, "finish");
    assert.ok(message.metadata.usage.totalTokens > 0);

    // the same through the Chat that useChat wraps
    const chat = new NodeChat({ id: chatId(), transport });
    await chat.sendMessage({ text: "second" });
    assert.equal(chat.status, "ready");
    assert.equal(textOf(chat.messages.at(-1)), "You said: second");
    return { chunks, message, chat: chat.messages };
  },

  async tools() {
    const chat = new NodeChat({ id: chatId(), transport: new DefaultChatTransport({ api }) });
    await chat.sendMessage({ text: "what time is it?" });
    assert.equal(chat.status, "ready", String(chat.error));
    const answer = chat.messages.at(-1);
    const [call] = tools(answer);
    assert.equal(call.toolName, "current_time");
    assert.equal(call.state, "output-available");
    assert.match(textOf(answer), /^The time is /);
    return { message: answer };
  },

  async approval() {
    const results = {};
    for (const approved of [true, false]) {
      const chat = new NodeChat({
        id: chatId(),
        transport: new DefaultChatTransport({ api }),
        sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
      });
      await chat.sendMessage({ text: "please delete report.pdf" });
      assert.equal(chat.status, "ready", String(chat.error));
      const asked = structuredClone(chat.messages.at(-1));
      const [part] = tools(asked);
      assert.equal(part.state, "approval-requested");
      assert.equal(part.approval.id, part.toolCallId);
      await chat.addToolApprovalResponse({ id: part.approval.id, approved });
      // the answer is sent automatically; wait for that response to end
      for (let i = 0; i < 500 && (chat.status !== "ready" || textOf(chat.messages.at(-1)) === ""); i++) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      assert.equal(chat.status, "ready", String(chat.error));
      const answer = chat.messages.at(-1);
      const [done] = tools(answer);
      assert.equal(done.state, approved ? "output-available" : "output-denied");
      results[approved ? "approved" : "denied"] = { asked, answer, messages: chat.messages.length };
    }
    assert.match(textOf(results.approved.answer), /Deleted report\.pdf/);
    assert.match(textOf(results.denied.answer), /did not delete report\.pdf/);
    return results;
  },

  async resume() {
    const transport = new DefaultChatTransport({ api });
    const id = chatId();
    // nothing to resume yet: 204, the client gets no stream
    assert.equal(await transport.reconnectToStream({ chatId: id }), null);
    const chat = new NodeChat({ id, transport });
    assert.equal(chat.messages.length, 0);
    await chat.resumeStream();
    assert.equal(chat.status, "ready");
    assert.equal(chat.messages.length, 0);

    const first = await transport.sendMessages({
      chatId: id,
      messages: [userMessage(SLOW)],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: undefined,
    });
    const reader = first.getReader();
    let chunk;
    do chunk = (await reader.read()).value;
    while (chunk.type !== "text-delta");
    // the first response is still streaming: a second reader resumes the run from its start
    const resumed = await transport.reconnectToStream({ chatId: id });
    assert.ok(resumed);
    const replay = await collect(resumed);
    const rest = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      rest.push(value);
    }
    assert.equal(textOf(replay.message), `You said: ${SLOW}`);
    assert.equal(replay.chunks[0].type, "start");
    assert.equal(rest.at(-1).type, "finish");
    // and once the run ended, nothing to resume again
    assert.equal(await transport.reconnectToStream({ chatId: id }), null);
    return { replay: replay.message };
  },

  async stop() {
    // the client's stop (an aborted fetch) is a disconnect: the run is cancelled
    const chat = new NodeChat({ id: chatId(), transport: new DefaultChatTransport({ api }) });
    const sent = chat.sendMessage({ text: SLOW });
    const answering = () => {
      const last = chat.messages.at(-1);
      return last?.role === "assistant" && textOf(last) !== "";
    };
    for (let i = 0; i < 500 && !answering(); i++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const runId = chat.messages.at(-1).metadata.runId;
    await chat.stop();
    await sent;
    assert.equal(chat.status, "ready");

    // the dedicated stop endpoint, for a run that outlives its stream (on_disconnect continue)
    const transport = new DefaultChatTransport({ api, body: { on_disconnect: "continue" } });
    const id = chatId();
    const stream = await transport.sendMessages({
      chatId: id,
      messages: [userMessage(SLOW)],
      trigger: "submit-message",
      messageId: undefined,
      abortSignal: undefined,
    });
    const reading = collect(stream);
    const stopped = await fetch(`${api}/${id}/stop`, { method: "POST" });
    assert.equal(stopped.status, 202);
    const { chunks } = await reading;
    assert.equal(chunks.at(-1).type, "abort");
    const idle = await fetch(`${api}/${id}/stop`, { method: "POST" });
    assert.equal(idle.status, 204);
    return { runId, stoppedRun: (await stopped.json()).run_id, lastChunk: chunks.at(-1) };
  },

  async overloaded() {
    const transport = new DefaultChatTransport({ api });
    let failure;
    try {
      await transport.sendMessages({
        chatId: chatId(),
        messages: [userMessage("hello")],
        trigger: "submit-message",
        messageId: undefined,
        abortSignal: undefined,
      });
    } catch (error) {
      failure = error;
    }
    assert.ok(failure, "the request should have failed");
    return { status: failure.statusCode, message: String(failure.message) };
  },
};

const fn = scenarios[scenario];
if (!fn) {
  console.error(`unknown scenario ${scenario}`);
  process.exit(2);
}
process.stdout.write(JSON.stringify(await fn()));
