"""13. A run whose input carries a 1 MB image: the time it adds to the first event.

One ``agent-server`` on ``openai:bench-model``, its ``OPENAI_BASE_URL`` at the fake upstream of
scenario 2 (``bench/fake_openai.py``, on loopback). The image, a PNG of 1,000,000 bytes, is
uploaded once (``POST /v1/files``); then the load generator (``task_ttfe_image``) times, round
by round, six paths in a rotating order, each from writing the request to its first
``text.delta`` (the service) or its first chunk with content (the SDK):

- the upstream called directly with the ``openai`` SDK: the text alone, and the text with the
  image as an ``image_url`` ``data:`` URL (what a program calling the model itself pays);
- ``POST /v1/sessions/{id}/runs`` with ``input`` = a text part alone (the baseline), the text
  and the image by ``file_id``, the text and the image as a ``data:`` URL of the same content
  (stored on arrival, found stored already), and as one of a new content each round (stored,
  written to disk).

Added = p50 (and p99) of a path with the image minus that of the same path without it, and
the service with the image minus the direct call with the image. The fake upstream counts the
requests of 1 MB or more it was sent, so the scenario knows that each image reached it.
"""

from __future__ import annotations

import statistics
from typing import Any

import httpx

from bench.measure import summary_ms
from bench.outcome import Config, Outcome
from bench.procs import HOST, agent_server, run_loadgen, running
from bench.scenarios import fake_upstream
from bench.uploads import _BOUNDARY, _form, _png

__all__ = ["IMAGE_BYTES", "scenario_image_input"]

IMAGE_BYTES = 1_000_000
SEED = 0

_LABELS = {
    "direct_text": "openai SDK directly, text only",
    "direct_image": "openai SDK directly, text + image (data: URL)",
    "service_text": "service, text part only",
    "service_file_id": "service, text + image by file_id",
    "service_data_url": "service, text + image as data: URL (stored already)",
    "service_data_url_new": "service, text + image as data: URL (new content)",
}
# each path's baselines: the same path without the image, and the direct call with the same input
_WITHOUT_IMAGE = {
    "direct_image": "direct_text",
    "service_file_id": "service_text",
    "service_data_url": "service_text",
    "service_data_url_new": "service_text",
}
_DIRECT = {
    "service_text": "direct_text",
    "service_file_id": "direct_image",
    "service_data_url": "direct_image",
    "service_data_url_new": "direct_image",
}
_IMAGE_PATHS = tuple(_WITHOUT_IMAGE)


def _upload(url: str, image: bytes) -> str:
    headers = {"Content-Type": f"multipart/form-data; boundary={_BOUNDARY}"}
    with httpx.Client(timeout=60, trust_env=False) as client:
        answer = client.post(f"{url}/v1/files", content=_form(image, "bench.png"), headers=headers)
    if answer.status_code != 201:
        raise RuntimeError(f"the upload answered {answer.status_code}: {answer.text[:300]}")
    return str(answer.json()["file_id"])


def _upstream_stats(port: int) -> dict[str, Any]:
    with httpx.Client(timeout=10, trust_env=False) as client:
        answer = client.get(f"http://{HOST}:{port}/stats")
    answer.raise_for_status()
    stats: dict[str, Any] = answer.json()
    return stats


def _added(
    stats: dict[str, dict[str, float]], samples: dict[str, list[float]], path: str, base: str
) -> dict[str, float]:
    """``path`` over ``base``: the differences of their p50 and p99, and the median of the
    differences round by round (both taken in the same round), in ms."""
    paired = [a - b for a, b in zip(samples[path], samples[base], strict=True)]
    return {
        "p50": stats[path]["p50"] - stats[base]["p50"],
        "p99": stats[path]["p99"] - stats[base]["p99"],
        "paired_p50": statistics.median(paired) * 1000,
    }


def _cell(added: dict[str, float] | None) -> str:
    if added is None:
        return "-"
    return f"{added['p50']:+.2f} / {added['p99']:+.2f}"


def scenario_image_input(cfg: Config) -> Outcome:
    requests = cfg.pick(100, 4)
    warmup = cfg.pick(30, 2)
    out = Outcome(
        13,
        "A 1 MB image in a run's input: time to first text.delta, beside the same run "
        "without it and the SDK called directly",
        columns=[
            "path",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "added vs without the image, p50 / p99 ms",
            "added vs the SDK directly, same input, p50 / p99 ms",
        ],
    )
    with fake_upstream() as up_port:
        upstream_url = f"http://{HOST}:{up_port}/v1"
        env = {
            "AGENT_MODEL": "openai:bench-model",
            "OPENAI_BASE_URL": upstream_url,
            "OPENAI_API_KEY": "bench-key",
        }
        with running(agent_server("image-input", env)) as server:
            file_id = _upload(server.url, _png(IMAGE_BYTES, SEED))
            before = _upstream_stats(up_port)
            result = run_loadgen(
                {
                    "task": "ttfe_image",
                    "host": HOST,
                    "port": server.port,
                    "upstream_url": upstream_url,
                    "model": "bench-model",
                    "file_id": file_id,
                    "image_bytes": IMAGE_BYTES,
                    "seed": SEED,
                    "requests": requests,
                    "warmup": warmup,
                    "time_limit": cfg.pick(400, 120),
                }
            )
        after = _upstream_stats(up_port)
    rounds = result["rounds"]
    if not rounds:
        raise RuntimeError(f"no round was measured within the time limit: {result}")
    samples: dict[str, list[float]] = result["samples"]
    stats = {path: summary_ms(values) for path, values in samples.items()}
    without = {p: _added(stats, samples, p, base) for p, base in _WITHOUT_IMAGE.items()}
    direct = {p: _added(stats, samples, p, base) for p, base in _DIRECT.items()}
    for path, label in _LABELS.items():
        row = stats[path]
        out.rows.append(
            [
                label,
                row["p50"],
                row["p90"],
                row["p99"],
                _cell(without.get(path)),
                _cell(direct.get(path)),
            ]
        )
    large = after["large_requests"] - before["large_requests"]
    expected = len(_IMAGE_PATHS) * result["done"]
    if large != expected:
        raise RuntimeError(
            f"the upstream was sent {large} requests of 1 MB or more, not {expected}: "
            "an image did not reach it"
        )
    out.notes.append(
        f"{rounds} rounds after {result['warmup']} of warm-up, one request per path each, "
        "sequential, the paths in a rotating order; each service request starts a new "
        "session. Added = p(path) - p(baseline); the median of the paired differences is in "
        "the raw figures."
    )
    out.notes.append(
        f"The image: a PNG of {IMAGE_BYTES:,} bytes ({4 * -(-IMAGE_BYTES // 3):,} bytes of "
        "base64); the upstream received "
        f"{large} requests of 1 MB or more (one per image path and round), the largest "
        f"{after['largest_body']:,} bytes."
    )
    out.raw = {
        "rounds": rounds,
        "warmup": result["warmup"],
        "image_bytes": IMAGE_BYTES,
        "paths": stats,
        "added_over_without_image": without,
        "added_over_direct": direct,
        "upstream": {**after, "large_requests": large, "expected_large_requests": expected},
        "samples_ms": {p: [round(v * 1000, 3) for v in values] for p, values in samples.items()},
    }
    return out
