"""What the one training loop (:mod:`santa.train.loop`) trains: an *objective* builds its
model, turns a batch into losses, and saves and loads its model; the loop does the rest.
Objectives are registered by name in :data:`santa.train.loop_config.OBJECTIVES`."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from santa.config import SantaConfig
from santa.train.loop_config import LoopConfig, objective_entry

__all__ = ["Objective", "StepContext", "objective_class"]


@dataclass
class StepContext:
    """What an objective's step reads of the loop that runs it (and nothing more): its
    models, device, collectives, precision and counters."""

    model: torch.nn.Module
    """The plain model (what checkpoints save, what tokenizes)."""
    forward_model: torch.nn.Module
    """What runs a forward: DDP's module, maybe compiled."""
    ddp_model: torch.nn.Module
    """DDP's module (``no_sync`` for GradCache), or the model on one process."""
    device: torch.device
    gather: Callable[[torch.Tensor], tuple[torch.Tensor, int]]
    """``santa.method.distributed.all_gather_with_grad`` on several ranks, else identity."""
    global_share: Callable[[torch.Tensor], torch.Tensor]
    """``santa.method.distributed.share_of_global_mean``."""
    autocast: contextlib.AbstractContextManager
    state: dict[str, Any]
    """The loop's counters (``step``, ``epoch``, ...), read only."""
    rank: int
    world_size: int


class Objective:
    """What one kind of training adds to the loop. Subclasses override the parts they need.

    The loop calls, in order: :meth:`build_model` (before DDP), :meth:`setup` (after DDP),
    then per step :meth:`losses` (inside autocast; the ``loss``
    entry is back-propagated, every entry is averaged into the logged window) and
    :meth:`after_step`; at reports :meth:`report_metrics` and :meth:`progress_line`; at
    checkpoints :meth:`save_model` / :meth:`load_model`. :meth:`forward_backward` runs
    :meth:`losses` and its backward; an objective replaces it to chunk the step (GradCache).
    :meth:`build_model`, :meth:`losses`, :meth:`save_model` and :meth:`load_model` have no
    default and raise ``NotImplementedError``: every registered objective gives its own
    (``tests/test_objective_registry.py`` checks). The step's parts take a
    :class:`StepContext` (``context``): what the step needs of the loop, not the loop.
    """

    tag = "train"
    """The progress lines' tag (``[train] step ...``)."""

    def __init__(self, loop: LoopConfig) -> None:
        self.loop = loop
        self.config: SantaConfig = loop.santa

    def learning_rate(self) -> float:
        """The peak learning rate of the optimizer."""
        return self.config.train.learning_rate

    def build_model(self) -> torch.nn.Module:
        """The module to train, on CPU (the loop moves and wraps it)."""
        raise NotImplementedError

    def find_unused_parameters(self, model: torch.nn.Module) -> bool:
        """Whether some parameters get no gradient (DDP must be told; the search costs)."""
        return False

    def setup(self, context: StepContext) -> None:
        """After the model is wrapped: anything that needs the device or the rank."""

    def losses(self, context: StepContext, batch: Any) -> dict[str, torch.Tensor | float]:
        """One batch's forward: ``{"loss": tensor to back-propagate, other metrics...}``."""
        raise NotImplementedError

    def forward_backward(self, context: StepContext, batch: Any) -> dict[str, torch.Tensor | float]:
        """One batch's gradients, accumulated into the (zeroed) parameters; returns
        :meth:`losses`' entries. By default :meth:`losses` under autocast, then backward;
        GradCache (``train.grad_cache_chunk_size``) runs its own chunked forward/backward."""
        with context.autocast:
            losses = self.losses(context, batch)
        losses["loss"].backward()
        return losses

    def after_step(self, context: StepContext) -> None:
        """After the optimizer step (the step counter already advanced)."""

    def report_metrics(self, context: StepContext) -> dict[str, float]:
        """Extra metrics of a report (e.g. hard negatives')."""
        return {}

    def progress_line(self, metrics: dict[str, float], steps: int) -> str:
        """One line of progress for the job's log (rank 0, every report)."""
        line = f"[{self.tag}] step {int(metrics['step'])}/{steps} loss {metrics['loss']:.4f}"
        for key in ("accuracy", "soft_label_entropy", "dev_mrr"):
            if key in metrics:
                line += f" {key} {metrics[key]:.4f}"
        return line

    def save_model(self, directory: str, model: torch.nn.Module) -> None:
        """Write the model into a checkpoint folder."""
        raise NotImplementedError

    def load_model(self, directory: str, model: torch.nn.Module) -> None:
        """Load the weights :meth:`save_model` wrote into ``model``."""
        raise NotImplementedError

    def evaluates(self) -> bool:
        """Whether dev metrics can be computed for this objective's model."""
        return False

    def close(self) -> None:
        """Release what :meth:`setup` took."""


def objective_class(name: str) -> type[Objective]:
    """The objective class registered under ``name`` in ``santa.train.loop_config.OBJECTIVES``."""
    module_name, _, class_name = objective_entry(name).objective.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
