// An AG-UI front end in a few lines: @ag-ui/client's HttpAgent against agent-server.
//
// Node.js 22.12 or later:
//
//   npm install @ag-ui/client@1.0.0
//   AGENT_URL=http://127.0.0.1:8000 node agui_client.mjs
//
// It asks the time (a tool call), then asks to delete a file: the tool needs a person's
// approval, so the run ends with an interrupt, which the next run answers with `resume`.
import { HttpAgent, buildResumeArray } from "@ag-ui/client";
import { randomUUID } from "node:crypto";

const base = process.env.AGENT_URL ?? "http://127.0.0.1:8000";
const headers = process.env.AGENT_API_KEY ? { Authorization: `Bearer ${process.env.AGENT_API_KEY}` } : {};
const agent = new HttpAgent({ url: `${base}/v1/agents/default/ag-ui`, headers });

const printer = {
  onTextMessageContentEvent: ({ event }) => void process.stdout.write(event.delta),
  onTextMessageEndEvent: () => void process.stdout.write("\n"),
  onToolCallStartEvent: ({ event }) => console.log(`[tool ${event.toolCallName}]`),
};

async function say(text) {
  console.log(`> ${text}`);
  agent.addMessage({ id: randomUUID(), role: "user", content: text });
  await agent.runAgent({}, printer);
}

await say("What time is it?");
await say("Please delete draft.txt");

// the run ended with an interrupt: a person decides, the next run carries the answer
for (const interrupt of agent.pendingInterrupts) console.log(`[asked] ${interrupt.message}`);
const resume = buildResumeArray(
  agent.pendingInterrupts,
  Object.fromEntries(
    agent.pendingInterrupts.map((i) => [i.id, { status: "resolved", payload: { approved: true } }]),
  ),
);
await agent.runAgent({ resume }, printer);
console.log(`pending interrupts: ${agent.pendingInterrupts.length}`);
