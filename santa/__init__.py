"""santa: structure-aware dense retrievers (SANTA) for code and product search, trained on Ray.

``import santa`` stays cheap: torch, transformers and pyarrow load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from santa.config import ModelConfig
    from santa.models.dual_encoder import DualEncoder

__all__ = ["load"]


def load(source: Any, model_config: ModelConfig | None = None) -> DualEncoder:
    """Load a trained :class:`~santa.models.dual_encoder.DualEncoder` from wherever it is stored.

    ``source`` is a local path or ``s3://`` URI of a Hugging Face model folder, a santa
    checkpoint (a Ray Train checkpoint folder holding ``model/``), a Ray Train run folder
    (its newest complete checkpoint), a Tune sweep root with ``best.json`` (its best
    checkpoint), or a ``ray.train.Checkpoint``; or a Hugging Face hub name. S3 credentials
    come from the standard AWS chain, the endpoint from ``AWS_ENDPOINT_URL``.

    Raises :class:`santa.models.checkpoints.CheckpointError` (a ``santa.files.storage.StorageError``)
    when nothing complete is found or storage cannot be reached.
    """
    from santa.models.checkpoints import load as load_model

    return load_model(source, model_config)
