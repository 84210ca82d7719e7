// A LangGraph client against agent-server, in Node: the official @langchain/langgraph-sdk
// Client (what useStream uses underneath), pointed at the service's /langgraph API.
//
// Node.js 20 or later:
//
//   npm install @langchain/langgraph-sdk@1.15.0
//   AGENT_URL=http://127.0.0.1:8000 node langgraph_client.mjs
//
// It streams an answer token by token, then asks to delete a file: the tool needs an approval,
// which arrives as an interrupt and is answered with command.resume.
import { Client } from "@langchain/langgraph-sdk";

const base = process.env.AGENT_URL ?? "http://127.0.0.1:8000";
const client = new Client({ apiUrl: `${base}/langgraph`, apiKey: process.env.AGENT_API_KEY });
const thread = await client.threads.create({ metadata: { example: "langgraph_client" } });
const human = (text) => ({ messages: [{ role: "user", content: text }] });

for await (const part of client.runs.stream(thread.thread_id, "default", {
  input: human("hello"),
  streamMode: "messages-tuple",
})) {
  if (part.event === "messages") process.stdout.write(part.data[0].content);
}
console.log();

let interrupt;
for await (const part of client.runs.stream(thread.thread_id, "default", {
  input: human("delete draft.txt"),
  streamMode: "updates",
})) {
  if (part.event === "updates" && part.data.__interrupt__) interrupt = part.data.__interrupt__[0];
}
const { action, args } = interrupt.value.action_request;
console.log(`interrupted: ${action} ${JSON.stringify(args)}`);

const answer = await client.runs.wait(thread.thread_id, "default", {
  command: { resume: [{ type: "accept", args: null }] },
});
console.log(answer.messages.at(-1).content);
