"""Export a resolved checkpoint as a local folder: the Hugging Face files, optionally
sentence-transformers' module files, and the model card, renamed into place whole."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from santa.models import checkpoints
from santa.models.card import Evaluation, write_model_card

__all__ = ["export_model"]


def export_model(
    resolved: checkpoints.ResolvedModel,
    to: str,
    *,
    overwrite: bool = False,
    sentence_transformers: bool = False,
    evaluation: Evaluation | None = None,
) -> tuple[Path, dict[str, Any] | None]:
    """Download into a hidden folder beside ``to``, add the sentence-transformers files
    (with ``sentence_transformers``) and the model card, rename into place. Returns the
    folder and what sentence-transformers files were written (None without)."""
    from santa.search.st_export import write_sentence_transformers_files

    if "://" in to:
        raise checkpoints.CheckpointError(f"the destination must be a local folder, not {to}")
    target = Path(os.path.abspath(os.path.expanduser(to)))
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not overwrite:
        raise checkpoints.CheckpointError(
            f"{target} already exists and is not empty (pass --overwrite)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        folder = checkpoints.download(resolved, staging / "model")
        written = write_sentence_transformers_files(folder) if sentence_transformers else None
        write_model_card(
            folder,
            model_uri=resolved.model_uri,
            checkpoint_uri=resolved.checkpoint_uri,
            step=resolved.step,
            sentence_transformers=sentence_transformers,
            evaluation=evaluation,
            name=target.name,
            location=to,
        )
        checkpoints.move_into_place(folder, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, written
