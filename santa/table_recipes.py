"""Recipes that reproduce a table of the papers, each setting with where it comes from.

Each :class:`TableRecipe` names the table and row it reproduces and the stage chain that
produced the row; every setting it makes is a :class:`Setting` that says its source:

- ``paper``: stated in the paper (the section is given);
- ``SANTA code``: not in the paper, taken from SANTA's released scripts
  (github.com/OpenMatch/SANTA, ``shell/*.sh``; its trainer is Hugging Face's ``Trainer``,
  whose defaults fill in what the scripts leave out);
- ``santa``: the paper and the scripts leave it open; santa's choice, with the reason.

Settings not listed keep :class:`~santa.config.TrainConfig`'s defaults, which do not change
what is computed (logging, checkpoint cadence, compile) or are santa's
(``seed``). Run a family with ``ray_jobs.pipeline --recipe NAME --stages <its chain>``;
``stage_recipe`` refuses a stage outside the chain, so a forgotten ``--stages`` cannot
silently train another recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from santa.config import ModelConfig, NegativesConfig, SantaConfig, TrainConfig

__all__ = ["CODE", "PAPER", "SANTA", "TABLE_RECIPES", "Setting", "TableRecipe"]

PAPER = "paper"
CODE = "SANTA code"
SANTA = "santa"
SOURCES = (PAPER, CODE, SANTA)


@dataclass(frozen=True)
class Setting:
    """One setting of a recipe: its value, its source and where that source says it."""

    value: Any
    source: str
    """``paper``, ``SANTA code`` or ``santa`` (the module doc)."""
    where: str
    """The paper's section/table, the script and its flag, or santa's reason."""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Setting.source must be one of {SOURCES}, got {self.source!r}")


def paper(value: Any, where: str) -> Setting:
    """A setting the paper states (``where``: its section or table)."""
    return Setting(value, PAPER, where)


def code(value: Any, where: str) -> Setting:
    """A setting from SANTA's released scripts (``where``: the script and flag)."""
    return Setting(value, CODE, where)


def santa(value: Any, why: str) -> Setting:
    """A setting the paper and the scripts leave open: santa's choice and why."""
    return Setting(value, SANTA, why)


@dataclass(frozen=True)
class TableRecipe:
    """A family of stage recipes reproducing one table row of a paper."""

    name: str
    """The pretraining recipe's name; later stages are ``<name>-<stage>``."""
    reproduces: str
    """Paper, table and row (or column) the family reproduces."""
    chain: tuple[str, ...]
    """The stages that produced the row, in order (``pretrain``, ``finetune``, ``ance``)."""
    stages: Mapping[str, Mapping[str, Setting]]
    """stage → ``{"section.field": Setting}``."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What the recipe cannot pin down (data preparation, differences from SANTA's code)."""

    def config(self, stage: str) -> SantaConfig:
        """The stage's :class:`SantaConfig` (settings applied to the dataclass defaults)."""
        if stage not in self.stages:
            raise ValueError(
                f"{self.name} reproduces {self.reproduces}, whose chain is "
                f"{','.join(self.chain)} (no {stage!r} stage): pass --stages {','.join(self.chain)}"
            )
        sections: dict[str, dict[str, Any]] = {"model": {}, "train": {}, "negatives": {}}
        for key, setting in self.stages[stage].items():
            section, _, name = key.partition(".")
            sections[section][name] = setting.value
        return SantaConfig(
            model=ModelConfig(**sections["model"]),
            train=TrainConfig(**sections["train"]),
            negatives=NegativesConfig(**sections["negatives"]),
        )

    def settings(self, stage: str, source: str | None = None) -> dict[str, Setting]:
        """The stage's settings, or those of one ``source``."""
        return {
            key: setting
            for key, setting in self.stages[stage].items()
            if source is None or setting.source == source
        }


# ----------------------------------------------------------------------------- shared

# SANTA section 4: "We use Adam optimizer ... set the warmup proportion to 0.1".
_ADAM = paper("adam", "SANTA §4 (Adam)")
# Adam has no weight decay of its own; SANTA's Trainer (Hugging Face) runs at weight
# decay 0 and clips gradients at norm 1.0 unless told otherwise, and the scripts never say.
_NO_DECAY = code(0.0, "Hugging Face Trainer default weight_decay=0.0 (not set in shell/*.sh)")
_CLIP = code(1.0, "Hugging Face Trainer default max_grad_norm=1.0 (not set in shell/*.sh)")
_WARMUP = paper(0.1, "SANTA §4 and A.4 (warm-up proportion 0.1)")
# Eq. 2: "sim is the dot product"; no temperature.
_DOT = paper("dot", "SANTA Eq. 2 (dot product)")
_DECODER0 = paper("decoder0", "SANTA Eq. 1 (first decoder position)")
# Lengths: the paper states none; the scripts pass these to train_santa.py.
_QUERY_LENGTH = code(50, "shell/pretrain-*.sh, finetune-*.sh: --q_max_len 50")
_DOCUMENT_LENGTH = code(240, "shell/pretrain-*.sh, finetune-*.sh: --p_max_len 240")
_TARGET_LENGTH = code(35, "shell/pretrain-*.sh: --l_max_len 35")
# Batches: the scripts train a map-style dataset with Hugging Face's Trainer, whose random
# sampler draws a new permutation of the whole training set every epoch.
_SHUFFLE = code(
    "global",
    "train_santa.py: Hugging Face Trainer (RandomSampler) over MappingDRTrainDataset",
)


