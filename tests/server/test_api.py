"""Every route of ``perdure serve`` over file, SQLite and PostgreSQL stores (SPEC §10).

Requests go through the whole ASGI stack with ``httpx.AsyncClient`` (no socket); the
answers are checked against what the library and the CLI say of the same store.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import postgres_server
from perdure.cli import ops
from perdure.server import MemoryBrowser, create_app
from perdure.session import Session, SessionStore, read_history_page
from server_support import PNG, client, close, conversation, fill

ABSENT = "01ARZ3NDEKTSV4RRFFQ69G5FAV"  # a well-formed ULID no checkpoint has
JSON = {"Content-Type": "application/json"}


def assert_error(response: Any, status: int, code: str, *fragments: str) -> None:
    """The one error body of SPEC §10, with no traceback in it."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    for fragment in fragments:
        assert fragment in body["error"]["message"]
    assert "Traceback" not in response.text


async def test_sessions_list_pages_by_id(store: SessionStore) -> None:
    for n in range(5):
        await fill(store, f"x{n}", conversation(0))
    async with client(create_app(store)) as http:
        first = (await http.get("/api/sessions", params={"limit": 3})).json()
        assert [s["session_id"] for s in first["sessions"]] == ["s1", "s2", "x0"]
        assert first["next_after"] == "x0"
        meta = first["sessions"][0]
        assert {"session_id", "created_at", "updated_at", "message_count"} <= set(meta)
        assert meta["message_count"] == 42
        rest = (await http.get("/api/sessions", params={"after": "x0", "limit": 10})).json()
        assert [s["session_id"] for s in rest["sessions"]] == ["x1", "x2", "x3", "x4"]
        assert rest["next_after"] is None


async def test_sessions_sorted_by_update_and_filtered(store: SessionStore) -> None:
    app = create_app(store)
    await fill(store, "late-one", conversation(0))
    async with client(app) as http:
        page = (await http.get("/api/sessions", params={"order": "updated", "limit": 2})).json()
        assert page["sessions"][0]["session_id"] == "late-one"
        assert (page["offset"], page["next_offset"], page["total"]) == (0, 2, 3)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", page["as_of"])  # as stored
        nxt = (await http.get("/api/sessions", params={"order": "updated", "offset": 2})).json()
        assert len(nxt["sessions"]) == 1
        assert nxt["next_offset"] is None
        found = (await http.get("/api/sessions", params={"q": "LATE"})).json()
        assert [s["session_id"] for s in found["sessions"]] == ["late-one"]
        # a write through the server is seen at once, not after the index's max age
        response = await http.post("/api/sessions/s2/checkpoints/" + ABSENT + "/fork", headers=JSON)
        assert_error(response, 404, "checkpoint_not_found")
        created = (await http.post("/api/sessions/s2/checkpoints", json={})).json()
        forked = await http.post(
            f"/api/sessions/s2/checkpoints/{created['checkpoint_id']}/fork", headers=JSON
        )
        new_id = forked.json()["session_id"]
        ids = [
            s["session_id"]
            for s in (await http.get("/api/sessions?order=id&q=")).json()["sessions"]
        ]
        assert new_id in ids


async def test_show_and_history(store: SessionStore) -> None:
    async with client(create_app(store)) as http:
        shown = (await http.get("/api/sessions/s1")).json()
        assert (shown["session_id"], shown["message_count"], shown["checkpoints"]) == ("s1", 42, 0)
        assert shown == json.loads(json.dumps(await ops.describe_session(store, "s1")))

        page = (await http.get("/api/sessions/s1/history", params={"offset": 0, "limit": 4})).json()
        assert set(page) == {"session_id", "messages", "offset", "next_offset", "total"}
        assert (page["offset"], page["total"]) == (0, 42)
        image = page["messages"][0]["content"][1]["image"]["source"]["bytes"]
        assert base64.b64decode(image["data"]) == PNG
        # a page that would end on a tool call grows to keep its result, as the library says
        page = (await http.get("/api/sessions/s1/history?offset=2&limit=2")).json()
        expected = await read_history_page(store, "s1", offset=2, limit=2)
        assert (page["offset"], page["next_offset"]) == (expected.offset, expected.next_offset)
        assert page["next_offset"] == 5
        assert "toolResult" in page["messages"][-1]["content"][0]


