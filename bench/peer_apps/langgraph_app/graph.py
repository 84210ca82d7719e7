# mypy: ignore-errors
# (runs in bench/.peers/langgraph, which has LangGraph; this project's environment has not)
"""Two LangGraph graphs for ``langgraph dev`` (in-memory API server).

- ``chat``: one node calling a fake chat model that streams ``You said: <input>`` one word per
  chunk (the service's demo model, word for word);
- ``approval``: a node that suspends at ``interrupt()`` until resumed, then answers
  ``Deleted <path>`` (the comparable of a run waiting for a confirmation).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypedDict

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt

_WORD = re.compile(r"\S+\s*")


class EchoWordsModel(BaseChatModel):
    """A fake chat model: ``You said: <last message>``, streamed one word per chunk."""

    @property
    def _llm_type(self) -> str:
        return "echo-words"

    def _answer(self, messages: list[BaseMessage]) -> str:
        return f"You said: {messages[-1].content}"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(self._answer(messages)))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for word in _WORD.findall(self._answer(messages)):
            yield ChatGenerationChunk(message=AIMessageChunk(content=word))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for word in _WORD.findall(self._answer(messages)):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word))
            if run_manager is not None:
                await run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk


_model = EchoWordsModel()


async def _call_model(state: MessagesState) -> dict[str, Any]:
    return {"messages": [await _model.ainvoke(state["messages"])]}


_chat = StateGraph(MessagesState)
_chat.add_node("model", _call_model)
_chat.add_edge(START, "model")
_chat.add_edge("model", END)
chat = _chat.compile()


class ApprovalState(TypedDict, total=False):
    path: str
    answer: str


def _delete(state: ApprovalState) -> dict[str, Any]:
    approved = interrupt({"tool": "delete_file", "arguments": {"path": state["path"]}})
    if approved:
        return {"answer": f"Deleted {state['path']} as you asked."}
    return {"answer": f"I did not delete {state['path']}."}


_approval = StateGraph(ApprovalState)
_approval.add_node("delete", _delete)
_approval.add_edge(START, "delete")
_approval.add_edge("delete", END)
approval = _approval.compile()
