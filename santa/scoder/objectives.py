"""SCodeR's two objectives for the one worker loop: the discriminators (Eq. 6-7) and the
soft-labeled dual encoder (Eq. 8-10).

Both read listwise examples (:mod:`santa.scoder.examples`) as raw rows and tokenize them in
the worker: a discriminator reads each ``[x; y]`` pair, the dual encoder the query and every
candidate apart. The dual encoder takes the discriminators' scores over ``{x⁺} ∪ X⁻`` as
soft labels, either from a ``scores`` column precomputed offline
(:mod:`santa.scoder.soft_labels`) or by running the discriminators in the worker without
gradient (``online``).

The loop itself (optimizer, schedule, DDP, compile, autocast, resume, metrics,
checkpoints) is :mod:`santa.train.loop`, shared with SANTA's objective.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pyarrow as pa
import torch

from santa.config import SantaConfig
from santa.method.losses import matryoshka_loss
from santa.method.scoder_losses import (
    adversarial_loss,
    discriminator_loss,
    distillation_loss,
    soft_labeled_loss,
)
from santa.models.dual_encoder import DualEncoder
from santa.scoder.discriminator import DiscriminatorPair
from santa.train.grad_cache import ChunkForward, chunk_inputs, ddp_no_sync, grad_cache_backward
from santa.train.objective import Objective
from santa.train.santa_objective import DualEncoderObjective, to_device

__all__ = [
    "DISCRIMINATORS_DIR",
    "DiscriminatorObjective",
    "SoftLabelObjective",
    "listwise_entropy",
    "own_candidate_scores",
    "pair_length",
    "soft_label_grad_cache_step",
    "soft_label_losses",
]

DISCRIMINATORS_DIR = "discriminators"  # inside a discriminator-stage checkpoint


def listwise_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over each row's candidates: ``(batch,)`` (nats)."""
    log_p = torch.log_softmax(scores.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def own_candidate_scores(every: torch.Tensor, width: int) -> torch.Tensor:
    """Each query's scores against its own candidates: ``(batch, batch * width)`` scores of
    every query against all candidates (query-major, ``width`` each) → ``(batch, width)``."""
    batch = every.shape[0]
    if every.shape[1] != batch * width:
        raise ValueError(f"expected {batch} × {width} candidates, got {every.shape[1]}")
    rows = torch.arange(batch, device=every.device)
    return every.reshape(batch, batch, width)[rows, rows]


def pair_length(config: SantaConfig) -> int:
    """Tokens of a discriminator's ``[x; y]`` input."""
    return config.scoder.max_pair_length or (
        config.train.max_query_length + config.train.max_document_length
    )


def _rows(batch: pa.Table | dict) -> dict[str, list]:
    """A batch of listwise rows as lists per column."""
    return batch.to_pydict() if isinstance(batch, pa.Table) else batch


class DiscriminatorObjective(Objective):
    """Eq. 6-7 for D_φ (text–code rows) and D_ψ (code–code rows) in one DDP module."""

    tag = "discriminators"

    def learning_rate(self) -> float:
        return self.config.scoder.discriminator_learning_rate

    def build_model(self) -> DiscriminatorPair:
        pair = DiscriminatorPair.from_pretrained(self.loop.init_model)
        config = self.config
        if (
            config.scoder.discriminator_gradient_checkpointing
            or config.model.gradient_checkpointing
        ):
            pair.gradient_checkpointing_enable()
        return pair

    def find_unused_parameters(self, model) -> bool:
        return True  # a batch may hold rows of one kind only: the other model gets no grad

    def losses(self, context, batch) -> dict[str, torch.Tensor | float]:
        rows = _rows(batch)
        pair: DiscriminatorPair = context.model
        train = self.config.train
        inputs: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}
        for kind, model in pair.by_kind.items():
            index = [i for i, k in enumerate(rows["kind"]) if k == kind]
            if not index:
                continue
            width = len(rows["candidates"][index[0]])
            encoded = model.tokenize_pairs(
                [rows["query"][i] for i in index for _ in range(width)],
                [text for i in index for text in rows["candidates"][i]],
                max_first=train.max_query_length,
                max_length=pair_length(self.config),
            )
            for key in ("input_ids", "attention_mask"):
                value = to_device(encoded[key], context.device)
                inputs[f"{kind}_{key}"] = value.reshape(len(index), width, -1)
            counts[kind] = len(index)
        unknown = set(rows["kind"]) - set(pair.by_kind)
        if unknown:
            raise ValueError(f"examples of kind {sorted(unknown)} but no discriminator for it")
        scores = context.forward_model(**inputs)  # {kind: (rows of kind, 1 + n)}
        total = sum(counts.values())
        loss = sum(discriminator_loss(s) * (counts[k] / total) for k, s in scores.items())
        correct = sum((s.argmax(dim=1) == 0).sum() for s in scores.values())  # on the device
        return {"loss": loss, "accuracy": correct / total}

    def save_model(self, directory: str, model: DiscriminatorPair) -> None:
        model.save_pretrained(os.path.join(directory, DISCRIMINATORS_DIR))

    def load_model(self, directory: str, model: DiscriminatorPair) -> None:
        restored = DiscriminatorPair.from_pretrained(os.path.join(directory, DISCRIMINATORS_DIR))
        model.load_state_dict(restored.state_dict())