async def test_checkpoints_create_list_restore_export_import_fork(store: SessionStore) -> None:
    async with client(create_app(store)) as http:
        created = await http.post("/api/sessions/s1/checkpoints", json={"label": "before"})
        assert created.status_code == 201
        meta = created.json()
        assert (meta["session_id"], meta["trigger"], meta["label"]) == ("s1", "manual", "before")
        assert meta["message_count"] == 42
        cid = meta["checkpoint_id"]

        await Session(store, "s1").store.commit("s1", conversation(11))  # the session moves on
        listed = (await http.get("/api/sessions/s1/checkpoints")).json()
        assert listed["checkpoints"] == [{**meta, "damaged": False}]

        restored = await http.post(f"/api/sessions/s1/checkpoints/{cid}/restore", headers=JSON)
        assert restored.status_code == 200, restored.text
        result = restored.json()
        assert (result["status"], result["from_messages"], result["to_messages"]) == (
            "restored",
            46,
            42,
        )
        assert (await read_history_page(store, "s1", offset=0, limit=0)).total == 42
        triggers = [
            c["trigger"]
            for c in (await http.get("/api/sessions/s1/checkpoints")).json()["checkpoints"]
        ]
        assert triggers == ["manual", "pre_restore"]

        exported = await http.get(f"/api/sessions/s1/checkpoints/{cid}/export")
        assert exported.status_code == 200
        assert "attachment" in exported.headers["content-disposition"]
        assert exported.content == await ops.export_checkpoint(store, "s1", cid)

        imported = await http.post(
            "/api/sessions/s3/checkpoints/import?create=true",
            content=exported.content,
            headers=JSON,
        )
        assert imported.status_code == 201, imported.text
        assert (imported.json()["session_id"], imported.json()["trigger"]) == ("s3", "import")
        not_created = await http.post(
            "/api/sessions/s4/checkpoints/import", content=exported.content, headers=JSON
        )
        assert_error(not_created, 404, "session_not_found")
        damaged = exported.content.replace(b'"q3"', b'"q4"', 1)
        assert damaged != exported.content
        assert_error(
            await http.post("/api/sessions/s2/checkpoints/import", content=damaged, headers=JSON),
            400,
            "checkpoint_import_invalid",
        )

        forked = await http.post(f"/api/sessions/s1/checkpoints/{cid}/fork", headers=JSON)
        assert forked.status_code == 201
        new_id = forked.json()["session_id"]
        assert forked.json()["source_session_id"] == "s1"
        assert (await read_history_page(store, new_id, offset=0, limit=0)).total == 42


