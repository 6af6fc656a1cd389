"""Signed checkpoint exports (SPEC §9): HMAC-SHA256 refuses forgeries the sha256 lets by."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent
from perdure.checkpoints.export import export_checkpoint_bytes, import_checkpoint_bytes
from perdure.checkpoints.store import CheckpointMeta, CheckpointRecord
from perdure.errors import CheckpointImportError
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session
from perdure.session.ulid import new_ulid
from perdure.types.json import compact_json_bytes

KEY = b"k" * 32


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _record() -> CheckpointRecord:
    messages: list[Any] = [
        {"role": "user", "content": [{"text": "pay 10 EUR"}]},
        {"role": "assistant", "content": [{"text": "paid"}]},
    ]
    meta = CheckpointMeta(
        checkpoint_id=new_ulid(),
        session_id="s",
        trigger="manual",
        label=None,
        message_count=2,
        created_at="2026-01-01T00:00:00+00:00",
    )
    return CheckpointRecord(meta, messages, {"state": {"n": 1}})


def _rehash(doc: dict[str, Any]) -> bytes:
    """``doc`` with its sha256 recomputed, as a forger would."""
    doc = {k: v for k, v in doc.items() if k != "sha256"}
    signature = doc.pop("hmac_sha256", None)
    doc["sha256"] = hashlib.sha256(compact_json_bytes(doc, sort_keys=True)).hexdigest()
    if signature is not None:
        doc["hmac_sha256"] = signature
    return compact_json_bytes(doc, sort_keys=True)


def _forged(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["messages"][0]["content"][0]["text"] = "pay 10000 EUR"
    return _rehash(doc)


def test_a_rehashed_forgery_passes_the_sha256_but_not_the_signature() -> None:
    signed = export_checkpoint_bytes(_record(), signing_key=KEY)
    forged = _forged(signed)
    # The sha256 alone accepts it: it detects damage, not forgery …
    assert import_checkpoint_bytes(forged).messages[0]["content"][0]["text"] == "pay 10000 EUR"
    # … the signature does not.
    with pytest.raises(CheckpointImportError, match="signature does not match") as caught:
        import_checkpoint_bytes(forged, verify_key=KEY)
    assert caught.value.code == "checkpoint_import_invalid"


def test_a_signed_export_imports_with_its_key_and_not_with_another() -> None:
    record = _record()
    signed = export_checkpoint_bytes(record, signing_key=KEY)
    assert json.loads(signed)["hmac_sha256"]
    imported = import_checkpoint_bytes(signed, verify_key=KEY)
    assert imported.messages == record.messages
    assert imported.agent_state == record.agent_state
    assert import_checkpoint_bytes(signed, verify_key=KEY.decode()).messages == record.messages
    with pytest.raises(CheckpointImportError, match="signature does not match"):
        import_checkpoint_bytes(signed, verify_key=b"another key")


def test_a_missing_signature_is_refused_when_a_key_is_given() -> None:
    unsigned = export_checkpoint_bytes(_record())
    assert "hmac_sha256" not in json.loads(unsigned)
    with pytest.raises(CheckpointImportError, match="not signed"):
        import_checkpoint_bytes(unsigned, verify_key=KEY)
    # A signed export with its signature stripped (and its sha256 still right).
    doc = json.loads(export_checkpoint_bytes(_record(), signing_key=KEY))
    del doc["hmac_sha256"]
    with pytest.raises(CheckpointImportError, match="not signed"):
        import_checkpoint_bytes(compact_json_bytes(doc, sort_keys=True), verify_key=KEY)


def test_unsigned_exports_still_import_without_a_key() -> None:
    unsigned = export_checkpoint_bytes(_record())
    assert json.loads(unsigned)["format"] == "perdure-checkpoint/1"
    assert import_checkpoint_bytes(unsigned).messages == _record().messages
    # A signed one imports without a key too (its signature is then not checked).
    assert import_checkpoint_bytes(export_checkpoint_bytes(_record(), signing_key=KEY))


@pytest.mark.parametrize(
    "mangle",
    [
        lambda doc: {**doc, "hmac_sha256": doc["hmac_sha256"][::-1]},
        lambda doc: {**doc, "hmac_sha256": 12},
        lambda doc: {**doc, "hmac_sha256": None},
        lambda doc: {**doc, "hmac_sha256": doc["hmac_sha256"].upper()},
    ],
)
def test_a_damaged_signature_is_refused(mangle: Any) -> None:
    doc = json.loads(export_checkpoint_bytes(_record(), signing_key=KEY))
    data = compact_json_bytes(mangle(doc), sort_keys=True)
    with pytest.raises(CheckpointImportError):
        import_checkpoint_bytes(data, verify_key=KEY)


def test_keys_are_checked() -> None:
    with pytest.raises(ValueError, match="signing_key"):
        export_checkpoint_bytes(_record(), signing_key=b"")
    with pytest.raises(TypeError, match="signing_key"):
        export_checkpoint_bytes(_record(), signing_key=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="verify_key"):
        import_checkpoint_bytes(b"{}", verify_key=3.5)  # type: ignore[arg-type]


def test_session_signs_exports_and_verifies_imports(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "s")
    session = Session(store, "a")
    agent = Agent(model=ScriptedModel(["paid"]), session_manager=session)
    agent("pay 10 EUR")
    mark = run(session.checkpoint())
    signed = run(session.export_checkpoint(mark.checkpoint_id, signing_key=KEY))
    other = Session(store, "b")
    imported = run(other.import_checkpoint(signed, verify_key=KEY))
    assert imported.message_count == 2
    before = run(other.list_checkpoints())
    with pytest.raises(CheckpointImportError):
        run(other.import_checkpoint(_forged(signed), verify_key=KEY))
    with pytest.raises(CheckpointImportError):
        run(other.import_checkpoint(run(session.export_checkpoint(mark.checkpoint_id)), KEY))
    assert run(other.list_checkpoints()) == before  # nothing written
    store.close()


def test_a_large_export_is_checked_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding and hashing a large export would stall every other coroutine: a
    worker thread does it; a small one is checked where it is."""
    import threading

    from perdure.session import session as session_module

    checked_on: list[int] = []
    real = session_module.import_checkpoint_bytes

    def recording(data: Any, *, verify_key: Any = None, progress: Any = None) -> Any:
        checked_on.append(threading.get_ident())
        return real(data, verify_key=verify_key, progress=progress)

    monkeypatch.setattr(session_module, "import_checkpoint_bytes", recording)
    store = FileSessionStore(tmp_path / "s")
    session = Session(store, "a")
    agent = Agent(model=ScriptedModel(["ok", "ok"]), session_manager=session)
    agent("short")
    small = run(session.export_checkpoint(run(session.checkpoint()).checkpoint_id))
    agent("x" * (session_module._IMPORT_ON_LOOP_MAX + 1))
    large = run(session.export_checkpoint(run(session.checkpoint()).checkpoint_id))
    assert len(small) <= session_module._IMPORT_ON_LOOP_MAX < len(large)
    other = Session(store, "b")

    async def import_both() -> tuple[int, Any, Any]:
        loop_thread = threading.get_ident()
        return (
            loop_thread,
            await other.import_checkpoint(small),
            await other.import_checkpoint(large),
        )

    loop_thread, first, second = run(import_both())
    assert checked_on[0] == loop_thread  # the small export, on the loop
    assert checked_on[1] != loop_thread  # the large one, in a worker
    assert (first.message_count, second.message_count) == (2, 4)
    restored = run(other.list_checkpoints())
    assert len(restored) == 2
    store.close()


