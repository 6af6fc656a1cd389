"""HookRegistry: typed callbacks on agent events; HookProvider: a bundle of them."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

from perdure.hooks.events import HookEvent

E = TypeVar("E", bound=HookEvent)
HookCallback: TypeAlias = Callable[[Any], Awaitable[None] | None]


@runtime_checkable
class HookProvider(Protocol):
    """An object that registers its callbacks on an agent's registry."""

    def register_hooks(self, registry: HookRegistry) -> None:
        """Add callbacks with ``registry.add_callback(EventType, callback)``."""
        ...


class HookRegistry:
    """Callbacks per event type; sync or async callbacks, run one after another.

    A callback registered for a base class also receives its subclasses' events.
    ``After*`` events (``should_reverse_callbacks``) run callbacks in reverse order.
    A callback that raises stops the dispatch and the error propagates: a failing hook
    (a session that cannot write, say) must not be silently ignored.
    """

    def __init__(self) -> None:
        self._callbacks: list[tuple[type[HookEvent], HookCallback]] = []

    def add_callback(self, event_type: type[E], callback: Callable[[E], Any]) -> None:
        """Call ``callback(event)`` for every event of ``event_type`` (or a subclass).

        Raises:
            TypeError: ``event_type`` is not a HookEvent class or ``callback`` is not
                callable.
        """
        if not (isinstance(event_type, type) and issubclass(event_type, HookEvent)):
            raise TypeError(f"event_type must be a HookEvent subclass, got {event_type!r}")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        self._callbacks.append((event_type, callback))

    def add_hook(self, provider: HookProvider) -> None:
        """Let ``provider`` register its callbacks.

        Raises:
            TypeError: ``provider`` has no ``register_hooks`` method.
        """
        register = getattr(provider, "register_hooks", None)
        if not callable(register):
            raise TypeError(f"hook provider {provider!r} has no register_hooks(registry) method")
        register(self)

    def callbacks_for(self, event: HookEvent) -> list[HookCallback]:
        """The callbacks ``event`` would run, in the order they would run."""
        matching = [cb for event_type, cb in self._callbacks if isinstance(event, event_type)]
        if event.should_reverse_callbacks:
            matching.reverse()
        return matching

    def has_callbacks(self, event_type: type[HookEvent]) -> bool:
        """True when some callback listens to ``event_type`` or one of its bases."""
        return any(issubclass(event_type, registered) for registered, _ in self._callbacks)

    def has_async_callbacks(self, event_type: type[HookEvent]) -> bool:
        """True when a callback for ``event_type`` is a coroutine function."""
        return any(
            issubclass(event_type, registered) and _is_async(cb)
            for registered, cb in self._callbacks
        )

    async def invoke(self, event: E) -> E:
        """Run every callback for ``event`` (awaiting async ones); return the event."""
        for callback in self.callbacks_for(event):
            outcome = callback(event)
            if inspect.isawaitable(outcome):
                await outcome
        return event

    def invoke_sync(self, event: E) -> E:
        """Run the callbacks of ``event`` without a loop.

        Raises:
            RuntimeError: a callback returned an awaitable (it needs :meth:`invoke`).
        """
        for callback in self.callbacks_for(event):
            outcome = callback(event)
            if inspect.isawaitable(outcome):
                close = getattr(outcome, "close", None)
                if callable(close):
                    close()
                raise RuntimeError(
                    f"hook {callback!r} for {type(event).__name__} is async; "
                    "it must be dispatched with `await registry.invoke(event)`"
                )
        return event


def _is_async(callback: HookCallback) -> bool:
    target = getattr(callback, "__call__", None)  # noqa: B004 - callable objects
    return inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(target)