async def test_errors_have_the_one_body(store: SessionStore) -> None:
    async with client(create_app(store)) as http:
        assert_error(await http.get("/api/sessions/nope"), 404, "session_not_found")
        assert_error(await http.get("/api/sessions/nope/history"), 404, "session_not_found")
        assert_error(await http.get("/api/sessions/nope/checkpoints"), 404, "session_not_found")
        assert_error(
            await http.get(f"/api/sessions/s1/checkpoints/{ABSENT}/export"),
            404,
            "checkpoint_not_found",
        )
        assert_error(
            await http.post(f"/api/sessions/s1/checkpoints/{ABSENT}/restore", headers=JSON),
            404,
            "checkpoint_not_found",
        )
        assert_error(
            await http.post("/api/sessions/s1/checkpoints/bad/restore", headers=JSON),
            400,
            "bad_request",
            "not a well-formed ULID",
        )
        assert_error(await http.get("/api/sessions?limit=0"), 400, "bad_request", "limit")
        assert_error(await http.get("/api/sessions?limit=x"), 400, "bad_request", "limit")
        assert_error(await http.get("/api/sessions?order=size"), 400, "bad_request", "order")
        assert_error(await http.get("/api/sessions/s1/history?offset=-1"), 400, "bad_request")
        assert_error(await http.get("/api/sessions/.hidden"), 400, "bad_request", "session id")
        assert_error(
            await http.post("/api/sessions/s1/checkpoints", json={"label": 3}),
            400,
            "bad_request",
            "label",
        )
        assert_error(
            await http.post("/api/sessions/s1/checkpoints", content=b"{", headers=JSON),
            400,
            "bad_request",
            "not valid JSON",
        )
        assert_error(
            await http.post("/api/sessions/s1/checkpoints", content=b"[]", headers=JSON),
            400,
            "bad_request",
        )
        assert_error(await http.get("/api/nothing"), 404, "not_found")
        # CORS is off: a preflight gets no Access-Control-* header, so browsers refuse
        preflight = await http.options(
            "/api/sessions/s1/checkpoints",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 405
        assert not any(h.lower().startswith("access-control") for h in preflight.headers)
        assert_error(await http.delete("/api/sessions/s1", headers=JSON), 405, "method_not_allowed")
        assert_error(
            await http.post("/api/sessions/s1/checkpoints", content=b"{}"),
            415,
            "unsupported_media_type",
        )
        assert_error(await http.get(f"/api/jobs/{ABSENT}"), 404, "job_not_found")
        assert_error(await http.get("/api/memory/u1/entries"), 404, "memory_not_configured")


async def test_a_damaged_session_is_500_session_store_corrupted(tmp_path: Any) -> None:
    from perdure.session import open_store

    store = open_store(f"sqlite:{tmp_path / 'd.db'}")
    await fill(store, "s1", conversation(2))
    close(store)
    import sqlite3

    with sqlite3.connect(tmp_path / "d.db") as conn:
        conn.execute("UPDATE perdure_messages SET body = replace(body, 'q1', 'q9')")
    store = open_store(f"sqlite:{tmp_path / 'd.db'}")
    try:
        async with client(create_app(store)) as http:
            assert_error(await http.get("/api/sessions/s1/history"), 500, "session_store_corrupted")
            # its metadata and checkpoints are still shown (the history is not read)
            shown = await http.get("/api/sessions/s1")
            assert (shown.status_code, shown.json()["message_count"]) == (200, 10)
            report = (await http.post("/api/verify", headers=JSON)).json()
            assert report["clean"] is False
            assert report["damaged_sessions"] == ["s1"]
    finally:
        close(store)


async def test_verify_answers_the_report_and_runs_as_a_job(store: SessionStore) -> None:
    from perdure.maintenance import verify_store

    async with client(create_app(store)) as http:
        report = await http.post("/api/verify", headers=JSON)
        assert report.status_code == 200
        assert report.json() == (await verify_store(store)).to_dict()
        assert report.json()["sessions_checked"] == 2
        named = (await http.post("/api/verify", json={"session_ids": ["s1", "zz"]})).json()
        assert (named["sessions_checked"], named["missing"]) == (1, ["zz"])
        assert_error(await http.post("/api/verify", json={"session_ids": "s1"}), 400, "bad_request")

        started = await http.post("/api/jobs/verify", headers=JSON)
        assert started.status_code == 202
        job_id = started.json()["job_id"]
        for _ in range(200):
            job = (await http.get(f"/api/jobs/{job_id}")).json()
            if job["state"] != "running":
                break
            await asyncio.sleep(0.02)
        assert job["state"] == "done", job
        assert (job["done"], job["total"]) == (2, 2)
        assert job["result"] == report.json()


@pytest.mark.parametrize("token", ["s3cret"])
async def test_token_guards_every_api_route(store: SessionStore, token: str) -> None:
    app = create_app(store, token=token)
    async with client(app) as anonymous:
        for method, path in [
            ("GET", "/api/sessions"),
            ("GET", "/api/sessions/s1"),
            ("GET", "/api/sessions/s1/history"),
            ("GET", "/api/sessions/s1/checkpoints"),
            ("POST", "/api/sessions/s1/checkpoints"),
            ("POST", f"/api/sessions/s1/checkpoints/{ABSENT}/restore"),
            ("POST", "/api/verify"),
            ("GET", "/api/info"),
        ]:
            response = await anonymous.request(method, path, headers=JSON)
            assert_error(response, 401, "unauthorized")
            assert response.headers["www-authenticate"] == "Bearer"
        wrong = await anonymous.get("/api/sessions", headers={"Authorization": "Bearer s3creT"})
        assert_error(wrong, 401, "unauthorized")
        basic = await anonymous.get("/api/sessions", headers={"Authorization": f"Basic {token}"})
        assert_error(basic, 401, "unauthorized")
        # the page and the API description load without it (they hold no data)
        assert (await anonymous.get("/")).status_code == 200
        assert (await anonymous.get("/openapi.json")).status_code == 200
        # nothing was written by the refused requests
        assert await ops.list_checkpoints(store, "s1") == []
    async with client(app, token) as http:
        assert (await http.get("/api/sessions")).status_code == 200
        assert (await http.post("/api/sessions/s1/checkpoints", json={})).status_code == 201


async def test_without_a_token_only_loopback_hosts_are_served(store: SessionStore) -> None:
    import httpx

    app = create_app(store)
    for host in ("127.0.0.1", "localhost:8765", "[::1]:8765"):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=f"http://{host}"
        ) as http:
            assert (await http.get("/api/sessions")).status_code == 200
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://evil.example:8765"
    ) as http:
        assert_error(await http.get("/api/sessions"), 403, "forbidden_host")
    # with a token the Host does not matter (the server may sit behind a proxy)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(store, token="t")),
        base_url="http://inspector.example",
        headers={"Authorization": "Bearer t"},
    ) as http:
        assert (await http.get("/api/sessions")).status_code == 200


