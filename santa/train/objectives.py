"""SANTA's objective for the one worker loop: SDA / DR over the global batch, plus MEP.

One forward per step through the DDP-wrapped :class:`~santa.models.dual_encoder.DualEncoder`;
the contrastive loss sees the global batch through ``all_gather_with_grad``. Hard negatives
(a mined table or the asynchronous miner, :mod:`santa.negatives.miner`) are added to the
batch between steps.
"""

from __future__ import annotations

import numpy as np
import torch

from santa.method.losses import contrastive_loss, total_loss
from santa.models.dual_encoder import DualEncoder
from santa.runtime.layout import checkpoint_model
from santa.train.loop import Objective

__all__ = [
    "BATCH_KEYS",
    "DualEncoderObjective",
    "SantaObjective",
    "compute_losses",
    "hard_negative_batch",
    "placeholder_negatives",
    "to_tensors",
]

BATCH_KEYS = {
    "hard_negative_input_ids": "hard_negative_input_ids",
    "hard_negative_attention_mask": "hard_negative_attention_mask",
    "query_input_ids": "query_input_ids",
    "query_attention_mask": "query_attention_mask",
    "document_input_ids": "document_input_ids",
    "document_attention_mask": "document_attention_mask",
    "masked_input_ids": "masked_document_input_ids",
    "masked_attention_mask": "masked_document_attention_mask",
    "labels": "mep_labels",
}


def to_tensors(arrays: dict[str, np.ndarray], device) -> dict[str, torch.Tensor]:
    """The model inputs of a numpy batch as long tensors on ``device`` (id strings stay)."""
    return {
        key: torch.as_tensor(value, dtype=torch.long).to(device)
        for key, value in arrays.items()
        if key in BATCH_KEYS
    }


def hard_negative_batch(model: DualEncoder, texts: list[str], max_length: int, device):
    """Tokenize hard-negative documents (``batch * n`` texts, query-major) for the model,
    as the training input tokenizes documents (fixed length, the backbone's own rules)."""
    encoded = model.tokenize(texts, max_length, padding="max_length")
    return {
        "hard_negative_input_ids": encoded["input_ids"].to(device),
        "hard_negative_attention_mask": encoded["attention_mask"].to(device),
    }


