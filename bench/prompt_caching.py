"""12. Prompt caching: the input billed over a ten-turn conversation, caching on and off.

One agent-server with two agents on the same Anthropic model, the same system prompt (about
2,500 tokens, an agent's instructions as they grow in practice) and the same tools: ``cached``
(prompt caching on, the default) and ``uncached`` (``prompt_caching = false``). The model is
the fake upstream of the test suite (``tests/fakes/upstream``) with its prompt cache on: it
counts a cache read when a request begins with a prefix, up to a ``cache_control`` breakpoint,
that an earlier request wrote, and reports ``cache_read_input_tokens`` and
``cache_creation_input_tokens`` as the Messages API does (prefixes under 1,024 tokens are not
cached). Each agent holds a ten-turn conversation in a session of its own; each run's usage is
read from its answer, as a client reads it.

The bill is Anthropic's price list in base-price input tokens: a token read from the cache
costs 0.1 of a fresh one, a token written to it 1.25, the rest 1. The figures are the input
billed with caching on and off, and their ratio.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.outcome import Config, Outcome, Target
from bench.procs import agent_server, running
from tests.fakes.upstream import FakeUpstream, Text

__all__ = ["CACHE_READ_PRICE", "CACHE_WRITE_PRICE", "billed", "scenario_prompt_caching"]

CACHE_READ_PRICE = 0.1
CACHE_WRITE_PRICE = 1.25
MODEL = "claude-bench"
TURNS = 10
ANSWER = (
    "Here is what I found. The request touches three parts of the system: the ingestion job, "
    "the nightly report and the billing export. The first two can change today; the third "
    "needs the finance team's sign-off, so I drafted the change and left it for review."
)


def _instructions() -> str:
    """A system prompt of about 2,500 tokens (the fake counts one per four characters)."""
    rules = [
        f"{n}. When a request concerns area {n}, check its owner, its runbook and the last "
        f"change made to it; say which of them you used, and never act outside area {n} "
        "without asking first."
        for n in range(1, 61)
    ]
    return "You are the operations assistant of a mid-sized company.\n" + "\n".join(rules)


def _agents(path: Path) -> Path:
    config = path / "agents.toml"
    prompt = _instructions().replace('"""', "")
    agents = []
    for name, caching in (("cached", "true"), ("uncached", "false")):
        agents.append(
            f'[agents.{name}]\nmodel = "anthropic:{MODEL}"\ntools = ["current_time"]\n'
            f'prompt_caching = {caching}\nsystem_prompt = """\n{prompt}"""\n'
        )
    config.write_text("\n".join(agents), encoding="utf-8")
    return config


def billed(usage: dict[str, Any]) -> float:
    """The input of ``usage`` in base-price tokens, as Anthropic bills it."""
    read = int(usage.get("cached_input_tokens") or 0)
    written = int(usage.get("cache_write_tokens") or 0)
    fresh = int(usage["input_tokens"]) - read - written
    return fresh + CACHE_READ_PRICE * read + CACHE_WRITE_PRICE * written


def _conversation(base_url: str, agent: str, turns: int) -> list[dict[str, Any]]:
    """Each turn's usage, as its run's answer reports it."""
    usages = []
    with httpx.Client(base_url=base_url, timeout=60, trust_env=False) as client:
        for turn in range(1, turns + 1):
            answer = client.post(
                f"/v1/sessions/{agent}-conversation/runs",
                json={
                    "input": f"Question {turn}: what should change in area {turn} this week?",
                    "agent": agent,
                    "stream": False,
                },
            )
            answer.raise_for_status()
            body = answer.json()
            if body["status"] != "completed":
                raise RuntimeError(f"turn {turn} of {agent} ended {body['status']}: {body}")
            usages.append(body["usage"])
    return usages


def _totals(usages: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "input_tokens": sum(u["input_tokens"] for u in usages),
        "cached_input_tokens": sum(u.get("cached_input_tokens") or 0 for u in usages),
        "cache_write_tokens": sum(u.get("cache_write_tokens") or 0 for u in usages),
        "billed": sum(billed(u) for u in usages),
    }


def scenario_prompt_caching(cfg: Config) -> Outcome:
    turns = cfg.pick(TURNS, 4)
    with (
        FakeUpstream.in_thread(default=Text(ANSWER), prompt_cache=True) as upstream,
        tempfile.TemporaryDirectory(prefix="bench-caching-") as scratch,
    ):
        env = {
            "AGENT_CONFIG": str(_agents(Path(scratch))),
            "ANTHROPIC_BASE_URL": upstream.anthropic_url,
            "ANTHROPIC_API_KEY": "bench-key",
            "AGENT_WARMUP": "0",  # no warm-up call: the upstream sees the conversations only
        }
        with running(agent_server("caching", env)) as server:
            per_turn = {
                agent: _conversation(server.url, agent, turns) for agent in ("cached", "uncached")
            }
    on, off = _totals(per_turn["cached"]), _totals(per_turn["uncached"])
    ratio = on["billed"] / off["billed"]
    out = Outcome(
        12,
        f"Prompt caching: input billed over a {turns}-turn conversation (Anthropic's prices)",
        columns=[
            "prompt caching",
            "input tokens",
            "read from cache",
            "written to cache",
            "billed (base-price tokens)",
            "billed vs off",
        ],
    )
    for label, totals in (("on", on), ("off", off)):
        out.rows.append(
            [
                label,
                f"{totals['input_tokens']:,.0f}",
                f"{totals['cached_input_tokens']:,.0f}",
                f"{totals['cache_write_tokens']:,.0f}",
                f"{totals['billed']:,.0f}",
                f"{totals['billed'] / off['billed']:.2f}",
            ]
        )
    out.targets.append(Target("input billed with caching on / off", ratio, 0.5))
    first, last = per_turn["cached"][0], per_turn["cached"][-1]
    out.notes.append(
        f"with caching on, turn 1 writes {first.get('cache_write_tokens') or 0:,} tokens to "
        f"the cache and reads none; turn {turns} reads {last.get('cached_input_tokens') or 0:,} "
        f"of its {last['input_tokens']:,} input tokens and writes "
        f"{last.get('cache_write_tokens') or 0:,}"
    )
    out.notes.append(
        f"prices: a cache read {CACHE_READ_PRICE}x, a cache write {CACHE_WRITE_PRICE}x the base "
        "input price (Anthropic's 5-minute cache); output is the same either way and left out"
    )
    out.raw = {"turns": turns, "per_turn": per_turn, "on": on, "off": off, "ratio": ratio}
    return out
