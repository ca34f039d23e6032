"""A whole run's config (:class:`SantaConfig`): the sections, stored and read back, and the command line's dotted overrides."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from santa.config.common import (
    SECTIONS,
    fail,
)
from santa.config.model import ModelConfig
from santa.config.negatives import MOVED_FROM_SCODER, MOVED_TO_NEGATIVES, NegativesConfig
from santa.config.scoder import ScoderConfig
from santa.config.train import TrainConfig


class MepWithoutDecoder(ValueError):
    """MEP asked of a backbone without a decoder: the jobs add the recipes that train it."""


@dataclass(frozen=True, kw_only=True)
class SantaConfig:
    """A whole run's config: the model and how to train it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Backbone, pooling and similarity."""

    train: TrainConfig = field(default_factory=TrainConfig)
    """Stage, optimisation, batch and loss weights."""

    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    """Hard negatives: their source, mining and the miner's encoder pool."""

    scoder: ScoderConfig = field(default_factory=ScoderConfig)
    """SCodeR's soft-labeled training (``ray_jobs.scoder`` only)."""

    def __post_init__(self) -> None:
        if self.model.kind != "t5" and self.train.uses_mep:
            raise MepWithoutDecoder(
                f"MEP (train.mep_weight={self.train.mep_weight}) needs a T5 backbone "
                f"(model.kind='t5'), not kind={self.model.kind!r}: encoder-only backbones "
                "train with the SDA/DR loss only; set train.mep_weight=0"
            )
        if (
            self.train.uses_mep
            and self.negatives.source != "none"
            and not self.model.embed_unmasked_document
        ):
            # Single-pass MEP embeds positives from the *masked* document (sentinels inside)
            # while mined hard negatives are plain text: the model could tell them apart by
            # the sentinels alone. With hard negatives, positives are embedded unmasked too
            # (a second pass gives the MEP loss), so both sides of the softmax look alike.
            model = dataclasses.replace(self.model, embed_unmasked_document=True)
            object.__setattr__(self, "model", model)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"model": {...}, "train": {...}, "negatives": {...}, "scoder": {...}}``."""
        return {
            "model": self.model.to_dict(),
            "train": self.train.to_dict(),
            "negatives": self.negatives.to_dict(),
            "scoder": self.scoder.to_dict(),
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SantaConfig:
        """Build from a dict made by :meth:`to_dict`; unknown keys are an error."""
        unknown = set(values) - set(SECTIONS)
        if unknown:
            fail(f"unknown SantaConfig keys {sorted(unknown)}; expected {', '.join(SECTIONS)}")
        train = dict(values.get("train", {}))
        negatives = dict(values.get("negatives", {}))
        scoder = dict(values.get("scoder", {}))
        for old, new in MOVED_TO_NEGATIVES.items():  # a config stored by an older santa
            if old in train:
                negatives.setdefault(new, train.pop(old))
        for old, new in MOVED_FROM_SCODER.items():
            if old in scoder:
                negatives.setdefault(new, scoder.pop(old))
        return cls(
            model=ModelConfig.from_dict(values.get("model", {})),
            train=TrainConfig.from_dict(train),
            negatives=NegativesConfig.from_dict(negatives),
            # Checkpoints from before SCodeR have no such section.
            scoder=ScoderConfig.from_dict(scoder),
        )

    def with_overrides(self, overrides: Iterable[str]) -> SantaConfig:
        """Return a copy with dotted ``section.field=value`` overrides applied and validated.

        Values are parsed by the field's type: ``true``/``false`` for booleans, ``none``
        for optional fields, numbers in any Python form (``1e-4``, ``128``).
        """
        changes: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for override in overrides:
            key, separator, raw_value = override.partition("=")
            section, dot, name = key.strip().partition(".")
            if not separator or not dot:
                fail(f"override {override!r} must look like 'train.learning_rate=1e-4'")
            if section not in changes:
                fail(f"override {override!r}: section must be one of {', '.join(SECTIONS)}")
            if section == "train" and name in MOVED_TO_NEGATIVES:
                fail(
                    f"override {override!r}: train.{name} is now negatives."
                    f"{MOVED_TO_NEGATIVES[name]} (--set negatives.{MOVED_TO_NEGATIVES[name]}=...)"
                )
            if section == "scoder" and name in MOVED_FROM_SCODER:
                fail(
                    f"override {override!r}: scoder.{name} is now negatives."
                    f"{MOVED_FROM_SCODER[name]} (--set negatives.{MOVED_FROM_SCODER[name]}=...)"
                )
            section_class = type(getattr(self, section))
            types_by_name = typing.get_type_hints(section_class)
            field_names = [f.name for f in dataclasses.fields(section_class)]
            if name not in field_names:
                fail(f"override {override!r}: unknown field; {section} has {field_names}")
            changes[section][name] = _parse_value(raw_value.strip(), types_by_name[name], key)
        return SantaConfig(
            model=dataclasses.replace(self.model, **changes["model"]),
            train=dataclasses.replace(self.train, **changes["train"]),
            negatives=dataclasses.replace(self.negatives, **changes["negatives"]),
            scoder=dataclasses.replace(self.scoder, **changes["scoder"]),
        )


def _parse_value(raw: str, annotation: Any, key: str) -> Any:
    """Parse an override's text as ``annotation`` (bool, int, float, str or Optional)."""
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    if type(None) in options:
        if raw.lower() in ("none", "null"):
            return None
        options = tuple(option for option in options if option is not type(None))
    (value_type,) = options
    if value_type is bool:
        lowered = raw.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        fail(f"override {key}={raw!r}: expected true or false")
    if value_type in (int, float):
        try:
            return value_type(raw)
        except ValueError:
            fail(f"override {key}={raw!r}: expected {value_type.__name__}")
    return raw


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)
