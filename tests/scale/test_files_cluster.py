"""Files across workers on PostgreSQL and Redis: a file uploaded to worker A is read, whole,
on worker B (its bytes live in the database, not on A's disk), and its owner's rules hold
there too."""

from __future__ import annotations

import hashlib

from tests.support.auth import API_KEYS, auth
from tests.support.cluster import StartCluster
from tests.support.files import pdf, png
from tests.support.problems import assert_problem


async def test_a_file_uploaded_to_one_worker_is_read_on_another(
    start_cluster: StartCluster,
) -> None:
    a, b = start_cluster(2, {"AGENT_API_KEYS": API_KEYS, "AGENT_WARMUP": "0"})
    alice, bob = auth("alice"), auth("bob")
    # 2.5 MiB: more than one of the database's 1 MiB pieces
    data = png(5 * 512 * 1024, seed=9)
    async with a.client(headers=alice) as on_a, b.client(headers=alice) as on_b:
        answer = await on_a.post("/v1/files", files={"file": ("scan.png", data, "image/png")})
        assert answer.status_code == 201, answer.text
        created = answer.json()
        path = f"/v1/files/{created['file_id']}"

        meta = await on_b.get(path)
        assert meta.status_code == 200 and meta.json() == created
        content = await on_b.get(f"{path}/content")
        assert content.status_code == 200
        assert hashlib.sha256(content.content).hexdigest() == created["sha256"]
        assert content.content == data
        assert_problem(await on_b.get(f"{path}/content", headers=bob), 404, "not_found")

        # the same bytes uploaded to B are the same content; deleted on B, A's copy stays
        again = await on_b.post("/v1/files", files={"file": ("copy.png", data)})
        assert again.status_code == 201 and again.json()["sha256"] == created["sha256"]
        assert (await on_b.delete(f"/v1/files/{again.json()['file_id']}")).status_code == 204
        assert (await on_a.get(f"{path}/content")).content == data

        # deleted on A, it is gone on B
        assert (await on_a.delete(path)).status_code == 204
        assert_problem(await on_b.get(f"{path}/content"), 404, "not_found")

        # a file B stored is read on A
        document = await on_b.post("/v1/files", files={"file": ("doc.pdf", pdf())})
        assert document.status_code == 201, document.text
        read = await on_a.get(f"/v1/files/{document.json()['file_id']}/content")
        assert read.content == pdf() and read.headers["content-type"] == "application/pdf"

        # a run on B uses a file uploaded to A: the model reads its bytes there (and the file,
        # now in the session's messages, cannot be deleted under it)
        scan = await on_a.post("/v1/files", files={"file": ("scan.png", data, "image/png")})
        assert scan.status_code == 201, scan.text
        created = scan.json()
        run = await on_b.post(
            f"/v1/sessions/files-{created['file_id'][-8:]}/runs",
            json={
                "input": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image", "file_id": created["file_id"]},
                ],
                "stream": False,
            },
        )
        assert run.status_code == 200, run.text
        answer = run.json()["output"]["content"]
        assert f"{len(data)} bytes, sha256 {created['sha256'][:12]}" in answer
        held = await on_a.delete(f"/v1/files/{created['file_id']}")
        assert_problem(held, 409, "file_in_use")
