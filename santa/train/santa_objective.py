"""SANTA's objective for the one worker loop: SDA / DR over the global batch, plus MEP.

One forward per step through the DDP-wrapped :class:`~santa.models.dual_encoder.DualEncoder`;
the contrastive loss sees the global batch through ``all_gather_with_grad``. Hard negatives
(a mined table or the asynchronous miner, :mod:`santa.negatives.miner`) are added to the
batch between steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from santa.files.layout import checkpoint_model
from santa.method.duplicates import document_keys
from santa.method.losses import contrastive_loss, matryoshka_contrastive_loss, total_loss
from santa.models.dual_encoder import DualEncoder
from santa.train.grad_cache import ChunkForward, chunk_inputs, ddp_no_sync, grad_cache_backward
from santa.train.objective import Objective

__all__ = [
    "BATCH_KEYS",
    "DualEncoderObjective",
    "SantaObjective",
    "compute_losses",
    "embeddings_of",
    "hard_negative_batch",
    "placeholder_negatives",
    "santa_grad_cache_step",
    "sda_loss",
    "to_device",
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


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` on ``device`` without stopping the host: to a GPU from pinned memory with
    ``non_blocking`` (a copy from pageable memory waits for every kernel queued before it)."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def to_tensors(arrays: dict[str, Any], device) -> dict[str, torch.Tensor]:
    """The model inputs of a batch (numpy arrays, or tensors the reader pinned already) as
    long tensors on ``device`` (id strings stay)."""
    return {
        key: to_device(torch.as_tensor(value, dtype=torch.long), device)
        for key, value in arrays.items()
        if key in BATCH_KEYS
    }


def hard_negative_batch(model: DualEncoder, texts: list[str], max_length: int, device):
    """Tokenize hard-negative documents (``batch * n`` texts, query-major) for the model,
    as the training input tokenizes documents (fixed length, the backbone's own rules)."""
    encoded = model.tokenize(texts, max_length, padding="max_length", role="document")
    return {
        "hard_negative_input_ids": to_device(encoded["input_ids"], device),
        "hard_negative_attention_mask": to_device(encoded["attention_mask"], device),
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


def embeddings_of(output, use_hard_negatives: bool = True) -> dict[str, torch.Tensor]:
    """The embeddings a forward gave, by role: ``query`` ``(batch, dim)``, ``doc``
    ``(batch, dim)`` and, when scored, ``hard`` ``(batch * n, dim)``."""
    embeddings = {"query": output.query_embeddings, "doc": output.doc_embeddings}
    if output.hard_negative_embeddings is not None and use_hard_negatives:
        embeddings["hard"] = output.hard_negative_embeddings
    return embeddings


def sda_loss(
    embeddings: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], config, gather
) -> torch.Tensor:
    """L_SDA (pretraining) or the DR loss (fine-tuning) of the global batch from its
    embeddings (:func:`embeddings_of`): the one definition the plain step and GradCache's
    share; duplicates masked by the batch's ``doc_keys`` / ``hard_negative_keys``; over
    nested prefixes of the embeddings with ``train.matryoshka_dims``."""
    options = {
        "gather": gather,
        "similarity": config.model.similarity,
        "temperature": config.model.temperature,
        "doc_keys": batch.get("doc_keys"),
        "hard_negative_keys": batch.get("hard_negative_keys"),
    }
    embedded = (embeddings["query"], embeddings["doc"], embeddings.get("hard"))
    if config.train.matryoshka_dims:
        return matryoshka_contrastive_loss(
            *embedded,
            dims=config.train.matryoshka_dims,
            weights=config.train.matryoshka_weights or None,
            **options,
        )
    return contrastive_loss(*embedded, **options)


def global_mep(
    mep: torch.Tensor | None, labels: torch.Tensor | None, model: DualEncoder, config, share
) -> torch.Tensor | None:
    """This rank's MEP mean as its part of the global batch's mean (``share``:
    :func:`santa.method.distributed.share_of_global_mean`): the ranks' target tokens differ
    in number, so DDP's average of their means would not be the batch's mean."""
    if mep is None or labels is None:
        return mep
    return mep * share(model.mep_token_count(labels, config.train.mep_reduction))


def compute_losses(
    ddp_model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    config,
    gather,
    use_hard_negatives: bool = True,
    *,
    model: DualEncoder | None = None,
    share=None,
) -> dict[str, torch.Tensor]:
    """One forward through the (DDP-wrapped) model and the SDA/DR + MEP losses
    (``use_hard_negatives=False``: the batch's hard negatives are encoded, not scored).
    With several ranks, ``model`` (the plain model) and ``share`` make MEP the global
    batch's token mean (:func:`global_mep`)."""
    inputs = {BATCH_KEYS[key]: value for key, value in batch.items() if key in BATCH_KEYS}
    output = ddp_model(**inputs, mep_reduction=config.train.mep_reduction)
    sda = sda_loss(embeddings_of(output, use_hard_negatives), batch, config, gather)
    mep = output.mep_loss
    if share is not None and model is not None:
        mep = global_mep(mep, inputs.get("mep_labels"), model, config, share)
    loss = total_loss(sda, mep, config.train.mep_weight, config.train.sda_weight)
    mep = mep if mep is not None else torch.zeros((), device=sda.device)
    return {"loss": loss, "loss_sda": sda, "loss_mep": mep}


def santa_grad_cache_step(
    forward_model: torch.nn.Module,
    model: DualEncoder,
    batch: dict[str, torch.Tensor],
    config,
    gather,
    *,
    chunk_size: int,
    autocast: contextlib.AbstractContextManager | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    use_hard_negatives: bool = True,
    share=None,
) -> dict[str, torch.Tensor]:
    """:func:`compute_losses` and its backward, by GradCache (:mod:`santa.train.grad_cache`).

    The worker's batch is embedded in chunks of ``chunk_size`` pairs (a query, its
    document, its masked document and MEP target, its ``n`` hard negatives); the SDA/DR
    loss is that of the whole global batch, and MEP is computed in the re-run chunks, each
    weighted by its share of the batch's target tokens so that the sum is the batch's MEP.
    Gradients land in the parameters (accumulated: zero them first); returns the losses,
    detached, with the keys of :func:`compute_losses`.

    ``forward_model`` is what runs a chunk (DDP-wrapped, maybe compiled), ``model`` the
    plain :class:`DualEncoder` under it; ``no_sync`` defaults to ``forward_model``'s when it
    is a DDP module.
    """
    train = config.train
    inputs = {BATCH_KEYS[key]: value for key, value in batch.items() if key in BATCH_KEYS}
    rows = inputs["query_input_ids"].shape[0]
    hard = inputs.get("hard_negative_input_ids")
    per_query = 0 if hard is None else hard.shape[0] // rows
    labels = inputs.get("mep_labels")
    reduction = train.mep_reduction
    batch_tokens = None if labels is None else model.mep_token_count(labels, reduction).clamp(min=1)
    # Several ranks: each chunk's part of the global batch's mean, not of this rank's.
    rank_share = 1.0 if labels is None or share is None else share(batch_tokens)
    # Hard negatives are query-major: a chunk of queries owns a block of them.
    chunks = chunk_inputs(inputs, rows, chunk_size, grouped="hard_negative", per_row=per_query)

    def forward(chunk: dict[str, torch.Tensor]) -> ChunkForward:
        output = forward_model(**chunk, mep_reduction=reduction)
        embeddings = embeddings_of(output, use_hard_negatives)
        if output.mep_loss is None:
            return ChunkForward(embeddings)
        # The chunk's mean (over its target tokens, or its documents), as a part of the
        # batch's mean.
        part = model.mep_token_count(chunk["mep_labels"], reduction) / batch_tokens
        mep = output.mep_loss * part * rank_share
        loss = total_loss(None, mep, train.mep_weight) if train.mep_weight else None
        return ChunkForward(embeddings, loss=loss, metrics={"loss_mep": mep})

    seen: dict[str, torch.Tensor] = {}

    def loss_from_embeddings(embeddings: dict[str, torch.Tensor]) -> torch.Tensor:
        sda = sda_loss(embeddings, batch, config, gather)
        seen["sda"] = sda.detach()
        return total_loss(sda, None, train.mep_weight, train.sda_weight)

    device = inputs["query_input_ids"].device
    weighted_sda, sums = grad_cache_backward(
        chunks,
        forward,
        loss_from_embeddings,
        device=device,
        autocast=autocast,
        no_sync=no_sync or ddp_no_sync(forward_model),
    )
    mep = sums.get("loss_mep", torch.zeros((), device=device))
    return {"loss": weighted_sda + sums.get("loss", 0.0), "loss_sda": seen["sda"], "loss_mep": mep}


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

    def setup(self, context) -> None:
        self.negatives = _negatives_client(self.loop, context.rank, context.world_size)
        self.table = None
        if self.negatives is not None and self.negatives.is_async:
            self.negatives.maybe_send_weights(context.state["step"], context.model, force=True)
            if self.config.negatives.wait_for_first:
                self.negatives.wait_for_first()

    def batch_tensors(self, context, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The step's tensors: the model inputs, hard negatives, the duplicate keys."""
        config, negatives = self.config, self.negatives
        # Everything is made on the host first and copied without waiting for the device
        # (the duplicate keys hash host tokens: hashing device tokens would read the GPU).
        host = {key: value for key, value in batch.items() if key in BATCH_KEYS}
        self.table = None
        hard_ids: list[str] = []
        if negatives is not None:
            negatives.poll()  # non-blocking: swaps in a newer table if the miner has one
            self.table = negatives.agreed_table(context.device, context.state["step"])
            if self.table is not None:
                # The batch's training rows name their queries (the reader adds them).
                docs = negatives.negatives_of_rows(
                    self.table, np.asarray(batch["row"]), context.state["step"]
                )
                texts = negatives.texts_of(self.table, docs)
                if config.train.mask_duplicates:
                    hard_ids = negatives.ids_of(self.table, docs)
                host.update(
                    hard_negative_batch(
                        context.model, texts, config.train.max_document_length, "cpu"
                    )
                )
        keys = {}
        if config.train.mask_duplicates:
            keys = _duplicate_keys(context.model, batch, host, hard_ids)
        tensors = to_tensors(host, context.device)
        tensors.update({key: to_device(value, context.device) for key, value in keys.items()})
        if negatives is not None and self.table is None:
            # No table yet: the same shapes, left out of the loss.
            tensors.update(placeholder_negatives(tensors, negatives.n))
        return tensors

    def losses(self, context, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        tensors = self.batch_tensors(context, batch)
        return compute_losses(
            context.forward_model,
            tensors,
            self.config,
            context.gather,
            use_hard_negatives=self.table is not None,
            model=context.model,
            share=context.global_share if context.world_size > 1 else None,
        )

    def forward_backward(self, context, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        chunk_size = self.config.train.grad_cache_chunk_size
        if not chunk_size:
            return super().forward_backward(context, batch)
        tensors = self.batch_tensors(context, batch)
        return santa_grad_cache_step(
            context.forward_model,
            context.model,
            tensors,
            self.config,
            context.gather,
            chunk_size=chunk_size,
            autocast=context.autocast,
            no_sync=ddp_no_sync(context.ddp_model),
            use_hard_negatives=self.table is not None,
            share=context.global_share if context.world_size > 1 else None,
        )

    def after_step(self, context) -> None:
        if self.negatives is not None:
            self.negatives.maybe_send_weights(context.state["step"], context.model)

    def report_metrics(self, context) -> dict[str, float]:
        if self.negatives is None:
            return {}
        return self.negatives.metrics(context.state["step"], self.table)

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


def _duplicate_keys(
    model: DualEncoder,
    batch: dict[str, Any],
    tensors: dict[str, Any],
    hard_ids: list[str],
) -> dict[str, torch.Tensor]:
    """Each document's keys (id, embedded tokens) for the loss's duplicate mask, on the
    host (``tensors``: the batch's token ids in host memory)."""
    rows = len(tensors["query_input_ids"])
    doc_ids = batch["doc_id"] if "doc_id" in batch else [""] * rows
    # The tokens the document's embedding comes from: the masked document in single-pass
    # MEP, the document otherwise (see DualEncoder.forward).
    single_pass = "labels" in tensors and not model.embed_unmasked_document
    embedded = tensors["masked_input_ids" if single_pass else "document_input_ids"]
    keys = {"doc_keys": document_keys(doc_ids, embedded)}
    if hard_ids:
        keys["hard_negative_keys"] = document_keys(hard_ids, tensors["hard_negative_input_ids"])
    return keys


def _negatives_client(loop, rank: int, world: int):
    """The worker's hard-negatives client, or None when training with in-batch negatives."""
    negatives = loop.santa.negatives
    if negatives.source == "none":
        return None
    from santa.negatives.client import NegativesClient

    return NegativesClient(
        negatives.source,
        data_uri=loop.data_uri,
        n=negatives.per_query,
        seed=loop.santa.train.seed,
        rank=rank,
        world_size=world,
        miner_name=loop.miner_name,
        refresh_every=negatives.refresh_every,
        row_cache=loop.row_cache,
    )
