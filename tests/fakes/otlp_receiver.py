"""An OTLP/HTTP trace receiver of our own, run as a process: ``python -m tests.fakes.otlp_receiver
OUT``.

It accepts ``POST /v1/traces`` (``application/x-protobuf``, gzip or not), decodes the body with
``opentelemetry-proto`` and appends one JSON line per span to ``OUT``: trace and span ids in
hex, parent, name, kind, status, attributes, events and links. It prints its port on its first
line of output, then serves until it is terminated.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    if which is None:
        return None
    found = getattr(value, which)
    return found if which != "kvlist_value" else MessageToDict(found)


def _attributes(items: Any) -> dict[str, Any]:
    pairs: list[KeyValue] = list(items)
    return {pair.key: _value(pair.value) for pair in pairs}


def decode(body: bytes) -> list[dict[str, Any]]:
    """The spans of one export request, as plain data."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[dict[str, Any]] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "service": resource.get("service.name"),
                        "scope": scope_spans.scope.name,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "status": span.status.code,
                        "attributes": _attributes(span.attributes),
                        "events": [
                            {"name": e.name, "attributes": _attributes(e.attributes)}
                            for e in span.events
                        ],
                        "links": [
                            {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()}
                            for link in span.links
                        ],
                    }
                )
    return spans


class _Handler(BaseHTTPRequestHandler):
    out: Path
    lock = threading.Lock()

    def do_POST(self) -> None:
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            spans = decode(body)
        except Exception:
            self.send_error(400, "not an ExportTraceServiceRequest")
            return
        with self.lock, self.out.open("a", encoding="utf-8") as sink:
            for span in spans:
                sink.write(json.dumps(span) + "\n")
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    _Handler.out = Path(sys.argv[1])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
