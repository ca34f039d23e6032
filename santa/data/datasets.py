"""The datasets santa preprocesses: one entry each, and the one dispatch to them.

Each :class:`Dataset` says what the data is, which stages it has (``pretrain`` /
``finetune`` pairs, ``eval`` BEIR folders), the library function that preprocesses it and
what the job checks before Ray starts. ``ray_jobs.preprocess --dataset NAME`` (its choices
are this registry's names), :class:`~santa.config.preprocess.PreprocessConfig` and
:func:`run_preprocess` (Python callers) all dispatch through it.

Adding a dataset: write a module in ``santa/data/`` with ``preprocess(config) -> report``
(read ``config.input``, write ``config.output`` published whole with
:func:`santa.files.outputs.staged_output`, return the report), then add one line to
:data:`DATASETS`. Functions are named ``"module:function"`` and imported when used, so this
registry imports none of them (the command line's ``--help`` starts no Ray, no torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DATASETS", "Dataset", "check_inputs", "dataset", "run_preprocess"]

# The Ray Data plan of santa's raw datasets (santa.data.plan) and its checks.
PLAN = "santa.data.plan:run_plan"
PLAN_CHECK = "santa.data.plan:check_inputs"
ALL_STAGES = ("pretrain", "finetune", "eval")


@dataclass(frozen=True)
class Dataset:
    """One dataset of the registry."""

    name: str
    """``--dataset NAME``, ``PreprocessConfig.dataset``."""
    about: str
    """What it is, in a few words (the job's ``--help``)."""
    stages: tuple[str, ...]
    """The stages it has; the first is the default (``--stage`` left out)."""
    run: str
    """``module:function``: ``(config) -> report``, the output published whole."""
    check: str = ""
    """``module:function``: ``(config) -> None``, the inputs checked before Ray starts."""
    uses_ray: bool = True
    """Whether ``run`` needs a Ray cluster (the job starts or joins one first)."""
    asst: bool = False
    """Code pairs: ``--asst`` may add SCodeR's ASST code–code pairs beside them."""
    default_input: str = ""
    """``module:function``: ``() -> URI`` when ``--input`` may be left out."""
    summary: str = "santa.data.accounting:format_text"
    """``module:function``: ``(report) -> str``, what the job prints."""

    def function(self, field: str) -> Callable[..., Any]:
        """The function one of the ``module:function`` fields names."""
        module, _, name = getattr(self, field).partition(":")
        return getattr(importlib.import_module(module), name)


DATASETS: dict[str, Dataset] = {
    entry.name: entry
    for entry in (
        Dataset("codesearchnet", "CodeSearchNet JSON lines (6 languages)", ALL_STAGES, PLAN,
                PLAN_CHECK, asst=True),
        Dataset("advtest", "CodeXGLUE AdvTest (Python; normalized names)", ALL_STAGES, PLAN,
                PLAN_CHECK, asst=True),
        Dataset("esci", "Amazon ESCI shopping queries (Parquet)", ALL_STAGES, PLAN, PLAN_CHECK),
        Dataset("source", "a source tree (default: this Python's standard library)",
                ALL_STAGES, PLAN, PLAN_CHECK, asst=True,
                default_input="santa.data.source:default_source_root"),
        Dataset("cosqa", "CoSQA's labelled web queries → a BEIR retrieval set", ("eval",),
                "santa.data.cosqa:preprocess", uses_ray=False, summary="json:dumps"),
        Dataset("pairs", "your own {query, positive, negatives?} JSON lines → training pairs",
                ("finetune", "pretrain"), "santa.data.pairs:preprocess",
                summary="santa.data.pairs:format_pairs_report"),
    )
}  # fmt: skip


def dataset(name: str) -> Dataset:
    """The registry's entry ``name``; a ``ValueError`` naming the known ones otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"dataset must be one of {tuple(DATASETS)}, not {name!r}") from None


def check_inputs(config) -> None:
    """The checks ``config.dataset`` makes of its input before any Ray work (one line)."""
    entry = dataset(config.dataset)
    if entry.check:
        entry.function("check")(config)


def run_preprocess(config) -> dict[str, Any]:
    """Preprocess ``config`` (a :class:`~santa.config.preprocess.PreprocessConfig` of
    any dataset of the registry) on the current Ray cluster where it needs one; the output
    is published whole (an interrupted or failed run leaves the previous output as it was).
    Returns the report."""
    return dataset(config.dataset).function("run")(config)
