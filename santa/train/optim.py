"""The optimizer of every training loop, built in one place from ``train.optimizer``.

``adamw`` (santa's default): decoupled weight decay ``train.weight_decay`` (Loshchilov &
Hutter). ``adam``: Adam as the SANTA paper names it (section 4, "We use Adam optimizer"),
with ``train.weight_decay`` as a coupled L2 penalty; the paper recipes set it to 0, which is
also what SANTA's released code trains with (Hugging Face ``Trainer``'s AdamW at its default
weight decay 0, the same update as Adam). Betas (0.9, 0.999) and eps 1e-8 are torch's
defaults for both, and Hugging Face's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from santa.config import OPTIMIZERS, TrainConfig

__all__ = ["OPTIMIZERS", "build_optimizer"]


def build_optimizer(
    parameters: Iterable[torch.nn.Parameter],
    train_config: TrainConfig,
    *,
    fused: bool = False,
    learning_rate: float | None = None,
) -> torch.optim.Optimizer:
    """The ``train.optimizer`` over ``parameters`` at ``learning_rate`` (default: the config's).

    ``fused`` asks for torch's one-kernel CUDA implementation (GPU training only); otherwise
    torch picks its default (``foreach``). ``learning_rate`` lets a second model of the same
    run (SCodeR's discriminators) train at its own rate.
    """
    options = {
        "lr": train_config.learning_rate if learning_rate is None else learning_rate,
        "weight_decay": train_config.weight_decay,
        "fused": True if fused else None,
    }
    if train_config.optimizer == "adam":
        return torch.optim.Adam(parameters, **options)
    if train_config.optimizer == "adamw":
        return torch.optim.AdamW(parameters, **options)
    raise ValueError(f"train.optimizer must be one of {OPTIMIZERS}, got {train_config.optimizer!r}")