def test_serving_beyond_loopback_needs_a_token() -> None:
    from perdure.server import check_bind

    for host in ("0.0.0.0", "192.168.1.5", "example.com", "::"):
        with pytest.raises(ValueError, match="not loopback"):
            check_bind(host, None)
        check_bind(host, "token")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, None)


async def test_bodies_past_the_cap_are_413(store: SessionStore) -> None:
    exported = await ops.export_checkpoint(
        store, "s1", (await ops.create_checkpoint(store, "s1", None)).checkpoint_id
    )
    app = create_app(store, max_body=len(exported) - 1)
    async with client(app) as http:
        response = await http.post(
            "/api/sessions/s2/checkpoints/import", content=exported, headers=JSON
        )
        assert_error(response, 413, "request_too_large")

        async def chunks() -> Any:  # no Content-Length: the cap counts what is read
            yield exported[:100]
            yield exported[100:]

        streamed = await http.post(
            "/api/sessions/s2/checkpoints/import", content=chunks(), headers=JSON
        )
        assert_error(streamed, 413, "request_too_large")
    assert len(await ops.list_checkpoints(store, "s2")) == 0
    async with client(create_app(store, max_body=len(exported))) as http:
        response = await http.post(
            "/api/sessions/s2/checkpoints/import", content=exported, headers=JSON
        )
        assert response.status_code == 201


TURN_IN_A_TOOL = """
import sys, time
from perdure import Agent, tool
from perdure.models import ScriptedModel
from perdure.session import Session, open_store

@tool
def wait() -> str:
    "Block the turn."
    print("in tool", flush=True)
    time.sleep(120)
    return "done"

use = {"toolUse": {"toolUseId": "w1", "name": "wait", "input": {}}}
call = {"role": "assistant", "content": [use]}
agent = Agent(
    model=ScriptedModel([call, "ok"]),
    tools=[wait],
    session_manager=Session(open_store(sys.argv[1]), sys.argv[2]),
)
agent("go")
"""


