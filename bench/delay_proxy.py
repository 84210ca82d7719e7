"""A TCP forwarder on loopback that adds a set delay to every byte it carries.

    python -m bench.delay_proxy --target 127.0.0.1:6379 --rtt-ms 50

Listens on ``--port`` (0: any free port; the first line printed is ``listening <port>``) and
forwards each connection to ``--target``. Each direction holds what it reads for half the
round-trip delay before writing it on, in order, so a request and its answer take
``--rtt-ms`` longer than on plain loopback: a Redis in another zone or region, as the
service would meet it. The delay is a deadline per chunk, not a sleep between chunks, so a
stream of pipelined commands keeps its throughput (as on a real long link).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

__all__ = ["main"]


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((time.monotonic() + delay, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        pass
    finally:
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        writer.close()
        with contextlib.suppress(BaseException):
            await writer.wait_closed()


async def serve(port: int, target_host: str, target_port: int, rtt: float) -> None:
    half = rtt / 2

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            _pump(client_r, server_w, half), _pump(server_r, client_w, half), return_exceptions=True
        )

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.delay_proxy", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--target", default="127.0.0.1:6379")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="added round-trip delay")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, host, int(port), args.rtt_ms / 1000))


if __name__ == "__main__":
    main()
