// Scenarios run by the official LangGraph JS client (npm `@langchain/langgraph-sdk`, Client),
// unmodified, against a real agent-server's /langgraph API.
// Usage: node langgraph_scenarios.mjs BASE_URL SCENARIO
// Prints one JSON object: what the scenario observed; exits non-zero on a failed check.
import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";

const [base, scenario] = process.argv.slice(2);
const client = new Client({ apiUrl: `${base}/langgraph` });

const human = (text) => ({ messages: [{ role: "user", content: text }] });

async function collect(stream) {
  const parts = [];
  for await (const part of stream) parts.push(part);
  return parts;
}

const scenarios = {
  async stream() {
    const assistants = await client.assistants.search();
    assert.deepEqual(
      assistants.map((a) => a.assistant_id),
      ["default"],
    );
    const thread = await client.threads.create({ metadata: { from: "js" } });
    const parts = await collect(
      client.runs.stream(thread.thread_id, "default", {
        input: human("hello from js"),
        streamMode: ["values", "messages-tuple"],
      }),
    );
    assert.equal(parts[0].event, "metadata");
    const text = parts
      .filter((p) => p.event === "messages")
      .map((p) => p.data[0].content)
      .join("");
    const values = parts.filter((p) => p.event === "values").at(-1).data;
    const found = await client.threads.search({ metadata: { from: "js" } });
    const history = await client.threads.getHistory(thread.thread_id);
    return {
      text,
      last: values.messages.at(-1).content,
      found: found.map((t) => t.thread_id).includes(thread.thread_id),
      checkpoints: history.length,
    };
  },

  async interrupt() {
    const thread = await client.threads.create();
    const first = await collect(
      client.runs.stream(thread.thread_id, "default", {
        input: human("delete draft.md"),
        streamMode: ["updates"],
      }),
    );
    const asked = first.find((p) => p.event === "updates" && p.data.__interrupt__);
    assert.ok(asked, JSON.stringify(first.map((p) => p.event)));
    const interrupt = asked.data.__interrupt__[0];
    const state = await client.threads.getState(thread.thread_id);
    assert.deepEqual(state.next, ["agent"]);
    const rest = await collect(
      client.runs.stream(thread.thread_id, "default", {
        command: { resume: [{ type: "accept", args: null }] },
        streamMode: ["values"],
      }),
    );
    const values = rest.filter((p) => p.event === "values").at(-1).data;
    return {
      action: interrupt.value.action_request,
      answer: values.messages.at(-1).content,
      status: (await client.threads.get(thread.thread_id)).status,
    };
  },

  // an interrupt answered with Agent Inbox's `edit` HumanResponse (its args an ActionRequest),
  // on the `editor` assistant, whose delete_file allows edits; refused on `default`
  async edit() {
    const interruptOf = async (threadId, assistant, text) => {
      const parts = await collect(
        client.runs.stream(threadId, assistant, {
          input: human(text),
          streamMode: ["updates"],
        }),
      );
      const asked = parts.find((p) => p.event === "updates" && p.data.__interrupt__);
      assert.ok(asked, JSON.stringify(parts.map((p) => p.event)));
      return asked.data.__interrupt__[0];
    };
    const edit = (path) => ({
      type: "edit",
      args: { action: "delete_file", args: { path } },
    });

    const thread = await client.threads.create();
    const asked = await interruptOf(thread.thread_id, "editor", "delete draft.md");
    const rest = await collect(
      client.runs.stream(thread.thread_id, "editor", {
        command: { resume: [edit("final.md")] },
        streamMode: ["values"],
      }),
    );
    const streamed = rest.filter((p) => p.event === "values").at(-1).data.messages;
    const state = await client.threads.getState(thread.thread_id);
    const called = (messages) =>
      messages.find((m) => m.type === "ai" && m.tool_calls?.length).tool_calls[0].args;

    const other = await client.threads.create();
    const strict = await interruptOf(other.thread_id, "default", "delete keep.md");
    let refused = null;
    try {
      await client.runs.wait(other.thread_id, "default", {
        command: { resume: [edit("gone.md")] },
      });
    } catch (error) {
      refused = { status: error.status, message: String(error.message) };
    }
    return {
      allowEdit: {
        editor: asked.value.config.allow_edit,
        default: strict.value.config.allow_edit,
      },
      streamedArgs: called(streamed),
      stateArgs: called(state.values.messages),
      toolResult: state.values.messages.find((m) => m.type === "tool").content,
      refused,
      afterRefusal: (await client.threads.get(other.thread_id)).status,
    };
  },
};

const run = scenarios[scenario];
if (!run) throw new Error(`unknown scenario ${scenario}`);
console.log(JSON.stringify(await run()));