def test_import_reports_progress_through_its_checks() -> None:
    """progress(done, total): the parse, the hashes, each attachment, each message,
    the agent state; it only grows, ends at (total, total), and stops where a
    refused export failed."""
    base = _record()
    image = {"image": {"format": "png", "source": {"bytes": b"\x89PNG not really"}}}
    messages: list[Any] = [
        {"role": "user", "content": [{"text": f"m{n}"}, image]} for n in range(130)
    ]
    meta = CheckpointMeta(**{**base.meta.to_dict(), "message_count": 130})
    record = CheckpointRecord(meta, messages, base.agent_state)
    data = export_checkpoint_bytes(record, signing_key=KEY)
    calls: list[tuple[int, int]] = []
    import_checkpoint_bytes(data, verify_key=KEY, progress=lambda d, t: calls.append((d, t)))
    assert len(json.loads(data)["attachments"]) == 1
    total = 3 + 1 + 130
    assert calls[:3] == [(1, total), (2, total), (3, total)]  # parse, hashes, attachment
    assert (3 + 64, total) in calls
    assert (3 + 128, total) in calls
    assert calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted({d for d, _ in calls})
    assert {t for _, t in calls} == {total}

    refused: list[tuple[int, int]] = []
    with pytest.raises(CheckpointImportError):
        import_checkpoint_bytes(
            data, verify_key=b"other", progress=lambda d, t: refused.append((d, t))
        )
    assert refused == [(1, total)]  # parsed, then refused at the signature