def placeholder_negatives(tensors: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """``n`` stand-in hard negatives per query, ``(batch * n, length)``: the batch's own
    documents, shifted by one row.

    Before the asynchronous miner's first table, the step still encodes ``n`` documents per
    query, so the compiled forward sees the shapes of every later step and never recompiles
    when the table arrives; the loss leaves them out (``use_hard_negatives=False``).
    """
    key = "document_input_ids" if "document_input_ids" in tensors else "masked_input_ids"
    ids = tensors[key]  # (batch, length)
    mask = tensors[key.replace("input_ids", "attention_mask")]
    return {
        "hard_negative_input_ids": torch.roll(ids, 1, 0).repeat_interleave(n, 0),
        "hard_negative_attention_mask": torch.roll(mask, 1, 0).repeat_interleave(n, 0),
    }


def compute_losses(
    ddp_model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    config,
    gather,
    use_hard_negatives: bool = True,
) -> dict[str, torch.Tensor]:
    """One forward through the (DDP-wrapped) model and the SDA/DR + MEP losses
    (``use_hard_negatives=False``: the batch's hard negatives are encoded, not scored)."""
    inputs = {BATCH_KEYS[key]: value for key, value in batch.items() if key in BATCH_KEYS}
    output = ddp_model(**inputs)
    sda = contrastive_loss(
        output.query_embeddings,
        output.doc_embeddings,
        output.hard_negative_embeddings if use_hard_negatives else None,
        gather=gather,
        similarity=config.model.similarity,
        temperature=config.model.temperature,
    )
    loss = total_loss(sda, output.mep_loss, config.train.mep_weight, config.train.sda_weight)
    mep = output.mep_loss if output.mep_loss is not None else torch.zeros(())
    return {"loss": loss, "loss_sda": sda, "loss_mep": mep}


class DualEncoderObjective(Objective):
    """What every objective that trains the dual encoder shares: its model, evaluated on the
    dev set, saved as an HF folder with the santa config in ``model/``."""

    def build_model(self) -> DualEncoder:
        model = DualEncoder.from_pretrained(self.loop.init_model, self.config.model)
        if self.config.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        return model

    def evaluates(self) -> bool:
        return True

    def save_model(self, directory: str, model: DualEncoder) -> None:
        model.save_pretrained(checkpoint_model(directory), santa_config=self.config)

    def load_model(self, directory: str, model: DualEncoder) -> None:
        restored = DualEncoder.from_pretrained(checkpoint_model(directory))
        model.load_state_dict(restored.state_dict())


class SantaObjective(DualEncoderObjective):
    """``sda_weight·L_SDA + mep_weight·L_MEP`` (pretraining) or the DR loss (fine-tuning),
    with in-batch and optional hard negatives."""

    tag = "train"

    def find_unused_parameters(self, model: DualEncoder) -> bool:
        # A T5 trained without MEP leaves an untied LM head (T5 v1.1) without gradient: DDP
        # must be told, or it waits for it. A tied head is the input embedding, and
        # encoder-only models use every parameter (their pooler is removed).
        tied = getattr(model.backbone.config, "tie_word_embeddings", True)
        return model.is_t5 and not self.config.train.uses_mep and not tied

    def setup(self, trainer) -> None:
        self.negatives = _negatives_client(self.loop, trainer.rank, trainer.world_size)
        self.table = None
        if self.negatives is not None and self.negatives.is_async:
            self.negatives.maybe_send_weights(trainer.state["step"], trainer.model, force=True)
            if self.config.negatives.wait_for_first:
                self.negatives.wait_for_first()

    def losses(self, trainer, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        config, negatives = self.config, self.negatives
        tensors = to_tensors(batch, trainer.device)
        self.table = None
        if negatives is not None:
            negatives.poll()  # non-blocking: swaps in a newer table if the miner has one
            self.table = negatives.agreed_table(trainer.device)
            if self.table is not None:
                texts = negatives.negatives_for(
                    self.table, batch["query_id"], batch["doc_id"], trainer.state["step"]
                )
                tensors.update(
                    hard_negative_batch(
                        trainer.model, texts, config.train.max_document_length, trainer.device
                    )
                )
            else:  # no table yet: the same shapes, left out of the loss
                tensors.update(placeholder_negatives(tensors, negatives.n))
        return compute_losses(
            trainer.forward_model,
            tensors,
            config,
            trainer.gather,
            use_hard_negatives=self.table is not None,
        )

    def after_step(self, trainer) -> None:
        if self.negatives is not None:
            self.negatives.maybe_send_weights(trainer.state["step"], trainer.model)

    def report_metrics(self, trainer) -> dict[str, float]:
        if self.negatives is None:
            return {}
        return self.negatives.metrics(trainer.state["step"], self.table)

    def progress_line(self, metrics: dict[str, float], steps: int) -> str:
        line = (
            f"[train] step {int(metrics['step'])}/{steps} loss {metrics['loss']:.4f} "
            f"(sda {metrics['loss_sda']:.4f}, mep {metrics['loss_mep']:.4f}) "
            f"{metrics['pairs_per_s']:.1f} pairs/s lr {metrics['learning_rate']:.2e}"
        )
        if "dev_mrr" in metrics:
            line += f" dev_mrr {metrics['dev_mrr']:.4f}"
        if "negatives_step" in metrics:
            line += f" negatives@{int(metrics['negatives_step'])}"
        return line


def _negatives_client(loop, rank: int, world: int):
    """The worker's hard-negatives client, or None when training with in-batch negatives."""
    negatives = loop.santa.negatives
    if negatives.source == "none":
        return None
    from santa.negatives.miner import NegativesClient

    return NegativesClient(
        negatives.source,
        data_uri=loop.data_uri,
        n=negatives.per_query,
        seed=loop.santa.train.seed,
        rank=rank,
        world_size=world,
        miner_name=loop.miner_name,
        refresh_every=negatives.refresh_every,
    )
