"""A FastAPI service that serves an agent, one persistent session per user.

Each request builds the user's agent from the store with ``await Agent.create(...)``
(no blocking I/O on the event loop), answers with ``await agent.invoke_async(...)``
and lets the session commit every message as it is added: any instance of the
service, or this one after a restart, picks the conversation up where it was. Two
requests of one user at once do not interleave: the second gets HTTP 409
(``session_locked``), never a forked history.

Run (``pip install fastapi uvicorn``; the scripted model needs no key)::

    PERDURE_STORE=sqlite:./chat.db uvicorn examples.fastapi_app:app
    curl -X POST localhost:8000/users/ana/messages -H 'content-type: application/json' \\
         -d '{"text": "hello"}'
    curl localhost:8000/users/ana/messages

By default a scripted model answers ``You said: …``; ``PERDURE_MODEL=openai:gpt-4o-mini``
(with ``OPENAI_API_KEY``) puts a real model behind it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from perdure import Agent
from perdure.errors import PerdureError
from perdure.models import Model, ScriptedModel, from_string
from perdure.session import Session, SessionStore, open_store, read_history_page

STATUS_BY_CODE = {
    "session_not_found": 404,
    "session_locked": 409,
    "session_conflict": 409,
    "turn_running": 409,
    "session_store_corrupted": 500,
}
USER_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class Prompt(BaseModel):
    text: str = Field(min_length=1, max_length=10_000)


def echo_model() -> Model:
    """A scripted model for one request: it repeats the user's last words."""

    def answer(messages: list[dict[str, Any]]) -> str:
        return f"You said: {messages[-1]['content'][-1]['text']}"

    return ScriptedModel([answer])


def create_app(store: SessionStore, new_model: Callable[[], Model] = echo_model) -> FastAPI:
    """The service over ``store``; ``new_model()`` gives each request its model."""
    app = FastAPI(title="perdure chat")

    def session_id(user: str) -> str:
        if not USER_ID.fullmatch(user):
            raise HTTPException(422, "user ids are 1-64 letters, digits, '_', '.' or '-'")
        return f"user-{user}"

    def http_error(error: PerdureError) -> HTTPException:
        return HTTPException(STATUS_BY_CODE.get(error.code, 500), f"{error.code}: {error}")

    @app.post("/users/{user}/messages")
    async def post_message(user: str, prompt: Prompt) -> dict[str, object]:
        try:
            agent = await Agent.create(
                model=new_model(), session_manager=Session(store, session_id(user))
            )
            result = await agent.invoke_async(prompt.text)
        except PerdureError as error:
            raise http_error(error) from error
        return {"reply": str(result), "messages": len(agent.messages)}

    @app.get("/users/{user}/messages")
    async def history(user: str, offset: int = 0, limit: int = 50) -> dict[str, object]:
        try:
            page = await read_history_page(store, session_id(user), offset=offset, limit=limit)
        except PerdureError as error:
            raise http_error(error) from error
        return {"total": page.total, "next_offset": page.next_offset, "messages": page.messages}

    return app


_SPEC = os.environ.get("PERDURE_MODEL")
app = create_app(
    open_store(os.environ.get("PERDURE_STORE", "sqlite:./perdure-chat.db")),
    (lambda: from_string(_SPEC)) if _SPEC else echo_model,
)
