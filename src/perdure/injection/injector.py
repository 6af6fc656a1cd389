"""Ephemeral injection: text folded into one model request, never into the history.

:func:`injection_middleware` builds the ``InvokeModelStage.Input`` middleware that
does the work; :class:`ContextInjector` is the plugin that registers one on an
agent. Everything that can fail — the trigger predicate, the render callback —
fails open: a warning on the ``perdure`` logger, no injection, and the model call
goes on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from perdure.hooks import InvokeModelContext, InvokeModelStage
from perdure.injection.fold import fold_into_last_user_message, is_user_turn
from perdure.state import AgentState
from perdure.types import Message

if TYPE_CHECKING:
    from perdure.agent import Agent

__all__ = [
    "TRIGGERS",
    "ContextInjector",
    "InjectionContext",
    "RenderCallback",
    "Trigger",
    "check_trigger",
    "injection_middleware",
]

logger = logging.getLogger("perdure.injection")


@dataclass(frozen=True)
class InjectionContext:
    """What a render callback or trigger predicate sees for one model call.

    Attributes:
        messages: the request's messages (a copy: changing them changes nothing).
        state: the agent's :class:`~perdure.state.AgentState`.
        agent: the agent making the call.
    """

    messages: list[Message]
    state: AgentState
    agent: Agent


RenderCallback: TypeAlias = Callable[[InjectionContext], "str | Awaitable[str | None] | None"]
"""Returns the text to inject for one call, or ``None``/``""`` for none; may be async."""

Trigger: TypeAlias = Literal["user_turn", "every_turn"] | Callable[[InjectionContext], bool]
"""When to inject: ``"user_turn"``, ``"every_turn"`` or a predicate."""

TRIGGERS = ("user_turn", "every_turn")


def check_trigger(trigger: object, argument: str = "trigger") -> None:
    """Check that ``trigger`` is ``"user_turn"``, ``"every_turn"`` or a callable.

    Raises:
        ValueError: an unknown trigger string (the message names ``argument``).
        TypeError: neither a str nor a callable.
    """
    if isinstance(trigger, str):
        if trigger not in TRIGGERS:
            raise ValueError(
                f"{argument} must be 'user_turn', 'every_turn' or a predicate, got {trigger!r}"
            )
        return
    if not callable(trigger):
        raise TypeError(
            f"{argument} must be 'user_turn', 'every_turn' or a predicate, "
            f"got {type(trigger).__name__}"
        )


def _should_inject(trigger: Trigger, context: InjectionContext) -> bool:
    if trigger == "every_turn":
        return True
    if trigger == "user_turn":
        return is_user_turn(context.messages)
    try:
        return bool(trigger(context))
    except Exception:
        logger.warning(
            "injection trigger %r raised; skipping injection for this model call",
            trigger,
            exc_info=True,
        )
        return False


def injection_middleware(
    render: RenderCallback,
    trigger: Trigger = "user_turn",
    *,
    warn_when_empty: bool = True,
    label: str = "injection",
) -> Callable[[InvokeModelContext], Awaitable[None]]:
    """Build an ``InvokeModelStage.Input`` middleware that folds ``render``'s text in.

    On each model call: if ``trigger`` says so, ``render`` is called (awaited when it
    returns an awaitable) and its text folded into the request's last user message
    with :func:`~perdure.injection.fold_into_last_user_message`. Only the request
    changes; the agent's history never does.

    Fails open: a trigger predicate or render callback that raises, or a render that
    returns ``None``, ``""`` or a non-str, means no injection and a warning on the
    ``perdure.injection`` logger (for ``None``/``""`` only when
    ``warn_when_empty``); the model call goes on.

    Raises:
        TypeError: ``render`` is not callable.
        ValueError: an unknown trigger string.
    """
    if not callable(render):
        raise TypeError(f"render must be callable, got {type(render).__name__}")
    check_trigger(trigger)

    async def middleware(call: InvokeModelContext) -> None:
        context = InjectionContext(messages=call.messages, state=call.agent.state, agent=call.agent)
        if not _should_inject(trigger, context):
            return
        try:
            outcome: Any = render(context)
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except Exception:
            logger.warning(
                "%s render callback raised; skipping injection for this model call",
                label,
                exc_info=True,
            )
            return
        if outcome is None or outcome == "":
            if warn_when_empty:
                logger.warning("%s render callback returned %r; nothing injected", label, outcome)
            return
        if not isinstance(outcome, str):
            logger.warning(
                "%s render callback returned a %s, not a str; nothing injected",
                label,
                type(outcome).__name__,
            )
            return
        new_messages, tail = fold_into_last_user_message(call.messages, outcome)
        if tail == 0:
            logger.warning(
                "%s: the request does not end with a user message; nothing injected", label
            )
            return
        call.messages = new_messages

    return middleware


class ContextInjector:
    """A plugin that injects just-in-time text into model requests, ephemerally.

    ``render(InjectionContext(messages, state, agent))`` returns the text for one
    model call (or ``None``); it may be a coroutine function. The text is folded
    into that request's last user message only: ``agent.messages``, snapshots and
    every session store stay byte-for-byte unchanged.

    Example::

        clock = ContextInjector(lambda ctx: f"<now>{datetime.now():%H:%M}</now>")
        agent = Agent(model=model, plugins=[clock])

    Args:
        render: the callback producing the text.
        trigger: ``"user_turn"`` (default: only when the request ends with a fresh
            user prompt), ``"every_turn"`` (every model call, tool turns included)
            or a predicate ``(InjectionContext) -> bool``; a predicate that raises
            means no injection.
        name: the plugin name.

    Raises:
        TypeError: ``render`` is not callable, or ``trigger`` is neither a str nor
            callable, or ``name`` is not a str.
        ValueError: an unknown trigger string.
    """

    def __init__(
        self,
        render: RenderCallback,
        trigger: Trigger = "user_turn",
        *,
        name: str = "perdure:context-injector",
    ) -> None:
        if not callable(render):
            raise TypeError(f"render must be callable, got {type(render).__name__}")
        check_trigger(trigger)
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        self.render = render
        self.trigger: Trigger = trigger
        self.name = name

    def init_agent(self, agent: Agent) -> None:
        """Register the injection middleware on ``agent``."""
        agent.middleware.add_middleware(
            InvokeModelStage.Input,
            injection_middleware(self.render, self.trigger, label=self.name),
        )

    def __repr__(self) -> str:
        return f"ContextInjector({self.render!r}, trigger={self.trigger!r})"
