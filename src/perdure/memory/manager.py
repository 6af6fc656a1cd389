"""MemoryManager: long-term memory for an agent — search, injection, tools, extraction."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perdure.crypto import Cipher
from perdure.errors import FilterFailedError
from perdure.hooks import AfterInvocationEvent, InvokeModelStage, MessageAddedEvent
from perdure.hygiene.filters import FilterChain, PersistenceFilter
from perdure.injection import (
    InjectionContext,
    escape_xml_attr,
    escape_xml_text,
    injection_middleware,
    is_user_turn,
    latest_text,
)
from perdure.memory.config import (
    DEFAULT_MAX_SEARCH_RESULTS,
    MEMORY_OUTBOX,
    ExtractionConfig,
    MemoryAddToolConfig,
    MemoryInjectionConfig,
    MemoryToolConfig,
)
from perdure.memory.entry import MemoryEntry
from perdure.memory.extraction import ExtractionChannel
from perdure.memory.local_store import LocalMemoryStore
from perdure.memory.outbox import ExtractionOutbox
from perdure.memory.store import MemoryStore, has_method, is_writable, store_name
from perdure.tools import AgentTool, DecoratedTool
from perdure.types import Message

if TYPE_CHECKING:
    from perdure.agent import Agent

__all__ = ["MAX_TOOL_LIMIT", "MemoryManager", "default_format", "default_query"]

logger = logging.getLogger("perdure.memory")

MAX_TOOL_LIMIT = 50
"""The largest ``limit`` the model may pass to ``search_memory``."""

_SEARCH_DESCRIPTION = (
    "Search long-term memory: facts and preferences remembered from earlier "
    "conversations with this user. Use it when what the user asks may depend on "
    "something they told you before."
)
_ADD_DESCRIPTION = (
    "Save one durable fact or preference about the user to long-term memory, so that "
    "it is remembered in later conversations. Write it as a short, self-contained "
    "sentence."
)


def default_query(messages: Sequence[Message]) -> str | None:
    """The adaptive query: the latest user text on a user turn, else the latest assistant text.

    On a user turn (the request ends with a user prompt) it is the text of that
    prompt; in the middle of a tool loop it is the latest assistant text — what the
    agent itself last said it was doing. ``None`` when there is no such text.
    """
    if is_user_turn(messages):
        return latest_text(messages[-1:], "user")
    return latest_text(messages, "assistant")


def default_format(entries: Sequence[MemoryEntry]) -> str:
    """The entries as an escaped ``<memory>`` block of ``<entry source="…">`` items.

    Content and source are escaped, so stored text can never close an element or
    add one (no stored prompt injection through the block's structure).
    """
    lines = ["<memory>"]
    for entry in entries:
        source = escape_xml_attr(entry.store_name or "memory")
        lines.append(f'<entry source="{source}">{escape_xml_text(entry.content)}</entry>')
    lines.append("</memory>")
    return "\n".join(lines)


class MemoryManager:
    """A plugin that gives an agent long-term memory from one or more stores.

    Attached with ``Agent(memory_manager=...)``, it wires three things:

    - **injection** (``injection``, on by default): before a model call, it searches
      every store with the adaptive query (:func:`default_query`) and folds the
      results, as an escaped ``<memory>`` block, into that request only — never
      into the history or any stored data;
    - **tools**: ``search_memory(query, limit=None)`` (``search_tool_config``, on by
      default) and ``add_memory(content)`` (``add_tool_config``, off by default);
    - **extraction** (``extraction``, off by default): messages are buffered in a
      durable outbox and distilled into memories in the background, at least once.
      ``await manager.flush()`` waits for it (the sync ``agent(...)`` call does so
      after every invocation).

    Each of the first three options takes ``True`` (defaults), ``False`` (off) or
    a config object. Impossible configurations raise ``ValueError`` here rather
    than at run time.

    Args:
        stores: the :class:`MemoryStore` objects (names unique).
        search_tool_config: ``True``, ``False`` or a :class:`MemoryToolConfig`.
        add_tool_config: ``True``, ``False`` or a :class:`MemoryAddToolConfig`.
        injection: ``True``, ``False`` or a :class:`MemoryInjectionConfig`.
        extraction: None, an :class:`ExtractionConfig` for every writable store, or
            a mapping from store name to :class:`ExtractionConfig`.
        filters: persistence filters (:mod:`perdure.hygiene.filters`, e.g.
            :class:`~perdure.hygiene.PIIRedactor`): every message is filtered before
            it is buffered for extraction (``kind="message"``,
            ``write="extraction"``), and every memory before it is added to a store,
            by :meth:`add`, the ``add_memory`` tool or extraction
            (``kind="memory_entry"``, ``write="memory"``). A filter that fails fails
            that write with :class:`~perdure.errors.FilterFailedError` (``add``
            raises it; a message that cannot be buffered is logged and not
            extracted, as any buffering failure is).

    Raises:
        TypeError: an argument of the wrong type (the message names it).
        ValueError: an impossible configuration: no stores, duplicate store names, a
            store without ``search``, a config naming an unknown store, an add tool
            or extraction for a store that cannot take it, extraction with an
            extractor into a store without ``add`` (or without one into a store
            without ``add_messages``), or extraction into a non-local store without
            an ``outbox``.
    """

    name = "perdure:memory-manager"

    def __init__(
        self,
        stores: Sequence[MemoryStore],
        search_tool_config: bool | MemoryToolConfig = True,
        add_tool_config: bool | MemoryAddToolConfig = False,
        injection: bool | MemoryInjectionConfig = True,
        extraction: ExtractionConfig | Mapping[str, ExtractionConfig] | None = None,
        *,
        filters: Iterable[PersistenceFilter] | None = None,
    ) -> None:
        self._filters = FilterChain(filters)
        if isinstance(stores, str | bytes) or not isinstance(stores, Sequence):
            raise TypeError(f"stores must be a list of MemoryStore, got {type(stores).__name__}")
        if not stores:
            raise ValueError("stores must hold at least one MemoryStore")
        self.stores: list[MemoryStore] = list(stores)
        self._by_name: dict[str, MemoryStore] = {}
        for index, store in enumerate(self.stores):
            if not has_method(store, "search"):
                raise ValueError(
                    f"stores[{index}] ({type(store).__name__}) does not implement search()"
                )
            name = store_name(store)
            if name in self._by_name:
                raise ValueError(
                    f"stores has two stores named {name!r}; give them distinct `name` attributes"
                )
            self._by_name[name] = store

        self.search_tool_config = self._option(
            search_tool_config, MemoryToolConfig, "search_tool_config"
        )
        if self.search_tool_config is not None:
            self._known(self.search_tool_config.stores, "search_tool_config.stores")

        self.add_tool_config = self._option(add_tool_config, MemoryAddToolConfig, "add_tool_config")
        self._add_targets: list[str] = []
        if self.add_tool_config is not None:
            self._add_targets = self._writable_targets(
                self.add_tool_config.stores, "add_tool_config"
            )
        if (
            self.search_tool_config is not None
            and self.add_tool_config is not None
            and self.search_tool_config.name == self.add_tool_config.name
        ):
            raise ValueError(
                f"search_tool_config and add_tool_config both name their tool "
                f"{self.add_tool_config.name!r}"
            )

        self.injection = self._option(injection, MemoryInjectionConfig, "injection")
        if self.injection is not None:
            self._known(self.injection.stores, "injection.stores")

        self._channels: list[ExtractionChannel] = self._build_extraction(extraction)

    # ------------------------------------------------------------------ config

    @staticmethod
    def _option(value: object, config_type: type[Any], argument: str) -> Any:
        if value is True:
            return config_type()
        if value is False or value is None:
            return None
        if isinstance(value, config_type):
            return value
        raise TypeError(
            f"{argument} must be True, False or a {config_type.__name__}, "
            f"got {type(value).__name__}"
        )

    def _known(self, names: Sequence[str] | None, argument: str) -> list[str]:
        if names is None:
            return list(self._by_name)
        unknown = [name for name in names if name not in self._by_name]
        if unknown:
            raise ValueError(
                f"{argument} names unknown stores {unknown}; the stores are {list(self._by_name)}"
            )
        return list(names)

    def _writable_targets(self, names: Sequence[str] | None, argument: str) -> list[str]:
        if names is None:
            targets = [name for name, store in self._by_name.items() if is_writable(store)]
            if not targets:
                raise ValueError(
                    f"{argument}: no store is writable (none implements add or add_messages)"
                )
            return targets
        targets = self._known(names, f"{argument}.stores")
        read_only = [name for name in targets if not is_writable(self._by_name[name])]
        if read_only:
            raise ValueError(
                f"{argument}.stores names stores that cannot be written to (no add or "
                f"add_messages): {read_only}"
            )
        return targets

    def _build_extraction(
        self, extraction: ExtractionConfig | Mapping[str, ExtractionConfig] | None
    ) -> list[ExtractionChannel]:
        if extraction is None:
            return []
        if isinstance(extraction, ExtractionConfig):
            names = self._writable_targets(None, "extraction")
            per_store = dict.fromkeys(names, extraction)
        elif isinstance(extraction, Mapping):
            if not extraction:
                raise ValueError("extraction must configure at least one store (or be None)")
            self._known(list(extraction), "extraction")
            per_store = dict(extraction)
            for name, config in per_store.items():
                if not isinstance(config, ExtractionConfig):
                    raise TypeError(
                        f"extraction[{name!r}] must be an ExtractionConfig, "
                        f"got {type(config).__name__}"
                    )
        else:
            raise TypeError(
                "extraction must be None, an ExtractionConfig or a mapping of store name to "
                f"ExtractionConfig, got {type(extraction).__name__}"
            )
        channels = []
        for name, config in per_store.items():
            store = self._by_name[name]
            if config.extractor is not None and not has_method(store, "add"):
                raise ValueError(
                    f"extraction[{name!r}] has an extractor, whose facts go to add(), but store "
                    f"{name!r} does not implement add()"
                )
            if config.extractor is None and not has_method(store, "add_messages"):
                raise ValueError(
                    f"extraction[{name!r}] has no extractor, so messages go to the store's "
                    f"add_messages(), which store {name!r} does not implement; give an extractor"
                )
            channels.append(
                ExtractionChannel(
                    store,
                    name,
                    ExtractionOutbox(
                        self._outbox_path(name, store, config),
                        _channel(name, store),
                        # An encrypted store's messages wait encrypted too (SPEC §9).
                        cipher=_store_cipher(store),
                    ),
                    extractor=config.extractor,
                    every_n_messages=config.every_n_messages,
                    on_invocation_end=config.on_invocation_end,
                    batch_size=config.batch_size,
                    entry_filter=self._filter_entry if self._filters else None,
                )
            )
        return channels

    @staticmethod
    def _outbox_path(name: str, store: object, config: ExtractionConfig) -> Path | str:
        if config.outbox is not None:
            return MEMORY_OUTBOX if config.outbox == MEMORY_OUTBOX else Path(config.outbox)
        if isinstance(store, LocalMemoryStore):
            if not isinstance(store.path, Path):
                return MEMORY_OUTBOX  # an in-memory store keeps nothing across a crash anyway
            return store.path.with_name(store.path.name + ".outbox")
        raise ValueError(
            f"extraction[{name!r}]: extraction is at least once, so buffered messages need a "
            "durable outbox: pass ExtractionConfig(outbox=PATH) (a SQLite file), or "
            "outbox=':memory:' to accept losing them in a crash"
        )

    # ------------------------------------------------------------------ plugin

    def init_agent(self, agent: Agent) -> Awaitable[None]:
        """Register the tools, the injection middleware and the extraction hooks on ``agent``.

        Returns a coroutine the agent awaits before its first model call: it runs
        each store's ``initialize()`` and restarts extraction of messages an earlier
        process left buffered.
        """
        for tool in self._tools():
            agent.tool_registry.register(tool)
        for store in self.stores:
            if has_method(store, "get_tools"):
                for tool in store.get_tools():
                    agent.tool_registry.register(tool)
        if self.injection is not None:
            config = self.injection

            async def render(context: InjectionContext) -> str | None:
                return await self._memory_context(context.messages, config)

            agent.middleware.add_middleware(
                InvokeModelStage.Input,
                injection_middleware(
                    render, config.trigger, warn_when_empty=False, label="memory injection"
                ),
            )
        if self._channels:
            agent.hooks.add_callback(MessageAddedEvent, self._on_message_added)
            agent.hooks.add_callback(AfterInvocationEvent, self._on_invocation_end)
        return self._start()

    async def _start(self) -> None:
        for store in self.stores:
            if has_method(store, "initialize"):
                await store.initialize()
        for channel in self._channels:
            if await channel.outbox.pending():
                logger.info(
                    "memory extraction for store %r: resuming messages left buffered",
                    channel.store_name,
                )
                channel.start_job()

    async def _on_message_added(self, event: MessageAddedEvent) -> None:
        message = event.message
        if self._filters:
            try:
                message = self._filters.message(message, "extraction")
            except FilterFailedError as exc:
                # No traceback: the filter's own exception (its cause) may quote the
                # message, and logs carry no message content.
                logger.error(
                    "memory extraction: a %s message is not buffered and will not be extracted: %s",
                    message.get("role"),
                    exc,
                )
                return
        for channel in self._channels:
            await channel.buffer(message)

    def _filter_entry(self, content: str) -> str:
        filtered: str = self._filters.apply("memory_entry", content, "memory")
        return filtered

    def _on_invocation_end(self, event: AfterInvocationEvent) -> None:
        for channel in self._channels:
            if channel.on_invocation_end:
                channel.start_job()

    # ------------------------------------------------------------------ search

    async def search(
        self, query: str, *, limit: int | None = None, stores: Sequence[str] | None = None
    ) -> list[MemoryEntry]:
        """Search the stores concurrently; entries are tagged with their ``store_name``.

        Each store returns at most ``limit`` entries (default 3). Results are
        interleaved by rank — every store's best, then every store's second, … — since
        scores of different stores are not comparable. A store that fails is
        skipped with a warning on the ``perdure.memory`` logger.

        Raises:
            TypeError, ValueError: a bad ``query``, ``limit`` or store name.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        if limit is None:
            limit = DEFAULT_MAX_SEARCH_RESULTS
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1 or None, got {limit!r}")
        names = self._known(stores, "stores")
        if not query.strip():
            return []
        outcomes = await asyncio.gather(
            *(self._search_store(name, query, limit) for name in names), return_exceptions=True
        )
        per_store: list[list[MemoryEntry]] = []
        for name, outcome in zip(names, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                logger.warning(
                    "memory store %r failed to search; skipping it",
                    name,
                    exc_info=(type(outcome), outcome, outcome.__traceback__),
                )
                continue
            per_store.append(outcome)
        merged: list[MemoryEntry] = []
        for rank in range(limit):
            merged.extend(entries[rank] for entries in per_store if rank < len(entries))
        return merged

    async def _search_store(self, name: str, query: str, limit: int) -> list[MemoryEntry]:
        found = await self._by_name[name].search(query, limit=limit)
        if not isinstance(found, list) or not all(isinstance(e, MemoryEntry) for e in found):
            raise TypeError(f"store {name!r} search() must return a list of MemoryEntry")
        return [dataclasses.replace(entry, store_name=name) for entry in found[:limit]]

    async def _memory_context(
        self, messages: list[Message], config: MemoryInjectionConfig
    ) -> str | None:
        query = (config.query or default_query)(messages)
        if not query or not query.strip():
            return None
        entries = await self.search(query, limit=config.max_results_per_store, stores=config.stores)
        entries = entries[: config.max_entries]
        if not entries:
            return None
        return (config.format or default_format)(entries)

    # ------------------------------------------------------------------ writing

    async def add(
        self,
        content: str,
        *,
        stores: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> list[str]:
        """Write ``content`` to the writable stores (or those named); return who took it.

        Stores are written concurrently, through ``add`` or else ``add_messages`` (as
        one user message). A store that fails is skipped with a warning.

        Raises:
            TypeError, ValueError: empty content, or a store that is unknown or not
                writable.
            FilterFailedError: a persistence filter failed; nothing was written.
            RuntimeError: every store failed.
        """
        if not isinstance(content, str):
            raise TypeError(f"content must be a str, got {type(content).__name__}")
        if not content.strip():
            raise ValueError("content must not be empty")
        names = self._writable_targets(stores, "add")
        if self._filters:
            content = self._filter_entry(content)
        outcomes = await asyncio.gather(
            *(self._add_to(name, content, metadata) for name in names), return_exceptions=True
        )
        accepted = []
        errors = []
        for name, outcome in zip(names, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                logger.warning(
                    "memory store %r failed to add a memory",
                    name,
                    exc_info=(type(outcome), outcome, outcome.__traceback__),
                )
                errors.append(f"{name}: {outcome}")
            else:
                accepted.append(name)
        if not accepted:
            raise RuntimeError("no memory store accepted the memory (" + "; ".join(errors) + ")")
        return accepted

    async def _add_to(self, name: str, content: str, metadata: dict[str, Any] | None) -> None:
        store = self._by_name[name]
        if has_method(store, "add"):
            await store.add(content, metadata=metadata)
        else:
            await store.add_messages(
                [{"role": "user", "content": [{"text": content}]}], metadata=metadata
            )

    # ------------------------------------------------------------------ tools

    def _tools(self) -> list[AgentTool]:
        tools: list[AgentTool] = []
        if self.search_tool_config is not None:
            tools.append(self._search_tool(self.search_tool_config))
        if self.add_tool_config is not None:
            tools.append(self._add_tool(self.add_tool_config))
        return tools

    def _search_tool(self, config: MemoryToolConfig) -> AgentTool:
        manager = self

        async def search_memory(query: str, limit: int | None = None) -> str:
            """Search long-term memory.

            Args:
                query: what to look for, in a few words.
                limit: at most this many memories from each store (default 3, at most 50).
            """
            if limit is not None and not 1 <= limit <= MAX_TOOL_LIMIT:
                raise ValueError(f"limit must be between 1 and {MAX_TOOL_LIMIT}, got {limit}")
            entries = await manager.search(
                query, limit=limit or config.max_results, stores=config.stores
            )
            if not entries:
                return "No matching memories."
            return default_format(entries)

        return DecoratedTool(
            search_memory, name=config.name, description=config.description or _SEARCH_DESCRIPTION
        )

    def _add_tool(self, config: MemoryAddToolConfig) -> AgentTool:
        manager = self
        targets = list(self._add_targets)

        async def add_memory(content: str) -> str:
            """Save a fact to long-term memory.

            Args:
                content: the fact, as one short self-contained sentence.
            """
            await manager.add(content, stores=targets, metadata={"source": "add_memory"})
            return "Saved to long-term memory."

        return DecoratedTool(
            add_memory, name=config.name, description=config.description or _ADD_DESCRIPTION
        )

    # ------------------------------------------------------------------ extraction

    async def flush(self, *, force: bool = False) -> None:
        """Wait until background extraction started so far has finished.

        With ``force=True``, also extract every message still buffered — those no
        trigger has reached yet — before returning. Extraction failures are logged,
        not raised: the messages stay buffered for the next trigger. Awaitable from
        any event loop and thread.
        """
        for channel in self._channels:
            if force:
                await channel.drain()
            else:
                await channel.wait()

    async def pending_extractions(self) -> int:
        """How many messages wait in the outboxes (buffered, or being extracted)."""
        counts = [await channel.outbox.pending() for channel in self._channels]
        return sum(counts)

    def close(self) -> None:
        """Close the outbox files (not the stores). Idempotent."""
        for channel in self._channels:
            channel.outbox.close()

    def __repr__(self) -> str:
        return f"MemoryManager(stores={list(self._by_name)})"


def _channel(name: str, store: object) -> str:
    namespace = getattr(store, "namespace", None)
    return f"{name}/{namespace}" if isinstance(namespace, str) and namespace else name


def _store_cipher(store: MemoryStore) -> Cipher | None:
    """The cipher an encrypted memory store was given (``store.cipher``), if any."""
    cipher = getattr(store, "cipher", None)
    return cipher if isinstance(cipher, Cipher) else None
