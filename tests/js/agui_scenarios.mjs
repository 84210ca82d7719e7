// Scenarios run by the official AG-UI client (@ag-ui/client's HttpAgent), unmodified, against a
// real agent-server. Usage: node agui_scenarios.mjs BASE_URL SCENARIO
// Prints one JSON object: what the scenario observed. Exits non-zero on a failed check, on any
// error the client raises that the scenario did not expect, and on any warning the client
// prints (it warns when it strips material a 1.0 stream must not carry).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { HttpAgent, buildResumeArray, verifyEvents } from "@ag-ui/client";
import { from, lastValueFrom, toArray } from "rxjs";

const [base, scenario] = process.argv.slice(2);
const url = `${base}/v1/agents/default/ag-ui`;

const warnings = [];
const warn = console.warn;
console.warn = (...args) => {
  warnings.push(args.map(String).join(" "));
  warn(...args);
};

function agent(threadId = `agui-${randomUUID()}`, agentUrl = url) {
  return new HttpAgent({ url: agentUrl, threadId, headers: {} });
}

// runAgent, recording every event the client accepted (after its own verifyEvents)
async function run(a, params = {}) {
  const events = [];
  let failure;
  try {
    await a.runAgent(params, { onEvent: ({ event }) => void events.push(event) });
  } catch (error) {
    failure = error;
  }
  return { events, failure };
}

// every stream the server sent, run through verifyEvents on its own as well
async function verified(events) {
  const out = await lastValueFrom(from(events).pipe(verifyEvents(), toArray()));
  assert.equal(out.length, events.length);
}

const types = (events) => events.map((e) => e.type);
const lastText = (a) =>
  a.messages.filter((m) => m.role === "assistant" && typeof m.content === "string").at(-1)
    ?.content;

