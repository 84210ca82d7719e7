"""Upload and download throughput of ``/v1/files``, beside the floor of the same server stack.

    uv run python -m bench.uploads [--sizes 1,10] [--uploads 8] [--rounds 3] [--no-postgres]

Servers, each its own process on 127.0.0.1, measured in alternating rounds:

- ``floor``: ``bench.baseline_upload``, a Starlette app on the same uvicorn stack that reads an
  upload's body as it arrives and drops it (and answers downloads from memory);
- ``sqlite``: ``agent-server`` on its default store (blobs in files beside the database);
- ``postgres``: ``agent-server`` on PostgreSQL (``BENCH_POSTGRES_URL``, a scratch schema; blobs
  in 1 MiB ``bytea`` pieces).

Each upload is a multipart body of a PNG of the given size whose bytes differ from every other
upload's (so each one is stored, not deduplicated); ``same`` rows upload one content again and
again (what deduplication saves); then the file is downloaded (``GET .../content``). Each
transfer goes to every server in turn, so the servers are measured at the same moments of a
shared machine. MB/s = the file's bytes / the wall time from the first byte sent to the answer
read, median over all rounds; "paired" is the median of floor time / server time over the
transfers taken side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.procs import HOST, ROOT, Server, agent_server, free_port, start_server

POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MB = 1_000_000
_BOUNDARY = "benchboundary7MA4YWxkTrZu0gW"


def _png(size: int, seed: int) -> bytes:
    """A whole PNG of exactly ``size`` bytes (a 1x1 image and a private chunk of filler),
    whose bytes differ for each ``seed``."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    head = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    tail = chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b"")
    filler = size - len(head) - len(tail) - 12
    pattern = bytes((seed + i) % 251 for i in range(251))
    return head + chunk(b"prVt", (pattern * (filler // 251 + 1))[:filler]) + tail


def _form(data: bytes, name: str) -> bytes:
    head = (
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{_BOUNDARY}--\r\n".encode()


@dataclass
class Figures:
    """Seconds per transfer, by (server, case)."""

    seconds: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, server: str, case: str, elapsed: float) -> None:
        self.seconds.setdefault((server, case), []).append(elapsed)

    def paired(self, server: str, case: str) -> float | None:
        """The median, over transfers taken side by side, of the floor's time over this
        server's (the floor's upload for both upload cases): this server's speed as a share
        of the floor's at the same moment."""
        floor = self.seconds.get(("floor", case.replace(", same content", "")))
        mine = self.seconds.get((server, case))
        if not floor or not mine:
            return None
        return round(statistics.median(f / m for f, m in zip(floor, mine, strict=False)), 2)

    def mb_per_s(self, server: str, case: str, size: int) -> float | None:
        times = self.seconds.get((server, case))
        return None if not times else size / MB / statistics.median(times)


def _upload(client: httpx.Client, url: str, body: bytes) -> tuple[float, str]:
    headers = {"Content-Type": f"multipart/form-data; boundary={_BOUNDARY}"}
    started = time.perf_counter()
    answer = client.post(f"{url}/v1/files", content=body, headers=headers)
    elapsed = time.perf_counter() - started
    if answer.status_code != 201:
        raise RuntimeError(f"upload answered {answer.status_code}: {answer.text[:300]}")
    created = answer.json()
    return elapsed, str(created.get("file_id", created.get("bytes")))


def _download(client: httpx.Client, url: str, path: str, size: int) -> float:
    started = time.perf_counter()
    answer = client.get(f"{url}{path}")
    elapsed = time.perf_counter() - started
    if answer.status_code != 200 or len(answer.content) != size:
        raise RuntimeError(f"download answered {answer.status_code}, {len(answer.content)} bytes")
    return elapsed


def _round(
    figures: Figures, servers: dict[str, Server], sizes: list[int], uploads: int, seed: int
) -> None:
    """Each transfer goes to every server in turn, so that the figures of the servers are
    taken at the same moments of a shared machine (and can be compared pair by pair)."""
    with httpx.Client(timeout=120.0, trust_env=False) as client:
        for size in sizes:
            label = f"{size // MB} MB"
            same = _form(_png(size, seed * 1000 + 999), "same.png")
            for server in servers.values():
                _upload(client, server.url, same)  # untimed: a warm connection, stored content
            for i in range(uploads):
                for number, (name, server) in enumerate(servers.items()):
                    body = _form(_png(size, seed * 1000 + i * 10 + number), f"bench-{i}.png")
                    elapsed, file_id = _upload(client, server.url, body)
                    figures.add(name, f"upload {label}", elapsed)
                    elapsed, _ = _upload(client, server.url, same)
                    figures.add(name, f"upload {label}, same content", elapsed)
                    path = (
                        f"/v1/files/{size}/content"
                        if name == "floor"
                        else f"/v1/files/{file_id}/content"
                    )
                    figures.add(
                        name, f"download {label}", _download(client, server.url, path, size)
                    )


def _floor() -> Server:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.baseline_upload:app",
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    return start_server("upload-floor", command, port=port, cwd=ROOT)


@contextmanager
def _postgres_schema() -> Iterator[str]:
    import asyncpg

    schema = f"bench_files_{uuid.uuid4().hex[:12]}"

    async def run(statement: str) -> None:
        connection = await asyncpg.connect(POSTGRES_URL)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{POSTGRES_URL}?search_path={schema}"
    finally:
        asyncio.run(run(f'DROP SCHEMA "{schema}" CASCADE'))


def measure(sizes_mb: list[int], uploads: int, rounds: int, postgres: bool) -> dict[str, object]:
    """Start the servers, run the rounds; the figures as a JSON-able dict."""
    sizes = [size * MB for size in sizes_mb]
    env = {"AGENT_WARMUP": "0", "AGENT_MAX_FILE_BYTES": str(max(sizes) + MB)}
    figures = Figures()
    with _postgres_schema() if postgres else _nothing() as url:
        servers: dict[str, Callable[[], Server]] = {
            "floor": _floor,
            "sqlite": lambda: agent_server("files-sqlite", env),
        }
        if url is not None:
            servers["postgres"] = lambda: agent_server(
                "files-postgres", {**env, "AGENT_DATABASE_URL": url}
            )
        started = {name: start() for name, start in servers.items()}
        try:
            for round_number in range(rounds):
                _round(figures, started, sizes, uploads, seed=round_number * 100 + 1)
        finally:
            for server in started.values():
                server.stop()
    cases = sorted({case for _, case in figures.seconds}, key=_case_order)
    rows = []
    for case in cases:
        size = int(case.split()[1]) * MB
        floor = figures.mb_per_s("floor", case.replace(", same content", ""), size)
        for name in started:
            value = figures.mb_per_s(name, case, size)
            if value is None:
                continue
            rows.append(
                {
                    "server": name,
                    "case": case,
                    "mb_per_s": round(value, 1),
                    "vs_floor": None if not floor else round(value / floor, 2),
                    "paired": figures.paired(name, case),
                    "transfers": len(figures.seconds[(name, case)]),
                }
            )
    return {"sizes_mb": sizes_mb, "uploads": uploads, "rounds": rounds, "rows": rows}


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _case_order(case: str) -> tuple[int, int, str]:
    kind, size = case.split()[:2]
    return (0 if kind == "upload" else 1, int(size), case)


def table(result: dict[str, object]) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| case | server | MB/s (median) | vs floor (medians) | vs floor (paired) | transfers |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows = result["rows"]
    assert isinstance(rows, list)
    for row in rows:
        ratio = "-" if row["vs_floor"] is None else f"{row['vs_floor']:.2f}"
        paired = "-" if row["paired"] is None else f"{row['paired']:.2f}"
        lines.append(
            f"| {row['case']} | {row['server']} | {row['mb_per_s']:,.1f} | {ratio} | {paired} |"
            f" {row['transfers']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.uploads", description=__doc__)
    parser.add_argument("--sizes", default="1,10", help="file sizes in MB, comma-separated")
    parser.add_argument("--uploads", type=int, default=8, help="uploads per size and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    result = measure(sizes, args.uploads, args.rounds, postgres=not args.no_postgres)
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
