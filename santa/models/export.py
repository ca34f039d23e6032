"""Export a resolved checkpoint as a local folder: the Hugging Face files, optionally
sentence-transformers' module files, and the model card, renamed into place whole."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from santa.models import checkpoints
from santa.models.card import Evaluation, write_model_card

__all__ = ["export_model", "plain_weights"]


def plain_weights(folder: Path) -> bool:
    """Rewrite a model folder whose weights are LoRA adapters (:mod:`santa.models.lora`) or
    a sharded checkpoint (:mod:`santa.models.sharded`) as plain weights, the adapters merged
    in (``W + α/r·BA``), so it loads without peft or santa; True when it did."""
    from santa.models import lora, sharded

    if not (lora.is_adapter_folder(folder) or sharded.is_sharded_folder(folder)):
        return False
    from santa.config import SantaConfig
    from santa.files.layout import SANTA_CONFIG_FILE
    from santa.models.dual_encoder import DualEncoder

    model = DualEncoder.from_pretrained(str(folder)).merge_adapters()
    saved = folder / SANTA_CONFIG_FILE
    payload = json.loads(saved.read_text()) if saved.is_file() else {}
    santa_config = SantaConfig.from_dict(payload) if "train" in payload else None
    merged = folder.parent / f"{folder.name}.merged"
    model.save_pretrained(str(merged), santa_config=santa_config)
    shutil.rmtree(folder)
    os.rename(merged, folder)
    return True


def export_model(
    resolved: checkpoints.ResolvedModel,
    to: str,
    *,
    overwrite: bool = False,
    sentence_transformers: bool = False,
    evaluation: Evaluation | None = None,
    dim: int | None = None,
) -> tuple[Path, dict[str, Any] | None]:
    """Download into a hidden folder beside ``to``, merge LoRA adapters and sharded weights
    into plain weights, add the sentence-transformers files (with ``sentence_transformers``;
    ``dim``: its ``truncate_dim``) and the model card, rename into place. Returns the folder
    and what sentence-transformers files were written (None without)."""
    from santa.models.st_export import write_sentence_transformers_files

    if dim is not None and not sentence_transformers:
        raise checkpoints.CheckpointError(
            "--dim is a sentence-transformers folder's truncate_dim: export with "
            "--format sentence-transformers"
        )
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
        plain_weights(folder)
        written = (
            write_sentence_transformers_files(folder, truncate_dim=dim)
            if sentence_transformers
            else None
        )
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
