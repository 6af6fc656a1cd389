"""Extraction: distilling buffered conversation into memories, in the background.

An :class:`Extractor` turns messages into facts; :class:`ModelExtractor` asks a
model. :class:`ExtractionChannel` (internal to the manager) runs one store's
extraction: it buffers messages in an :class:`~perdure.memory.ExtractionOutbox`,
starts background jobs when a trigger fires, and acknowledges messages only after
the store accepted what came out of them — at least once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from perdure.errors import FilterFailedError, ModelError
from perdure.injection import escape_xml_text
from perdure.memory.outbox import ExtractionOutbox
from perdure.models import Model, ModelResponse
from perdure.types import Message

__all__ = [
    "DEFAULT_EXTRACTION_INSTRUCTIONS",
    "ExtractionChannel",
    "Extractor",
    "ModelExtractor",
    "as_extractor",
    "parse_facts",
    "render_transcript",
]

logger = logging.getLogger("perdure.memory")

DEFAULT_EXTRACTION_INSTRUCTIONS = (
    "You maintain the long-term memory of an assistant. From the conversation you are "
    "given, list the durable facts about the user worth remembering in later, unrelated "
    "conversations: preferences, personal details, standing instructions, decisions. "
    "Write each fact as one short, self-contained sentence in the third person "
    '("The user prefers dark mode."), one fact per line, with no numbering or commentary. '
    "Skip small talk, one-off requests and anything only the assistant said. If there is "
    "nothing worth remembering, answer NONE."
)


@runtime_checkable
class Extractor(Protocol):
    """Distils a stretch of conversation into facts to remember."""

    async def extract(self, messages: Sequence[Message]) -> list[str]:
        """Return the facts worth remembering from ``messages`` (may be empty)."""
        ...


def render_transcript(messages: Sequence[Message]) -> str:
    """The text of ``messages`` as ``role: text`` lines, escaped for an XML-like block.

    Only text blocks count: tool calls and tool results are left out.
    """
    lines = []
    for message in messages:
        texts = [
            block["text"].strip()
            for block in message.get("content") or []
            if isinstance(block.get("text"), str) and block["text"].strip()
        ]
        if texts:
            lines.append(f"{message.get('role')}: {escape_xml_text(' '.join(texts))}")
    return "\n".join(lines)


_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


def parse_facts(text: str) -> list[str]:
    """Facts from a model's answer: a JSON list of strings, or one fact per line.

    Bullets and numbering are stripped; blank lines, ``NONE`` and repeats dropped.
    """
    facts: list[str] = []
    stripped = text.strip()
    candidates: list[Any]
    try:
        decoded = json.loads(stripped)
    except ValueError:
        decoded = None
    candidates = decoded if isinstance(decoded, list) else stripped.splitlines()
    for candidate in candidates:
        if not isinstance(candidate, str):
            continue
        fact = _BULLET.sub("", candidate).strip()
        if not fact or fact.strip(".").upper() == "NONE" or fact in facts:
            continue
        facts.append(fact)
    return facts


class ModelExtractor:
    """An :class:`Extractor` that asks a model for the facts.

    The conversation is sent as one escaped ``<conversation>`` block in a user
    message, with ``instructions`` as the system prompt and no tools; the answer is
    read with :func:`parse_facts`.

    Args:
        model: any :class:`~perdure.models.Model`.
        instructions: the system prompt.

    Raises:
        TypeError: ``model`` has no ``stream`` method or ``instructions`` is not a str.
    """

    def __init__(self, model: Model, *, instructions: str = DEFAULT_EXTRACTION_INSTRUCTIONS):
        if not callable(getattr(model, "stream", None)):
            raise TypeError(f"model must implement the Model protocol, got {model!r}")
        if not isinstance(instructions, str) or not instructions.strip():
            raise TypeError("instructions must be a non-empty str")
        self.model = model
        self.instructions = instructions

    async def extract(self, messages: Sequence[Message]) -> list[str]:
        """Ask the model for the facts in ``messages``.

        Raises:
            ModelError: the model failed or ended without a response.
        """
        transcript = render_transcript(messages)
        if not transcript:
            return []
        request: list[Message] = [
            {
                "role": "user",
                "content": [
                    {
                        "text": f"<conversation>\n{transcript}\n</conversation>\n\n"
                        "List the facts worth remembering, one per line, or NONE."
                    }
                ],
            }
        ]
        response: ModelResponse | None = None
        stream = self.model.stream(request, tool_specs=[], system_prompt=self.instructions)
        try:
            async for event in stream:
                if isinstance(event, ModelResponse):
                    response = event
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        if response is None:
            raise ModelError(f"extraction model {type(self.model).__name__} gave no response")
        text = "\n".join(
            block["text"]
            for block in response.message["content"]
            if isinstance(block.get("text"), str)
        )
        return parse_facts(text)

    def __repr__(self) -> str:
        return f"ModelExtractor({self.model!r})"


def as_extractor(value: object) -> Extractor | None:
    """``value`` as an Extractor: itself, a Model wrapped in ModelExtractor, or None.

    Raises:
        TypeError: ``value`` is neither.
    """
    if value is None:
        return None
    if callable(getattr(value, "extract", None)):
        return value  # type: ignore[return-value]  # structurally an Extractor
    if callable(getattr(value, "stream", None)):
        return ModelExtractor(value)  # type: ignore[arg-type]  # structurally a Model
    raise TypeError(
        f"extractor must be an Extractor (an async extract(messages) method), a Model or None, "
        f"got {type(value).__name__}"
    )


class ExtractionChannel:
    """The extraction of one store: its outbox, its triggers and its background jobs.

    Jobs are tasks on the event loop that triggered them; each is mirrored by a
    ``concurrent.futures.Future`` so that :meth:`flush` can wait for it from any
    event loop or thread. Concurrent jobs claim disjoint messages.
    """

    def __init__(
        self,
        store: Any,
        store_name: str,
        outbox: ExtractionOutbox,
        *,
        extractor: Extractor | None,
        every_n_messages: int | None,
        on_invocation_end: bool,
        batch_size: int,
        entry_filter: Callable[[str], str] | None = None,
    ) -> None:
        self.store = store
        self.entry_filter = entry_filter
        self.store_name = store_name
        self.outbox = outbox
        self.extractor = extractor
        self.every_n_messages = every_n_messages
        self.on_invocation_end = on_invocation_end
        self.batch_size = batch_size
        self._jobs: dict[concurrent.futures.Future[None], asyncio.Task[None]] = {}

    async def buffer(self, message: Message) -> None:
        """Buffer ``message`` durably; start a job when ``every_n_messages`` are waiting.

        A failure to buffer does not fail the agent's turn (memory is fail-open, like
        search): it is logged as an error, naming what is lost for extraction.
        """
        try:
            waiting = await self.outbox.append(message)
        except Exception:
            logger.error(
                "memory extraction for store %r: could not buffer a %s message; it will not "
                "be extracted",
                self.store_name,
                message.get("role"),
                exc_info=True,
            )
            return
        if self.every_n_messages is not None and waiting >= self.every_n_messages:
            self.start_job()

    def start_job(self) -> None:
        """Start a background extraction job on the running event loop."""
        loop = asyncio.get_running_loop()
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        task = loop.create_task(self._run_job(done))
        self._jobs[done] = task
        done.add_done_callback(self._forget)

    def _forget(self, done: concurrent.futures.Future[None]) -> None:
        self._jobs.pop(done, None)

    async def _run_job(self, done: concurrent.futures.Future[None]) -> None:
        try:
            while await self._extract_batch():
                pass
        except asyncio.CancelledError:
            logger.warning(
                "memory extraction for store %r was cancelled; its messages stay buffered",
                self.store_name,
            )
            raise
        finally:
            done.set_result(None)

    async def _extract_batch(self) -> bool:
        """Extract one batch; True when a batch was done and more may be waiting."""
        claimed = await self.outbox.claim(self.batch_size)
        if not claimed:
            return False
        ids = [row_id for row_id, _ in claimed]
        messages = [message for _, message in claimed]
        try:
            if self.extractor is not None:
                facts = await self.extractor.extract(messages)
                if self.entry_filter is not None:
                    facts = [self.entry_filter(fact) for fact in facts]  # all before any add
                for fact in facts:
                    await self.store.add(fact, metadata={"source": "extraction"})
            else:
                await self.store.add_messages(messages, metadata={"source": "extraction"})
            await self.outbox.ack(ids)
        except BaseException as exc:
            self.outbox.release(ids)
            if not isinstance(exc, Exception):
                raise
            filtered = isinstance(exc, FilterFailedError)
            logger.warning(
                "memory extraction for store %r failed%s; %d messages stay buffered for a retry",
                self.store_name,
                f": {exc}" if filtered else "",
                len(ids),
                # No traceback for a failed filter: its cause may quote the memory.
                exc_info=not filtered,
            )
            return False
        return True

    async def wait(self) -> None:
        """Wait for every job started so far (from any event loop or thread)."""
        while True:
            pending = [
                done
                for done, task in list(self._jobs.items())
                if not done.done() and not task.get_loop().is_closed()
            ]
            if not pending:
                return
            for done in pending:
                await asyncio.wrap_future(done)

    async def drain(self) -> None:
        """Extract every buffered message now, in this task, then wait for the jobs."""
        await self.wait()
        while await self._extract_batch():
            pass