def _pretrain(backbone: Setting, batch: Setting, lr: Setting, epochs: Setting) -> dict:
    """Structure-aware pretraining (SDA + MEP, in-batch negatives only)."""
    return {
        "model.backbone": backbone,
        "model.kind": paper("t5", "SANTA §4 (T5 / CodeT5)"),
        "model.pooling": _DECODER0,
        "model.similarity": _DOT,
        # The reference embeds the document from the same pass that gives the MEP loss.
        "model.embed_unmasked_document": code(
            False, "model.py encode_p: embedding from the masked pass with labels"
        ),
        "train.stage": paper("pretrain", "SANTA §3.2"),
        "train.optimizer": _ADAM,
        "train.weight_decay": _NO_DECAY,
        "train.grad_clip": _CLIP,
        "train.warmup_ratio": _WARMUP,
        "train.global_batch_size": batch,
        "train.learning_rate": lr,
        "train.epochs": epochs,
        "train.sda_weight": paper(1.0, "SANTA Eq. 4 (L = L_SDA + L_MEP)"),
        "train.mep_weight": paper(1.0, "SANTA Eq. 4 (L = L_SDA + L_MEP)"),
        # Eq. 7 sums over the target tokens; SANTA's code takes Hugging Face's per-token mean
        # (token_mean). The brief for these recipes is the paper's equation.
        "train.mep_reduction": paper("sum", "SANTA Eq. 7 (sum over target tokens)"),
        "negatives.per_query": paper(0, "SANTA A.2 (in-batch negatives only)"),
        "train.max_query_length": _QUERY_LENGTH,
        "train.max_document_length": _DOCUMENT_LENGTH,
        "train.max_target_length": _TARGET_LENGTH,
        "train.shuffle": _SHUFFLE,
    }


def _finetune(pretrain: dict, lr: Setting, epochs: Setting, batch: Setting) -> dict:
    """Fine-tuning with the DR loss (Eq. 3) and in-batch negatives, from the pretrained model."""
    settings = {
        key: value
        for key, value in pretrain.items()
        if key not in ("train.max_target_length", "train.mep_reduction", "train.sda_weight")
    }
    settings.update(
        {
            "train.stage": paper("finetune", "SANTA §4 (fine-tuning, Eq. 3)"),
            "train.mep_weight": paper(0.0, "SANTA Eq. 3 (the DR loss alone)"),
            "train.learning_rate": lr,
            "train.epochs": epochs,
            "train.global_batch_size": batch,
        }
    )
    return settings


def _ance(finetune: dict, lr: Setting, epochs: Setting, mined_by: str, where: str) -> dict:
    """Fine-tuning on in-batch negatives plus one hard negative from the top 100."""
    settings = dict(finetune)
    settings.update(
        {
            "train.learning_rate": lr,
            "train.epochs": epochs,
            "negatives.per_query": paper(1, f"{where} (one hard negative)"),
            "negatives.top_k": paper(100, f"{where} (sampled from the top 100 {mined_by})"),
            # Mined once with the previous stage's model and sampled from, as ANCE's first
            # round: the pipeline's ance stage with --hard-negatives table (its default).
            "negatives.skip_top": santa(0, "the paper samples from the whole top 100"),
        }
    )
    return settings


# ----------------------------------------------------------------------------- code

_CODET5 = paper("Salesforce/codet5-base", "SANTA §4 (CodeT5-base for code search)")
_A4_PRETRAIN = _pretrain(
    _CODET5,
    batch=paper(128, "SANTA A.4 (batch 128 in pretraining)"),
    lr=paper(5e-5, "SANTA A.4 (pretraining learning rate 5e-5)"),
    epochs=paper(10, "SANTA A.4 (10 pretraining epochs)"),
)


def _a4_finetune(lr: Setting) -> dict:
    """A.4's fine-tuning: batch 128, 12 epochs, in-batch negatives and one hard negative."""
    finetune = _finetune(
        _A4_PRETRAIN,
        lr=lr,
        epochs=paper(12, "SANTA A.4 (12 fine-tuning epochs)"),
        batch=paper(128, "SANTA A.4 (batch 128 in fine-tuning)"),
    )
    return _ance(finetune, lr, finetune["train.epochs"], "of the pretrained SANTA", "SANTA A.4")


