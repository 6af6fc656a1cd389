"""What a :class:`~perdure.multiagent.Graph` and a :class:`~perdure.multiagent.Swarm`
share: one invocation at a time, the stored run read once, a run begun or resumed.

An orchestrator keeps its run's records in memory between invocations. They are read
from its :class:`~perdure.multiagent.persist.RunStore` (its node agents restored with
them) on the first invocation, and forgotten when an invocation fails, so the next one
reads the run as it is stored (a save that failed, a cancellation) and goes on from
there.

A run's start record names the orchestrator that began it (its kind and id): a stored
run of another (a swarm's met by a graph, another ``graph_id`` in a ``Session``) is
refused, finished or not, rather than resumed as this one's or overwritten by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from perdure._runtime.loop import run_sync
from perdure._runtime.threads import ProcessLock
from perdure.agent import Agent
from perdure.errors import SessionMismatchError, TurnRunningError
from perdure.multiagent.persist import RunStore
from perdure.multiagent.run import RunState, replay, start_record

__all__ = ["Orchestrator"]

R = TypeVar("R")


class Orchestrator(Generic[R]):
    """The invocation frame of an orchestrator of ``kind`` (``"graph"``, ``"swarm"``)."""

    kind: str

    def __init__(self, store: RunStore, run_id: str) -> None:
        self._store = store
        self._run_id = run_id
        self._records: list[dict[str, Any]] | None = None
        self._lock = ProcessLock()

    def __call__(self, task: str) -> R:
        """Run (or resume) on ``task``; the sync face of :meth:`invoke_async`."""
        return run_sync(self.invoke_async(task), async_name=f"{self.kind}.invoke_async(task)")

    async def invoke_async(self, task: str) -> R:
        """Run on ``task``, or resume the unfinished run of that task.

        Raises:
            TypeError: ``task`` is not a str.
            ValueError: an unfinished run of another task is stored.
            SessionMismatchError: the session holds the run of another orchestrator
                (another kind, or another id where a session holds one run), or
                something else than a run.
            TurnRunningError: this orchestrator is running already.
            SessionConflictError, SessionLockedError: another writer has the run
                (or any other error saving it: the next invocation reads what is
                stored and goes on from there).
            SessionCorruptedError: the stored run is damaged.
        """
        if not isinstance(task, str):
            raise TypeError(f"task must be a str, got {type(task).__name__}")
        if not self._lock.acquire(blocking=False):
            raise TurnRunningError(f"{self.kind} {self._run_id!r} is already running")
        try:
            async with self._store.holding():
                return await self._invoke(task)
        except BaseException:
            self._records = None  # read again, as stored, by the next invocation
            raise
        finally:
            self._lock.release()

    async def _invoke(self, task: str) -> R:
        raise NotImplementedError

    def _node_agents(self) -> Iterable[Agent]:
        """The agents whose state is kept with the run."""
        raise NotImplementedError

    def _check_resumable(self, state: RunState) -> None:
        """Raise ``ValueError`` when an unfinished run cannot go on here (default: it can)."""

    async def _begin(self, task: str, entry: str) -> tuple[list[dict[str, Any]], RunState, bool]:
        """The run's records and state, and whether the run is a new one.

        Reads the stored run on the first invocation (restoring the node agents);
        resumes an unfinished run of ``task``, else starts a new one at ``entry``.
        """
        if self._records is None:
            records = await self._store.load() or []
            state = replay(records, self._run_id) if records else None
            if state is not None:
                # Before an agent is restored: another orchestrator's run changes none.
                self._check_owner(state)
            self._records = records
            for agent in self._node_agents():
                await self._store.restore_agent(agent)
        else:
            records = self._records
            state = replay(records, self._run_id) if records else None
        if state is not None and state.status == "running":
            if state.task != task:
                raise ValueError(
                    f"{self.kind} {self._run_id!r} has an unfinished run of the task "
                    f"{state.task!r}; call it with that task to resume it"
                )
            self._check_resumable(state)
            return records, state, False
        # What the run that ends held of the node agents goes on into the new one.
        carried = await self._store.carry_agents(records, list(self._node_agents()))
        start = start_record(self.kind, task, [entry], {}, self._run_id)
        records = self._records = [start, *carried]
        return records, replay(records, self._run_id), True

    def _check_owner(self, state: RunState) -> None:
        """Refuse a stored run that another orchestrator began.

        Neither resumed (its results reported as this one's) nor replaced by a new run
        (its records lost). A run whose id was not recorded (an older one) is taken as
        this one's if it is of this kind.

        Raises:
            SessionMismatchError: the run is of another kind, or of another id.
        """
        other_id = state.run_id if state.run_id is not None else self._run_id
        if state.kind == self.kind and other_id == self._run_id:
            return
        store = self._store
        theirs = f"{state.kind} {other_id!r}"
        ours = f"{self.kind} {self._run_id!r}"
        finished = "an unfinished" if state.status == "running" else f"a {state.status}"
        if store.single_run:
            advice = f"a Session holds one run: give {ours} a Session of its own"
        else:
            advice = f"give {ours} another {self.kind}_id"
        raise SessionMismatchError(
            f"{store.where} holds {finished} run of {theirs}, not of {ours}: it is "
            f"neither resumed nor overwritten; {advice}",
            details={
                "found": {"kind": state.kind, "id": state.run_id, "status": state.status},
                "expected": {"kind": self.kind, "id": self._run_id},
            },
        )
