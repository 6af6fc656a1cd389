"""The web page in a real browser: Debian's chromium driven by Playwright.

The page is served by a real ``perdure serve``; the test opens the list, opens a
session, pages its history, restores a checkpoint and runs verify, checking what
the page shows, and saves a screenshot of each view under ``docs/`` for the README.
Skipped when chromium or Playwright is missing, except under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_serve_cli import start, stop

from perdure.cli import ops
from perdure.session import open_store, read_history_page
from server_support import close, conversation, fill

CHROMIUM = "/usr/bin/chromium"
# PERDURE_SCREENSHOTS=1 refreshes the README's screenshots in docs/; otherwise they go
# to the test's temporary directory (a test run leaves the tree as it found it).
DOCS = Path(__file__).resolve().parents[2] / "docs"
IN_CI = os.environ.get("CI") == "true"


def _require_browser() -> Any:
    reason = None
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        reason = f"no chromium at {CHROMIUM}: apt-get install -y chromium"
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        reason = "playwright is not installed: pip install playwright"
    if reason is not None:
        if IN_CI:
            pytest.fail(f"under CI=true the browser test must run, but {reason}")
        pytest.skip(reason)
    return sync_playwright, expect


async def _make(url: str, memory_path: Path) -> dict[str, Any]:
    from perdure.memory import LocalMemoryStore

    store = open_store(url)
    await fill(store, "support-ticket-4711", conversation(20))  # 82 messages
    checkpoint = await ops.create_checkpoint(store, "support-ticket-4711", "before the refund")
    await store.commit("support-ticket-4711", conversation(30))  # 122 messages
    for n in range(60):
        await fill(store, f"session-{n:03d}", conversation(n % 3))
    close(store)
    memory = LocalMemoryStore(memory_path, namespace="alice")
    for fact in ("prefers green tea", "lives in Lyon", "allergic to peanuts"):
        await memory.add(fact)
    memory.close()
    return {"checkpoint_id": checkpoint.checkpoint_id}


def expected_range(url: str, offset: int) -> str:
    """What the page should say of the 50-message page asked at ``offset``."""
    store = open_store(url)
    try:
        page = asyncio.run(read_history_page(store, "support-ticket-4711", offset=offset, limit=50))
    finally:
        close(store)
    return f"messages {page.offset}–{page.next_offset - 1} of {page.total}"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    url = f"file:{tmp_path / 'store'}"
    known = asyncio.run(_make(url, tmp_path / "memory.db"))
    proc, base = start("--store", url, "--memory", f"sqlite:{tmp_path / 'memory.db'}")
    try:
        yield base, url, known
    finally:
        stop(proc)


def test_list_session_history_restore_verify_memory(
    served: tuple[str, str, dict[str, Any]], tmp_path: Path
) -> None:
    sync_playwright, expect = _require_browser()
    shots = DOCS if os.environ.get("PERDURE_SCREENSHOTS") == "1" else tmp_path
    base, url, known = served
    # asked before the browser starts: Playwright's sync API runs a loop of its own
    newest, older = expected_range(url, 122 - 50), expected_range(url, 71 - 50)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # a console error is a script or a CSP violation of the page's own
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

            # the list: paged server-side, sortable by update time, filterable by id
            page.goto(f"{base}/")
            page.wait_for_selector("#sessions")
            rows = page.locator("#sessions tbody tr")
            expect(rows).to_have_count(50)
            expect(rows.first.locator("td").first).to_have_text("session-000")
            page.click("#next-page")
            expect(rows).to_have_count(11)
            assert "support-ticket-4711" in page.locator("#sessions").inner_text()
            page.click("#sort-updated")
            expect(rows.first.locator("td").first).to_have_text("session-059")
            page.fill("#filter", "ticket")
            page.press("#filter", "Enter")
            expect(rows).to_have_count(1)
            page.screenshot(path=str(shots / "serve-sessions.png"))

            # a session: the newest page first, tool calls with their results, images
            page.click("text=support-ticket-4711")
            page.wait_for_selector("#session-title")
            assert page.inner_text("#session-title") == "support-ticket-4711"
            # pages start where the library says: 72 is a tool result, so 71 (its call)
            assert page.inner_text("#page-range") == newest
            assert page.inner_text("#page-range") == "messages 71–121 of 122"
            tool = page.locator(".tool").first
            assert "⚙ add" in tool.inner_text()
            assert "↳ r" in tool.locator(".tool-result").inner_text()
            page.click("#older")
            expect(page.locator("#page-range")).to_have_text(older)
            page.click("#older")
            expect(page.locator("#page-range")).to_have_text("messages 0–49 of 122")
            image = page.locator("img.msg-image").first
            assert image.evaluate("img => img.complete && img.naturalWidth") == 48
            page.screenshot(path=str(shots / "serve-session.png"), full_page=False)

            # restore a checkpoint, after the confirmation
            dialogs: list[str] = []

            def accept(dialog: Any) -> None:
                dialogs.append(dialog.message)
                dialog.accept()

            page.on("dialog", accept)
            item = page.locator(f'li[data-checkpoint-id="{known["checkpoint_id"]}"]')
            assert "before the refund" in item.inner_text()
            item.locator("button.restore").click()
            page.wait_for_selector("#notice")
            assert "82 messages" in dialogs[0]
            assert page.inner_text("#notice").startswith(
                f"Restored to {known['checkpoint_id']}: 122 → 82 messages"
            )
            assert page.inner_text("#message-count") == "82"
            assert page.locator("#checkpoints li").count() == 2  # and its pre_restore
            page.screenshot(path=str(shots / "serve-restored.png"))

            # verify, with its progress and report
            page.click("#nav-verify")
            page.click("#run-verify")
            page.wait_for_selector("#verify-clean", timeout=30_000)
            assert "61 sessions and 2 checkpoints verified: no damage" in page.inner_text(
                "#verify-clean"
            )
            page.screenshot(path=str(shots / "serve-verify.png"))

            # memory: one user's entries, searched, one deleted
            page.click("#nav-memory")
            page.fill("#namespace", "alice")
            page.press("#namespace", "Enter")
            page.wait_for_selector("#memories")
            assert page.locator("#memories tbody tr").count() == 3
            page.fill("#memory-search", "tea")
            page.press("#memory-search", "Enter")
            expect(page.locator("#memories tbody tr")).to_have_count(1)
            page.screenshot(path=str(shots / "serve-memory.png"))
            page.locator("button.delete-memory").click()
            page.wait_for_selector("text=Nothing remembered.")
            assert errors == []
        finally:
            browser.close()
    # the store says what the page said
    assert expected_range(url, 0).endswith(" of 82")


def test_the_page_asks_for_the_token_once(tmp_path: Path) -> None:
    sync_playwright, expect = _require_browser()
    url = f"file:{tmp_path / 'store'}"
    asyncio.run(_make(url, tmp_path / "memory.db"))
    proc, base = start("--store", url, env={"PERDURE_TOKEN": "let-me-in"})
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page()
                asked: list[str] = []

                def answer(dialog: Any) -> None:
                    asked.append(dialog.message)
                    dialog.accept("wrong" if len(asked) == 1 else "let-me-in")

                page.on("dialog", answer)
                page.goto(f"{base}/")
                expect(page.locator("#sessions tbody tr")).to_have_count(50)
                assert len(asked) == 2  # the wrong token was refused and asked again
                assert "needs a token" in asked[0]
                page.click("text=session-007")
                expect(page.locator("#session-title")).to_have_text("session-007")
                assert len(asked) == 2  # kept for the rest of the visit
            finally:
                browser.close()
    finally:
        stop(proc)


def test_verify_shows_the_damage_it_found(tmp_path: Path) -> None:
    sync_playwright, expect = _require_browser()
    from perdure.session import FileSessionStore

    url = f"file:{tmp_path / 'store'}"
    asyncio.run(_make(url, tmp_path / "memory.db"))
    journal = FileSessionStore(tmp_path / "store").session_dir("session-004") / "journal.jsonl"
    data = bytearray(journal.read_bytes())
    data[data.index(b'"q0"') + 2] ^= 0x01  # one bit of one message
    journal.write_bytes(bytes(data))
    proc, base = start("--store", url)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page()
                page.goto(f"{base}/#/verify")
                page.click("#run-verify")
                rows = page.locator("#damage tbody tr")
                expect(rows).to_have_count(1, timeout=30_000)
                cells = rows.first.locator("td").all_inner_texts()
                assert cells[0] == "session-004"
                assert cells[2].startswith("journal.jsonl byte ")
                assert "1 damaged (61 sessions and 1 checkpoint verified)" in page.inner_text(
                    "#verify-report"
                )
                # the damaged session's history says so; its page still opens
                rows.first.locator("a").click()
                expect(page.locator("[role=alert]")).to_contain_text("session_store_corrupted")
            finally:
                browser.close()
    finally:
        stop(proc)


def test_an_import_shows_its_upload_checks_and_write(tmp_path: Path) -> None:
    """On a server with a signing key the page's export is signed; its import job is
    followed to the end; an unsigned or damaged export ends with the job's error, and
    nothing is written."""
    sync_playwright, expect = _require_browser()
    url = f"file:{tmp_path / 'store'}"
    known = asyncio.run(_make(url, tmp_path / "memory.db"))
    store = open_store(url)
    try:
        data = asyncio.run(
            ops.export_checkpoint(store, "support-ticket-4711", known["checkpoint_id"])
        )
    finally:
        close(store)
    unsigned, damaged = tmp_path / "unsigned.json", tmp_path / "damaged.json"
    unsigned.write_bytes(data)
    key = tmp_path / "export.key"
    key.write_bytes(b"shared secret\n")
    proc, base = start("--store", url, "--signing-key-file", str(key))
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page()
                page.goto(f"{base}/#/s/support-ticket-4711")
                item = page.locator(f'li[data-checkpoint-id="{known["checkpoint_id"]}"]')
                with page.expect_download() as download:
                    item.locator("button.export").click()
                signed = Path(download.value.path()).read_bytes()
                assert b'"hmac_sha256"' in signed
                damaged.write_bytes(signed.replace(b'"q3"', b'"q4"', 1))

                page.goto(f"{base}/#/s/session-007")
                expect(page.locator("#session-title")).to_have_text("session-007")
                notice = page.locator("#checkpoint-notice")
                for refused, reason in ((unsigned, "not signed"), (damaged, "sha256")):
                    page.set_input_files("#import-file", str(refused))
                    page.click("#import-checkpoint")
                    expect(notice).to_contain_text("checkpoint_import_invalid", timeout=30_000)
                    expect(notice).to_contain_text(reason)
                    expect(page.locator("#import-checkpoint")).to_be_enabled()
                expect(page.locator("#checkpoints li")).to_have_count(0)
                good = tmp_path / "signed.json"
                good.write_bytes(signed)
                page.set_input_files("#import-file", str(good))
                page.click("#import-checkpoint")
                expect(page.locator("#notice")).to_contain_text(
                    "Imported checkpoint", timeout=30_000
                )
                item = page.locator("#checkpoints li")
                expect(item).to_have_count(1)
                assert "before the refund" in item.inner_text()
                assert "82 messages" in item.inner_text()
            finally:
                browser.close()
    finally:
        stop(proc)
    store = open_store(url)
    try:
        listed = asyncio.run(ops.list_checkpoints(store, "session-007"))
    finally:
        close(store)
    assert [(c.trigger, c.label, c.message_count) for c in listed] == [  # type: ignore[union-attr]
        ("import", "before the refund", 82)
    ]