_CODE_NOTES = (
    "Chain: pretrain, then fine-tune with one hard negative mined by the *pretrained* model "
    "(A.4): ray_jobs.pipeline --stages pretrain,ance.",
    "Pretraining data: CodeSearchNet with the CodeSearch/Adv dev and test functions left out "
    "(A.4); santa's preprocessing drops every held-out url and duplicate document.",
    "SANTA's scripts train one model per language (shell/pretrain-code.sh, finetune-code.sh "
    "take one language's data): run once per language with --languages for CodeSearch.",
)

CODET5_BASE_CODESEARCH = TableRecipe(
    name="codet5-base-codesearch",
    reproduces="SANTA Table 6 (Appendix A.4), CodeSearch columns, row SANTA (Hard Negative)",
    chain=("pretrain", "ance"),
    stages={
        "pretrain": _A4_PRETRAIN,
        "ance": _a4_finetune(paper(2e-5, "SANTA A.4 (learning rate 2e-5 for CodeSearch)")),
    },
    notes=_CODE_NOTES,
)

CODET5_BASE_ADV = TableRecipe(
    name="codet5-base-adv",
    reproduces="SANTA Table 6 (Appendix A.4), Adv column, row SANTA (Hard Negative)",
    chain=("pretrain", "ance"),
    stages={
        "pretrain": _A4_PRETRAIN,
        "ance": _a4_finetune(paper(1e-5, "SANTA A.4 (learning rate 1e-5 for Adv)")),
    },
    notes=(
        *_CODE_NOTES[:2],
        "Fine-tuning data: AdvTest's train split (python); evaluate with --protocol advtest.",
    ),
)

# ----------------------------------------------------------------------------- products

_T5 = paper("t5-base", "SANTA §4 (T5-base for product search)")
_ESCI_BATCH = paper(16, "SANTA §4 (batch size 16)")
_ESCI_PRETRAIN = _pretrain(
    _T5,
    batch=_ESCI_BATCH,
    lr=paper(1e-4, "SANTA §4 (continuous training learning rate 1e-4 for products)"),
    epochs=paper(6, "SANTA §4 (6 continuous training epochs)"),
)
_ESCI_FINETUNE = _finetune(
    _ESCI_PRETRAIN,
    lr=paper(5e-5, "SANTA §4 (fine-tuning learning rate 5e-5 for products)"),
    epochs=paper(60, "SANTA §4 (60 fine-tuning epochs for products)"),
    batch=_ESCI_BATCH,
)
_ESCI_ANCE = _ance(
    _ESCI_FINETUNE,
    lr=paper(1e-5, "SANTA §4 (hard-negative learning rate 1e-5 for products)"),
    # The paper gives no epoch count for this stage; the scripts' dev checkpoint folder is
    # named hard-neg/top-100/t5-shop-1e-5_60 (shell/dev_product_finetune.sh).
    epochs=santa(60, "not stated; as the fine-tuning stage (the scripts' t5-shop-1e-5_60)"),
    mined_by="of SANTA (Inbatch)",
    where="SANTA §4",
)

T5_BASE_ESCI = TableRecipe(
    name="t5-base-esci",
    reproduces="SANTA Table 2, product columns (NDCG@100 two- and four-class), rows "
    "SANTA (Inbatch) after finetune and SANTA (Hard Negative) after ance",
    chain=("pretrain", "finetune", "ance"),
    stages={"pretrain": _ESCI_PRETRAIN, "finetune": _ESCI_FINETUNE, "ance": _ESCI_ANCE},
    notes=(
        "Pretraining pairs: ray_jobs.preprocess --dataset esci --esci-version large "
        "--esci-pretrain paper (one pair per Exact judgment, as SANTA's "
        "processing/Product/build_product_entity.py; Table 5: 331,590 pairs).",
        "Fine-tuning pairs: --stage finetune --split train (ESCI small, the dev queries "
        "carved out as SANTA's build_product.py); dev: --stage eval --split valid.",
        "SANTA's code embeds a product as 'title : T text : D' (description only); santa "
        "embeds 'T D' with the bullet points after the description, in training and "
        "evaluation alike.",
    ),
)

TABLE_RECIPES: dict[str, TableRecipe] = {
    recipe.name: recipe for recipe in (CODET5_BASE_CODESEARCH, CODET5_BASE_ADV, T5_BASE_ESCI)
}


def table_recipe_factories() -> dict[str, Any]:
    """``{recipe name: factory}`` for every stage of every table recipe (``santa.recipes``)."""
    factories = {}
    for recipe in TABLE_RECIPES.values():
        for stage in recipe.stages:
            name = recipe.name if stage == "pretrain" else f"{recipe.name}-{stage}"
            factories[name] = _factory(recipe, stage)
    return factories


def _factory(recipe: TableRecipe, stage: str):
    def build() -> SantaConfig:
        return recipe.config(stage)

    build.__doc__ = f"{recipe.reproduces}: the {stage} stage."
    return build


def check_stage(recipe_name: str, stage: str) -> None:
    """Raise ValueError when ``stage`` is not in the chain of the table recipe ``recipe_name``."""
    recipe = TABLE_RECIPES.get(recipe_name)
    if recipe is not None and stage not in recipe.chain:
        recipe.config(stage)  # raises with the chain in the message