class SoftLabelObjective(DualEncoderObjective):
    """Eq. 8-10: ``λ·L_adv + (1 − λ)·L_distill`` against the discriminators' soft labels."""

    tag = "dual_encoder"

    def find_unused_parameters(self, model: DualEncoder) -> bool:
        # No MEP here: a T5's untied LM head gets no gradient (see SantaObjective).
        tied = getattr(model.backbone.config, "tie_word_embeddings", True)
        return model.is_t5 and not tied

    def setup(self, context) -> None:
        self.teacher = None
        if self.config.scoder.soft_labels == "online":
            teacher = DiscriminatorPair.from_pretrained(self.loop.discriminators).eval()
            teacher.requires_grad_(False)
            self.teacher = teacher.to(context.device)

    def soft_labels(self, rows: dict[str, list], device) -> torch.Tensor:
        """The discriminators' scores ``(batch, 1 + n)``: read, or computed without grad."""
        if self.teacher is None:
            if any(score is None for score in rows.get("scores", [None])):
                raise ValueError("offline soft labels need a 'scores' column (soft_labels.py)")
            return to_device(torch.tensor(rows["scores"], dtype=torch.float32), device)
        width = len(rows["candidates"][0])
        scores = torch.empty(len(rows["query"]), width, device=device)
        with torch.no_grad():  # a constant for G_θ (no_grad: the result enters the loss)
            for kind, model in self.teacher.by_kind.items():
                index = [i for i, k in enumerate(rows["kind"]) if k == kind]
                if index:
                    scores[index] = model.score_lists(
                        [rows["query"][i] for i in index],
                        [rows["candidates"][i] for i in index],
                        max_first=self.config.train.max_query_length,
                        max_length=pair_length(self.config),
                    ).float()
        return scores

    def inputs(self, context, rows: dict[str, list]) -> dict[str, torch.Tensor]:
        """The model inputs of a batch: its queries and, query-major, every candidate."""
        train = self.config.train
        model: DualEncoder = context.model
        encoded_queries = model.tokenize(
            rows["query"], train.max_query_length, "max_length", role="query"
        )
        encoded_documents = model.tokenize(
            [text for row in rows["candidates"] for text in row],
            train.max_document_length,
            "max_length",
            role="document",
        )
        device = context.device
        return {
            "query_input_ids": to_device(encoded_queries["input_ids"], device),
            "query_attention_mask": to_device(encoded_queries["attention_mask"], device),
            "document_input_ids": to_device(encoded_documents["input_ids"], device),
            "document_attention_mask": to_device(encoded_documents["attention_mask"], device),
        }

    def losses(self, context, batch) -> dict[str, torch.Tensor | float]:
        rows = _rows(batch)
        teacher = self.soft_labels(rows, context.device)  # (batch, 1 + n)
        output = context.forward_model(**self.inputs(context, rows))
        return soft_label_losses(
            context.model,
            output.query_embeddings,
            output.doc_embeddings,
            teacher,
            self.config.scoder.adversarial_weight,
            matryoshka_dims=self.config.train.matryoshka_dims,
            matryoshka_weights=self.config.train.matryoshka_weights,
        )

    def forward_backward(self, context, batch) -> dict[str, torch.Tensor | float]:
        chunk_size = self.config.train.grad_cache_chunk_size
        if not chunk_size:
            return super().forward_backward(context, batch)
        rows = _rows(batch)
        teacher = self.soft_labels(rows, context.device)  # (batch, 1 + n)
        return soft_label_grad_cache_step(
            context.forward_model,
            context.model,
            self.inputs(context, rows),
            teacher,
            self.config.scoder.adversarial_weight,
            chunk_size=chunk_size,
            autocast=context.autocast,
            no_sync=ddp_no_sync(context.ddp_model),
            matryoshka_dims=self.config.train.matryoshka_dims,
            matryoshka_weights=self.config.train.matryoshka_weights,
        )


