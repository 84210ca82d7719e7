// A Vercel AI SDK front end against agent-server, in Node: the `ai` package's
// DefaultChatTransport and readUIMessageStream (what useChat uses underneath).
//
// Node.js 22.12 or later:
//
//   npm install ai@7.0.173
//   AGENT_URL=http://127.0.0.1:8000 node ai_sdk_chat.mjs
//
// It sends a message and prints the answer as it streams, then asks to delete a file: the
// tool needs an approval, which the next request carries in the assistant message.
import { DefaultChatTransport, readUIMessageStream } from "ai";
import { randomUUID } from "node:crypto";

const base = process.env.AGENT_URL ?? "http://127.0.0.1:8000";
const headers = process.env.AGENT_API_KEY ? { Authorization: `Bearer ${process.env.AGENT_API_KEY}` } : {};
const transport = new DefaultChatTransport({ api: `${base}/v1/agents/default/ai-sdk/chat`, headers });
const chatId = `chat-${randomUUID()}`;
const messages = [];

async function send() {
  const stream = await transport.sendMessages({
    chatId,
    messages,
    trigger: "submit-message",
    messageId: undefined,
    abortSignal: undefined,
  });
  let answer;
  for await (const message of readUIMessageStream({ stream, message: messages.at(-1)?.role === "assistant" ? messages.at(-1) : undefined })) {
    answer = message;
  }
  if (messages.at(-1)?.id === answer.id) messages[messages.length - 1] = answer;
  else messages.push(answer);
  return answer;
}

function show(message) {
  for (const part of message.parts) {
    if (part.type === "text") console.log(part.text);
    if (part.type === "dynamic-tool") console.log(`[tool ${part.toolName}: ${part.state}]`);
  }
}

messages.push({ id: randomUUID(), role: "user", parts: [{ type: "text", text: "Hello!" }] });
show(await send());

messages.push({ id: randomUUID(), role: "user", parts: [{ type: "text", text: "Please delete draft.txt" }] });
const asked = await send();
show(asked);

// a person approves: the tool part carries the answer, and the chat goes on
const part = asked.parts.find((p) => p.state === "approval-requested");
part.state = "approval-responded";
part.approval = { ...part.approval, approved: true };
const answer = await send();
show(answer);
console.log(`usage: ${JSON.stringify(answer.metadata.usage)}`);
