"""Migration into perdure from other frameworks' persisted sessions.

- :mod:`~perdure.migrate.strands` — migration from the Strands Agents SDK's
  ``FileSessionManager`` layout (``perdure migrate strands``).
"""
