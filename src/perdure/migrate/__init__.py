"""Migration into perdure from other frameworks' persisted sessions.

- :mod:`~perdure.migrate.strands` — migration from the Strands Agents SDK's
  ``FileSessionManager`` layout (``perdure migrate strands``).
- :mod:`~perdure.migrate.copy` — sessions and their checkpoints from any perdure
  store to any other, verified (``perdure copy``).
"""
