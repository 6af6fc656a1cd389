"""Migration into perdure from other frameworks' persisted sessions.

- :mod:`~perdure.migrate.strands` — migration from the Strands Agents SDK's
  ``FileSessionManager`` layout (``perdure migrate strands``).
- :mod:`~perdure.migrate.openai_agents` — migration from the OpenAI Agents SDK's
  ``SQLiteSession`` database (``perdure migrate openai-agents``), and the mapping of
  the SDK's items to perdure messages that ``PerdureSession`` stores.
- :mod:`~perdure.migrate.langgraph` — migration from LangGraph's ``SqliteSaver``
  database into a checkpoint saver (``perdure migrate langgraph``).
- :mod:`~perdure.migrate.report` — what the migrations share: statuses, counts, a
  read-only SQLite source.
- :mod:`~perdure.migrate.copy` — sessions and their checkpoints from any perdure
  store to any other, verified (``perdure copy``).
"""