async def test_a_restore_while_a_turn_holds_the_lock_is_409(
    store: SessionStore, store_url: str
) -> None:
    checkpoint = await ops.create_checkpoint(store, "s1", None)
    turn = await asyncio.create_subprocess_exec(
        sys.executable, "-c", TURN_IN_A_TOOL, store_url, "s1", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert turn.stdout is not None
        assert await asyncio.wait_for(turn.stdout.readline(), 60) == b"in tool\n"
        async with client(create_app(store)) as http:
            response = await http.post(
                f"/api/sessions/s1/checkpoints/{checkpoint.checkpoint_id}/restore",
                headers=JSON,
            )
            assert_error(response, 409, "session_locked")
            created = await http.post("/api/sessions/s1/checkpoints", json={})
            assert_error(created, 409, "session_locked")
            # reading is never blocked
            assert (await http.get("/api/sessions/s1/history")).status_code == 200
    finally:
        turn.kill()
        await turn.wait()
    # nothing was restored: the turn's own messages are still there
    page = await read_history_page(store, "s1", offset=0, limit=0)
    assert page.total > 42


@pytest.fixture(params=["sqlite", "postgres"])
def memory_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "postgres":
        return postgres_server.store_url(request)
    return f"sqlite:{tmp_path / 'memory.db'}"


@pytest.mark.parametrize("encrypted", [False, True])
async def test_memory_view_lists_searches_and_deletes(
    store: SessionStore, memory_url: str, encrypted: bool
) -> None:
    from crypto_keys import cipher

    # With keys (perdure serve takes them from PERDURE_KEYS / PERDURE_KEYS_FILE), an
    # encrypted memory store is browsed as a plain one.
    browser = MemoryBrowser(memory_url, cipher=cipher("k1") if encrypted else None)
    try:
        await browser.store("alice").add("likes green tea")
        await browser.store("alice").add("lives in Lyon")
        await browser.store("bob").add("likes coffee")
        async with client(create_app(store, memory=browser)) as http:
            assert (await http.get("/api/info")).json()["memory"] is True
            page = (await http.get("/api/memory/alice/entries")).json()
            assert [e["content"] for e in page["entries"]] == ["likes green tea", "lives in Lyon"]
            assert (page["total"], page["next_offset"]) == (2, None)
            one = (await http.get("/api/memory/alice/entries?limit=1")).json()
            assert one["next_offset"] == 1
            found = (await http.get("/api/memory/alice/entries", params={"q": "tea"})).json()
            assert [e["content"] for e in found["entries"]] == ["likes green tea"]
            memory_id = found["entries"][0]["memory_id"]
            # another namespace's id is not deletable from here
            assert_error(
                await http.delete(f"/api/memory/bob/entries/{memory_id}", headers=JSON),
                404,
                "memory_not_found",
            )
            deleted = await http.delete(f"/api/memory/alice/entries/{memory_id}", headers=JSON)
            assert deleted.json() == {"namespace": "alice", "memory_id": memory_id, "deleted": True}
            left = (await http.get("/api/memory/alice/entries")).json()
            assert [e["content"] for e in left["entries"]] == ["lives in Lyon"]
            bob = (await http.get("/api/memory/bob/entries")).json()
            assert [e["content"] for e in bob["entries"]] == ["likes coffee"]
            assert_error(
                await http.delete("/api/memory/alice/entries/x", headers=JSON), 400, "bad_request"
            )
    finally:
        browser.close()
    if encrypted and memory_url.startswith("sqlite:"):
        stored = await asyncio.to_thread(Path(memory_url.removeprefix("sqlite:")).read_bytes)
        assert b"Lyon" not in stored  # sealed, and no plaintext index


def test_memory_urls() -> None:
    for bad in ("redis://h", "file:x", "nonsense"):
        with pytest.raises(ValueError):
            MemoryBrowser(bad)


async def test_the_openapi_document_names_every_route(store: SessionStore) -> None:
    from starlette.routing import Route

    app = create_app(store)
    async with client(app) as http:
        document = (await http.get("/openapi.json")).json()
    documented = {(path, m.upper()) for path, ops_ in document["paths"].items() for m in ops_}
    served = {
        (route.path, method)
        for route in app.routes
        if isinstance(route, Route) and route.path.startswith("/api/")
        for method in (route.methods or ()) - {"HEAD"}
    }
    assert documented == served


class BrokenListing:
    """A real store whose listing fails the way a bug would (not a perdure error)."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def list(self, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail at /srv/keys")


async def test_an_unexpected_error_is_500_without_its_details(
    store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    async with client(create_app(BrokenListing(store))) as http:  # type: ignore[arg-type]
        response = await http.get("/api/sessions")
        assert_error(response, 500, "internal_error", "see the server log")
        assert "secret" not in response.text
        # the rest of the API still answers
        assert (await http.get("/api/sessions/s1/history")).status_code == 200
    logged = [r for r in caplog.records if r.name == "perdure.server"]
    assert logged
    assert logged[0].exc_info is not None
    assert "secret detail" in str(logged[0].exc_info[1])


async def poll(http: Any, job: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """Poll a job until it ends; the job and every (done, total, phase) seen meanwhile."""
    seen: list[tuple[Any, ...]] = [(job["done"], job["total"], job["phase"])]
    for _ in range(5000):
        if job["state"] != "running":
            break
        await asyncio.sleep(0.002)
        job = (await http.get(f"/api/jobs/{job['job_id']}")).json()
        seen.append((job["done"], job["total"], job["phase"]))
    return job, seen


async def test_a_big_import_is_a_job_with_progress_through_its_checks(
    store: SessionStore,
) -> None:
    import os

    images: list[Any] = [
        {
            "role": "user",
            "content": [
                {"text": f"photo {n}"},
                {"image": {"format": "png", "source": {"bytes": os.urandom(64 * 1024)}}},
            ],
        }
        for n in range(40)
    ]
    await fill(store, "big", conversation(1500) + images)
    cid = (await ops.create_checkpoint(store, "big", "big")).checkpoint_id
    data = await ops.export_checkpoint(store, "big", cid)
    assert len(data) > 3 * 1024 * 1024
    async with client(create_app(store)) as http:
        started = await http.post("/api/jobs/import/s2", content=data, headers=JSON)
        assert started.status_code == 202, started.text
        assert (started.json()["kind"], started.json()["phase"]) == ("import", "verifying")
        job, seen = await poll(http, started.json())
        assert job["state"] == "done", job
        result = job["result"]
        assert (result["session_id"], result["trigger"], result["label"]) == ("s2", "import", "big")
        assert result["message_count"] == 1500 * 4 + 2 + 40
        # Steps: the parse, the hashes, 41 attachments (the PNG and 40 photos), each
        # message, the agent state.
        total = 3 + 41 + result["message_count"]
        assert (job["done"], job["total"], job["phase"]) == (total, total, "writing")
        dones = [done for done, _, _ in seen]
        assert dones == sorted(dones)
        assert any(0 < done < total for done in dones), seen  # progress was seen moving
        assert {t for _, t, _ in seen} <= {None, total}
        listed = (await http.get("/api/sessions/s2/checkpoints")).json()["checkpoints"]
        assert listed[-1]["checkpoint_id"] == result["checkpoint_id"]
        assert (await ops.export_checkpoint(store, "s2", result["checkpoint_id"])) != data

        # A session created by the import shows in the list at once.
        created = await http.post("/api/jobs/import/fresh?create=true", content=data, headers=JSON)
        job, _ = await poll(http, created.json())
        assert job["state"] == "done", job
        assert (await read_history_page(store, "fresh", offset=0, limit=0)).total == 0
        page = (await http.get("/api/sessions", params={"q": "fresh"})).json()
        assert [s["session_id"] for s in page["sessions"]] == ["fresh"]


async def test_a_refused_import_job_ends_with_the_error_and_writes_nothing(
    store: SessionStore,
) -> None:
    cid = (await ops.create_checkpoint(store, "s1", None)).checkpoint_id
    data = await ops.export_checkpoint(store, "s1", cid)
    damaged = data.replace(b'"q3"', b'"q4"', 1)
    assert damaged != data
    async with client(create_app(store)) as http:
        before = (await http.get("/api/sessions/s2/checkpoints")).json()
        started = await http.post("/api/jobs/import/s2", content=damaged, headers=JSON)
        assert started.status_code == 202
        job, _ = await poll(http, started.json())
        assert job["state"] == "failed"
        assert job["result"] is None
        assert job["error"]["code"] == "checkpoint_import_invalid"
        assert "sha256" in job["error"]["message"]
        assert (await http.get("/api/sessions/s2/checkpoints")).json() == before

        job, _ = await poll(
            http, (await http.post("/api/jobs/import/nobody", content=data, headers=JSON)).json()
        )
        assert (job["state"], job["error"]["code"]) == ("failed", "session_not_found")
        job, _ = await poll(
            http,
            (
                await http.post("/api/jobs/import/nobody?create=1", content=damaged, headers=JSON)
            ).json(),
        )
        assert (job["state"], job["error"]["code"]) == ("failed", "checkpoint_import_invalid")
        assert await ops.message_count(store, "nobody") is None  # nothing was created

        assert_error(
            await http.post("/api/jobs/import/.hidden", content=data, headers=JSON),
            400,
            "bad_request",
        )
        assert_error(
            await http.post("/api/jobs/import/s2?create=maybe", content=data, headers=JSON),
            400,
            "bad_request",
        )


async def test_exports_are_signed_on_request_and_imports_verified_with_the_key(
    store: SessionStore,
) -> None:
    from perdure.checkpoints.export import import_checkpoint_bytes

    key = b"a key the team shares"
    cid = (await ops.create_checkpoint(store, "s1", "mark")).checkpoint_id
    export = f"/api/sessions/s1/checkpoints/{cid}/export"
    unsigned = await ops.export_checkpoint(store, "s1", cid)
    other = await ops.export_checkpoint(store, "s1", cid, b"another key")

    async with client(create_app(store)) as http:  # no key: nothing to sign with
        assert (await http.get("/api/info")).json()["signing"] is False
        assert_error(
            await http.get(export, params={"signed": "true"}),
            400,
            "signing_key_not_configured",
            "--signing-key-file",
        )
        assert (await http.get(export, params={"signed": "false"})).content == unsigned
        assert_error(await http.get(export, params={"signed": "yes"}), 400, "bad_request")
        # without a key, imports are checked by their sha256 alone, signed or not
        answer = await http.post("/api/sessions/s2/checkpoints/import", content=other, headers=JSON)
        assert answer.status_code == 201, answer.text

    async with client(create_app(store, signing_key=key)) as http:
        assert (await http.get("/api/info")).json()["signing"] is True
        signed = (await http.get(export, params={"signed": "true"})).content
        assert signed == await ops.export_checkpoint(store, "s1", cid, key)
        assert import_checkpoint_bytes(signed, verify_key=key).meta.label == "mark"
        assert (await http.get(export)).content == unsigned  # signing is asked for

        before = (await http.get("/api/sessions/s2/checkpoints")).json()
        for refused, reason in ((unsigned, "not signed"), (other, "signature does not match")):
            assert_error(
                await http.post(
                    "/api/sessions/s2/checkpoints/import", content=refused, headers=JSON
                ),
                400,
                "checkpoint_import_invalid",
                reason,
            )
            job, _ = await poll(
                http,
                (await http.post("/api/jobs/import/s2", content=refused, headers=JSON)).json(),
            )
            assert (job["state"], job["error"]["code"]) == ("failed", "checkpoint_import_invalid")
            assert reason in job["error"]["message"]
        assert (await http.get("/api/sessions/s2/checkpoints")).json() == before

        answer = await http.post(
            "/api/sessions/s2/checkpoints/import", content=signed, headers=JSON
        )
        assert answer.status_code == 201, answer.text
        job, _ = await poll(
            http, (await http.post("/api/jobs/import/s2", content=signed, headers=JSON)).json()
        )
        assert job["state"] == "done", job
        assert job["result"]["label"] == "mark"


def test_a_signing_key_must_be_a_non_empty_bytes_or_str(tmp_path: Any) -> None:
    from perdure.session import open_store

    store = open_store(f"sqlite:{tmp_path / 'p.db'}")
    try:
        with pytest.raises(ValueError, match="signing_key must not be empty"):
            create_app(store, signing_key=b"")
        with pytest.raises(TypeError, match="signing_key must be bytes or str"):
            create_app(store, signing_key=42)  # type: ignore[arg-type]
        assert create_app(store, signing_key="text key") is not None
    finally:
        close(store)