def soft_label_losses(
    model: DualEncoder,
    query_embeddings: torch.Tensor,
    candidate_embeddings: torch.Tensor,
    teacher: torch.Tensor,
    adversarial_weight: float,
    *,
    matryoshka_dims: Sequence[int] = (),
    matryoshka_weights: Sequence[float] = (),
) -> dict[str, torch.Tensor | float]:
    """Eq. 10 from the embeddings of the queries ``(batch, dim)`` and of their candidates
    ``(batch * (1 + n), dim)``, query-major (summed over nested prefixes with
    ``matryoshka_dims``, :func:`santa.method.losses.matryoshka_loss`); ``loss`` and the logged figures (detached
    tensors: the loop reads them once per logged window, not at every step)."""
    width = teacher.shape[1]
    every = model.similarity(query_embeddings, candidate_embeddings)
    scores = own_candidate_scores(every, width)  # (batch, 1 + n)
    loss = soft_labeled_loss(scores, teacher, adversarial_weight=adversarial_weight)
    if matryoshka_dims:
        # Eq. 10 on nested prefixes of the embeddings (the logged figures: full width).
        loss = matryoshka_loss(
            lambda queries, candidates: soft_labeled_loss(
                own_candidate_scores(model.similarity(queries, candidates), width),
                teacher,
                adversarial_weight=adversarial_weight,
            ),
            (query_embeddings, candidate_embeddings),
            matryoshka_dims,
            matryoshka_weights or None,
        )
    with torch.no_grad():
        return {
            "loss": loss,
            "loss_adv": adversarial_loss(scores, teacher).detach(),
            "loss_distill": distillation_loss(scores, teacher).detach(),
            "soft_label_entropy": listwise_entropy(teacher).mean().detach(),
            "accuracy": (scores.argmax(dim=1) == 0).float().mean(),
        }


def soft_label_grad_cache_step(
    forward_model: torch.nn.Module,
    model: DualEncoder,
    inputs: dict[str, torch.Tensor],
    teacher: torch.Tensor,
    adversarial_weight: float,
    *,
    chunk_size: int,
    autocast=None,
    no_sync=None,
    matryoshka_dims: Sequence[int] = (),
    matryoshka_weights: Sequence[float] = (),
) -> dict[str, torch.Tensor | float]:
    """:func:`soft_label_losses` and its backward by GradCache (:mod:`santa.train.grad_cache`):
    chunks of ``chunk_size`` examples (a query and its ``1 + n`` candidates)."""
    rows, width = teacher.shape
    chunks = chunk_inputs(inputs, rows, chunk_size, grouped="document", per_row=width)

    def forward(chunk: dict[str, torch.Tensor]) -> ChunkForward:
        output = forward_model(**chunk)
        return ChunkForward({"query": output.query_embeddings, "doc": output.doc_embeddings})

    figures: dict[str, torch.Tensor | float] = {}

    def loss_from_embeddings(embeddings: dict[str, torch.Tensor]) -> torch.Tensor:
        figures.update(
            soft_label_losses(
                model,
                embeddings["query"],
                embeddings["doc"],
                teacher,
                adversarial_weight,
                matryoshka_dims=matryoshka_dims,
                matryoshka_weights=matryoshka_weights,
            )
        )
        return figures["loss"]

    loss, _ = grad_cache_backward(
        chunks,
        forward,
        loss_from_embeddings,
        device=teacher.device,
        autocast=autocast,
        no_sync=no_sync or ddp_no_sync(forward_model),
    )
    return {**figures, "loss": loss}
