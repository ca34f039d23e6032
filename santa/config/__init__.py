"""Config as code: frozen dataclasses, validated on construction (recipes: santa.config.recipes).

Configs travel through Ray as plain dicts (:meth:`SantaConfig.to_dict` /
:meth:`SantaConfig.from_dict`); the command line picks a recipe and changes a few fields
with dotted overrides (:meth:`SantaConfig.with_overrides`)::

    config = get_recipe("tiny").with_overrides(["train.learning_rate=1e-4"])

The sections live apart (:mod:`santa.config.model`, ``train``, ``negatives``, ``scoder``,
and :mod:`santa.config.run` for the whole); import them from here.
"""

from santa.config.common import (
    COMPILE_MODES,
    COMPILE_SCOPES,
    DECODER_POOLINGS,
    DISTRIBUTED_BACKENDS,
    ENCODER_POOLINGS,
    EPOCH_UNITS,
    MEP_REDUCTIONS,
    MODEL_KINDS,
    NEGATIVE_INDEXES,
    OPTIMIZERS,
    PADDING_SIDES,
    PROJECTION_ACTIVATIONS,
    SECTIONS,
    SHUFFLES,
    SIMILARITIES,
    SOFT_LABEL_MODES,
    STAGES,
    STRATEGIES,
    T5_POOLINGS,
    TINY_BACKBONE,
)
from santa.config.model import ModelConfig
from santa.config.negatives import MOVED_FROM_SCODER, MOVED_TO_NEGATIVES, NegativesConfig
from santa.config.run import SantaConfig
from santa.config.scoder import ScoderConfig
from santa.config.train import TrainConfig

__all__ = [
    "COMPILE_MODES",
    "COMPILE_SCOPES",
    "DECODER_POOLINGS",
    "DISTRIBUTED_BACKENDS",
    "ENCODER_POOLINGS",
    "EPOCH_UNITS",
    "MEP_REDUCTIONS",
    "MODEL_KINDS",
    "MOVED_FROM_SCODER",
    "MOVED_TO_NEGATIVES",
    "ModelConfig",
    "NEGATIVE_INDEXES",
    "NegativesConfig",
    "OPTIMIZERS",
    "PADDING_SIDES",
    "PROJECTION_ACTIVATIONS",
    "SECTIONS",
    "SHUFFLES",
    "SIMILARITIES",
    "SOFT_LABEL_MODES",
    "STAGES",
    "STRATEGIES",
    "SantaConfig",
    "ScoderConfig",
    "T5_POOLINGS",
    "TINY_BACKBONE",
    "TrainConfig",
]
