"""perdure underneath other agent frameworks (SPEC §10).

- :mod:`perdure.adapters.openai_agents` — :class:`PerdureSession`, the OpenAI Agents
  SDK's ``Session`` protocol on any perdure session store (``perdure[openai-agents]``).
- :mod:`perdure.adapters.langgraph` — :class:`PerdureSaver`, LangGraph's checkpointer
  (``BaseCheckpointSaver``) on any perdure storage (``perdure[langgraph]``).

Importing this package imports no framework: each adapter module imports its own SDK.
"""
