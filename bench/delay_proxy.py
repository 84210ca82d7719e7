"""A TCP forwarder on loopback that adds a set delay to every byte it carries.

    python -m bench.delay_proxy --target 127.0.0.1:6379 --rtt-ms 50

Listens on ``--port`` (0: any free port; the first line printed is ``listening <port>``) and
forwards each connection to ``--target``. Each direction holds what it reads for half the
round-trip delay before writing it on, in order, so a request and its answer take
``--rtt-ms`` longer than on plain loopback: a Redis in another zone or region, as the
service would meet it. The delay is a deadline per chunk, not a sleep between chunks, so a
stream of pipelined commands keeps its throughput (as on a real long link).

Each direction of each connection is a reader thread and a writer thread with blocking
sockets. Why threads: an event loop wakes up for a timer only to the millisecond (epoll's
timeout is rounded up), which added 0.5-1 ms to every leg, about 2 ms to a round trip of
+50 ms; ``time.sleep`` wakes within a few tens of microseconds of its deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import threading
import time

__all__ = ["main"]

_CHUNK = 65536


def _pump(source: socket.socket, target: socket.socket, delay: float) -> None:
    """Copy ``source`` to ``target``, each chunk ``delay`` seconds after it was read."""
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def deliver() -> None:
        try:
            while True:
                due, data = chunks.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                target.sendall(data)
        except OSError:
            pass
        finally:
            # the far side hears the end (or the failure) of this direction
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                source.shutdown(socket.SHUT_RD)

    sender = threading.Thread(target=deliver, daemon=True)
    sender.start()
    try:
        while True:
            data = source.recv(_CHUNK)
            chunks.put((time.monotonic() + delay, data))
            if not data:
                break
    except OSError:
        chunks.put((0.0, b""))
    sender.join()


def _connect(client: socket.socket, target: tuple[str, int], half: float) -> None:
    try:
        upstream = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(upstream, client, half), daemon=True)
    back.start()
    _pump(client, upstream, half)
    back.join()
    client.close()
    upstream.close()


def serve(port: int, target: tuple[str, int], rtt: float) -> None:
    half = rtt / 2
    listener = socket.create_server(("127.0.0.1", port), backlog=128)
    print(f"listening {listener.getsockname()[1]}", flush=True)
    with listener:
        while True:
            client, _ = listener.accept()
            threading.Thread(target=_connect, args=(client, target, half), daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.delay_proxy", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--target", default="127.0.0.1:6379")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="added round-trip delay")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        serve(args.port, (host, int(port)), args.rtt_ms / 1000)


if __name__ == "__main__":
    main()
