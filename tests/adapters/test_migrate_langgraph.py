"""``perdure migrate langgraph --from sqlite:DB --to URL``: threads written by LangGraph's
real ``SqliteSaver`` become PerdureSaver threads that read back equal, verified."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from lg_support import import_langgraph

import_langgraph()
pytest.importorskip("langgraph.checkpoint.sqlite", reason="langgraph-checkpoint-sqlite")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

from perdure.adapters.langgraph import PerdureSaver  # noqa: E402
from perdure.cli._common import EXIT_NOT_FOUND, EXIT_PROBLEM, EXIT_USAGE  # noqa: E402
from perdure.cli.main import cli  # noqa: E402
from perdure.migrate.langgraph import migrate_langgraph  # noqa: E402


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def graph_builder() -> StateGraph:
    def answer(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(f"answer {len(state['messages'])}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", answer)
    builder.add_edge(START, "model")
    builder.add_edge("model", END)
    return builder


THREADS = {"alice": 3, "bob ünïcode/x": 1}


@pytest.fixture
def lg_db(tmp_path: Path) -> Path:
    path = tmp_path / "lg.db"
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    graph = graph_builder().compile(checkpointer=saver)
    for thread, turns in THREADS.items():
        config: Any = {"configurable": {"thread_id": thread}}
        for n in range(turns):
            graph.invoke({"messages": [HumanMessage(f"{thread} {n}")]}, config)
    # pending writes on the newest checkpoint, with a task path
    latest = saver.get_tuple({"configurable": {"thread_id": "alice", "checkpoint_ns": ""}})
    assert latest is not None
    saver.put_writes(latest.config, [("messages", [HumanMessage("pending")])], "t1", "a:b")
    conn.close()
    return path


def history(saver: Any, thread: str) -> list[tuple[Any, ...]]:
    """Everything a saver gives back about a thread, for comparing two savers."""
    return [
        (
            t.config["configurable"],
            t.checkpoint,
            t.metadata,
            (t.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
            t.pending_writes,
        )
        for t in saver.list({"configurable": {"thread_id": thread}})
    ]


def source_history(path: Path, thread: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        return history(SqliteSaver(conn), thread)
    finally:
        conn.close()


def test_threads_are_copied_equal_and_verified(lg_db: Path, tmp_path: Path) -> None:
    before = hashlib.sha256(lg_db.read_bytes()).hexdigest()
    target = f"sqlite:{tmp_path / 'perdure.db'}"
    result = invoke("migrate", "langgraph", "--from", f"sqlite:{lg_db}", "--to", target, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["counts"]["imported"] == 2
    assert all(t["verified"] for t in report["threads"])
    assert {t["thread_id"]: t["checkpoints"] for t in report["threads"]} == {
        "alice": 9,
        "bob ünïcode/x": 3,
    }
    with PerdureSaver(target) as saver:
        for thread in THREADS:
            ours = history(saver, thread)
            assert ours == source_history(lg_db, thread)
        assert any(entry[4] for entry in history(saver, "alice"))  # pending writes came too
        graph = graph_builder().compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "alice"}}
        graph.invoke({"messages": [HumanMessage("after the move")]}, config)
        # 6 + the new question and its answer (a write of an unknown task is not applied)
        assert len(graph.get_state(config).values["messages"]) == 8
    assert hashlib.sha256(lg_db.read_bytes()).hexdigest() == before  # read-only

    again = invoke("migrate", "langgraph", "--from", str(lg_db), "--to", target, "--json")
    assert json.loads(again.output)["counts"]["skipped"] == 2
    replaced = invoke("migrate", "langgraph", "--from", str(lg_db), "--to", target, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert "replaced the existing thread" in replaced.output
    assert "2 imported, 0 skipped, 0 failed" in replaced.output


def test_a_dry_run_writes_nothing(lg_db: Path, tmp_path: Path) -> None:
    target = tmp_path / "none.db"
    result = invoke(
        "migrate", "langgraph", "--from", f"sqlite:{lg_db}", "--to", f"sqlite:{target}",
        "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 would import" in result.stderr  # piped: the table on stdout, the summary not
    header, *rows = (line.split("\t") for line in result.stdout.splitlines())
    assert header[:2] == ["thread", "status"]
    assert [row[1] for row in rows] == ["would import"] * 2
    assert not target.exists()


def test_bad_sources_and_targets(lg_db: Path, tmp_path: Path) -> None:
    memory = invoke("migrate", "langgraph", "--from", str(lg_db), "--to", "memory:")
    assert memory.exit_code == EXIT_USAGE
    assert "keeps data only while" in memory.output
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE x (a)").connection.close()
    wrong = invoke("migrate", "langgraph", "--from", str(other), "--to", f"file:{tmp_path}/f")
    assert wrong.exit_code == EXIT_USAGE
    assert "not a LangGraph SqliteSaver database" in wrong.output
    empty = tmp_path / "empty.db"
    conn = sqlite3.connect(empty, check_same_thread=False)
    SqliteSaver(conn).setup()
    conn.close()
    none = invoke("migrate", "langgraph", "--from", str(empty), "--to", f"file:{tmp_path}/f")
    assert none.exit_code == EXIT_NOT_FOUND


class ForgetfulSaver(PerdureSaver):
    """Loses every pending write on the way back: the verify step must catch it."""

    async def aget_tuple(self, config: Any) -> Any:
        found = await super().aget_tuple(config)
        return None if found is None else found._replace(pending_writes=[])


def test_a_thread_that_reads_back_different_fails_and_is_removed(lg_db: Path) -> None:
    saver = ForgetfulSaver("memory:")
    report = asyncio.run(migrate_langgraph(lg_db, saver))
    assert not report.ok
    for entry in report.threads:
        assert entry.status == "failed"
        assert "differs in its pending writes" in (entry.reason or "")
        assert not entry.verified
        assert list(saver.list({"configurable": {"thread_id": entry.thread_id}})) == []


def test_the_cli_exits_1_when_a_thread_fails(
    lg_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("perdure.adapters.langgraph.PerdureSaver", ForgetfulSaver)
    result = invoke("migrate", "langgraph", "--from", str(lg_db), "--to", f"file:{tmp_path}/f")
    assert result.exit_code == EXIT_PROBLEM
    assert "failed" in result.output