const scenarios = {
  async run() {
    const a = agent();
    a.addMessage({ id: randomUUID(), role: "user", content: "hello there" });
    const { events, failure } = await run(a);
    assert.equal(failure, undefined, String(failure));
    await verified(events);
    const t = types(events);
    assert.equal(t[0], "RUN_STARTED");
    assert.equal(t.at(-1), "RUN_FINISHED");
    assert.ok(t.includes("TEXT_MESSAGE_CONTENT"));
    const finished = events.at(-1);
    assert.equal(finished.outcome.type, "success");
    assert.ok(finished.usage.length >= 1);
    return {
      types: t,
      text: lastText(a),
      usage: finished.usage,
      runId: events[0].rawEvent.run_id,
      threadId: a.threadId,
      events,
    };
  },

  async tool() {
    const a = agent();
    a.addMessage({ id: randomUUID(), role: "user", content: "what time is it?" });
    const { events, failure } = await run(a);
    assert.equal(failure, undefined, String(failure));
    await verified(events);
    const result = events.find((e) => e.type === "TOOL_CALL_RESULT");
    const start = events.find((e) => e.type === "TOOL_CALL_START");
    assert.equal(start.toolCallName, "current_time");
    assert.equal(result.toolCallId, start.toolCallId);
    const call = a.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.id === start.toolCallId);
    assert.equal(call.function.name, "current_time");
    const toolMessage = a.messages.find((m) => m.role === "tool");
    assert.equal(toolMessage.toolCallId, start.toolCallId);
    return { types: types(events), text: lastText(a), events };
  },

  async interrupt() {
    const a = agent();
    a.addMessage({ id: randomUUID(), role: "user", content: "please delete notes.txt" });
    const first = await run(a);
    assert.equal(first.failure, undefined, String(first.failure));
    await verified(first.events);
    const finished = first.events.at(-1);
    assert.equal(finished.type, "RUN_FINISHED");
    assert.equal(finished.outcome.type, "interrupt");
    assert.equal(a.pendingInterrupts.length, 1);
    const interrupt = a.pendingInterrupts[0];
    assert.equal(interrupt.reason, "confirmation");
    assert.ok(interrupt.expiresAt);

    // plain input while the interrupt is pending: refused with RUN_ERROR
    const other = agent(a.threadId);
    other.addMessage({ id: randomUUID(), role: "user", content: "something else" });
    const refused = await run(other);
    await verified(refused.events);
    const error = refused.events.find((e) => e.type === "RUN_ERROR");
    assert.equal(error.code, "interrupt_pending");

    const resume = buildResumeArray(a.pendingInterrupts, {
      [interrupt.id]: { status: "resolved", payload: { approved: true } },
    });
    const second = await run(a, { resume });
    assert.equal(second.failure, undefined, String(second.failure));
    await verified(second.events);
    assert.equal(second.events.at(-1).outcome.type, "success");
    assert.equal(a.pendingInterrupts.length, 0);

    // the same answer again: idempotent, the rest of the run replayed
    const again = agent(a.threadId);
    const repeated = await run(again, { resume });
    assert.equal(repeated.failure, undefined, String(repeated.failure));
    await verified(repeated.events);
    return {
      interrupt,
      refused: error,
      text: lastText(a),
      repeatedText: lastText(again),
      resumedTypes: types(second.events),
      events: [...first.events, ...refused.events, ...second.events, ...repeated.events],
    };
  },

  async deny() {
    const a = agent();
    a.addMessage({ id: randomUUID(), role: "user", content: "delete secrets.txt" });
    await run(a);
    const [interrupt] = a.pendingInterrupts;
    const resume = buildResumeArray(a.pendingInterrupts, {
      [interrupt.id]: { status: "cancelled" },
    });
    const second = await run(a, { resume });
    assert.equal(second.failure, undefined, String(second.failure));
    await verified(second.events);
    return { text: lastText(a), events: second.events };
  },

  async abort() {
    const a = agent();
    a.addMessage({ id: randomUUID(), role: "user", content: `a slow answer please ${"and more ".repeat(20)}` });
    let runId;
    const events = [];
    const done = a.runAgent(
      {},
      {
        onEvent: ({ event }) => {
          events.push(event);
          if (event.type === "RUN_STARTED") runId = event.rawEvent.run_id;
          if (event.type === "TEXT_MESSAGE_CONTENT") a.abortRun();
        },
      },
    );
    let failure;
    try {
      await done;
    } catch (error) {
      failure = String(error);
    }
    assert.ok(runId);
    return { runId, threadId: a.threadId, types: types(events), failure, events };
  },

  // the "thinker" agent of tests/fakes/reasoning_models.py: reasoning, a tool call, the answer
  async reasoning() {
    const a = agent(undefined, `${base}/v1/agents/thinker/ag-ui`);
    a.addMessage({ id: randomUUID(), role: "user", content: "what time is it?" });
    const { events, failure } = await run(a);
    assert.equal(failure, undefined, String(failure));
    await verified(events);
    const t = types(events);
    // each model call's reasoning before what it leads to: the tool call, the answer
    assert.ok(t.indexOf("REASONING_START") < t.indexOf("TOOL_CALL_START"));
    assert.ok(t.lastIndexOf("REASONING_END") < t.indexOf("TEXT_MESSAGE_START"));
    const reasoning = a.messages.filter((m) => m.role === "reasoning");
    const finished = events.at(-1);
    assert.equal(finished.outcome.type, "success");
    return {
      types: t,
      reasoning: reasoning.map((m) => m.content),
      roles: a.messages.map((m) => m.role),
      text: lastText(a),
      usage: finished.usage,
      events,
    };
  },

  async overloaded() {
    const a = agent();
    a.addMessage({ id: randomUUID(), role: "user", content: "hello" });
    let failed;
    const { failure } = await run(a, {});
    failed = failure;
    assert.ok(failed, "the run should have failed");
    return { status: failed.status, message: String(failed.message), payload: failed.payload };
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
