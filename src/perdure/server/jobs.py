"""Long operations run as jobs the page polls: ``POST /api/jobs/verify``,
``POST /api/jobs/import/{session_id}``, ``GET /api/jobs/{id}``.

A job is an asyncio task on the server's loop with a progress counter the
operation's ``progress(done, total)`` callback moves (from a worker thread too: it
only sets two numbers), and a ``phase`` the operation names (``verifying``,
``writing``). Jobs live in memory: a restart
forgets them (their effects, if any, are in the store). The newest
:data:`MAX_JOBS` are kept; older finished ones are dropped.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from perdure.errors import PerdureError
from perdure.server.errors import error_body, log

MAX_JOBS = 100

JobState = Literal["running", "done", "failed"]


@dataclass
class Job:
    """One long operation: what it is, how far it got, and its result or error."""

    job_id: str
    kind: str
    state: JobState = "running"
    done: int = 0
    total: int | None = None
    phase: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def progress(self, done: int, total: int) -> None:
        """The operation's progress callback."""
        self.done, self.total = done, total

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "job_id": self.job_id,
            "kind": self.kind,
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "phase": self.phase,
            "result": self.result,
            "error": self.error,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


class Jobs:
    """The server's jobs, by id."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self, kind: str, work: Callable[[Job], Awaitable[Any]], *, phase: str | None = None
    ) -> Job:
        """Start ``work(job)`` in the background; its return value becomes the result."""
        job = Job(uuid.uuid4().hex, kind, phase=phase)
        self._jobs[job.job_id] = job
        self._trim()
        task = asyncio.get_running_loop().create_task(self._run(job, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def get(self, job_id: str) -> Job | None:
        """The job with that id, if it is still kept."""
        return self._jobs.get(job_id)

    async def close(self) -> None:
        """Cancel the jobs still running (the server is stopping)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self, job: Job, work: Callable[[Job], Awaitable[Any]]) -> None:
        try:
            job.result = await work(job)
            job.state = "done"
        except PerdureError as exc:
            job.state, job.error = "failed", error_body(exc.code, exc.message)["error"]
        except (ValueError, TypeError) as exc:
            job.state, job.error = "failed", error_body("bad_request", str(exc))["error"]
        except Exception as exc:
            log.error("job %s failed", job.job_id, exc_info=exc)
            job.state = "failed"
            job.error = error_body("internal_error", "internal error; see the server log")["error"]
        finally:
            job.finished_at = time.time()

    def _trim(self) -> None:
        if len(self._jobs) <= MAX_JOBS:
            return
        for job_id, job in list(self._jobs.items()):
            if len(self._jobs) <= MAX_JOBS:
                break
            if job.state != "running":
                del self._jobs[job_id]
