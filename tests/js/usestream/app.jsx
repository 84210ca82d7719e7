// A small chat page on `useStream` (npm `@langchain/langgraph-sdk/react`), unmodified, against
// the service's /langgraph API from another origin. tests/e2e/test_langgraph_usestream.py
// bundles it with build.mjs and drives it in headless Chromium.
//
// The page reads where the service is from its query string:
//   ?api=http://127.0.0.1:8000/langgraph&assistant=default&key=sk-...
import { useStream } from "@langchain/langgraph-sdk/react";
import { useState } from "react";
import { createRoot } from "react-dom/client";

const query = new URLSearchParams(window.location.search);

function text(content) {
  if (typeof content === "string") return content;
  // content blocks: the text ones are what a reader sees
  return (content ?? [])
    .filter((block) => block.type === "text")
    .map((block) => block.text)
    .join("");
}

function Message({ message }) {
  const calls = message.tool_calls ?? [];
  return (
    <li data-type={message.type} data-id={message.id}>
      <span className="text">{text(message.content)}</span>
      {calls.map((call) => (
        <code key={call.id} className="tool-call">
          {call.name}({JSON.stringify(call.args)})
        </code>
      ))}
    </li>
  );
}

// A HumanInterrupt (Agent Inbox's shape): the tool and its arguments, with the answers allowed.
function Interrupt({ interrupt, answer, busy }) {
  const { action_request: request, config = {}, description } = interrupt.value ?? {};
  return (
    <section role="alertdialog" aria-label="Interrupt" data-id={interrupt.id}>
      <p className="description">{description}</p>
      <p>
        <strong className="action">{request?.action}</strong>{" "}
        <code className="args">{JSON.stringify(request?.args)}</code>
      </p>
      <button
        type="button"
        disabled={busy || !config.allow_accept}
        onClick={() => answer({ type: "accept" })}
      >
        Accept
      </button>
      <button
        type="button"
        disabled={busy || !config.allow_ignore}
        onClick={() => answer({ type: "ignore" })}
      >
        Ignore
      </button>
    </section>
  );
}

function App() {
  // the last run started: the SDK reads its ids from the stream's Content-Location
  const [created, setCreated] = useState(null);
  const stream = useStream({
    apiUrl: query.get("api"),
    assistantId: query.get("assistant") ?? "default",
    apiKey: query.get("key") ?? undefined,
    messagesKey: "messages",
    onCreated: setCreated,
  });
  const [prompt, setPrompt] = useState("");

  const send = (event) => {
    event.preventDefault();
    const content = prompt.trim();
    if (!content) return;
    setPrompt("");
    stream.submit({ messages: [{ type: "human", content }] });
  };
  const answer = (response) => stream.submit(undefined, { command: { resume: response } });

  return (
    <>
      <ol id="messages" aria-label="Messages">
        {stream.messages.map((message, index) => (
          <Message key={message.id ?? index} message={message} />
        ))}
      </ol>
      {stream.interrupt?.value != null && (
        <Interrupt interrupt={stream.interrupt} answer={answer} busy={stream.isLoading} />
      )}
      {stream.error != null && <p role="alert">{String(stream.error?.message ?? stream.error)}</p>}
      <form onSubmit={send}>
        <input
          aria-label="Prompt"
          value={prompt}
          onChange={(event) => setPrompt(event.target.value)}
        />
        <button type="submit" disabled={stream.isLoading}>
          Send
        </button>
      </form>
      <p
        id="status"
        data-loading={String(stream.isLoading)}
        data-thread-id={created?.thread_id ?? ""}
        data-run-id={created?.run_id ?? ""}
      >
        {stream.isLoading ? "streaming" : "idle"}
      </p>
    </>
  );
}

createRoot(document.getElementById("root")).render(<App />);
